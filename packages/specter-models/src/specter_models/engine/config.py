"""The engine's configuration: what to load, how to spend GPU memory, kernels, speculation.

Every field is checked when the dataclass is built; a bad value raises ``ValueError`` naming
the field, the value and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from specter_models.engine.model_source import DTYPES
from specter_models.presets import DEMO_MODEL

__all__ = [
    "CPU_EXPERT_MODES",
    "BatchConfig",
    "CpuExpertsConfig",
    "EngineConfig",
    "KernelConfig",
    "LoadConfig",
    "MemoryConfig",
    "SpeculationConfig",
]


def _fail(owner: str, name: str, value: object, expected: str) -> None:
    raise ValueError(f"{owner}.{name}={value!r}: expected {expected}.")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_switch(owner: str, name: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        _fail(owner, name, value, "True, False or None (the loader decides)")


@dataclass(frozen=True)
class LoadConfig:
    """What to load, and where.

    Attributes:
        model: a preset (``deepseek-v2-lite``, ``qwen1.5-moe``, ``phi-3.5-moe``,
            ``tiny-*``: seeded random weights), the trained demo ``specter-code-tiny``, or
            a checkpoint folder.
        device: ``"auto"`` (CUDA when torch sees a GPU, else the CPU), ``"cpu"``,
            ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"float16"``, ``"bfloat16"``, ``"float32"``, ``"float64"``, or None:
            float16 on a GPU, float32 on a CPU.
        weights_seed: seed of a preset's random weights (ignored for checkpoints).
        draft: ``"rtn"`` (the experts quantized to INT4 on load, round-to-nearest) or a
            GPTQ checkpoint folder of the same model.
    """

    model: str = DEMO_MODEL
    device: str = "auto"
    dtype: str | None = None
    weights_seed: int = 0
    draft: str = "rtn"

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            _fail("LoadConfig", "model", self.model, "a preset name or a checkpoint folder")
        device = self.device
        known = device in ("auto", "cpu", "cuda")
        if not (isinstance(device, str) and (known or device.startswith("cuda:"))):
            _fail("LoadConfig", "device", device, "'auto', 'cpu', 'cuda' or 'cuda:N'")
        if self.dtype is not None and self.dtype not in DTYPES:
            _fail("LoadConfig", "dtype", self.dtype, f"None or one of {', '.join(DTYPES)}")
        if not _is_int(self.weights_seed):
            _fail("LoadConfig", "weights_seed", self.weights_seed, "an int")
        if not isinstance(self.draft, str) or not self.draft:
            _fail("LoadConfig", "draft", self.draft, "'rtn' or a GPTQ checkpoint folder")


@dataclass(frozen=True)
class MemoryConfig:
    """How the GPU memory is spent: expert slots, the pinned hot set, the miss path.

    Attributes:
        gpu_memory_gb: the GPU memory budget in GB; expert slots get what the fixed state
            leaves. ``"auto"``: the device memory free at start less
            :data:`~specter_models.engine.auto_budget.AUTO_BUDGET_MARGIN_GB` (no budget on a
            CPU, or where that holds every expert). None (and no ``slots_per_layer``): every
            expert resident.
        slots_per_layer: a fixed number of FP16 expert slots per MoE layer instead of a
            budget (the two are exclusive).
        hot_experts: ``"auto"`` (a hot set chosen on the routing of the calibration prompt
            and its first ``hot_set_tokens`` greedy tokens; needs a budget), ``"none"``, a
            file (a ``specter bench`` results file with a ``hot_experts`` record, or JSON
            ``{"hot_experts": [[ids], ...]}``), or None: ``"auto"`` when speculating under a
            budget that leaves some expert without a slot and a calibration prompt of two or
            more tokens is given, else none.
        hot_set_tokens: with ``hot_experts="auto"``, greedy tokens decoded after the
            calibration prompt whose routing chooses the hot set too (0: the prompt alone).
        draft_pruned: experts per layer the INT4 draft skips (their memory buys FP16 slots;
            the target still computes them, so the output is unchanged). ``"auto"``: with
            an auto hot set a third of the experts under a budget that leaves some expert
            without a slot; with a hot-set file the file's pruned experts. 0: none.
        miss_path: how a verification under a budget meets experts without a slot:
            ``"load"`` them into slots, ``"stream"`` them in place from pinned host memory,
            or ``"auto"``: stream under a budget, load otherwise.
        stream_fills: on the streamed path, candidate slots per layer a step fills with the
            experts it streams. None: :data:`~specter_models.engine.PLAIN_STREAM_FILLS` when
            decoding plainly, 0 when speculating (its prefetches keep the free slots).
        stream_staging: on the streamed path (float16), experts per layer a verification
            copies into a device staging buffer before its expert kernel reads them (fixed
            state in the memory plan; 0: none).
        max_seq_len: positions the KV cache holds (prompt, new tokens and one verification).
            None: 2048, or the model's limit if lower.
    """

    gpu_memory_gb: float | str | None = None
    slots_per_layer: int | None = None
    hot_experts: str | None = None
    hot_set_tokens: int = 32
    draft_pruned: int | str = "auto"
    miss_path: str = "auto"
    stream_fills: int | None = None
    stream_staging: int = 0
    max_seq_len: int | None = None

    def __post_init__(self) -> None:
        budget = self.gpu_memory_gb
        if (
            budget is not None
            and budget != "auto"
            and (isinstance(budget, bool) or not isinstance(budget, int | float) or not budget > 0)
        ):
            _fail("MemoryConfig", "gpu_memory_gb", budget, "a number of GB > 0, 'auto' or None")
        slots = self.slots_per_layer
        if slots is not None and not (_is_int(slots) and slots >= 1):
            _fail("MemoryConfig", "slots_per_layer", slots, "an int >= 1, or None")
        if budget is not None and slots is not None:
            raise ValueError(
                f"MemoryConfig: gpu_memory_gb={budget!r} and slots_per_layer={slots!r} are "
                "exclusive; give one of them."
            )
        if self.hot_experts is not None and (
            not isinstance(self.hot_experts, str) or not self.hot_experts
        ):
            _fail("MemoryConfig", "hot_experts", self.hot_experts, "'auto', 'none', a file or None")
        if not (_is_int(self.hot_set_tokens) and self.hot_set_tokens >= 0):
            _fail("MemoryConfig", "hot_set_tokens", self.hot_set_tokens, "an int >= 0")
        pruned = self.draft_pruned
        if pruned != "auto" and not (_is_int(pruned) and pruned >= 0):
            _fail("MemoryConfig", "draft_pruned", pruned, "an int >= 0 or 'auto'")
        if self.miss_path not in ("auto", "load", "stream"):
            _fail("MemoryConfig", "miss_path", self.miss_path, "'auto', 'load' or 'stream'")
        fills = self.stream_fills
        if fills is not None and not (_is_int(fills) and fills >= 0):
            _fail("MemoryConfig", "stream_fills", fills, "an int >= 0, or None")
        if not (_is_int(self.stream_staging) and self.stream_staging >= 0):
            _fail("MemoryConfig", "stream_staging", self.stream_staging, "an int >= 0")
        length = self.max_seq_len
        if length is not None and not (_is_int(length) and length >= 2):
            _fail("MemoryConfig", "max_seq_len", length, "an int >= 2, or None")

    @property
    def budgeted(self) -> bool:
        """Some expert may lack a slot: a budget or a slot count is given."""
        return self.gpu_memory_gb is not None or self.slots_per_layer is not None


@dataclass(frozen=True)
class KernelConfig:
    """Kernel and graph switches; None lets the loader decide.

    Attributes:
        batch_invariant: batch-invariant verification, so speculative greedy output equals
            plain greedy output bit for bit in fp16 (None: on for fp16/bf16 on CUDA).
        cuda_graphs: capture decode steps as CUDA graphs (None: on for CUDA).
        piecewise_graphs: with CUDA graphs, graph the target under a budget too, piecewise
            between its routed-expert calls (None: whenever CUDA graphs are on).
        shared_overlap: run DeepSeek-V2's and Qwen2-MoE's shared experts on a side stream
            beside the routed ones, the same bits (None: on).
    """

    batch_invariant: bool | None = None
    cuda_graphs: bool | None = None
    piecewise_graphs: bool | None = None
    shared_overlap: bool | None = None

    def __post_init__(self) -> None:
        for name in ("batch_invariant", "cuda_graphs", "piecewise_graphs", "shared_overlap"):
            _check_switch("KernelConfig", name, getattr(self, name))


@dataclass(frozen=True)
class SpeculationConfig:
    """How the engine speculates.

    Attributes:
        depth: proposals per iteration K (0: plain decoding, no INT4 draft loaded, its
            memory becomes FP16 expert slots) or ``"auto"``: an adaptive depth up to
            ``max_depth``, which under a budget also decodes plainly where plain decoding
            was faster in the load's timed trial (``trial_tokens``), or, without a trial,
            where the calibration routing, replayed through the draftless slots, moves
            fewer experts than through the draft's, or where an earlier run of the same
            setup found that no depth beats plain decoding (its kept verdict, see
            ``speculation_verdict``); ``keep_draft`` speculates anyway.
        max_depth: the adaptive depth's largest K.
        keep_draft: with ``depth="auto"``, always load the draft and speculate.
        depth_memory: with ``depth="auto"``, start from the step costs (and, under a
            budget, the verdict on speculation) an earlier run of the same setup measured,
            and keep this engine's (in ``$SPECTER_CACHE_DIR``, default ``~/.cache/specter``).
        warmup_tokens: with ``depth="auto"`` and every expert resident, greedy tokens of the
            calibration prompt decoded unrecorded before the first generation, so the
            adaptive depth starts from measured step times (0: none).
        trial_tokens: with ``depth="auto"`` under a budget and a calibration prompt, tokens
            of the calibration prompt each of plain decoding and speculation decodes, timed,
            at load; the faster is kept (``engine.arm_trial``). 0: no trial (decide on the
            calibration routing's expert loads); None: 32 on a CUDA device, 0 elsewhere.
    """

    depth: int | str = "auto"
    max_depth: int = 16
    keep_draft: bool = False
    depth_memory: bool = True
    warmup_tokens: int = 32
    trial_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.depth != "auto" and not (_is_int(self.depth) and self.depth >= 0):
            _fail("SpeculationConfig", "depth", self.depth, "an int >= 0 or 'auto'")
        if not (_is_int(self.max_depth) and self.max_depth >= 1):
            _fail("SpeculationConfig", "max_depth", self.max_depth, "an int >= 1")
        for name in ("keep_draft", "depth_memory"):
            if not isinstance(getattr(self, name), bool):
                _fail("SpeculationConfig", name, getattr(self, name), "True or False")
        if not (_is_int(self.warmup_tokens) and self.warmup_tokens >= 0):
            _fail("SpeculationConfig", "warmup_tokens", self.warmup_tokens, "an int >= 0")
        if self.trial_tokens is not None and not (
            _is_int(self.trial_tokens) and self.trial_tokens >= 0
        ):
            _fail("SpeculationConfig", "trial_tokens", self.trial_tokens, "None or an int >= 0")
        if self.depth == 0 and self.keep_draft:
            raise ValueError(
                "SpeculationConfig: keep_draft=True keeps the INT4 draft to speculate with, "
                "but depth=0 decodes plainly without one; drop keep_draft or give a depth."
            )

    @property
    def largest_depth(self) -> int:
        """The largest K a verification may check: ``max_depth`` for ``"auto"``, else
        ``depth``."""
        return self.max_depth if self.depth == "auto" else int(self.depth)


CPU_EXPERT_MODES = ("auto", "off", "on")
"""``CpuExpertsConfig.mode``'s values."""


@dataclass(frozen=True)
class CpuExpertsConfig:
    """Whether the host's cores compute some experts (``specter_models.cpu_experts``).

    Attributes:
        mode: ``"off"``: every expert on the GPU; ``"on"``: each MoE layer's least routed
            experts of the calibration routing are CPU-homed, as many as the load-time cost
            model chooses and at least one, on any device (a model whose dtype the host's
            GEMM cannot run is refused, with why); ``"auto"``: the cost model's choice on a
            CUDA device under a budget that leaves some expert without a slot, with a
            calibration prompt, where it homes any expert; off otherwise.
        threads: host threads the executor computes on (None: every usable core but one);
            at least 1 and at most the machine's cores.
    """

    mode: str = "off"
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in CPU_EXPERT_MODES:
            _fail("CpuExpertsConfig", "mode", self.mode, "'auto', 'off' or 'on'")
        cores = os.cpu_count() or 1
        threads = self.threads
        if threads is not None and not (_is_int(threads) and 1 <= threads <= cores):
            _fail(
                "CpuExpertsConfig",
                "threads",
                threads,
                f"None or an int from 1 to this machine's {cores} cores",
            )


@dataclass(frozen=True)
class BatchConfig:
    """How many sequences the engine decodes together (``Engine.generate_batch``,
    ``Engine.batch_session``).

    Attributes:
        max_batch: sequences decoded at once, at least 1. The KV cache holds ``max_batch``
            slots of ``MemoryConfig.max_seq_len`` positions each, and the memory plan counts
            them (a budget's slots pay for them); 1: single-sequence decoding only.
    """

    max_batch: int = 1

    def __post_init__(self) -> None:
        if not (_is_int(self.max_batch) and self.max_batch >= 1):
            _fail("BatchConfig", "max_batch", self.max_batch, "an int >= 1")


@dataclass(frozen=True)
class EngineConfig:
    """Everything :meth:`~specter_models.engine.Engine.from_config` needs."""

    load: LoadConfig = field(default_factory=LoadConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    kernels: KernelConfig = field(default_factory=KernelConfig)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    cpu_experts: CpuExpertsConfig = field(default_factory=CpuExpertsConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)

    def __post_init__(self) -> None:
        for name, kind in (
            ("load", LoadConfig),
            ("memory", MemoryConfig),
            ("kernels", KernelConfig),
            ("speculation", SpeculationConfig),
            ("cpu_experts", CpuExpertsConfig),
            ("batch", BatchConfig),
        ):
            if not isinstance(getattr(self, name), kind):
                _fail("EngineConfig", name, getattr(self, name), f"a {kind.__name__}")
        hot = self.memory.hot_experts
        if self.speculation.depth == 0 and hot not in (None, "none"):
            raise ValueError(
                f"MemoryConfig.hot_experts={hot!r} pins experts in place of their INT4 draft "
                "copies, but SpeculationConfig.depth=0 decodes without a draft; leave "
                "hot_experts unset or give a depth."
            )
