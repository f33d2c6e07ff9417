"""The transformers baselines: ``hf`` (fastest configuration), ``hf-default`` and ``hf-offload``.

``hf`` is transformers' own ``generate`` with every weight on the GPU, in the fastest
configuration found on one H200 (static KV cache, compiled; ``batched_mm`` experts for models
with small experts, prompt included; ``grouped_mm`` for large ones, since ``batched_mm``
gathers one copy of the expert weights per routed pair: 68 GiB for a HumanEval prompt on
Phi-3.5-MoE; ``batched_mm`` decode steps with a ``grouped_mm`` prompt is a third choice,
measured 2.2x slower on DeepSeek-V2-Lite); ``hf-default``
is ``generate`` as a user calls it (dynamic cache, the model's default experts
implementation); ``hf-offload`` dispatches the model with accelerate's ``device_map`` under
``max_memory`` at the budget, so whole layers of experts move per token.

Timing: a streamer stamps the host clock when each new token reaches it (``generate``
copies each token to the host, which waits for the GPU). The first new token ends the
prefill; TPOT is the time from it to the last token over the tokens after the first: the
same per-token decode cost Specter's TPOT measures.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

__all__ = [
    "DECODE_BATCHED_MM",
    "HF_CONFIGS",
    "HF_DECODE_EXPERTS",
    "HFGeneration",
    "HFRunner",
    "choose_decode_experts",
    "offload_model",
]

DECODE_BATCHED_MM = "specter_batched_mm_decode"
"""The experts implementation ``hf`` registers with transformers: ``batched_mm`` for a forward
of one token (a decode step), ``grouped_mm`` for more (the prompt)."""

HF_DECODE_EXPERTS = ("auto", "batched_mm", "grouped_mm", "batched_mm_prompt_too")
"""The experts implementations ``hf`` may decode with (``HFRunner(decode_experts=)``):
``batched_mm`` decodes with it and prefills through ``grouped_mm``; ``batched_mm_prompt_too``
is transformers' own ``batched_mm`` for both (the configuration docs/benchmarking.md measured at
7.0 ms/token on DeepSeek-V2-Lite; its prompt gathers one expert copy per routed pair)."""

BATCHED_MM_MAX_EXPERT_PARAMS = 32_000_000
"""``auto``'s rule: ``batched_mm`` decodes while one expert has at most this many weights.
Measured on one H200 (static cache, compiled): DeepSeek-V2-Lite's 8.7 M-weight experts are
fastest with ``batched_mm`` (docs/benchmarking.md); Phi-3.5-MoE's 78.6 M-weight experts take
40.6 ms/token with it against 14.4 ms with ``grouped_mm`` (it copies ``k`` experts per token)."""

BATCHED_MM_MAX_GATHER_BYTES = 4_000_000_000
"""Expert copies transformers' ``batched_mm`` may gather in one forward (``k`` per token):
``hf`` feeds a longer prompt in chunks of at most this many bytes of copies
(``generate(prefill_chunk_size=)``; whole, a 512-token DeepSeek-V2-Lite prompt ran out of
memory on one H100 80GB), and the batched runner sends larger forwards through
``grouped_mm`` (``hf_batch``)."""

HF_CONFIGS = {
    "hf": {"cache_implementation": "static", "experts_implementation": DECODE_BATCHED_MM},
    "hf-default": {"cache_implementation": None, "experts_implementation": "grouped_mm"},
    "hf-offload": {"cache_implementation": None, "experts_implementation": None},
}
"""``generate`` settings of each transformers system (None: transformers' default)."""


def choose_decode_experts(model: torch.nn.Module) -> str:
    """``batched_mm_prompt_too`` or ``grouped_mm`` for ``hf``, by the weights of one routed
    expert (see :data:`BATCHED_MM_MAX_EXPERT_PARAMS`); ``batched_mm_prompt_too`` for a model
    without transformers' stacked experts.

    Small experts take transformers' own ``batched_mm`` for the prompt as well: on
    DeepSeek-V2-Lite the split (``batched_mm``, the prompt through ``grouped_mm``) decoded at
    20.4 ms/token against 9.1 ms on one H200 (31.7 ms on another), so only large experts,
    whose gathered prompt copies do not fit (Phi-3.5-MoE), leave it."""
    expert = _one_expert(model)
    if expert is None:
        return "batched_mm_prompt_too"
    return "batched_mm_prompt_too" if expert[0] <= BATCHED_MM_MAX_EXPERT_PARAMS else "grouped_mm"


def _one_expert(model: torch.nn.Module) -> tuple[int, int] | None:
    """``(weights, bytes)`` of one routed expert of ``model``'s first stacked experts module
    (transformers' ``gate_up_proj`` and ``down_proj``), or None without one."""
    for module in model.modules():
        gate_up, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
        if isinstance(gate_up, torch.Tensor) and isinstance(down, torch.Tensor):
            weights = (gate_up.numel() + down.numel()) // gate_up.shape[0]
            return weights, weights * gate_up.element_size()
    return None


def batched_mm_prefill_chunk(model: torch.nn.Module) -> int | None:
    """Prompt tokens per forward whose ``batched_mm`` expert copies stay within
    :data:`BATCHED_MM_MAX_GATHER_BYTES` (``k`` routed experts a token), at least 1; None for
    a model without transformers' stacked experts."""
    expert = _one_expert(model)
    if expert is None:
        return None
    top_k = int(
        getattr(model.config, "num_experts_per_tok", 0)
        or getattr(model.config, "moe_top_k", 0)
        or 1
    )
    return max(1, BATCHED_MM_MAX_GATHER_BYTES // (top_k * expert[1]))


def batched_mm_decode_experts_forward(
    module: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """transformers' ``batched_mm`` experts for ``hidden_states [1, H]``, ``grouped_mm`` for
    ``[T > 1, H]``.

    ``batched_mm`` gathers ``T * k`` expert weight copies, cheap for one token and the
    fastest decode step measured, but ``T * k * expert bytes`` for a prompt. The branch is
    on a shape, so a compiled decode step keeps ``batched_mm`` alone.
    """
    from transformers.integrations import moe

    if hidden_states.shape[0] == 1:
        return moe.batched_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    return moe.grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)


def _register_decode_experts() -> None:
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(DECODE_BATCHED_MM, batched_mm_decode_experts_forward)


def _allow_one_compile_per_layer(model: torch.nn.Module, shapes: int = 1) -> int:
    """Raise dynamo's recompile limit to cover one compiled frame per decoder layer (per
    input shape: ``shapes`` batch sizes compile one decode step each).

    A graph break inside a decoder layer (PhiMoE's router) makes dynamo compile each layer's
    forward on its own, specialised on ``layer_idx``; with the default limit of 8 the layers
    past the eighth ran eagerly (Phi-3.5-MoE's ``hf`` decode step: 49.9 ms on one H200).
    Returns the limit now in force.
    """
    import torch._dynamo.config as dynamo_config

    layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
    wanted = (2 * layers + 8) * max(1, shapes)
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    limit = max(getattr(dynamo_config, name), wanted)
    setattr(dynamo_config, name, limit)
    if hasattr(dynamo_config, "accumulated_recompile_limit"):
        dynamo_config.accumulated_recompile_limit = max(
            dynamo_config.accumulated_recompile_limit, 4 * limit
        )
    return limit


class _TimingStreamer:
    """Stamps the host clock at every ``put`` after the prompt's (transformers streamer API)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # generate puts the prompt first
            self._prompt_seen = True
            return
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        """Nothing to flush."""


@dataclass
class HFGeneration:
    """One ``generate`` call's tokens and times.

    Attributes:
        tokens: the new token ids.
        prefill_s: from the call to the first new token (prompt processing).
        decode_s: from the first new token to the last.
        tpot_s: ``decode_s / (len(tokens) - 1)``; None with fewer than two tokens.
        peak_gpu_bytes: ``torch.cuda.max_memory_allocated`` after the call (None on CPU).
    """

    tokens: list[int]
    prefill_s: float
    decode_s: float
    tpot_s: float | None
    peak_gpu_bytes: int | None = None
    settings: dict[str, object] = field(default_factory=dict)


class HFRunner:
    """Greedy ``generate`` on a transformers causal LM with one of :data:`HF_CONFIGS`.

    Args:
        model: a transformers causal LM (on its device, eval mode).
        system: ``hf``, ``hf-default`` or ``hf-offload``.
        pad_token_id: passed to ``generate`` (no tokenizer needed).
        compile: allow transformers' automatic compilation of the static-cache decode step
            (on CUDA; False passes ``disable_compile=True``).
        max_cache_len: size every static cache for this many positions, so that prompts of
            different lengths reuse one compiled decode step instead of recompiling (which
            would land inside the timed decode).
        device: where input ids go (default: the input embedding's device). An accelerate-
            dispatched model may keep its embedding offloaded (on ``meta``): give the GPU.
        decode_experts: ``hf``'s experts implementation for decode steps: ``batched_mm``
            (the prompt goes through ``grouped_mm``), ``grouped_mm`` (both),
            ``batched_mm_prompt_too`` (transformers' ``batched_mm`` for both), or ``auto``
            (default: by expert size, :func:`choose_decode_experts`).

    Raises:
        ValueError: an unknown system or ``decode_experts``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        system: str,
        pad_token_id: int = 0,
        *,
        compile: bool = True,
        max_cache_len: int | None = None,
        device: torch.device | str | None = None,
        decode_experts: str = "auto",
    ) -> None:
        if system not in HF_CONFIGS:
            raise ValueError(
                f"unknown transformers system {system!r}; expected {list(HF_CONFIGS)}."
            )
        if decode_experts not in HF_DECODE_EXPERTS:
            raise ValueError(
                f"decode_experts={decode_experts!r} is not one of {HF_DECODE_EXPERTS}; "
                "choose batched_mm (small experts) or grouped_mm (large experts)."
            )
        self.model = model
        self.system = system
        self.settings = dict(HF_CONFIGS[system])
        if decode_experts == "auto":
            decode_experts = choose_decode_experts(model)
        if system == "hf" and decode_experts == "grouped_mm":
            self.settings["experts_implementation"] = "grouped_mm"
        if system == "hf" and decode_experts == "batched_mm_prompt_too":
            self.settings["experts_implementation"] = "batched_mm"
        self.pad_token_id = pad_token_id
        self.max_cache_len = max_cache_len
        self._device = torch.device(device) if device is not None else None
        impl = self.settings["experts_implementation"]
        if next(model.parameters()).dtype == torch.float64:
            impl = "eager"  # grouped_mm and batched_mm have no float64 kernels (CPU tests)
        if impl == DECODE_BATCHED_MM:
            _register_decode_experts()
        if impl is not None:
            model.set_experts_implementation(impl)
        self.settings["experts_implementation"] = model.config._experts_implementation
        self.settings["cache_implementation"] = self.settings["cache_implementation"] or "dynamic"
        self.settings["compile"] = compile and self.settings["cache_implementation"] == "static"
        if self.settings["compile"]:
            self.settings["recompile_limit"] = _allow_one_compile_per_layer(model)
        chunk = None
        if self.settings["experts_implementation"] == "batched_mm":
            chunk = batched_mm_prefill_chunk(model)
        self.settings["prefill_chunk_size"] = chunk

    @property
    def device(self) -> torch.device:
        """Where input ids go (the embedding's device unless given)."""
        if self._device is not None:
            return self._device
        return self.model.get_input_embeddings().weight.device

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> HFGeneration:
        """Greedy decode exactly ``max_new_tokens`` tokens (an EOS token does not stop it).

        Raises:
            ValueError: an empty prompt or a budget < 1.
        """
        if not prompt_ids:
            raise ValueError("prompt_ids is empty; give at least one token.")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)
        streamer = _TimingStreamer()
        kwargs: dict[str, object] = {}
        if self.settings["cache_implementation"] == "static":
            kwargs["cache_implementation"] = "static"
            if self.max_cache_len is not None:
                kwargs["max_cache_len"] = max(self.max_cache_len, len(prompt_ids) + max_new_tokens)
            if not self.settings["compile"]:
                kwargs["disable_compile"] = True
            chunk = self.settings.get("prefill_chunk_size")
            if chunk is not None and len(prompt_ids) > chunk:
                kwargs["prefill_chunk_size"] = chunk
        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                # No EOS: every system decodes exactly max_new_tokens greedy tokens. (Not
                # min_new_tokens, which would mask EOS and change the greedy choice.)
                eos_token_id=None,
                pad_token_id=self.pad_token_id,
                streamer=streamer,
                **kwargs,
            )
        tokens = out[0, len(prompt_ids) :].tolist()
        stamps = streamer.stamps
        prefill = stamps[0] - started if stamps else time.perf_counter() - started
        decode = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
        return HFGeneration(
            tokens=tokens,
            prefill_s=prefill,
            decode_s=decode,
            tpot_s=decode / (len(stamps) - 1) if len(stamps) > 1 else None,
            peak_gpu_bytes=torch.cuda.max_memory_allocated(self.device) if cuda else None,
            settings=dict(self.settings),
        )


def offload_model(model: torch.nn.Module, gpu_memory_gb: float, device: int = 0) -> dict:
    """Dispatch a CPU-resident model with accelerate under ``max_memory`` at the budget.

    Args:
        model: the transformers model, weights in host memory.
        gpu_memory_gb: GPU memory accelerate may fill with weights (GB, 1e9 bytes).
        device: CUDA device index.

    Returns:
        The device map (module name -> device), for the record.

    Raises:
        ImportError: accelerate is not installed (``pip install accelerate``).
    """
    try:
        from accelerate import dispatch_model, infer_auto_device_map
    except ImportError as exc:
        raise ImportError(
            "hf-offload needs accelerate (`pip install accelerate`); it is part of the GPU "
            "machine's image."
        ) from exc
    no_split = getattr(model, "_no_split_modules", None) or []
    device_map = infer_auto_device_map(
        model,
        max_memory={device: int(gpu_memory_gb * 1e9), "cpu": 10**15},
        no_split_module_classes=list(no_split),
        dtype=next(model.parameters()).dtype,
    )
    dispatch_model(model, device_map=device_map)
    return {name: str(where) for name, where in device_map.items()}
