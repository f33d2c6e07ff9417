"""Experiments of docs/benchmarking.md: which systems run at which budgets, and in what order.

An experiment is a list of *stages*, each one model build: the transformers reference
(``hf``, ``hf-default``), one Specter load per (budget, with or without the INT4 draft), and
the accelerate offload. Stages run in priority order so that a run stopped by its time limit
has measured what matters most first: the transformers reference, then the unlimited budget,
then the high budget (where the issue's targets are), then the low one, then the slow
offload baseline.

``default`` is what ``nox -s bench-<model>`` runs: every system of the TPOT table at the
model's low and high budgets and unlimited, the ablations at the high budget, the depth
sweep at the high budget, and the routing experiments (working set against K, draft/target
agreement, hit rate per policy, Belady bound), from HumanEval prompts, 128 new tokens.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specter_bench.bench_record import RETIRED_SYSTEMS, SYSTEM_NAMES
from specter_bench.engine_systems import ENGINE_SYSTEMS
from specter_bench.model_loading import EngineOptions
from specter_bench.prompt_sources import PromptSourceConfig
from specter_bench.routing_analysis import DEFAULT_DEPTHS

__all__ = [
    "ABLATIONS",
    "BATCH_SYSTEMS",
    "DEFAULT_BATCH_SIZES",
    "DEFAULT_CALIBRATION_PROMPTS",
    "EXPERIMENTS",
    "BenchConfig",
    "Stage",
    "plan_stages",
    "resolve_budgets",
]

TPOT_SYSTEMS = ("hf", "hf-default", "offload", "lru", "spec-lru", "specter")
TTFT_SYSTEMS = ("specter", "offload", "lru")
DEFAULT_PROMPT_LENGTHS = (512, 2048, 8192)
"""Prompt lengths in tokens of the ``ttft`` experiment."""
ABLATIONS = (
    "specter-acquire",
    "specter-no-hot",
    "specter-no-prefetch",
    "specter-token-verify",
    "specter-unfused-draft",
    "specter-row-cut",
    "specter-fill",
    "specter-staged",
)
HF_SYSTEMS = ("hf", "hf-default")
BATCH_SYSTEMS = ("specter", "offload", "hf")
"""Systems of the ``batch`` experiment: the engine speculating, the same engine without a
draft, and transformers' batched ``generate`` in its fastest configuration."""
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
"""Batch sizes B of the ``batch`` experiment."""
BATCH_PROMPT_TOKENS = 16
"""The ``batch`` experiment's prompts are cut to this many tokens unless told otherwise
(``max_prompt_tokens``): 16-token prefixes, 128 new tokens each."""
DEFAULT_SWEEP_DEPTHS = (0, 2, 4, 8, 16, 32)
DEFAULT_CALIBRATION_PROMPTS = 8
"""Calibration prompts whose decodes count each budget's hot set (see ``BenchConfig``)."""

EXPERIMENTS = {
    "default": "TPOT of every system at low/high/unlimited, ablations, depth sweep, routing",
    "tpot": "TPOT of hf, hf-default, offload, lru, spec-lru and specter at each budget",
    "ttft": "time to first token of specter, offload and lru at each budget for prompts of "
    "--prompt-lengths tokens",
    "ablations": "specter and its ablations at the high budget",
    "routing": "working set against K, draft/target agreement, hit rate per policy",
    "depth-sweep": "specter's TPOT against depth K at the high budget",
    "hot-sweep": "specter's TPOT against the pinned hot count at the high budget",
    "offload": "hf-offload at the low budget (very slow: few tokens and prompts)",
    "batch": "mean TPOT, throughput and distinct experts per layer of specter, offload and "
    "hf's batched generate at the high budget for each of --batch-sizes",
    "all": "default plus hf-offload",
}
"""Experiment names and what they measure."""


