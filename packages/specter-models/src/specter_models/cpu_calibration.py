"""The CPU expert path's load-time calibration: the machine's costs, the placement, the split.

:func:`measure_placement_costs` times, on the loaded model and this machine, one expert of
the host store on the executor's threads (one row, four rows), its transfer to the device
and its compute there, and the fixed cost of handing a layer's rows to the host and back.
:func:`choose_placement` turns a calibration routing and those costs into the CPU-homed
experts of every layer (specter-cache's ``choose_cpu_homed``). :func:`placement_split`
says, after a decode, how the experts the target needed were met.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specter_cache.cpu_placement import CpuPlacement, PlacementCosts, choose_cpu_homed
from specter_models.cpu_experts import expert_rows
from specter_models.expert_math import expert_mlp
from specter_models.hot_experts import routing_counts

__all__ = [
    "PLACEMENT_ROWS",
    "choose_placement",
    "cpu_experts_per_token",
    "measure_placement_costs",
    "placement_split",
    "routing_frequencies",
]

PLACEMENT_ROWS = 4
"""Rows a step is assumed to compute when the placement is chosen: about a verification of
three proposals. One value for speculative and plain decoding, so that both, at one budget,
home the same experts and their greedy outputs stay equal."""


def _median_seconds(run: Callable[[], object], repeats: int, sync: Callable[[], None]) -> float:
    run()  # first use: allocations, kernel selection
    sync()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_placement_costs(loaded: Any, threads: int, *, repeats: int = 5) -> PlacementCosts:
    """The costs of the CPU path on this machine, measured on ``loaded``'s first expert.

    Args:
        loaded: a ``SpecterModel`` (its host store, device and dtype).
        threads: the host threads the executor will run with.
        repeats: timed runs of each measurement (the median counts).
    """
    store = loaded.cache.store
    tensors = store.get(0, 0)
    gate_up, down = tensors["gate_up"], tensors["down"]
    hidden, dtype, device = down.shape[0], gate_up.dtype, loaded.device
    generator = torch.Generator().manual_seed(0)
    x = (0.1 * torch.randn(4, hidden, generator=generator)).to(dtype)
    weights = torch.ones(4)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        one = _median_seconds(
            lambda: expert_rows(x[:1], weights[:1], gate_up, down), repeats, _noop
        )
        four = _median_seconds(lambda: expert_rows(x, weights, gate_up, down), repeats, _noop)
    finally:
        torch.set_num_threads(previous)
    nbytes = store.expert_bytes(0)
    if device.type == "cuda":
        link_s, gpu_s, sync_s = _device_costs(gate_up, down, x, device, repeats)
    else:  # the "device" is the host itself: a copy, the plain-torch expert, no hand-off
        target = [torch.empty_like(gate_up), torch.empty_like(down)]

        def copy() -> None:
            target[0].copy_(gate_up)
            target[1].copy_(down)

        link_s = _median_seconds(copy, repeats, _noop)
        gpu_s = _median_seconds(lambda: expert_mlp(x[:1], gate_up, down), repeats, _noop)
        sync_s = 0.0
    return PlacementCosts(
        link_bytes_per_s=nbytes / max(link_s, 1e-9),
        cpu_expert_s=one,
        cpu_row_s=max(0.0, (four - one) / 3),
        gpu_expert_s=gpu_s,
        sync_s=sync_s,
        expert_bytes=nbytes,
        threads=threads,
    )


def _noop() -> None:
    return None


def _device_costs(
    gate_up: torch.Tensor, down: torch.Tensor, x: torch.Tensor, device: torch.device, repeats: int
) -> tuple[float, float, float]:
    """``(transfer, device compute, hand-off)`` seconds of one expert on a CUDA device."""
    sync = torch.cuda.synchronize
    slot = [torch.empty_like(gate_up, device=device), torch.empty_like(down, device=device)]

    def transfer() -> None:
        slot[0].copy_(gate_up, non_blocking=True)
        slot[1].copy_(down, non_blocking=True)

    link = _median_seconds(transfer, repeats, sync)
    row = x[:1].to(device)
    gpu = _median_seconds(lambda: expert_mlp(row, slot[0], slot[1]), repeats, sync)
    pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    back = torch.empty(x.shape, dtype=torch.float32, pin_memory=True)
    up = torch.empty(x.shape, dtype=torch.float32, device=device)
    on_device = x.to(device)

    def hand_off() -> None:  # rows down, an event waited for, results up
        pinned.copy_(on_device, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        ready.synchronize()
        up.copy_(back, non_blocking=True)

    handoff = _median_seconds(hand_off, repeats, sync)
    return link, gpu, handoff


def routing_frequencies(routes: Sequence[torch.Tensor], num_experts: int) -> list[list[float]]:
    """``[L][E]``: the share of the routings' positions that routed to each expert.

    Args:
        routes: ``[T, L, k]`` routings (a calibration decode's).
        num_experts: ``E``.
    """
    counts = routing_counts(routes, num_experts)
    positions = sum(int(r.shape[0]) for r in routes)
    return (counts.double() / max(positions, 1)).tolist()


def choose_placement(
    loaded: Any,
    costs: PlacementCosts,
    routes: Sequence[torch.Tensor] | None,
    *,
    slots_per_layer: int | Sequence[int],
    rows: int = PLACEMENT_ROWS,
    at_least: int = 0,
    exclude: Sequence[Sequence[int]] | None = None,
) -> CpuPlacement:
    """The CPU-homed experts of ``loaded``'s layers.

    Args:
        loaded: the ``SpecterModel`` (experts per layer, their bytes, the pinned hot set,
            which stays on the device).
        costs: :func:`measure_placement_costs`' result.
        routes: calibration routings ``[T, L, k]``; None or empty: every expert equally
            routed (then the highest ids are homed first).
        slots_per_layer: the slots the choice assumes (one budget's draftless plan, so
            every system at that budget homes the same experts).
        rows: rows a step computes.
        at_least: experts a layer homed at least (``"on"``).
        exclude: experts per layer that stay on the device besides ``loaded``'s pinned
            ones (a hot set other loads of the same budget pin).
    """
    cache = loaded.cache
    L, E = cache.num_layers, cache.num_experts
    if routes:
        frequencies = routing_frequencies(routes, E)
    else:
        k = int(loaded.config.num_experts_per_tok)
        frequencies = [[k / E] * E for _ in range(L)]
    return choose_cpu_homed(
        frequencies,
        slots_per_layer,
        costs,
        rows=rows,
        expert_bytes=[cache.store.expert_bytes(layer) for layer in range(L)],
        exclude=[
            set(cache.pinned(layer)) | set(exclude[layer] if exclude else ()) for layer in range(L)
        ],
        at_least=at_least,
    )


def placement_split(cache_total: dict[str, Any], cpu: Any | None) -> dict[str, int]:
    """How the experts the target needed were met, from the cache's totals and the CPU
    executor (``CpuExpertExecutor`` or None): ``resident`` (in a slot before the window:
    hits not brought by a prefetch), ``transferred`` (loaded into a slot: prefetches used
    and demand loads), ``streamed`` (read in place) and ``cpu`` (computed on the host)."""
    hits = int(cache_total.get("hits", 0))
    used = int(cache_total.get("prefetch_used", 0))
    return {
        "resident": max(0, hits - used),
        "transferred": used + int(cache_total.get("demand_loads", 0)),
        "streamed": int(cache_total.get("streamed_reads", 0)),
        "cpu": 0 if cpu is None else int(cpu.stats.experts),
    }


def cpu_experts_per_token(cpu: Any | None, tokens: int) -> dict[str, float | int] | None:
    """The CPU expert executor's work over a decode of ``tokens`` tokens, per token (None
    without an executor): threads, homed experts, expert computations and routed pairs,
    host busy and waiting time, bytes each way."""
    if cpu is None:
        return None
    stats, n = cpu.stats, max(tokens, 1)
    return {
        "threads": cpu.threads,
        "homed_experts": sum(cpu.homed_per_layer()),
        "layer_calls_per_token": stats.layer_calls / n,
        "experts_per_token": stats.experts / n,
        "pairs_per_token": stats.pairs / n,
        "busy_ms_per_token": 1e3 * stats.busy_s / n,
        "wait_ms_per_token": 1e3 * stats.wait_s / n,
        "d2h_mb_per_token": stats.d2h_bytes / 1e6 / n,
        "h2d_mb_per_token": stats.h2d_bytes / 1e6 / n,
    }
