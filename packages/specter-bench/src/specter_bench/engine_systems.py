"""The systems that run on Specter's engine: ``offload``, ``lru``, ``spec-lru``, ``specter`` and
ablations.

All of them decode through a ``specter_models.SpecterModel`` (the same FP16 target weights
and expert cache machinery) and specter-spec's ``SpecController``; they differ in what is
switched on:

=====================  ===========  ========  ============  ==========  ===========  ======
system                 speculation  prefetch  verification  draft       policy       misses
=====================  ===========  ========  ============  ==========  ===========  ======
offload                no           no        (one row)     none + hot  LRU          stream*
lru                    no           no        (one row)     none        LRU          load
spec-lru               yes          no        token-wise    fused INT4  LRU          load
specter                yes          yes       expert-wise   INT4 + hot  predictive   stream
specter-acquire        yes          yes       expert-wise   INT4 + hot  predictive   load
specter-no-hot         yes          yes       expert-wise   fused INT4  predictive   stream
specter-no-prefetch    yes          no        expert-wise   INT4 + hot  predictive*  stream
specter-token-verify   yes          yes       token-wise    INT4 + hot  predictive   load
specter-unfused-draft  yes          yes       expert-wise   per-expert  predictive   stream
specter-row-cut        yes          yes       expert-wise   INT4 + hot  predictive   load
specter-fill           yes          yes       expert-wise   INT4 + hot  predictive   stream*
specter-staged         yes          yes       expert-wise   INT4 + hot  predictive   stream+
specter-held           yes          yes       expert-wise   INT4 + hot  predictive   stream
specter-held0          yes          yes       expert-wise   INT4 + hot  predictive   stream
specter-snapshot       yes          yes       expert-wise   INT4 + hot  predictive   stream
specter-no-wait        yes          yes       expert-wise   INT4 + hot  predictive   stream^
specter-plain          no           no        (one row)     none        LRU          stream
specter-plain-fill     no           no        (one row)     none        LRU          stream*
=====================  ===========  ========  ============  ==========  ===========  ======

"misses": how a verification meets experts without a slot (specter-models' ``miss_path``):
``load`` acquires them (loaded into slots on demand, computed in waves as they land, a host
decision per layer); ``stream`` reads them in place from the pinned host store inside the
expert kernel, so a verification under a budget is one CUDA graph (``streamed_misses``);
``specter-acquire`` is ``specter`` on the acquire path. Token-wise verification and row
truncation are host decisions per layer, so they acquire. ``specter-fill`` (stream*) is
``specter`` with streamed fills: each verification writes up to ``FILL_CANDIDATES`` of the
experts it streams per layer into slots it takes from the policy's coldest experts, so
those are resident afterwards for no extra transfer (specter-models' ``stream_fills``).
``specter-staged`` (stream+) is ``specter`` with staging: before each layer's expert kernel a
wide copy kernel moves the layer's first ``STAGING_SLOTS`` missing experts into a device
buffer, where the expert kernel reads them (specter-models' ``stream_staging``; float16 only:
in other dtypes it runs unstaged, and its records say ``stream_staging`` 0). It stays a
variant: with the 32-column per-pair tile it no longer pays (DeepSeek-V2-Lite at 24 GB on
one H200: 12.81 ms against ``specter``'s 12.64 ms, one process).

``specter-held`` and ``specter-held0`` are ``specter`` whose verification launches before
most of its plan's data copies are issued: the first ``HELD_LEAD`` loads (or none) go out
before it, the rest right after (specter-cache's ``verify_lead``), so the host's copy calls
overlap the verification instead of delaying it; a held expert that has not landed when its
layer runs is streamed.

``specter`` plans each draft's final prefetch layer by layer as the draft's last forward
publishes its routing counts (specter-cache's ``SpeculativePrefetcher(layerwise=True)``;
specter-models' loader makes the counter publish on CUDA under a budget), so its prefetches
go out while the draft still runs; ``specter-snapshot`` is ``specter`` planning from one
snapshot after the draft instead (the arm layer-by-layer planning replaced).

``specter``'s verifications wait, layer by layer, for the prefetches of that layer still in
flight and read them from their slots (specter-models' ``stream_waits``, the default);
``specter-no-wait`` (stream^) streams them meanwhile, so each such expert crosses the link
twice (the arm waiting replaced).

``offload`` is the strongest plain offloader the engine has, the baseline ``specter`` must
beat at every budget: plain decoding (no draft, K = 0) whose misses are streamed in place,
whose streamed steps fill slots (``specter-plain-fill``), with pipelined records
(specter-models' ``StreamRecord.pipelined``: a step's fill candidates are chosen before the
step before it is counted, so its launch does not wait for that step; on one H200 8-28%
less time a token than without, and ``specter generate --depth 0`` decodes that way), the
draft's memory as slots, and under a budget a pinned hot set where pinning pays
(specter-models' ``choose_plain_hot_experts`` on the calibration routing: without a draft a
pinned expert frees no memory, so the question is only whether pinning the most routed
experts moves fewer experts than LRU over the same slots; the replay keeps none where it
does not). Next-layer prefetch (copying the experts a layer's router will probably pick
while the layer before runs) is not built. ``lru`` is the textbook reference (the policy
of Mixtral offloading: misses loaded into slots on demand); it is host-bound: every MoE
layer reads its routing back to the host (a device sync) before the host can decide what
to copy, so copies, host bookkeeping and compute run one after another, layer by layer.
Its cheaper miss path is streaming, which is ``offload``'s. ``specter`` with an adaptive
depth under a budget falls back to ``offload`` where the depth policy, after the warm-up,
chooses K = 0 (``falls_back``): its measured decodes then run as ``offload`` on
``offload``'s load, and their records say ``speculation: off (depth auto chose 0: ...)``.

"INT4 + hot": under a budget the draft has a pinned hot set (specter-models'
``hot_experts``): the experts ``choose_hot_experts`` picks from a calibration routing stay
in FP16 slots for good, the draft computes them from there and holds INT4 copies of the
others only, and the memory that frees buys slots (none are pinned where that does not pay,
or with no budget). ``specter-no-hot`` is ``specter`` with an INT4 copy of every expert.
``specter-row-cut`` is ``specter`` plus miss-aware row truncation (specter-models'
``row_truncation``: greedy verification stops computing tail rows whose missing experts cost
more than their expected tokens); a variant measured beside the ablations.

"none + hot": ``offload``'s pinned hot set, under a budget where the calibration replay says
pinning pays (see above).

\\* without plans the predictive policy is LRU. ``lru`` and ``offload`` load no INT4 draft, so
at a budget they get the draft's memory as extra expert slots (Mixtral-Offloading's
same-memory setting).

Statistics cover the decode only: the cache's and prefetcher's counters are zeroed when the
first iteration starts (after the prefill), by an observer wrapped around the prefetcher.
Every system prefills expert-wise; token-wise verification starts with the decode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specter_bench.host_pauses import HostPauses
from specter_bench.model_loading import FILL_CANDIDATES, STAGING_SLOTS
from specter_bench.resource_meter import DeviceMemory, seconds_since_start
from specter_bench.system_run import SystemRun
from specter_bench.unfused_draft import unfused_draft_kernel
from specter_models import RowTruncation
from specter_models.cpu_calibration import cpu_experts_per_token, placement_split
from specter_models.engine.decode_window import DecodeWindow, make_depth_policy
from specter_spec import SpecController

__all__ = [
    "ENGINE_SYSTEMS",
    "DecodeWindow",
    "EngineSystem",
    "EngineSystemRunner",
    "make_depth_policy",
    "staging_width",
    "use_staging",
]


@dataclass(frozen=True)
class EngineSystem:
    """What an engine system switches on.

    Attributes:
        name: the system's name in records.
        speculate: draft K proposals per iteration (else K = 0, the target alone).
        prefetch: the draft's routing drives prefetches (the prefetcher observes phases).
        verification: ``"expert"`` (waves per layer over all rows) or ``"token"``.
        needs_draft: load the INT4 draft (``lru`` does not: more slots at a budget).
        policy: the replacement policy of the cache it is loaded with.
        fused_draft: the draft's routed experts in one fused launch (else per expert).
        row_truncation: miss-aware row truncation of greedy verification.
        hot_experts: under a budget, load with the pinned hot set chosen for it
            (``choose_hot_experts`` with a draft, ``choose_plain_hot_experts`` without).
        miss_path: ``"load"`` (acquire missing experts) or ``"stream"`` (read them in place).
        stream_fills: on the streamed path, candidate slots per layer a verification fills
            with the experts it streams (0: no fills).
        stream_staging: on the streamed path, experts per layer a verification stages into
            the device buffer before its expert kernel (0: none; at most the buffer the
            model was loaded with).
        verify_lead: on the streamed path, loads of a verification's plan whose data copies
            go out before its launch, the rest right after it (specter-cache's
            ``SpeculativePrefetcher(verify_lead=)``; None: all before).
        pipelined_records: on the streamed path without a draft, choose a step's fill
            candidates before the step before it is counted (specter-models'
            ``StreamRecord.pipelined``; deferred records only, the default on CUDA).
        layerwise: plan each draft's final prefetch layer by layer as the draft publishes
            its routing (``SpeculativePrefetcher(layerwise=)``; needs a publishing counter,
            else the final plan is a snapshot).
        stream_waits: on the streamed path, a verification waits at each layer for that
            layer's prefetches in flight instead of streaming them (specter-models'
            ``stream_waits``; its default, True, here too).
        falls_back: with an adaptive depth under a budget, decode as ``offload`` (on its
            draftless load) where the depth policy, after the warm-up, chooses K = 0
            (``specter_models.engine.speculation_verdict``); its records say so.
    """

    name: str
    speculate: bool
    prefetch: bool
    verification: str
    needs_draft: bool
    policy: str
    fused_draft: bool = True
    row_truncation: bool = False
    hot_experts: bool = False
    miss_path: str = "load"
    stream_fills: int = 0
    stream_staging: int = 0
    verify_lead: int | None = None
    pipelined_records: bool = False
    layerwise: bool = False
    stream_waits: bool = True
    falls_back: bool = False


MEMORY_SAMPLE_TOKENS = 16
"""A decode samples the driver's view of GPU memory at its first token and every this many
tokens after it (and at its end)."""

HELD_LEAD = 4
"""Loads of a verification's plan ``specter-held`` copies before the launch (the first
layers' experts, so they land before the verification reaches them)."""


