"""Routed experts computed on the host's cores: the CPU expert executor.

Under a budget some experts of each MoE layer are *CPU-homed* (specter-cache's
``choose_cpu_homed``, fixed at load): a target forward never computes them on the device.
Their routed pairs are computed here, from the pinned host store the device's streamed reads
use too, while the device computes the layer's other experts:

1. the layer's hidden states, routed ids and weights go to pinned host buffers (one
   device-to-host copy each, on the compute stream, and an event), and the device's expert
   kernel is launched on the other pairs (homed pairs carry id -1 there);
2. the host waits for that event (the one host sync this path adds to a layer: the host
   must know which rows chose a homed expert) while the device runs on;
3. :func:`expert_rows` computes every homed pair on torch's CPU GEMM (oneDNN/MKL, on the
   executor's intra-op threads), one fixed-shape call per row;
4. the results go back through a pinned buffer (a small host-to-device copy on the compute
   stream, its buffer reused only after an event says the copy is done) and are written
   into the layer's accumulator: into their own pair rows ``[T, k, H]`` under batch
   invariance, so ``sum_routed_pairs`` adds every pair in the fixed order j = 0..k-1, or,
   summed per row on the host in that order, into ``[T, H]``.

Exactness. A CPU-computed pair has other bits than the device kernel's, so a pair's path
depends only on the expert (homed or not, fixed at load), never on what is resident or in
flight; and a row's result must not depend on how many rows its expert computes at once,
or a verification of K + 1 rows would differ from K + 1 one-row steps. torch's CPU GEMM
picks kernels and blockings by the row count (a GEMV for one row, a GEMM for several), so
:func:`expert_rows` runs every row as its own ``[1, H]`` call on a fresh (aligned) copy of
the row: each row's arithmetic is then the same whatever else is routed with it. The
weights stay in the model's dtype (an FP16 model's FP16 values: a BF16 or INT4 copy would
change the model). On one AMD EPYC core an FP16 DeepSeek-V2-Lite expert took 2.6 ms a row
this way against 6.7 ms upcasting the weights to FP32 per call.

Forwards of more rows than the executor's ``max_rows`` (the model's largest verification; a
prefill, the same in a speculative and a target-only decode of one prompt) compute every
expert on the device, where it reads each expert once for all its rows.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specter_cache import ExpertStore
from specter_models.streamed_misses import STREAM_MAX_ROWS

__all__ = [
    "CPU_MAX_ROWS",
    "CpuExpertExecutor",
    "CpuExpertStats",
    "CpuKernelUnavailableError",
    "check_cpu_kernel",
    "default_cpu_threads",
    "expert_rows",
    "usable_cpus",
]

CPU_MAX_ROWS = STREAM_MAX_ROWS
"""The most rows a target forward may hand to the host (an executor's ``max_rows`` is at most
this)."""


def usable_cpus() -> int:
    """Cores this process may run on (its affinity mask where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_cpu_threads() -> int:
    """The executor's threads by default: every usable core but one, which the thread that
    launches the device's work keeps."""
    return max(1, usable_cpus() - 1)


def expert_rows(
    x: torch.Tensor, weights: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """One expert's routing-weighted SwiGLU for each row, each row computed on its own.

    Args:
        x: ``[M, H]`` rows routed to the expert (the model's dtype).
        weights: ``[M]`` their routing weights.
        gate_up: ``[2I, H]`` (gate rows first), the model's dtype.
        down: ``[H, I]``.

    Returns:
        ``[M, H]`` in the accumulator's dtype (float32 for half-precision models):
        ``weight * down(silu(gate x) * up x)``. Row ``i`` is one ``[1, H]`` call chain on a
        fresh copy of ``x[i]``, so its bits do not depend on ``M``.
    """
    I = down.shape[1]
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
    out = torch.empty(x.shape[0], down.shape[0], dtype=acc)
    for i in range(x.shape[0]):
        row = x[i : i + 1].clone()  # a fresh, aligned allocation: the same call every time
        h = F.linear(row, gate_up)
        y = F.linear(F.silu(h[:, :I]) * h[:, I:], down)
        out[i] = y[0].to(acc) * weights[i].to(acc)
    return out


class CpuKernelUnavailableError(ValueError):
    """The host cannot run the CPU expert kernel for this model (the message says why)."""


def check_cpu_kernel(dtype: torch.dtype) -> None:
    """Run :func:`expert_rows` once on a tiny expert of ``dtype`` and compare it with a
    float64 computation.

    Raises:
        CpuKernelUnavailableError: torch's CPU GEMM cannot run ``dtype`` here, or gives wrong
            numbers; the message names the error and what to use instead.
    """
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 64, generator=generator)
    gate_up = torch.randn(64, 64, generator=generator) / 8
    down = torch.randn(64, 32, generator=generator) / 8
    weights = torch.rand(2, generator=generator)
    try:
        got = expert_rows(x.to(dtype), weights, gate_up.to(dtype), down.to(dtype))
    except (RuntimeError, TypeError, NotImplementedError) as error:
        raise CpuKernelUnavailableError(
            f"the CPU expert kernel (torch's CPU GEMM in {dtype}) cannot run here: {error}. "
            "Use --cpu-experts off (or auto, which then keeps every expert on the GPU)."
        ) from error
    want = expert_rows(x.double(), weights.double(), gate_up.double(), down.double())
    scale = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-5
    if not torch.allclose(got.double(), want, rtol=scale * 10, atol=scale):
        raise CpuKernelUnavailableError(
            f"torch's CPU GEMM in {dtype} gives wrong results on this machine (largest error "
            f"{(got.double() - want).abs().max().item():.3g}). Use --cpu-experts off."
        )


@dataclass
class CpuExpertStats:
    """What the executor did since the last reset.

    Attributes:
        layer_calls: layer forwards that handed rows to the host (each one host sync).
        experts: expert computations (one per homed expert a layer forward routed to).
        pairs: routed pairs computed (one kernel row each).
        busy_s: host time computing them.
        wait_s: host time waiting for a layer's inputs (its router on the device).
        d2h_bytes: bytes copied to the host (hidden states, ids, weights).
        h2d_bytes: bytes copied back (results and their pair indices).
    """

    layer_calls: int = 0
    experts: int = 0
    pairs: int = 0
    busy_s: float = 0.0
    wait_s: float = 0.0
    d2h_bytes: int = 0
    h2d_bytes: int = 0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "layer_calls": self.layer_calls,
            "experts": self.experts,
            "pairs": self.pairs,
            "busy_ms": 1e3 * self.busy_s,
            "wait_ms": 1e3 * self.wait_s,
            "d2h_bytes": self.d2h_bytes,
            "h2d_bytes": self.h2d_bytes,
        }


