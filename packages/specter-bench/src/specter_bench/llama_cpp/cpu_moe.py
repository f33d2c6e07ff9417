"""How many layers' routed experts llama.cpp must keep on the CPU to fit a GPU memory budget.

llama.cpp's ``--n-cpu-moe N`` (with ``-ngl 99``: every layer on the GPU) keeps the routed
experts of decoder blocks ``0 .. N-1`` in host memory and computes them on the CPU; every
other tensor is on the GPU except the token embeddings, which llama.cpp always keeps on the
host. DeepSeek-V2-Lite's block 0 is dense, so ``N = 1`` moves nothing there.

For a budget of ``G`` GB (1e9 bytes, as Specter's ``--gpu-memory-gb``), ``auto`` picks the
smallest ``N`` with

    gpu_bytes(N) = W + sum(E_b for blocks b >= N) + KV + C + R  <=  G

* ``W``: every tensor of the GGUF but the token embeddings and the routed experts, exactly
  (the file's own byte sizes: the attention, norms, routers, shared experts, dense blocks
  and the output head);
* ``E_b``: block ``b``'s routed experts (``blk.b.ffn_{gate,up,down}_exps``), exactly;
* ``KV``: the F16 KV cache of the context, ``n_ctx * blocks * (key_length + value_length)
  * head_count_kv * 2`` bytes (DeepSeek-V2's MLA cache: key 576 = latent 512 + rope 64,
  value 512, one head; an upper bound, llama.cpp may store less);
* ``C``: the compute buffer of one micro-batch, estimated as
  ``n_ubatch * 4 * (vocab + 32 * n_embd)`` bytes: the F32 logits of every row plus a
  generous allowance for the activations (DeepSeek-V2-Lite at the default 512 rows: 0.34 GB);
* ``R``: a fixed 256 MiB for cuBLAS workspaces, CUDA graphs and small buffers.

The CUDA context itself (about 0.5 GB in the driver's view) is outside the budget, as it is
for Specter's budget (PyTorch's allocator counts its own allocations only). A speculative
run adds the draft's ``W + E + KV + C`` with all its experts on the GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from specter_bench.llama_cpp.gguf_file import GgufFile

__all__ = [
    "COMPUTE_ACTIVATION_WIDTH",
    "DEFAULT_UBATCH",
    "FIXED_RESERVE_BYTES",
    "BudgetTooSmallError",
    "CpuMoePlan",
    "GpuFootprint",
    "estimate_at",
    "gpu_footprint",
    "plan_cpu_moe",
]

GB = 1e9
FIXED_RESERVE_BYTES = 256 * 2**20
COMPUTE_ACTIVATION_WIDTH = 32
"""Activation allowance of the compute buffer, in multiples of ``n_embd`` per row."""
DEFAULT_UBATCH = 512  # llama.cpp's default n_ubatch
_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down|gate_up)_(ch|)exps\.")
_TOKEN_EMBEDDINGS = "token_embd.weight"


class BudgetTooSmallError(ValueError):
    """The budget cannot hold even the non-expert state with every routed expert on the CPU."""


@dataclass(frozen=True)
class GpuFootprint:
    """What one GGUF puts on the GPU with ``-ngl 99``, in bytes.

    Attributes:
        non_expert_bytes: ``W``: every tensor but the token embeddings and routed experts.
        expert_bytes_per_block: ``E_b`` for every block (0 for a dense block).
        host_bytes: the token embeddings (always on the host).
        kv_bytes: the KV cache of the context.
        compute_bytes: the estimated compute buffer.
        n_ctx: the context the KV cache holds.
    """

    non_expert_bytes: int
    expert_bytes_per_block: tuple[int, ...]
    host_bytes: int
    kv_bytes: int
    compute_bytes: int
    n_ctx: int

    def gpu_bytes(self, n_cpu_moe: int) -> int:
        """Bytes on the GPU with the first ``n_cpu_moe`` blocks' experts on the CPU (the
        fixed reserve not included)."""
        experts = sum(self.expert_bytes_per_block[n_cpu_moe:])
        return self.non_expert_bytes + experts + self.kv_bytes + self.compute_bytes


@dataclass(frozen=True)
class CpuMoePlan:
    """The ``--n-cpu-moe`` chosen for a budget.

    Attributes:
        n_cpu_moe: blocks whose routed experts stay on the CPU.
        budget_gb: the budget (None: no budget, every expert on the GPU).
        estimated_gpu_gb: the estimate at ``n_cpu_moe``, the fixed reserve and a draft
            included.
        cpu_expert_gb: routed experts left on the CPU.
        moe_blocks_on_cpu: blocks with experts among the first ``n_cpu_moe``.
        breakdown: the estimate's terms in GB.
    """

    n_cpu_moe: int
    budget_gb: float | None
    estimated_gpu_gb: float
    cpu_expert_gb: float
    moe_blocks_on_cpu: int
    breakdown: dict[str, float]

    def describe(self) -> str:
        """One line: the choice and its estimate."""
        terms = ", ".join(f"{k} {v:.2f}" for k, v in self.breakdown.items() if v)
        budget = "no budget" if self.budget_gb is None else f"{self.budget_gb:g} GB"
        return (
            f"--n-cpu-moe {self.n_cpu_moe} ({self.moe_blocks_on_cpu} MoE blocks, "
            f"{self.cpu_expert_gb:.2f} GB of experts on the CPU): GPU estimate "
            f"{self.estimated_gpu_gb:.2f} GB for {budget} ({terms} GB)"
        )


def gpu_footprint(gguf: GgufFile, *, n_ctx: int, n_ubatch: int = DEFAULT_UBATCH) -> GpuFootprint:
    """The GPU bytes of ``gguf`` with every layer offloaded (``-ngl 99``), by part.

    Raises:
        ValueError: the file lacks the block count or names no routed experts (not an MoE
            model), or a context < 1.
    """
    if n_ctx < 1:
        raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
    blocks = gguf.arch_value("block_count")
    if not isinstance(blocks, int) or blocks < 1:
        raise ValueError(f"{gguf.path}: no {gguf.architecture}.block_count in its metadata")
    experts = [0] * blocks
    non_expert = host = 0
    for tensor in gguf.tensors:
        if tensor.name == _TOKEN_EMBEDDINGS:
            host += tensor.nbytes
        elif match := _EXPERTS.match(tensor.name):
            experts[int(match.group(1))] += tensor.nbytes
        else:
            non_expert += tensor.nbytes
    if not any(experts):
        raise ValueError(
            f"{gguf.path}: no routed-expert tensors (blk.N.ffn_*_exps); --n-cpu-moe applies "
            "to Mixture-of-Experts models only"
        )
    n_embd = int(gguf.arch_value("embedding_length", 0))
    heads = int(gguf.arch_value("attention.head_count", 1) or 1)
    kv_heads = gguf.arch_value("attention.head_count_kv", heads)
    kv_heads = int(max(kv_heads) if isinstance(kv_heads, list) else kv_heads)
    key = int(gguf.arch_value("attention.key_length", n_embd // heads))
    value = int(gguf.arch_value("attention.value_length", n_embd // heads))
    kv = n_ctx * blocks * (key + value) * kv_heads * 2
    vocab = int(gguf.vocab_size or gguf.arch_value("vocab_size", 0) or 0)
    compute = n_ubatch * 4 * (vocab + COMPUTE_ACTIVATION_WIDTH * n_embd)
    return GpuFootprint(non_expert, tuple(experts), host, kv, compute, n_ctx)


def plan_cpu_moe(
    target: GpuFootprint, budget_gb: float | None, *, draft: GpuFootprint | None = None
) -> CpuMoePlan:
    """The smallest ``--n-cpu-moe`` whose estimate fits ``budget_gb``.

    Args:
        target: the target's footprint.
        budget_gb: GB (1e9 bytes); None keeps every expert on the GPU (``n_cpu_moe`` 0).
        draft: a draft model's footprint, held whole on the GPU beside the target.

    Raises:
        BudgetTooSmallError: the estimate exceeds the budget even with every block's experts
            on the CPU (the message gives the estimate and its parts).
    """
    extra = FIXED_RESERVE_BYTES + (draft.gpu_bytes(0) if draft is not None else 0)
    blocks = len(target.expert_bytes_per_block)
    if budget_gb is None:
        chosen = 0
    else:
        limit = budget_gb * GB
        fits = [n for n in range(blocks + 1) if target.gpu_bytes(n) + extra <= limit]
        if not fits:
            plan = estimate_at(target, blocks, budget_gb, draft=draft)
            raise BudgetTooSmallError(
                f"a GPU memory budget of {budget_gb:g} GB cannot hold llama.cpp's state even "
                f"with every routed expert on the CPU: {plan.describe()}; give at least "
                f"{plan.estimated_gpu_gb:.1f} GB"
            )
        chosen = fits[0]
    return estimate_at(target, chosen, budget_gb, draft=draft)


def estimate_at(
    target: GpuFootprint,
    n: int,
    budget_gb: float | None,
    *,
    draft: GpuFootprint | None = None,
) -> CpuMoePlan:
    """The estimate with the first ``n`` blocks' experts on the CPU (no budget check).

    Raises:
        ValueError: ``n`` outside ``[0, blocks]``.
    """
    if not 0 <= n <= len(target.expert_bytes_per_block):
        raise ValueError(
            f"--n-cpu-moe {n}: the model has {len(target.expert_bytes_per_block)} blocks; give "
            "a count from 0 to that"
        )
    breakdown = {
        "non-expert weights": target.non_expert_bytes / GB,
        "GPU experts": sum(target.expert_bytes_per_block[n:]) / GB,
        "KV cache": target.kv_bytes / GB,
        "compute buffer": target.compute_bytes / GB,
        "reserve": FIXED_RESERVE_BYTES / GB,
        "draft": (draft.gpu_bytes(0) / GB) if draft is not None else 0.0,
    }
    return CpuMoePlan(
        n_cpu_moe=n,
        budget_gb=budget_gb,
        estimated_gpu_gb=sum(breakdown.values()),
        cpu_expert_gb=sum(target.expert_bytes_per_block[:n]) / GB,
        moe_blocks_on_cpu=sum(1 for b in target.expert_bytes_per_block[:n] if b),
        breakdown=breakdown,
    )