_SPECTER = EngineSystem(
    "specter",
    True,
    True,
    "expert",
    True,
    "predictive",
    hot_experts=True,
    miss_path="stream",
    layerwise=True,
    falls_back=True,
)


_PLAIN_FILL = EngineSystem(
    "specter-plain-fill",
    False,
    False,
    "expert",
    False,
    "lru",
    miss_path="stream",
    stream_fills=FILL_CANDIDATES,
)


def _variant(name: str, **changes: Any) -> EngineSystem:
    """``specter`` with ``changes`` (an ablation or variant of the table above)."""
    return dataclasses.replace(_SPECTER, name=name, falls_back=False, **changes)


ENGINE_SYSTEMS: dict[str, EngineSystem] = {
    s.name: s
    for s in (
        EngineSystem("lru", False, False, "expert", False, "lru"),
        EngineSystem("spec-lru", True, False, "token", True, "predictive"),
        _SPECTER,
        _variant("specter-acquire", miss_path="load"),
        _variant("specter-no-hot", hot_experts=False),
        _variant("specter-no-prefetch", prefetch=False),
        _variant("specter-token-verify", verification="token", miss_path="load"),
        _variant("specter-unfused-draft", fused_draft=False, hot_experts=False),
        _variant("specter-row-cut", row_truncation=True, miss_path="load"),
        _variant("specter-fill", stream_fills=FILL_CANDIDATES),
        _variant("specter-staged", stream_staging=STAGING_SLOTS),
        _variant("specter-held", verify_lead=HELD_LEAD),
        _variant("specter-held0", verify_lead=0),
        _variant("specter-snapshot", layerwise=False),
        _variant("specter-no-wait", stream_waits=False),
        EngineSystem("specter-plain", False, False, "expert", False, "lru", miss_path="stream"),
        _PLAIN_FILL,
        dataclasses.replace(_PLAIN_FILL, name="offload", pipelined_records=True, hot_experts=True),
    )
}
"""Engine systems by name (``spec-lru`` shares the predictive-policy load: with its plans
cleared and no prefetch, that policy is exactly LRU)."""