@dataclass(frozen=True)
class BenchConfig:
    """One ``specter bench`` invocation.

    Attributes:
        model: preset name, ``specter-code-tiny`` or a checkpoint folder.
        experiment: one of :data:`EXPERIMENTS`.
        systems: restrict the TPOT systems (None: the experiment's).
        budgets: GB budgets with None for unlimited (None: the model's low, high, unlimited).
        prompts: where prompts come from (``limit`` = prompts used).
        max_new_tokens: tokens generated per prompt.
        max_prompt_tokens: prompts are cut to this many tokens.
        depth: K of the speculating systems, or ``"auto"`` (online adaptive depth).
        max_depth: the adaptive depth's largest K.
        sweep_depths: depths of the depth sweep.
        working_set_depths: depths K of the working-set experiment.
        device: ``cuda``, ``cuda:N`` or ``cpu``.
        dtype: the models' dtype (float16 on a GPU; float64 keeps CPU tests free of
            near-tie flips).
        seed: seed of preset weights.
        out_dir: where JSON lines go.
        tag: file name tag (default: model and date).
        max_minutes: no new run starts after this long (None: no limit).
        stage_reserve_minutes: no new stage (a model build) starts with less than this left
            before ``max_minutes``; the offload stage (a CPU copy of the model, then very slow
            decoding) needs three times as much.
        warmup: unrecorded decodes per system before measuring.
        warmup_tokens: tokens of each warm-up decode (compilation, autotuning, cache filling
            and the adaptive depth's first estimates need a few iterations, not a full decode).
        hf_compile: let transformers compile its static-cache decode step (its fastest
            configuration; the compilation happens in the warm-up).
        hf_decode_experts: ``hf``'s experts implementation for decode steps
            (``auto``, ``batched_mm`` or ``grouped_mm``, see ``HFRunner``).
        offload_new_tokens: tokens per prompt for ``hf-offload``.
        offload_prompts: prompts for ``hf-offload``.
        calibration_prompts: prompts after the measured ones (same source) whose target
            routing chooses each budget's pinned hot set; 0: no hot sets. The default,
            :data:`DEFAULT_CALIBRATION_PROMPTS`, is 8: on DeepSeek-V2-Lite's recorded routing
            (24 HumanEval sequences, ``specter policy-replay``) a hot set counted on 8
            decodes moved 8.7% fewer experts at 24 GB than one counted on 2.
        hot_experts_per_layer: pin this many experts per layer at every budget instead of
            the count the calibration replay chooses (None); the set is still the
            calibration prompts' most routed experts.
        draft_pruned_per_layer: experts per layer the draft of systems with a hot set skips
            at every budget (``specter_models.load(draft_pruned_experts=)``): the calibration
            prompts' least routed, whose INT4 memory buys FP16 slots; ``"auto"`` (default):
            ``specter_models.auto_pruned_per_layer`` (a third of the experts under a budget
            that leaves some expert without a slot, none otherwise); 0: none.
        sweep_prompts: prompts of the depth and hot-count sweeps (the first ones).
        hot_sweep_counts: pinned experts per layer of the hot-count sweep (None: 0, the
            chosen count and four counts spread over those the budget holds).
        engine: the ``specter_models.load`` switches of the engine systems (batch
            invariance, CUDA graphs).
        cpu_experts: CPU expert modes (``off``, ``auto``, ``on``) every engine system runs
            with, one after another (``bench_cpu``).
        cpu_threads: host thread counts of the CPU expert path, one run of each (None: every
            core but one).
        command: the command line, recorded with the results.
        routing_trace: a routing trace (``specter record-routing``) every engine system
            replays (prompt ``i`` is its sequence ``i``, calibration prompts the ones after
            the measured ones); None: the model's own (random-weight) routing.
        runs: each system's measured pass over the prompts is repeated this many times on
            the same load (``run_index`` in its records); tables show the median and the
            range across runs, and a target ratio holds only where it holds at the worst
            run (the headline protocol uses 3).
        prompt_lengths: prompt lengths in tokens of the ``ttft`` experiment (the measured
            prompts' text repeated to exactly each length).
        fallback: with an adaptive depth, ``specter`` decodes as ``offload`` at a budget
            where its warm-up chose K = 0 (False: it speculates there anyway, to measure
            what the draft costs).
        batch_sizes: the ``batch`` experiment's batch sizes B: each system decodes the
            first B prompts together (one engine load per system sized for the largest B).
    """

    model: str
    experiment: str = "default"
    systems: tuple[str, ...] | None = None
    budgets: tuple[float | None, ...] | None = None
    prompts: PromptSourceConfig = field(default_factory=lambda: PromptSourceConfig(limit=3))
    max_new_tokens: int = 128
    max_prompt_tokens: int = 512
    depth: int | str = "auto"
    max_depth: int = 16
    sweep_depths: tuple[int, ...] = DEFAULT_SWEEP_DEPTHS
    working_set_depths: tuple[int, ...] = DEFAULT_DEPTHS
    device: str = "cuda"
    dtype: torch.dtype = torch.float16
    seed: int = 0
    out_dir: Path = Path("benchmarks/results")
    tag: str | None = None
    max_minutes: float | None = None
    stage_reserve_minutes: float = 1.0
    warmup: int = 1
    warmup_tokens: int = 32
    hf_compile: bool = True
    hf_decode_experts: str = "auto"
    offload_new_tokens: int = 8
    offload_prompts: int = 1
    calibration_prompts: int = DEFAULT_CALIBRATION_PROMPTS
    hot_experts_per_layer: int | None = None
    draft_pruned_per_layer: int | str = "auto"
    sweep_prompts: int = 2
    hot_sweep_counts: tuple[int, ...] | None = None
    engine: EngineOptions = field(default_factory=EngineOptions)
    cpu_experts: tuple[str, ...] = ("off",)
    cpu_threads: tuple[int, ...] | None = None
    command: str | None = None
    routing_trace: Path | None = None
    runs: int = 1
    prompt_lengths: tuple[int, ...] = DEFAULT_PROMPT_LENGTHS
    fallback: bool = True
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES

    def __post_init__(self) -> None:
        if self.experiment not in EXPERIMENTS:
            raise ValueError(
                f"unknown experiment {self.experiment!r}; expected one of {', '.join(EXPERIMENTS)}."
            )
        known = set(SYSTEM_NAMES) - set(RETIRED_SYSTEMS)
        for system in self.systems or ():
            if system in RETIRED_SYSTEMS:
                raise ValueError(
                    f"system {system!r} no longer runs; use {RETIRED_SYSTEMS[system]} (old "
                    "records that name it still read)."
                )
            if system not in known:
                runnable = ", ".join(s for s in SYSTEM_NAMES if s in known)
                raise ValueError(f"unknown system {system!r}; expected some of {runnable}.")
        if self.depth != "auto" and (not isinstance(self.depth, int) or self.depth < 1):
            raise ValueError(
                f"depth of the speculating systems must be an int >= 1 or 'auto', got "
                f"{self.depth!r} (use --systems lru for decoding without speculation)."
            )
        replayed = [s for s in self.systems or () if s in HF_SYSTEMS or s == "hf-offload"]
        if self.routing_trace is not None and replayed:
            raise ValueError(
                f"--routing replay replays a trace on Specter's engine; {', '.join(replayed)} "
                "run transformers' own routing: leave them out of --systems."
            )
        pruned = self.draft_pruned_per_layer
        if pruned != "auto" and (isinstance(pruned, bool) or not isinstance(pruned, int)
                                 or pruned < 0):  # fmt: skip
            raise ValueError(
                f"draft_pruned_per_layer must be an int >= 0 or 'auto' (experts per layer the "
                f"draft skips), got {pruned!r}."
            )
        if self.experiment == "ttft":
            hf = [s for s in self.systems or () if s.startswith("hf")]
            if hf:
                raise ValueError(
                    f"the ttft experiment measures engine systems, not {', '.join(hf)}: "
                    "transformers' time to first token is its prefill, in every tpot record "
                    "(prefill ms)."
                )
        lengths = self.prompt_lengths
        if not lengths or any(isinstance(n, bool) or not isinstance(n, int) or n < 2
                              for n in lengths):  # fmt: skip
            raise ValueError(
                f"prompt_lengths must be ints >= 2 (tokens), got {lengths!r}; e.g. 512,2048,8192."
            )
        modes = self.cpu_experts
        if not modes or any(m not in ("auto", "off", "on") for m in modes):
            raise ValueError(
                f"cpu_experts must name some of auto, off and on, got {list(modes)!r}."
            )
        cores = os.cpu_count() or 1
        if self.cpu_threads is not None and (
            not self.cpu_threads
            or any(
                isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= cores
                for t in self.cpu_threads
            )
        ):
            raise ValueError(
                f"cpu_threads must be thread counts from 1 to this machine's {cores} cores, got "
                f"{list(self.cpu_threads)!r}."
            )
        self._check_batch()
        for name in ("max_new_tokens", "max_prompt_tokens", "max_depth", "sweep_prompts", "runs"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}.")

    def _check_batch(self) -> None:
        """The ``batch`` experiment's own checks: its batch sizes and systems."""
        sizes = self.batch_sizes
        if not sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                            for b in sizes):  # fmt: skip
            raise ValueError(
                f"batch_sizes must be ints >= 1 (sequences decoded together), got "
                f"{list(sizes)!r}; e.g. 1,2,4,8,16,32."
            )
        if self.experiment != "batch":
            return
        other = [s for s in self.systems or () if s not in BATCH_SYSTEMS]
        if other:
            raise ValueError(
                f"the batch experiment measures {', '.join(BATCH_SYSTEMS)}, not "
                f"{', '.join(other)}; leave them out of --systems."
            )
        if self.routing_trace is not None:
            raise ValueError(
                "the batch experiment decodes with the model's own routing; a routing trace "
                "replays one sequence at a time: run it with --routing random."
            )
        if tuple(self.cpu_experts) != ("off",):
            raise ValueError(
                f"--cpu-experts {','.join(self.cpu_experts)}: the batch experiment runs with "
                "every expert on the GPU or streamed; leave --cpu-experts out."
            )