@dataclass
class _Job:
    """One layer forward's hand-off: which layer, its rows and what the host reads."""

    layer: int
    rows: int
    x: torch.Tensor  # [T, H] on the host (the pinned buffer's rows on CUDA)
    ids: torch.Tensor  # [T, k] int64 on the host
    weights: torch.Tensor  # [T, k] on the host
    ready: torch.cuda.Event | None  # the copies landed (CUDA)


class CpuExpertExecutor:
    """Computes the CPU-homed experts' routed pairs of target forwards on the host.

    Args:
        store: the host expert store (``gate_up [2I, H]`` and ``down [H, I]`` per expert).
        homed: ``homed[layer]``: that MoE layer's CPU-homed experts.
        top_k: routed experts per row ``k``.
        device: the model's device (CUDA: pinned buffers and events; the CPU: the host
            path runs as a separate path of the same process, for tests).
        threads: torch's intra-op threads while the executor is installed (None: every
            usable core but one).
        max_rows: target forwards of at most this many rows hand their homed pairs to the
            host (at most :data:`CPU_MAX_ROWS`); longer ones compute every expert on the
            device.

    Raises:
        ValueError: a bad thread count, row limit or homed set.
    """

    def __init__(
        self,
        store: ExpertStore,
        homed: Sequence[Sequence[int]],
        *,
        top_k: int,
        device: torch.device | str,
        threads: int | None = None,
        max_rows: int = CPU_MAX_ROWS,
    ):
        L, E = store.num_layers, store.num_experts
        sets = [tuple(sorted({int(e) for e in layer})) for layer in homed]
        if len(sets) != L or any(not 0 <= e < E for s in sets for e in s):
            raise ValueError(f"homed needs one list of expert ids in [0, {E}) per layer ({L})")
        if threads is None:
            threads = default_cpu_threads()
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}")
        if isinstance(max_rows, bool) or not isinstance(max_rows, int):
            max_rows = 0
        if not 1 <= max_rows <= CPU_MAX_ROWS:
            raise ValueError(f"max_rows must be an int in [1, {CPU_MAX_ROWS}], got {max_rows!r}")
        self.store = store
        self.homed = tuple(sets)
        self.top_k = top_k
        self.device = torch.device(device)
        self.threads = threads
        self.max_rows = max_rows
        self.stats = CpuExpertStats()
        mask = torch.zeros(L, E, dtype=torch.bool)
        for layer, experts in enumerate(sets):
            mask[layer, list(experts)] = True
        self._masks = mask.to(self.device)
        self._homed_sets = [frozenset(s) for s in sets]
        self._previous_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        self._buffers: dict[str, torch.Tensor] = {}
        self._copied: list[torch.cuda.Event | None] = [None, None]  # results buffers in use
        self._turn = 0

    def close(self) -> None:
        """Give torch back the intra-op thread count it had before."""
        torch.set_num_threads(self._previous_threads)

    def reset_stats(self) -> None:
        self.stats = CpuExpertStats()

    def takes(self, layer: int, rows: int) -> bool:
        """Whether a target forward of ``rows`` rows hands ``layer``'s homed pairs to the
        host: the layer homes some expert and ``1 <= rows <= max_rows``."""
        return bool(self.homed[layer]) and 1 <= rows <= self.max_rows

    def homed_per_layer(self) -> list[int]:
        return [len(h) for h in self.homed]

    # -------------------------------------------------------------------------- a layer
    def begin(
        self, layer: int, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor
    ) -> tuple[_Job, torch.Tensor]:
        """Start handing ``layer``'s rows to the host: ``(job, device ids)``.

        Args:
            layer: the MoE layer.
            x: ``[T, H]`` hidden states, ``T <= max_rows``.
            ids: ``[T, k]`` routed ids.
            weights: ``[T, k]`` routing weights.

        Returns:
            The job for :meth:`finish`, and ``ids`` with every homed pair set to -1 (what
            the device computes). No host sync.
        """
        T = x.shape[0]
        homed = self._masks[layer][ids.long()]
        device_ids = torch.where(homed, torch.full_like(ids, -1), ids)
        if x.device.type != "cuda":
            job = _Job(layer, T, x, ids.long(), weights, None)
            return job, device_ids
        buffers = self._host_buffers(x, ids.shape[1])
        hx, hids, hw = buffers["x"][:T], buffers["ids"][:T], buffers["weights"][:T]
        hx.copy_(x, non_blocking=True)
        hids.copy_(ids.long(), non_blocking=True)
        hw.copy_(weights.float(), non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(x.device))
        self.stats.d2h_bytes += hx.nbytes + hids.nbytes + hw.nbytes
        return _Job(layer, T, hx, hids, hw, ready), device_ids

    def finish(self, job: _Job, out: torch.Tensor) -> None:
        """Compute ``job``'s homed pairs on the host and write them into ``out``: per pair
        (``[T, k, H]``) or summed per row in pair order (``[T, H]``)."""
        waited = time.perf_counter()
        if job.ready is not None:
            job.ready.synchronize()  # the layer's inputs; the device's expert kernel runs on
        started = time.perf_counter()
        stats = self.stats
        stats.wait_s += started - waited
        stats.layer_calls += 1
        homed = self._homed_sets[job.layer]
        routed: dict[int, list[tuple[int, int]]] = {}
        for t, row in enumerate(job.ids.tolist()):
            for j, e in enumerate(row):
                if e in homed:
                    routed.setdefault(e, []).append((t, j))
        if not routed:
            stats.busy_s += time.perf_counter() - started
            return
        k, H = job.ids.shape[1], out.shape[-1]
        pairs = sum(len(p) for p in routed.values())
        values = torch.empty(pairs, H, dtype=out.dtype)
        index: list[int] = []
        n = 0
        for e in sorted(routed):
            tokens = [t for t, _ in routed[e]]
            slots = [j for _, j in routed[e]]
            weights = job.weights[tokens, slots]
            tensors = self.store.get(job.layer, e)
            values[n : n + len(tokens)] = expert_rows(
                job.x[tokens], weights, tensors["gate_up"], tensors["down"]
            )
            index += [t * k + j for t, j in routed[e]]
            n += len(tokens)
        stats.experts += len(routed)
        stats.pairs += pairs
        if out.dim() == 2:
            values, index = _sum_per_row(values, index, k)
        stats.busy_s += time.perf_counter() - started
        self._write(values, index, out)

    def _write(self, values: torch.Tensor, index: list[int], out: torch.Tensor) -> None:
        """``values [P, H]`` into ``out``: pair rows ``index`` of ``[T * k, H]``, or rows
        ``index`` of ``[T, H]`` added (each row at most once, so in no particular order)."""
        flat = out.view(-1, out.shape[-1])
        if out.device.type != "cuda":
            where = torch.tensor(index, dtype=torch.long)
            if out.dim() == 3:
                flat[where] = values
            else:
                flat.index_add_(0, where, values)
            return
        P = values.shape[0]
        turn = self._turn
        self._turn ^= 1
        if self._copied[turn] is not None:
            self._copied[turn].synchronize()  # that buffer's last copy up is done
        host_values = self._buffers[f"values{turn}"][:P]
        host_index = self._buffers[f"index{turn}"][:P]
        host_values.copy_(values)
        host_index.copy_(torch.tensor(index, dtype=torch.long))
        device_values = self._buffers["device_values"][:P]
        device_index = self._buffers["device_index"][:P]
        device_values.copy_(host_values, non_blocking=True)
        device_index.copy_(host_index, non_blocking=True)
        copied = torch.cuda.Event()
        copied.record(torch.cuda.current_stream(out.device))
        self._copied[turn] = copied
        self.stats.h2d_bytes += host_values.nbytes + host_index.nbytes
        if out.dim() == 3:
            flat.index_copy_(0, device_index, device_values)
        else:
            flat.index_add_(0, device_index, device_values)

    def _host_buffers(self, x: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
        """Pinned staging for the largest forward, allocated on first use."""
        if self._buffers:
            return self._buffers
        rows, H, acc = self.max_rows, x.shape[1], torch.float32
        pinned = {"pin_memory": True}
        self._buffers = {
            "x": torch.empty(rows, H, dtype=x.dtype, **pinned),
            "ids": torch.empty(rows, k, dtype=torch.long, **pinned),
            "weights": torch.empty(rows, k, dtype=torch.float32, **pinned),
            "values0": torch.empty(rows * k, H, dtype=acc, **pinned),
            "values1": torch.empty(rows * k, H, dtype=acc, **pinned),
            "index0": torch.empty(rows * k, dtype=torch.long, **pinned),
            "index1": torch.empty(rows * k, dtype=torch.long, **pinned),
            "device_values": torch.empty(rows * k, H, dtype=acc, device=x.device),
            "device_index": torch.empty(rows * k, dtype=torch.long, device=x.device),
        }
        return self._buffers


def _sum_per_row(values: torch.Tensor, index: list[int], k: int) -> tuple[torch.Tensor, list[int]]:
    """Pair results ``values [P, H]`` at pair indices ``t * k + j`` summed per row ``t``,
    pairs in ascending ``j``: ``([R, H], rows)``."""
    by_row: dict[int, list[tuple[int, int]]] = {}
    for p, flat in enumerate(index):
        by_row.setdefault(flat // k, []).append((flat % k, p))
    rows = sorted(by_row)
    summed = torch.empty(len(rows), values.shape[1], dtype=values.dtype)
    for r, t in enumerate(rows):
        ordered = [p for _, p in sorted(by_row[t])]
        acc = values[ordered[0]].clone()
        for p in ordered[1:]:
            acc += values[p]
        summed[r] = acc
    return summed, rows
