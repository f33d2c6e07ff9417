"""The engine: a loaded model set up for fast decoding, and its generations.

``Engine.from_config`` runs the whole fast path once: the tokenizer, the memory plan and
its checks, the pinned hot set and pruned draft (chosen on a calibration prompt's routing,
or read from a file), the choice between speculating and plain decoding, the CUDA graphs
captured ahead, the adaptive depth's kept costs and warm-up. ``Engine.generate`` then
streams completions; ``generate_batch`` and ``batch_session`` decode several together.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from specter_models.batch_adapters import BatchedSlots
from specter_models.engine.arm_trial import choose_by_trial, trial_tokens_of
from specter_models.engine.auto_budget import auto_budget
from specter_models.engine.batch_generation import BatchGeneration, batch_requests
from specter_models.engine.batch_session import BatchSession
from specter_models.engine.config import EngineConfig
from specter_models.engine.cpu_setup import set_up_cpu_experts
from specter_models.engine.decode_window import DecodeWindow, make_depth_policy
from specter_models.engine.depth_memory import (
    engine_setup,
    recall_depth_costs,
    write_depth_costs,
)
from specter_models.engine.generation import Generation
from specter_models.engine.hot_sets import (
    IN_PLACE_READ_COST,
    choose_prompt_engine,
    pruned_from_file,
    read_hot_set,
    release_memory,
    resolve_hot_experts,
)
from specter_models.engine.model_source import (
    load_tokenizer,
    model_config,
    num_experts_of,
    prompt_ids,
    resolve_device,
    resolve_dtype,
)
from specter_models.engine.plans import (
    PLAIN_STREAM_FILLS,
    DraftDoesNotFitError,
    budget_plan,
    engine_choices,
    neither_fits,
    plain_plan,
)
from specter_models.engine.speculation_verdict import (
    read_verdict,
    speculation_verdict,
    verdict_setup,
    write_verdict,
)
from specter_models.engine.warmup import capture_decode_graphs, warm_adaptive_depth
from specter_models.memory_plan import DEFAULT_MAX_SEQ_LEN, MemoryBudgetError
from specter_spec import AdaptiveDepth, SamplingConfig, SpecController

__all__ = ["PLAIN_STREAM_FILLS", "Engine", "engine_choices"]


def _silent(line: str) -> None:
    del line


class Engine:
    """A model loaded for fast decoding with offloaded experts and speculation.

    Build one with :meth:`from_config`; call :meth:`generate` for each completion.

    Attributes:
        config: the configuration it was built from.
        model: the ``SpecterModel`` (target, draft, cache, prefetcher).
        tokenizer: the model's tokenizer (``encode``/``decode``), or a byte tokenizer for
            models without one.
        max_positions: the model's position limit (None where it has none).
        max_seq_len: positions the KV cache holds.
        device: the resolved device (``"cpu"``, ``"cuda"``, ...).
        dtype: the model's dtype.
        depth: the depth it decodes at: an int (0: plain decoding) or ``"auto"``.
        budget_gb: the GPU memory budget in GB (``"auto"`` resolved), or None.
        setup_stats: what setting up measured (hot-set choice, plain-or-draft trial, graph
            capture, depth warm-up, depth costs), repeated in every generation's ``stats``.
    """

    def __init__(self) -> None:
        raise TypeError("build an Engine with Engine.from_config(EngineConfig(...)).")

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        *,
        calibration_prompt: str | Sequence[int] | None = None,
        log: Callable[[str], None] | None = None,
    ) -> Engine:
        """Load and set up the model of ``config``.

        Args:
            config: the engine's configuration.
            calibration_prompt: text or token ids whose routing chooses the hot set
                (``MemoryConfig.hot_experts`` ``"auto"``, the default under a budget when
                speculating) and the plain-or-draft choice of an adaptive depth, and from
                which the adaptive depth warms up with every expert resident. Usually the
                first prompt to be generated from. None: no hot set by default, no warm-up.
            log: receives progress and notes, one line at a time (default: nothing).

        Raises:
            ValueError: a bad or conflicting configuration (the message names the field).
            CpuKernelUnavailableError: ``CpuExpertsConfig.mode="on"`` where the host cannot run
                the CPU expert kernel in the model's dtype (the message says why).
            MemoryBudgetError: the budget cannot hold the model
                (:class:`~specter_models.engine.DraftDoesNotFitError` when it would without the
                INT4 draft).
            FileNotFoundError, KeyError: an unknown model or a missing file.
        """
        if not isinstance(config, EngineConfig):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}.")
        log = log or _silent

        def build(chosen: EngineConfig) -> Engine:
            engine = object.__new__(cls)
            engine._set_up(chosen, calibration_prompt, log)
            return engine

        tokens = trial_tokens_of(config, calibration_prompt)
        if tokens:  # an adaptive depth under a budget: time both decodings (arm_trial)
            return choose_by_trial(build, config, calibration_prompt, tokens, log)
        return build(config)

    # ------------------------------------------------------------------------ set-up
    def _set_up(
        self,
        config: EngineConfig,
        calibration_prompt: str | Sequence[int] | None,
        log: Callable[[str], None],
    ) -> None:
        load, memory, spec = config.load, config.memory, config.speculation
        self.config = config
        self._log = log
        device = resolve_device(load.device)
        dtype = resolve_dtype(load.dtype, device)
        hf_config = model_config(load.model)
        num_experts = num_experts_of(hf_config)
        self.tokenizer = load_tokenizer(load.model, int(hf_config.vocab_size))
        self.max_positions = getattr(hf_config, "max_position_embeddings", None)
        self.device, self.dtype = device, dtype
        ids = (
            None
            if calibration_prompt is None
            else prompt_ids(self.tokenizer, calibration_prompt, "calibration prompt")
        )
        max_depth = spec.largest_depth
        max_seq_len = memory.max_seq_len
        if max_seq_len is None:
            max_seq_len = min(self.max_positions or DEFAULT_MAX_SEQ_LEN, DEFAULT_MAX_SEQ_LEN)
        if self.max_positions is not None and max_seq_len > self.max_positions:
            raise ValueError(
                f"MemoryConfig.max_seq_len={max_seq_len}: {load.model} has "
                f"{self.max_positions} positions (max_position_embeddings); give at most that."
            )
        self.max_seq_len = max_seq_len
        plan_args = {
            "dtype": dtype,
            "max_seq_len": max_seq_len,
            "max_batch": config.batch.max_batch,
        }
        budget = memory.gpu_memory_gb
        if budget == "auto":
            chosen = auto_budget(
                hf_config, device, staging_slots=memory.stream_staging, **plan_args
            )
            log(chosen.reason)
            budget = chosen.budget_gb
        self.budget_gb = budget
        depth = spec.depth
        speculate = depth != 0
        budgeted = budget is not None or memory.slots_per_layer is not None
        speculation = "off (depth 0)" if not speculate else f"on (depth {depth})"
        self._verdict_setup = None
        if depth == "auto" and budgeted and spec.depth_memory and not spec.keep_draft:
            self._verdict_setup = verdict_setup(
                config, device=device, dtype=dtype, budget_gb=budget, max_seq_len=max_seq_len
            )
            kept = read_verdict(self._verdict_setup, log)
            if kept is not None and not kept.pays:
                log(
                    f"{kept.describe()}, as an earlier run of this setup measured: decoding "
                    "plainly without the INT4 draft (--keep-draft speculates anyway)"
                )
                speculate, depth, speculation = False, 0, kept.state
        miss_path, fills = engine_choices(
            memory.miss_path, memory.stream_fills, budgeted=budgeted, speculate=speculate
        )

        def load_model(with_draft: bool, hot=None, pruned=None, miss=None, fill=None):
            return self._load(
                with_draft, hot, pruned, device, dtype, max_seq_len,
                miss_path if miss is None else miss, fills if fill is None else fill,
            )  # fmt: skip

        chosen_by_default = memory.hot_experts is None
        holds_every_expert = False
        if chosen_by_default and budget is not None:
            plan, _ = budget_plan(
                hf_config, budget, with_draft=True, staging_slots=memory.stream_staging,
                **plan_args,
            )  # fmt: skip
            holds_every_expert = plan is not None and plan.slots_per_layer >= plan.num_experts
        hot_experts = resolve_hot_experts(
            memory.hot_experts if speculate else None,
            speculate=speculate,
            budget_gb=budget,
            prompt_tokens=0 if ids is None else len(ids),
            holds_every_expert=holds_every_expert,
        )
        hot = pruned = None
        auto_choice = None
        choice_s = None
        if hot_experts == "auto":
            if budget is None:
                raise ValueError(
                    "MemoryConfig.hot_experts='auto' (--hot-experts auto) chooses a hot set for "
                    "a memory budget: give gpu_memory_gb (--gpu-memory-gb)."
                )
            if ids is None:
                raise ValueError(
                    "MemoryConfig.hot_experts='auto' chooses on the routing of the calibration "
                    "prompt: pass calibration_prompt to Engine.from_config, or a hot-set file."
                )
            continuation = memory.hot_set_tokens
            routed = (
                f"the routing of the prompt and its first {continuation} greedy tokens"
                if continuation
                else "the prompt's routing"
            )
            default_note = (
                "; the default under a budget, --hot-experts none skips it"
                if chosen_by_default
                else ""
            )
            log(f"choosing the hot set on {routed} (a target-only load{default_note}) ...")
            compare_plain = depth == "auto" and not spec.keep_draft
            chose_from = time.perf_counter()
            try:
                prompt_choice = choose_prompt_engine(
                    lambda: load_model(False), budget, ids, compare_plain=compare_plain,
                    staging_slots=memory.stream_staging, continuation_tokens=continuation,
                    pruned_per_layer=memory.draft_pruned, **plan_args,
                )  # fmt: skip
                choice = prompt_choice.hot
            except MemoryBudgetError:
                if not chosen_by_default:
                    raise
                prompt_choice = choice = None  # the load below says what does not fit
            choice_s = time.perf_counter() - chose_from
            if prompt_choice is not None and prompt_choice.plain is not None:
                auto_choice = prompt_choice.as_dict()
                decided = (
                    "decoding plainly, without the INT4 draft (--keep-draft speculates anyway)"
                    if prompt_choice.decode_plainly
                    else "speculating"
                )
                log(
                    f"auto: the routing of {prompt_choice.routing_tokens} positions moves "
                    f"{prompt_choice.draft_loads} experts with the draft "
                    f"({choice.slots_per_layer} slots a layer, {choice.per_layer} pinned) and "
                    f"{prompt_choice.plain.loads} without it "
                    f"({prompt_choice.plain.slots_per_layer} slots a layer, each read in place: "
                    f"{IN_PLACE_READ_COST} of the draft's loads in link time): {decided}"
                )
                if prompt_choice.decode_plainly:
                    speculate, depth, choice = False, 0, None
                    speculation = (
                        f"off (depth auto chose 0: the calibration routing moves "
                        f"{prompt_choice.plain.loads} experts without the draft, each read in "
                        f"place, against {prompt_choice.draft_loads} with it)"
                    )
                    miss_path, fills = engine_choices(
                        memory.miss_path, memory.stream_fills, budgeted=budgeted,
                        speculate=False,
                    )  # fmt: skip
            if choice is not None:
                log(f"hot set: {choice.describe()}")
                hot = choice.hot_experts if choice.per_layer else None
                pruned = choice.pruned_experts or None
        elif hot_experts is not None:
            hot, stored = read_hot_set(hot_experts, budget)
            pruned = pruned_from_file(stored, memory.draft_pruned, hot_experts)
        log(f"loading {load.model} on {device} ...")
        started = time.perf_counter()
        plain, plain_short = plain_plan(
            hf_config, budget, staging_slots=memory.stream_staging, **plan_args
        )
        try:
            loaded = load_model(speculate, hot, pruned if speculate else None, miss_path, fills)
        except MemoryBudgetError as exc:
            if not speculate:
                raise
            if plain is None:
                raise neither_fits(exc, plain_short) from exc
            raise DraftDoesNotFitError(
                f"{exc} Without the INT4 draft it fits: depth 0 decodes plainly with "
                f"{plain.slots_per_layer} FP16 expert slots per layer.",
                plain,
                exc,
            ) from exc
        log(f"loaded {loaded!r} in {time.perf_counter() - started:.1f} s")
        self.model = loaded
        record = getattr(getattr(loaded, "runtime", None), "stream_record", None)
        if record is not None and not speculate and miss_path == "stream":
            # Plain streamed steps choose their fills before the step before is counted (on
            # deferred records, CUDA's): 8-28% less time a token on one H200.
            record.pipelined = True
        slots = loaded.memory.plan.slots_per_layer
        if speculate and plain is not None and plain.slots_per_layer > slots:
            log(
                f"note: the INT4 draft leaves {slots} FP16 expert slots per layer in this "
                f"budget; plain decoding (--depth 0) would have {plain.slots_per_layer}"
            )
        if loaded.tokenizer is None and hasattr(self.tokenizer, "offset"):
            log("note: this model has random weights and no tokenizer: its text is noise (bytes)")
        if memory.slots_per_layer is not None:
            placement_slots = memory.slots_per_layer
        else:  # the draftless plan's: a speculative and a plain engine home the same experts
            placement_slots = plain.slots_per_layer if plain is not None else slots
        cpu_experts = set_up_cpu_experts(
            loaded, config.cpu_experts, prompt_ids=ids, continuation_tokens=memory.hot_set_tokens,
            placement_slots=placement_slots, log=log,
        )  # fmt: skip
        self.depth = depth
        self._speculate = speculate
        self._streamed_plain = not speculate and miss_path == "stream"
        self._depth_policy = make_depth_policy(depth, max_depth)
        capture = capture_decode_graphs(
            loaded, prompt_length=len(ids) if ids else 1, speculate=speculate, log=log
        )
        self._depth_memory = None  # (file, setup): where the policy's costs are kept
        primed = False
        if isinstance(self._depth_policy, AdaptiveDepth) and spec.depth_memory:
            setup = engine_setup(
                load.model, loaded, device=device, dtype=dtype, budget_gb=budget,
                max_depth=max_depth,
            )  # fmt: skip
            kept, primed = recall_depth_costs(self._depth_policy, setup, log)
            self._depth_memory = (kept, setup)
        warmup_s = None
        if ids is not None:
            warmup_s = warm_adaptive_depth(
                self._controller(SamplingConfig()),
                loaded,
                ids,
                spec.warmup_tokens,
                every_expert_resident=slots >= num_experts,
                log=log,
            )
        eos = getattr(self.tokenizer, "eos_token_id", None)
        has_tokenizer = loaded.tokenizer is not None
        self._stop_ids = [eos] if isinstance(eos, int) and has_tokenizer else []
        self._used = False
        self._session: BatchSession | None = None
        self._batch: tuple[BatchedSlots, Any] | None = None
        self.setup_stats = {
            "speculation": speculation,
            "auto_choice": auto_choice,
            "arm_trial": None,  # arm_trial.choose_by_trial fills it in where it ran
            "hot_set_choice_s": choice_s,
            **capture,
            "depth_warmup_s": warmup_s,
            "cpu_placement": cpu_experts,
            "depth_costs": (
                None
                if self._depth_memory is None
                else ("primed from an earlier run" if primed else "first run of this setup")
            ),
        }

    def _load(
        self,
        with_draft: bool,
        hot: list[list[int]] | None,
        pruned: list[list[int]] | None,
        device: str,
        dtype: torch.dtype,
        max_seq_len: int,
        miss_path: str,
        stream_fills: int,
    ) -> Any:
        from specter_models.loader import load_model

        config = self.config
        kernels = config.kernels
        return load_model(
            config.load.model,
            gpu_memory_gb=self.budget_gb,
            slots_per_layer=config.memory.slots_per_layer,
            device=device,
            dtype=dtype,
            draft=config.load.draft if with_draft else None,
            policy="predictive" if with_draft else "lru",
            seed=config.load.weights_seed,
            max_seq_len=max_seq_len,
            hot_experts=hot,
            draft_pruned_experts=pruned if with_draft else None,
            batch_invariant=kernels.batch_invariant,
            cuda_graphs=kernels.cuda_graphs,
            piecewise_graphs=kernels.piecewise_graphs,
            shared_overlap=kernels.shared_overlap,
            miss_path=miss_path,
            stream_fills=stream_fills,
            stream_staging=config.memory.stream_staging,
            max_batch=config.batch.max_batch,
        )

    def _controller(self, sampling: SamplingConfig) -> SpecController:
        loaded = self.model
        return SpecController(
            loaded.draft if self._speculate else None,
            loaded.target,
            cache=DecodeWindow(
                loaded.cache, loaded.prefetcher, streamed_plain=self._streamed_plain
            ),
            depth=self._depth_policy,
            sampling=sampling,
        )

    # ---------------------------------------------------------------------- generate
    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> Generation:
        """Start a completion of ``prompt``; iterate the result to run it.

        Args:
            prompt: text (encoded with :attr:`tokenizer`) or token ids.
            max_new_tokens: the most tokens to generate (>= 1).
            sampling: specter-spec's ``SamplingConfig`` (default greedy).
            stop_token_ids: tokens that end the generation (default: the tokenizer's end
                of sequence where the model has a tokenizer of its own; ``[]``: none).

        Returns:
            A :class:`~specter_models.engine.Generation`, which yields
            :class:`~specter_models.engine.GenerationChunk` s and holds the statistics
            once iterated.

        Raises:
            ValueError: an empty prompt, a bad ``max_new_tokens``, or a prompt and
                ``max_new_tokens`` the KV cache cannot hold.
        """
        ids = self._checked_prompt(prompt, max_new_tokens)
        self._check_idle("Engine.generate")
        if self._used:
            self.model.reset()
        self._used = True
        controller = self._controller(sampling or SamplingConfig.greedy())
        stop = self._stop_ids if stop_token_ids is None else list(stop_token_ids)
        stream = controller.stream(ids, max_new_tokens, stop_token_ids=stop)
        return Generation(
            stream,
            self.tokenizer,
            loaded=self.model,
            cuda=self.device.startswith("cuda"),
            engine_stats=self.setup_stats,
            on_finish=self._keep_depth_costs,
        )

    def _checked_prompt(self, prompt: str | Sequence[int], max_new_tokens: int) -> list[int]:
        """``prompt``'s token ids, checked with ``max_new_tokens`` against the KV cache.

        Raises:
            ValueError: an empty prompt, a bad ``max_new_tokens``, or more positions than
                the KV cache (a slot of it, batched) holds.
        """
        ids = prompt_ids(self.tokenizer, prompt, "prompt")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}.")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens}.")
        largest = self.config.speculation.largest_depth if self._speculate else 0
        need = len(ids) + max_new_tokens + largest + 2
        if need > self.max_seq_len:
            raise ValueError(
                f"the prompt ({len(ids)} tokens) plus max_new_tokens={max_new_tokens} and one "
                f"verification of depth {largest} need {need} positions; the engine's KV cache "
                f"holds {self.max_seq_len} (MemoryConfig.max_seq_len). Shorten the prompt, "
                "generate fewer tokens or raise max_seq_len."
            )
        return ids

    # ------------------------------------------------------------------------- batches
    def batch_session(self) -> BatchSession:
        """A session decoding up to ``BatchConfig.max_batch`` sequences together, each in
        its own KV slot: ``add`` sequences, ``step`` them, ``cancel`` one (see
        :class:`~specter_models.engine.batch_session.BatchSession`). Each sequence's greedy
        output is what ``generate`` decodes for it alone. The model is reset first.

        Raises:
            RuntimeError: another session still has active sequences.
            ValueError: a model whose setup batched decoding does not cover (CPU-homed
                experts).
        """
        self._check_idle("Engine.batch_session")
        if self._batch is None:
            policy = make_depth_policy(self.depth, self.config.speculation.largest_depth)
            self._batch = (BatchedSlots(self.model), policy)
        if self._used:
            self.model.reset()
        self._used = True
        slots, policy = self._batch
        self._session = BatchSession(
            self, slots, policy, speculate=self._speculate, prompt_ids=self._checked_prompt
        )
        return self._session

    def generate_batch(
        self,
        prompts: Sequence[str | Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        sampling: SamplingConfig | Sequence[SamplingConfig | None] | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> BatchGeneration:
        """Complete several prompts together (at most ``BatchConfig.max_batch``); iterate
        the result to run it.

        Args:
            prompts: texts or token-id lists.
            max_new_tokens: one budget for all, or one per prompt.
            sampling: one ``SamplingConfig`` for all, or one per prompt (each seeds its own
                generator); default greedy.
            stop_token_ids: tokens that end a sequence (default: the tokenizer's end of
                sequence where the model has a tokenizer of its own).

        Returns:
            A :class:`~specter_models.engine.batch_generation.BatchGeneration`.

        Raises:
            ValueError, TypeError: no prompt, too many, a bad prompt or budget, per-prompt
                lists of the wrong length.
            RuntimeError: a batch session still has active sequences.
        """
        prompts, budgets, samplings = batch_requests(
            prompts, max_new_tokens, sampling, self.config.batch.max_batch
        )
        ids = [self._checked_prompt(p, n) for p, n in zip(prompts, budgets, strict=True)]
        session = self.batch_session()
        return BatchGeneration(session, ids, budgets, samplings, stop_token_ids, self.setup_stats)

    def release(self) -> None:
        """Free the engine's model (device memory, the pinned host store); the engine
        cannot decode afterwards.

        Raises:
            RuntimeError: a batch session is still decoding.
        """
        self._check_idle("Engine.release")
        self.model = None
        self._session = self._batch = None
        release_memory()

    def _check_idle(self, what: str) -> None:
        if self.model is None:
            raise RuntimeError(f"{what}: this engine was released; build another one")
        session = self._session
        if session is not None and session.active:
            raise RuntimeError(
                f"{what}: a batch session is decoding {session.active} sequences on this "
                "engine; step it until they finish (or cancel them) first."
            )

    def _keep_depth_costs(self) -> None:
        if self._depth_memory is not None:
            path, setup = self._depth_memory
            write_depth_costs(path, setup, self._depth_policy.export_costs(), self._log)
        if self._verdict_setup is not None and self._speculate:
            verdict = speculation_verdict(self._depth_policy)
            if verdict is not None:
                write_verdict(self._verdict_setup, verdict, self._log)

    def __repr__(self) -> str:
        return f"Engine({self.model!r}, depth={self.depth!r})"