@dataclass(frozen=True)
class Stage:
    """One model build and what runs on it.

    Attributes:
        kind: ``"hf"`` (transformers, every weight on the device), ``"engine"`` (a Specter
            load), ``"hot-sweep"`` (one Specter load per pinned hot count), ``"offload"``
            (transformers with accelerate offload), ``"batch"`` (one ``specter_models.Engine``
            of a ``batch`` experiment's system, sized for its largest batch) or
            ``"hf-batch"`` (transformers' batched ``generate``).
        budget_gb: the budget (None: unlimited).
        with_draft: an engine load with the INT4 draft (``lru`` alone loads none).
        policy: the engine cache's replacement policy.
        systems: systems measured on this build, in order.
        routing: record teacher-forced target/draft routing here (the first engine stage
            with a draft).
        depth_sweep: run the depth sweep on this build.
        hot_experts: load with the budget's pinned hot set (specter-models'
            ``choose_hot_experts`` on the run's calibration routing with a draft,
            ``choose_plain_hot_experts`` without one).
        fallback: a draftless load where a speculating system that falls back
            (``EngineSystem.falls_back``) decodes as ``offload``: when ``offload``, measured
            before it at the budget, decoded the first prompt faster in a trial after the
            warm-ups, or (``offload`` not measured) when its warm-up chose K = 0. A stage
            with no systems of its own loads only then.
    """

    kind: str
    budget_gb: float | None
    systems: tuple[str, ...]
    with_draft: bool = True
    policy: str = "predictive"
    routing: bool = False
    depth_sweep: bool = False
    hot_experts: bool = False
    fallback: bool = False