def _layerwise(loaded: Any) -> bool:
    """Whether the prefetcher plans a draft's final prefetch layer by layer (it needs a
    publishing counter: specter-models' loader makes one on CUDA under a budget)."""
    prefetcher = getattr(loaded, "prefetcher", None)
    return bool(
        getattr(prefetcher, "layerwise", False) and getattr(loaded.counter, "publishing", False)
    )


def _pipelined_records(loaded: Any) -> bool:
    """Whether the model's stream record chooses fill candidates before the last step is
    counted (specter-models' ``StreamRecord.pipelined``; only deferred records do)."""
    record = getattr(getattr(loaded, "runtime", None), "stream_record", None)
    return bool(record is not None and getattr(record, "pipelined", False) and record.deferred)


def _shared_overlap(loaded: Any) -> dict[str, object] | None:
    """Whether the model runs its shared experts on a side stream, and how many blocks did
    (``specter_models``' ``shared_overlap``); None for a model without the switch."""
    overlap = getattr(loaded, "shared_overlap", None)
    if overlap is None:
        return None
    return {"enabled": bool(overlap.enabled), "blocks": overlap.patched, "forks": overlap.forks}


def staging_width(loaded: Any) -> int:
    """Experts the model's staging buffer holds (0: it was loaded without one)."""
    staging = getattr(getattr(loaded, "runtime", None), "staging", None)
    return 0 if staging is None else staging.num_slots


