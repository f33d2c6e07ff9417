"""A loaded Specter model: target, draft, expert cache and prefetcher over one model object."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from specter_cache import ExpertCache, RoutingCounter, SpeculativePrefetcher
from specter_models.architecture import Architecture
from specter_models.cpu_experts import CPU_MAX_ROWS, CpuExpertExecutor, check_cpu_kernel
from specter_models.experts_runtime import ExpertsMode, ExpertsRuntime
from specter_models.kv_slots import KVSlots
from specter_models.memory_meter import MemoryPeaks
from specter_models.memory_plan import DEFAULT_MAX_VERIFY_ROWS, MemoryPlan
from specter_models.shared_overlap import SharedExpertOverlap
from specter_models.spec_adapters import DraftModel, SharedKV, TargetModel
from specter_models.specter_experts import SpecterExperts
from specter_models.step_graphs import DEFAULT_WINDOW_STEP, StepGraphs
from specter_models.streamed_misses import STREAM_MAX_ROWS


@dataclass
class MemoryReport:
    """Planned and measured memory of a loaded model.

    Attributes:
        plan: the GPU memory plan (budget, fixed state, slots, expected peak).
        load: host and GPU peaks measured while loading.
        host_store_bytes: pinned (or plain) host bytes of the FP16 expert store.
        host_store_pinned: whether the store is page-locked.
        load_seconds: wall time of the load, by phase.
    """

    plan: MemoryPlan
    load: MemoryPeaks
    host_store_bytes: int
    host_store_pinned: bool
    load_seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "plan": self.plan.as_dict(),
            "load": self.load.as_dict(),
            "host_store_bytes": self.host_store_bytes,
            "host_store_pinned": self.host_store_pinned,
            "load_seconds": dict(self.load_seconds),
        }


class SpecterModel:
    """Everything ``specter_models.load`` builds, ready for specter-spec's controller.

    Attributes:
        model: transformers' own model object (routed experts swapped for ``SpecterExperts``).
        config: its config.
        architecture: the model type's facts.
        target: the FP16 target (``SpecModel``).
        draft: the INT4 draft sharing every other tensor (``SpecModel``), or None.
        cache: the FP16 expert cache (specter-cache ``ExpertCache``).
        counter: the draft's routing counters.
        prefetcher: the speculation observer to pass as ``SpecController(cache=...)``.
        runtime: the shared experts runtime (mode, verification kind, routing trace).
        tokenizer: the checkpoint's tokenizer, or None.
        memory: planned and measured memory.
        source: what was loaded (a checkpoint folder or ``preset:<name>:seed=<seed>``).
        shared_overlap: the switch of the shared experts' side stream (``shared_overlap``),
            or None when the model was built without it. Graphs already captured keep the
            setting they were captured with.
        kv_slots: the KV cache's sequence slots (``KVSlots``; slot 0 is ``kv``'s): as many
            as ``load(max_batch=)`` asked for, for batched decoding (``batch_decoding``).

    Example:
        >>> from specter_spec import SpecController
        >>> from specter_models.loader import load_model
        >>> lm = load_model("tiny-deepseek-v2", device="cpu")  # doctest: +SKIP
        >>> SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4)  # doctest: +SKIP
    """

    def __init__(
        self,
        *,
        model: PreTrainedModel,
        architecture: Architecture,
        runtime: ExpertsRuntime,
        experts: Sequence[SpecterExperts],
        kv: SharedKV,
        counter: RoutingCounter,
        prefetcher: SpeculativePrefetcher,
        has_draft: bool,
        tokenizer: Any,
        memory: MemoryReport,
        source: str,
        max_verify_rows: int = DEFAULT_MAX_VERIFY_ROWS,
        shared_overlap: SharedExpertOverlap | None = None,
        kv_slots: KVSlots | None = None,
    ):
        self.model = model
        self.config: PretrainedConfig = model.config
        self.architecture = architecture
        self.runtime = runtime
        self.experts = list(experts)
        self.kv = kv
        self.cache: ExpertCache = runtime.cache
        self.counter = counter
        self.prefetcher = prefetcher
        self.target = TargetModel(model, runtime, kv)
        self.draft = DraftModel(model, runtime, kv) if has_draft else None
        self.tokenizer = tokenizer
        self.memory = memory
        self.source = source
        self.max_verify_rows = max_verify_rows
        self.shared_overlap = shared_overlap
        self.kv_slots = kv_slots

    def __repr__(self) -> str:
        plan = self.memory.plan
        return (
            f"SpecterModel({self.architecture.model_type}, source={self.source!r}, "
            f"device={self.device}, dtype={plan.dtype}, slots_per_layer={plan.slots_per_layer}"
            f"/{plan.num_experts}, draft={'int4' if self.draft else None}"
            + (f", hot_experts={plan.hot_experts_per_layer}" if plan.hot_experts_per_layer else "")
            + (f", pruned={plan.pruned_experts_per_layer}" if plan.pruned_experts_per_layer else "")
            + ")"
        )

    @property
    def device(self) -> torch.device:
        """The model's device."""
        return self.target.device

    @property
    def hot_experts(self) -> list[list[int]]:
        """The pinned hot set per MoE layer (``load_model(hot_experts=)``), empty lists when none:
        kept in FP16 slots for good; the draft computes them from those slots."""
        return [list(self.cache.pinned(layer)) for layer in range(self.cache.num_layers)]

    @property
    def draft_pruned_experts(self) -> list[list[int]]:
        """The experts the draft skips per MoE layer (``load_model(draft_pruned_experts=)``), empty
        lists when none."""
        return [list(module.pruned_experts) for module in self.experts]

    @property
    def verification(self) -> str:
        """``"expert"`` (waves per layer) or ``"token"`` (row by row)."""
        return self.runtime.verification

    @verification.setter
    def verification(self, kind: str) -> None:
        self.runtime.verification = kind

    @property
    def miss_path(self) -> str:
        """How a verification meets experts without a slot: ``"load"`` (acquired in waves:
        loaded, then computed as they land) or ``"stream"`` (read in place from the pinned
        host store by the expert kernel; no host decision, so the verification is one CUDA
        graph under a budget too; ``streamed_misses``)."""
        return self.runtime.miss_path

    @miss_path.setter
    def miss_path(self, path: str) -> None:
        self.runtime.set_miss_path(path, top_k=int(self.config.num_experts_per_tok))

    @property
    def stream_fills(self) -> int:
        """On the streamed miss path, candidate slots per layer a verification fills with
        the experts it streams, which are then resident for no extra transfer (0, the
        default: none; ``streamed_misses``). Set it between forwards, at most the value
        ``load_model(stream_fills=)`` gave (the stream record's width)."""
        return self.runtime.stream_fills

    @stream_fills.setter
    def stream_fills(self, count: int) -> None:
        self.runtime.stream_fills = count

    @property
    def stream_staging(self) -> int:
        """On the streamed miss path, experts per layer a verification copies into the
        staging buffer with a wide kernel before its expert kernel reads them there (0, the
        default: none; ``streamed_misses``). Set it between forwards, at most the value
        ``load_model(stream_staging=)`` gave (the buffer's slots)."""
        return self.runtime.stream_staging

    @stream_staging.setter
    def stream_staging(self, count: int) -> None:
        self.runtime.stream_staging = count

    @property
    def stream_waits(self) -> bool:
        """On the streamed miss path, whether a verification waits at each layer for that
        layer's prefetches still crossing the link (``StreamedMisses.wait_for_landing``) and
        reads them from their slots, instead of streaming them meanwhile, which moves each
        such expert twice (``streamed_misses``). Set it between forwards; graphs are captured
        per value.

        Raises:
            ValueError: not a bool.
        """
        return self.runtime.stream_waits

    @stream_waits.setter
    def stream_waits(self, enabled: bool) -> None:
        self.runtime.stream_waits = enabled

    @property
    def cpu_experts(self) -> CpuExpertExecutor | None:
        """The CPU expert executor computing each layer's CPU-homed experts on the host, or
        None (every expert on the device; ``set_cpu_experts``)."""
        return self.runtime.cpu_experts

    def set_cpu_experts(
        self, homed: Sequence[Sequence[int]] | None, threads: int | None = None
    ) -> CpuExpertExecutor | None:
        """Compute ``homed[layer]`` of every MoE layer on the host from now on (None, or
        every list empty: none), on ``threads`` host threads (None: every usable core but
        one). The cache stops loading them (``ExpertCache.set_host_experts``); target
        forwards of at most ``max_verify_rows`` rows hand their pairs to the host, which makes
        the target's steps piecewise graphs (``cpu_experts``). Call it between forwards.

        Returns:
            The executor, or None.

        Raises:
            CpuKernelUnavailableError: the host cannot run the kernel in this model's dtype.
            ValueError: bad ids, a pinned (hot) expert, or a bad thread count.
        """
        previous = self.runtime.cpu_experts
        if previous is not None:
            previous.close()
        self.runtime.cpu_experts = None
        self.cache.set_host_experts(None)
        if homed is None or not any(homed):
            return None
        check_cpu_kernel(self.cache.store.layout(0).spec("gate_up").dtype)
        self.cache.set_host_experts(homed)
        executor = CpuExpertExecutor(
            self.cache.store,
            homed,
            top_k=int(self.config.num_experts_per_tok),
            device=self.device,
            threads=threads,
            max_rows=min(self.max_verify_rows, CPU_MAX_ROWS),
        )
        self.runtime.cpu_experts = executor
        return executor

    @property
    def batch_invariant(self) -> bool:
        """Whether target forwards are batch-invariant (see ``load_model(batch_invariant=)``)."""
        return self.runtime.batch_invariant

    @batch_invariant.setter
    def batch_invariant(self, enabled: bool) -> None:
        self.runtime.batch_invariant = bool(enabled)

    @property
    def cuda_graphs(self) -> bool:
        """Whether decode steps are captured as CUDA graphs (see ``enable_step_graphs``)."""
        graphs = self.target.graphs
        return graphs is not None and graphs.capture

    @cuda_graphs.setter
    def cuda_graphs(self, enabled: bool) -> None:
        if enabled:
            self.enable_step_graphs(capture=True)
        else:
            self.disable_step_graphs()

    def enable_step_graphs(
        self,
        *,
        capture: bool = True,
        window_step: int = DEFAULT_WINDOW_STEP,
        piecewise: bool = False,
    ) -> None:
        """Run decode steps in the KV cache's window mode, captured as CUDA graphs.

        The draft's steps of one row are graphed always; the target's steps of up to
        ``max_verify_rows`` rows while every expert is resident (no budget), verification
        is expert-wise and no routing trace is recorded (``specter_models.step_graphs``).

        Args:
            capture: capture and replay CUDA graphs (a CUDA model); False runs window mode
                eagerly (the same arithmetic, uncaptured: what CPU tests compare).
            window_step: KV windows are multiples of this many rows.
            piecewise: also graph the target when its whole forward cannot be (a budget,
                token-wise verification or a routing trace): one graph per stretch between
                routed-expert calls, the experts eager in between (``load`` turns it on
                with CUDA graphs).

        Raises:
            ValueError: capture on a CPU model, or an unsupported attention implementation.
        """
        runtime, cache = self.runtime, self.kv.cache

        def target_applies() -> bool:
            # Token-wise verification with every expert resident is the same single wave; the
            # streamed miss path takes no host decision either (verifications fit its rows).
            # The CPU expert path reads each layer's routing on the host: piecewise.
            if runtime.routing_trace is not None or runtime.cpu_experts is not None:
                return False
            return self.cache.every_layer_resident() or runtime.streams(self.max_verify_rows)

        self.target.graphs = StepGraphs(
            self.model,
            runtime,
            cache,
            ExpertsMode.TARGET,
            max_rows=self.max_verify_rows,
            window_step=window_step,
            capture=capture,
            applicable=target_applies,
            piecewise=piecewise,
        )
        if self.draft is not None:
            self.draft.graphs = StepGraphs(
                self.model,
                runtime,
                cache,
                ExpertsMode.DRAFT,
                max_rows=1,
                window_step=window_step,
                capture=capture,
            )

    def capture_step_graphs(
        self, max_length: int | None = None, *, min_length: int = 1, max_rows: int | None = None
    ) -> dict[str, int]:
        """Capture, now, every graph later decode steps up to ``max_length`` positions need
        (default: the KV cache's ``max_seq_len``), so that no decode pays for a capture;
        then empty the KV cache and the routing counts the capturing forwards left.

        ``min_length`` (the prompt's length plus one, say) leaves out the windows no later
        step reaches; ``max_rows`` caps the rows captured (1: plain decoding's steps only).
        Each role's argmax (greedy decoding's, outside the graphs) runs on its capturing
        forwards' logits, so its kernel compiles here too, not in the first decode.

        The target's graphs are captured only where they apply (every expert resident, the
        streamed miss path, or piecewise graphs), for the current ``miss_path`` (switching it
        later needs the other path's graphs: capture again).

        Returns:
            Graphs captured per role.

        Raises:
            RuntimeError: CUDA graphs are off (``cuda_graphs``).
            ValueError: ``min_length`` or ``max_rows`` is not a positive int, or
                ``min_length`` is past ``max_length``.
        """
        if not self.cuda_graphs:
            raise RuntimeError("CUDA graphs are off: load with cuda_graphs=True (a CUDA model)")
        captured = {}
        try:
            for role, adapter in (("target", self.target), ("draft", self.draft)):
                graphs = adapter.graphs if adapter is not None else None
                if graphs is None or not graphs.applies(1):
                    continue
                # On the streamed miss path the target's forwards record as they stream (the
                # record of these capturing forwards is not counted).
                record = self.runtime.stream_record
                streamed = (
                    record.forward(self.cache, STREAM_MAX_ROWS, count=False)
                    if role == "target" and record is not None and self.runtime.streams(1)
                    else contextlib.nullcontext()
                )
                with streamed:
                    captured[role] = graphs.capture_ahead(
                        max_length, min_end=min_length, max_rows=max_rows, on_logits=adapter.argmax
                    )
        finally:
            self.kv.reset()
            self.counter.clear()
        return captured

    def disable_step_graphs(self) -> None:
        """Back to transformers' plain forward for every step (captured graphs are freed)."""
        self.target.graphs = None
        if self.draft is not None:
            self.draft.graphs = None

    def graph_stats(self) -> dict[str, dict[str, object] | None]:
        """Captures, replays, eager window forwards and any disabling reason, per role."""
        return {
            role: (adapter.graphs.stats.as_dict() if adapter and adapter.graphs else None)
            for role, adapter in (("target", self.target), ("draft", self.draft))
        }

    def reset(self) -> None:
        """Empty the KV cache and zero every statistic (cache, prefetcher, counters, the CPU
        expert executor's).

        Resident experts stay resident and captured CUDA graphs stay captured: a benchmark's
        warm-up decides what the cache holds and which steps are graphed.
        """
        for adapter in (self.target, self.draft):
            if adapter is not None and adapter.graphs is not None:
                adapter.graphs.stats.reset_counts()
        self.kv.reset()
        if self.kv_slots is not None:  # every sequence slot of batched decoding too
            for slot in range(self.kv_slots.num_slots):
                self.kv_slots.cache(slot).crop_to(0)
        self.counter.clear()
        self.cache.reset_stats()
        self.prefetcher.reset_stats()
        if self.runtime.cpu_experts is not None:
            self.runtime.cpu_experts.reset_stats()

    def prefetch_all(self) -> None:
        """Load every expert into its slot (the all-resident configuration).

        Raises:
            ValueError: a layer has fewer slots than experts.
        """
        E = self.cache.num_experts
        if min(self.cache.slots_per_layer) < E:
            raise ValueError(
                f"prefetch_all needs a slot per expert ({E} per layer), the cache has "
                f"{list(self.cache.slots_per_layer)}; load without a budget for all-resident"
            )
        self.cache.prefetch({layer: list(range(E)) for layer in range(self.cache.num_layers)})
        self.cache.synchronize()
        self.cache.expire_prefetches()

    def controller(self, depth: Any = 8, **kwargs: Any):
        """A ``SpecController`` over this model's draft and target with the prefetcher.

        Args:
            depth: K, or a depth policy (see specter-spec); 0 runs the target alone.
            **kwargs: more ``SpecController`` arguments (``sampling``, ``clock``, ...).
        """
        from specter_spec import SpecController

        return SpecController(self.draft, self.target, cache=self.prefetcher, depth=depth, **kwargs)

    def generate(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        max_new_tokens: int,
        *,
        depth: Any = 8,
        stop_token_ids: Iterable[int] = (),
        **kwargs: Any,
    ):
        """Speculative generation (greedy unless ``sampling=`` is given); see ``controller``."""
        return self.controller(depth, **kwargs).generate(prompt_ids, max_new_tokens, stop_token_ids)

    def state_tensors(self, role: str) -> dict[str, torch.Tensor]:
        """Device tensors a role reads, by name: for byte accounting of what is shared.

        ``"target"``: every parameter plus the FP16 slot tensors; ``"draft"``: every parameter
        plus the INT4 experts. Parameters appear under the same names, as the same objects.

        Raises:
            ValueError: an unknown role.
        """
        params = {f"param:{n}": p for n, p in self.model.named_parameters()}
        if role == "target":
            for layer in range(self.cache.num_layers):
                for name, t in self.cache.slot_tensors(layer).items():
                    params[f"slots:{layer}.{name}"] = t
            return params
        if role == "draft":
            for module in self.experts:
                for name, t in module.draft_tensors().items():
                    params[f"int4:{module.layer}.{name}"] = t
            return params
        raise ValueError(f"role must be 'target' or 'draft', got {role!r}")