def resolve_budgets(
    requested: tuple[float | None, ...] | None, low: float | None, high: float | None
) -> tuple[float | None, ...]:
    """The budgets to measure: as requested, else the model's low, high and unlimited.

    Args:
        requested: explicit budgets (None entries are unlimited), or None.
        low, high: the model's benchmark budgets (None when it has none).

    Raises:
        ValueError: no explicit budgets for a model without benchmark budgets.
    """
    if requested is not None:
        if not requested:
            raise ValueError("budgets is empty; give at least one (a GB value or 'unlimited').")
        return tuple(dict.fromkeys(requested))
    if low is None or high is None:
        raise ValueError(
            "this model has no benchmark budgets (only the full-size presets do); give them "
            "with --budgets, e.g. --budgets 0.3,0.5,unlimited."
        )
    return (low, high, None)


def _order(budgets: tuple[float | None, ...]) -> list[float | None]:
    """Unlimited first, then from the largest budget to the smallest."""
    return sorted(budgets, key=lambda b: (b is not None, -(b or 0.0)))


def _draft_stages(
    budget: float | None, systems: list[str], *, routing: bool, depth_sweep: bool = False
) -> list[Stage]:
    """The draft loads of ``systems`` at ``budget``: under a budget, the systems with a hot
    set (and the depth sweep, which is ``specter``'s) get a load of their own, first; those
    of them that stage get one after it (a staging buffer is fixed state, which would cost
    the others slots)."""
    if budget is None:
        hot: list[str] = []
        plain = systems
    else:
        hot = [s for s in systems if ENGINE_SYSTEMS[s].hot_experts]
        plain = [s for s in systems if not ENGINE_SYSTEMS[s].hot_experts]
    staged = [s for s in hot if ENGINE_SYSTEMS[s].stream_staging]
    hot = [s for s in hot if s not in staged]
    stages = []
    if hot or (depth_sweep and budget is not None):
        stages.append(
            Stage(
                "engine", budget, tuple(hot), with_draft=True, policy="predictive",
                routing=routing, depth_sweep=depth_sweep, hot_experts=True,
            )
        )  # fmt: skip
        routing = depth_sweep = False
    if staged:
        stages.append(Stage("engine", budget, tuple(staged), hot_experts=True))
    if plain or routing or depth_sweep:
        stages.append(
            Stage(
                "engine", budget, tuple(plain), with_draft=True, policy="predictive",
                routing=routing, depth_sweep=depth_sweep,
            )
        )  # fmt: skip
    return stages