def use_staging(loaded: Any, count: int) -> int:
    """Stage ``count`` experts per layer, at most what the model's buffer holds (a model
    loaded without one runs unstaged); returns the width set."""
    loaded.stream_staging = min(count, staging_width(loaded))
    return loaded.stream_staging


def _graph_stats(loaded: Any) -> dict[str, Any] | None:
    """The model's CUDA-graph counters for this decode (``SpecterModel.graph_stats``)."""
    stats = getattr(loaded, "graph_stats", None)
    return stats() if callable(stats) else None


class EngineSystemRunner:
    """Decodes prompts with one engine system on one loaded ``SpecterModel``.

    One controller (and depth policy) serves every prompt, so an adaptive depth carries what
    it learned from one prompt to the next, as in serving.

    Args:
        loaded: the model from ``specter_models.load`` (its draft, policy and budget must fit
            the system: see :data:`ENGINE_SYSTEMS`).
        system: the system.
        depth: K or ``"auto"`` (ignored without speculation).
        max_depth: the adaptive depth's largest K.
        clock: the controller's clock (default: specter-spec's phase clock).
        speculation: what the records' ``speculation`` setting says (default: ``on (depth
            K)`` for a speculating system, ``off`` otherwise); a system falling back to
            ``offload`` passes its depth policy's verdict.

    Raises:
        ValueError: the system speculates but the model has no draft.
    """

    def __init__(
        self,
        loaded: Any,
        system: EngineSystem,
        depth: int | str = "auto",
        *,
        max_depth: int = 16,
        clock: Callable[[], float] | None = None,
        speculation: str | None = None,
    ) -> None:
        if system.speculate and loaded.draft is None:
            raise ValueError(
                f"system {system.name!r} speculates but the model was loaded without a draft "
                "(draft=None); load it with draft='rtn'."
            )
        self.loaded = loaded
        self.system = system
        self.depth = depth if system.speculate else 0
        self.speculation = speculation or (f"on (depth {depth})" if system.speculate else "off")
        self.window = DecodeWindow(
            loaded.cache,
            loaded.prefetcher if system.prefetch else None,
            self._start_decoding,
            streamed_plain=(
                not system.speculate and not system.prefetch and system.miss_path == "stream"
            ),
        )
        self.controller = SpecController(
            loaded.draft if system.speculate else None,
            loaded.target,
            cache=self.window,
            depth=make_depth_policy(self.depth, max_depth),
            clock=clock,
        )
        # One policy per runner: its estimates carry over from prompt to prompt.
        self._row_truncation = RowTruncation() if system.row_truncation else None

    def _start_decoding(self) -> None:
        self.loaded.verification = self.system.verification

    def _prepare(self) -> None:
        loaded, system = self.loaded, self.system
        loaded.reset()
        # Every system prefills expert-wise (the prefill is not what the systems compare);
        # the system's own verification starts with the first decode iteration.
        loaded.verification = "expert"
        policy = loaded.cache.policy
        if not system.prefetch and hasattr(policy, "clear_plan"):
            policy.clear_plan()  # no plans: the predictive policy is plain LRU
        self.window.started = False
        if hasattr(loaded, "miss_path"):
            loaded.miss_path = system.miss_path
        if hasattr(loaded, "stream_fills"):
            loaded.stream_fills = system.stream_fills
        if hasattr(loaded, "stream_staging"):
            use_staging(loaded, system.stream_staging)
        if hasattr(loaded, "stream_waits"):
            loaded.stream_waits = system.stream_waits
        prefetcher = getattr(loaded, "prefetcher", None)
        if prefetcher is not None and hasattr(prefetcher, "verify_lead"):
            prefetcher.verify_lead = system.verify_lead
        if prefetcher is not None and hasattr(prefetcher, "layerwise"):
            prefetcher.layerwise = system.layerwise
        runtime = getattr(loaded, "runtime", None)
        if runtime is not None and hasattr(runtime, "row_truncation"):
            runtime.row_truncation = self._row_truncation  # priced at the loader's bandwidth
        record = getattr(runtime, "stream_record", None)
        if record is not None and hasattr(record, "pipelined"):
            record.pipelined = self.system.pipelined_records

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> SystemRun:
        """Greedy decode of ``max_new_tokens`` tokens with this system.

        Raises:
            ValueError: as ``SpecController.generate``.
        """
        self._prepare()
        # A routing replay (specter_models.routing_replay): the prompt's recorded sequence
        # routes the experts and decides each iteration's acceptance.
        replay = getattr(getattr(self.loaded, "runtime", None), "routing_replay", None)
        if replay is not None:
            self.controller.acceptance = replay.start(prompt_ids, max_new_tokens)
        device = self.loaded.device
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        kernel = (
            contextlib.nullcontext()
            if self.system.fused_draft
            else unfused_draft_kernel(self.loaded.draft)
        )
        memory = DeviceMemory(device)
        started_s = seconds_since_start()
        with kernel, HostPauses(device) as pauses:
            started = time.perf_counter()
            stream = self.controller.stream(prompt_ids, max_new_tokens)
            ttft_s = None
            for index, _ in enumerate(stream):
                if ttft_s is None:
                    ttft_s = time.perf_counter() - started
                if index % MEMORY_SAMPLE_TOKENS == 0:
                    memory.sample()  # the driver's view at step boundaries: no device sync
            result = stream.result()
        memory.sample()
        stats = result.stats
        # Statistics are read once per generation, outside the decode loop (host syncs).
        cache_stats = self.loaded.cache.stats()
        prefetcher = None
        if self.system.prefetch:
            prefetcher = {k: v for k, v in self.loaded.prefetcher.stats().items() if k != "cache"}
        speculates = self.system.speculate
        cpu = getattr(getattr(self.loaded, "runtime", None), "cpu_experts", None)
        policy = str(cache_stats["policy"])
        if policy == "predictive" and not self.system.prefetch:
            policy = "predictive without plans (= LRU)"
        return SystemRun(
            system=self.system.name,
            tokens=list(result.tokens),
            prefill_s=stats.prefill_time_s,
            decode_s=stats.decode_time_s,
            decode_tokens=stats.new_tokens,
            draft_s=stats.draft_time_s if speculates else None,
            verify_s=stats.verify_time_s if speculates else None,
            generation=stats.as_dict(per_iteration=False),
            cache=cache_stats["total"],  # type: ignore[arg-type]
            prefetcher=prefetcher,
            peak_gpu_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
            ttft_s=ttft_s,
            started_s=started_s,
            driver_peak_bytes=memory.peak,
            slots_per_layer=list(self.loaded.cache.slots_per_layer),
            settings={
                "speculation": self.speculation,
                "depth": self.depth,
                "verification": self.system.verification,
                "miss_path": self.system.miss_path,
                "stream_fills": getattr(self.loaded, "stream_fills", None)
                if self.system.miss_path == "stream"
                else None,
                "stream_staging": getattr(self.loaded, "stream_staging", None)
                if self.system.miss_path == "stream"
                else None,
                "stream_waits": getattr(self.loaded, "stream_waits", None)
                if self.system.miss_path == "stream"
                else None,
                "pipelined_records": _pipelined_records(self.loaded),
                "prefetch": self.system.prefetch,
                "layerwise": _layerwise(self.loaded) if self.system.prefetch else None,
                "fused_draft": self.system.fused_draft,
                "row_truncation": self.system.row_truncation,
                "policy": policy,
                "draft": "int4" if self.loaded.draft is not None else None,
                "hot_experts_per_layer": self.loaded.memory.plan.hot_experts_per_layer,
                "draft_pruned_per_layer": self.loaded.memory.plan.pruned_experts_per_layer,
                "batch_invariant": bool(getattr(self.loaded, "batch_invariant", False)),
                "cuda_graphs": bool(getattr(self.loaded, "cuda_graphs", False)),
                "shared_overlap": _shared_overlap(self.loaded),
                "graphs": _graph_stats(self.loaded),
                "host_pauses": pauses.as_dict(),
                "cpu_experts": cpu_experts_per_token(cpu, stats.new_tokens),
                "placement": placement_split(cache_stats["total"], cpu),
            },
        )
