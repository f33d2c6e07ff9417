"""The engine's CPU expert path, set up from ``CpuExpertsConfig`` once the model is loaded.

``"auto"`` turns the path on where it can pay: a CUDA device, a budget that leaves some
expert without a slot, decode steps not captured as whole CUDA graphs (``auto_declines``),
and a calibration prompt. Then (and always with ``"on"``) it checks
that the host can run the kernel in the model's dtype, measures the machine's costs
(``measure_placement_costs``), routes the calibration prompt and its first greedy tokens
through the loaded target (every expert still on the device, so a speculative and a plain
engine route them alike), and homes the experts the cost model chooses
(``choose_placement``) before any graph is captured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from specter_models.cpu_calibration import choose_placement, measure_placement_costs
from specter_models.cpu_experts import (
    CpuKernelUnavailableError,
    check_cpu_kernel,
    default_cpu_threads,
)
from specter_models.engine.config import CpuExpertsConfig

__all__ = ["auto_declines", "calibration_routing", "set_up_cpu_experts"]


def calibration_routing(loaded: Any, prompt_ids: Sequence[int], tokens: int) -> torch.Tensor:
    """``[T, L, k]``: the target's routing of ``prompt_ids`` and its first ``tokens`` greedy
    tokens (as many as the KV cache holds), decoded plainly by ``loaded`` itself; the model
    is reset afterwards."""
    from specter_models.routing_recorder import RoutingRecorder, teacher_forced_pass
    from specter_spec import SpecController

    room = loaded.kv.cache.max_seq_len - len(prompt_ids) - 1
    sequence = list(prompt_ids)
    tokens = max(0, min(tokens, room))
    loaded.reset()
    if tokens:
        decoded = SpecController(None, loaded.target, depth=0).generate(sequence, tokens).tokens
        sequence += list(decoded)[:-1]  # the last token's routing is no step's
    recorder = RoutingRecorder(loaded.model)
    try:
        routing = teacher_forced_pass(recorder, loaded.target, sequence, 0, loaded.reset).routing
    finally:
        recorder.remove()
        loaded.reset()
    return routing


def auto_declines(loaded: Any, *, has_prompt: bool) -> str | None:
    """Why ``"auto"`` leaves the CPU path off for ``loaded`` (None: it may pay).

    The path reads each layer's routing on the host, so the target's experts run eagerly
    between piecewise graphs. Where the whole step would otherwise be one CUDA graph, that
    costs more than the misses the host takes off the link (DeepSeek-V2-Lite at 24 GB on an
    H100: 12.3 ms a token against 6.8 speculating, 27.8 against 6.4 plain; see
    docs/decisions.md), so ``"auto"`` stays off there and ``"on"`` forces the path.
    """
    if loaded.device.type != "cuda":
        return "no GPU to overlap (on the CPU every expert is computed by the host already)"
    if min(loaded.cache.slots_per_layer) >= loaded.cache.num_experts:
        return "every expert holds a slot"
    if loaded.cuda_graphs:
        return (
            "the CPU path runs the target's experts outside CUDA graphs, which measured "
            "slower than streaming the misses (--cpu-experts on forces it)"
        )
    if not has_prompt:
        return "no calibration prompt to choose the CPU-homed experts on"
    return None


def set_up_cpu_experts(
    loaded: Any,
    config: CpuExpertsConfig,
    *,
    prompt_ids: Sequence[int] | None,
    continuation_tokens: int,
    placement_slots: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Install the CPU expert path on ``loaded`` as ``config`` asks; returns what was done
    (the engine's ``cpu_placement`` statistics: mode, whether it is on and why not, threads,
    the machine's costs and the placement).

    Args:
        loaded: the engine's ``SpecterModel``, before its graphs are captured.
        config: the choice.
        prompt_ids: the calibration prompt (None: none; ``"on"`` then homes by id).
        continuation_tokens: greedy tokens routed after it.
        placement_slots: the slots per layer the placement assumes: the budget's
            draftless plan's, so a speculative and a plain engine home the same experts.
        log: progress lines.

    Raises:
        CpuKernelUnavailableError: ``"on"`` where the host cannot run the kernel.
    """
    record: dict[str, Any] = {"mode": config.mode, "active": False, "reason": None}
    if config.mode == "off":
        return record
    if config.mode == "auto":
        why = auto_declines(loaded, has_prompt=prompt_ids is not None)
        if why is not None:
            log(f"CPU experts off (auto): {why}")
            record["reason"] = why
            return record
    try:
        check_cpu_kernel(loaded.cache.store.layout(0).spec("gate_up").dtype)
    except CpuKernelUnavailableError as error:
        if config.mode == "on":
            raise
        log(f"CPU experts off (auto): {error}")
        record["reason"] = str(error)
        return record
    threads = config.threads or default_cpu_threads()
    costs = measure_placement_costs(loaded, threads)
    routes = None
    if prompt_ids is not None:
        routes = [calibration_routing(loaded, prompt_ids, continuation_tokens)]
    elif config.mode == "on":
        log("CPU experts: no calibration prompt; homing the highest expert ids of each layer")
    placement = choose_placement(
        loaded, costs, routes, slots_per_layer=placement_slots,
        at_least=1 if config.mode == "on" else 0,
    )  # fmt: skip
    record.update(threads=threads, placement=placement.as_dict())
    costs_text = ", ".join(
        f"{name} {value:.3g}" for name, value in costs.as_dict().items() if name.endswith("ms")
    )
    if not placement.any:
        why = f"the cost model homes no expert ({costs_text})"
        log(f"CPU experts off (auto): {why}")
        record["reason"] = why
        return record
    loaded.set_cpu_experts(placement.homed, threads)
    record["active"] = True
    log(f"CPU experts: {placement.describe()}, on {threads} host threads ({costs_text})")
    return record