def _draftless_stages(
    budget: float, systems: tuple[str, ...], *, fallback: bool
) -> tuple[list[Stage], list[Stage]]:
    """The draftless loads of ``systems`` at ``budget``, as ``(before the draft's stages,
    after them)``: those with a hot set (``offload``) get a load of their own, then the
    others (``lru`` and the plain variants).

    With ``fallback`` the hot set's load runs first: ``offload`` is the plain arm a
    speculating system's trial is measured against (``BenchRunner._fallback_check``), and a
    system that falls back decodes as ``offload`` on a draftless load after the draft's
    stages."""
    hot = tuple(s for s in systems if ENGINE_SYSTEMS[s].hot_experts)
    plain = tuple(s for s in systems if not ENGINE_SYSTEMS[s].hot_experts)
    before, after = [], []
    if hot:
        (before if fallback else after).append(
            Stage("engine", budget, hot, with_draft=False, policy="lru", hot_experts=True)
        )
    if fallback:
        after.append(
            Stage("engine", budget, (), with_draft=False, policy="lru", hot_experts=True,
                  fallback=True)
        )  # fmt: skip
    if plain:
        after.append(Stage("engine", budget, plain, with_draft=False, policy="lru"))
    return before, after


def plan_stages(config: BenchConfig, budgets: tuple[float | None, ...]) -> list[Stage]:
    """The stages of ``config.experiment`` at ``budgets``, in running order.

    The high budget is the largest finite one (where ablations and the depth sweep run);
    the low budget the smallest (where ``hf-offload`` runs). A routing replay plans the
    engine's stages only (transformers cannot replay a trace).
    """
    exp = config.experiment
    if exp == "batch":
        return _batch_stages(config, budgets)
    finite = [b for b in budgets if b is not None]
    high = max(finite) if finite else None
    low = min(finite) if finite else None
    if exp in ("default", "all", "tpot"):
        tpot = TPOT_SYSTEMS
    elif exp == "ttft":
        tpot = TTFT_SYSTEMS
    elif exp == "ablations":
        tpot = ("specter",)
    else:
        tpot = ()
    if config.systems is not None:
        tpot = tuple(s for s in config.systems if s not in ABLATIONS and s != "hf-offload")
    ablations = (
        ABLATIONS if exp in ("default", "all", "ablations") and config.systems is None
        else tuple(s for s in (config.systems or ()) if s in ABLATIONS)
    )  # fmt: skip
    sweep = exp in ("default", "all", "depth-sweep")
    hot_sweep = exp in ("default", "all", "hot-sweep") and high is not None
    routing = exp in ("default", "all", "routing")
    offload = exp in ("all", "offload") or "hf-offload" in (config.systems or ())
    if config.routing_trace is not None:  # a replay runs on the engine alone
        tpot, offload = tuple(s for s in tpot if s in ENGINE_SYSTEMS), False

    stages: list[Stage] = []
    hf = tuple(s for s in HF_SYSTEMS if s in tpot)
    if hf:
        stages.append(Stage("hf", None, hf))
    # Specter first: under a time limit, the system the targets are about is measured first.
    # Systems named with --systems keep their order (an A/B's arms can run either way round).
    engine_spec = tuple(
        sorted(
            (s for s in tpot if s in ENGINE_SYSTEMS and ENGINE_SYSTEMS[s].needs_draft),
            key=lambda s: config.systems is None and s != "specter",
        )
    )
    # The engine without a draft (``offload``, ``lru``, streamed plain decoding): at a budget,
    # loads of its own, whose slots take the draft's memory.
    draftless = tuple(s for s in tpot if s in ENGINE_SYSTEMS and not ENGINE_SYSTEMS[s].needs_draft)
    falls_back = (
        config.fallback
        and config.depth == "auto"
        and any(ENGINE_SYSTEMS[s].falls_back for s in engine_spec)
    )
    # Ablations and the sweep run at the high budget (unlimited when no finite budget), in a
    # stage of their own after every budget's target systems: under a time limit the cells
    # the targets compare are measured first.
    extras_budget = high
    first_draft_stage = True
    for budget in _order(budgets):
        on_draft = list(engine_spec)
        if budget is None:
            on_draft += draftless  # unlimited: every expert resident, the draft costs no slot
        do_routing = routing and first_draft_stage
        before, after = (
            _draftless_stages(budget, draftless, fallback=falls_back)
            if budget is not None
            else ([], [])
        )
        stages += before
        if on_draft or do_routing:
            stages += _draft_stages(budget, on_draft, routing=do_routing)
            first_draft_stage = False
        stages += after
    extras = [s for s in ablations if s not in engine_spec]
    if extras or sweep:
        stages += _draft_stages(
            extras_budget, extras, routing=routing and first_draft_stage, depth_sweep=sweep
        )
    if hot_sweep:
        stages.append(Stage("hot-sweep", high, ()))
    if offload and low is not None:
        stages.append(Stage("offload", low, ("hf-offload",)))
    return stages


def _batch_stages(config: BenchConfig, budgets: tuple[float | None, ...]) -> list[Stage]:
    """The ``batch`` experiment: one engine stage per (budget, engine system), ``specter``
    first at each budget, then transformers' batched ``generate`` (every weight on the
    device, measured once)."""
    systems = [s for s in BATCH_SYSTEMS if s in (config.systems or BATCH_SYSTEMS)]
    if config.systems is not None:  # named systems keep their order
        systems = [s for s in config.systems if s in BATCH_SYSTEMS]
    stages = []
    for budget in _order(budgets):
        for system in systems:
            if system in ENGINE_SYSTEMS:
                draft = ENGINE_SYSTEMS[system].needs_draft
                stages.append(Stage("batch", budget, (system,), with_draft=draft))
    if "hf" in systems:
        stages.append(Stage("hf-batch", None, ("hf",)))
    return stages
