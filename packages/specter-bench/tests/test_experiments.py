"""Experiment plans: which systems run at which budgets, in priority order."""

import pytest

from specter_bench.experiments import ABLATIONS, BenchConfig, plan_stages, resolve_budgets


def _stages(**kw):
    config = BenchConfig(model="deepseek-v2-lite", **kw)
    return plan_stages(config, resolve_budgets(config.budgets, 16.0, 24.0))


def test_default_plan_covers_every_system_budget_and_experiment():
    stages = _stages()
    described = [(s.kind, s.budget_gb, s.with_draft, s.hot_experts, s.systems) for s in stages]
    assert described[0] == ("hf", None, True, False, ("hf", "hf-default"))
    # Unlimited first (every system shares the all-resident load: nothing to pin), then
    # 24 GB, then 16 GB: at each, offload's draftless load with its own hot set first (the
    # plain arm specter's adaptive depth is measured against), then specter's hot-set load,
    # the plain draft's, the draftless load where specter falls back (only if it does), and
    # lru's; the ablations and the depth sweep last, at the high budget, split the same way.
    assert described[1] == ("engine", None, True, False, ("specter", "spec-lru", "offload", "lru"))
    for first, budget in ((2, 24.0), (7, 16.0)):
        assert described[first : first + 5] == [
            ("engine", budget, False, True, ("offload",)),
            ("engine", budget, True, True, ("specter",)),
            ("engine", budget, True, False, ("spec-lru",)),
            ("engine", budget, False, True, ()),
            ("engine", budget, False, False, ("lru",)),
        ]
        assert stages[first + 3].fallback  # specter's adaptive depth may fall back here
        others = [*stages[first : first + 3], stages[first + 4]]
        assert not any(s.fallback for s in others)
    hot_ablations = (
        "specter-acquire", "specter-no-prefetch", "specter-token-verify", "specter-row-cut",
        "specter-fill",
    )  # fmt: skip
    assert described[12] == ("engine", 24.0, True, True, hot_ablations)
    # Staging has a load of its own: its buffer is fixed state the others would pay for.
    assert described[13] == ("engine", 24.0, True, True, ("specter-staged",))
    assert described[14] == (
        "engine", 24.0, True, False, ("specter-no-hot", "specter-unfused-draft")
    )  # fmt: skip
    assert set(hot_ablations) | {"specter-staged"} | set(described[14][4]) == set(ABLATIONS)
    assert described[15] == ("hot-sweep", 24.0, True, False, ())
    assert len(stages) == 16  # hf-offload only in "all" / "offload"
    assert [s.routing for s in stages] == [False, True] + [False] * 14
    assert [s.depth_sweep for s in stages] == [False] * 12 + [True, False, False, False]
    assert stages[2].policy == "lru"
    assert stages[3].policy == "predictive"


def test_a_fixed_depth_or_no_specter_plans_no_fallback_load():
    fixed = _stages(experiment="tpot", depth=3, budgets=(24.0,))
    assert [s.systems for s in fixed if not s.with_draft] == [("offload",), ("lru",)]
    assert fixed[0].with_draft  # no trial to measure against: specter first
    assert not any(s.fallback for s in fixed)
    # specter alone with an adaptive depth: an empty draftless load, used only if it falls back
    alone = _stages(experiment="tpot", systems=("specter",), budgets=(24.0,))
    assert [(s.with_draft, s.hot_experts, s.fallback, s.systems) for s in alone] == [
        (True, True, False, ("specter",)),
        (False, True, True, ()),
    ]
    assert not any(s.fallback for s in _stages(experiment="tpot", systems=("lru",)))
    assert not any(s.fallback for s in _stages(experiment="tpot", fallback=False))


def test_the_ttft_experiment_runs_engine_systems_only():
    stages = _stages(experiment="ttft", budgets=(24.0, None))
    assert [(s.budget_gb, s.with_draft, s.systems) for s in stages] == [
        (None, True, ("specter", "offload", "lru")),
        (24.0, False, ("offload",)),
        (24.0, True, ("specter",)),
        (24.0, False, ()),  # where specter falls back, if it does
        (24.0, False, ("lru",)),
    ]
    assert not any(s.routing or s.depth_sweep for s in stages)
    with pytest.raises(ValueError, match="the ttft experiment measures engine systems, not hf"):
        BenchConfig(model="m", experiment="ttft", systems=("hf", "specter"))
    with pytest.raises(ValueError, match="prompt_lengths must be ints >= 2"):
        BenchConfig(model="m", experiment="ttft", prompt_lengths=(1,))


def test_other_experiments():
    offload = _stages(experiment="all")[-1]
    assert (offload.kind, offload.budget_gb, offload.systems) == ("offload", 16.0, ("hf-offload",))
    routing = _stages(experiment="routing")
    assert [(s.kind, s.routing, s.systems) for s in routing] == [("engine", True, ())]
    assert [(s.kind, s.budget_gb) for s in _stages(experiment="hot-sweep")] == [("hot-sweep", 24.0)]
    assert _stages(experiment="hot-sweep", budgets=(None,)) == []  # no budget: nothing to pin
    sweep = _stages(experiment="depth-sweep")
    assert [(s.budget_gb, s.depth_sweep, s.hot_experts, s.systems) for s in sweep] == [
        (24.0, True, True, ())
    ]
    chosen = _stages(experiment="tpot", systems=("lru", "specter"), budgets=(20.0,), depth=2)
    assert [(s.budget_gb, s.with_draft, s.hot_experts, s.systems) for s in chosen] == [
        (20.0, True, True, ("specter",)),
        (20.0, False, False, ("lru",)),
    ]
    # Named systems keep their order in a load they share (an A/B's arms either way round);
    # unnamed, specter comes first.
    swapped = _stages(
        experiment="tpot", systems=("specter-held", "specter"), budgets=(24.0,), depth=2
    )
    assert [s.systems for s in swapped] == [("specter-held", "specter")]
    engine = [s for s in _stages(experiment="tpot", budgets=(24.0,)) if s.kind == "engine"]
    assert engine[0].systems == ("offload",)  # the plain arm of specter's trial, first
    assert engine[1].systems[0] == "specter"
    # The engine without a draft shares lru's draftless load at a budget, and the draft's
    # load at an unlimited one (every expert resident: the draft costs no slot).
    draftless = _stages(
        experiment="tpot", systems=("specter", "lru", "specter-plain-fill"), budgets=(16.0, None),
        depth=2,
    )  # fmt: skip
    assert [(s.budget_gb, s.with_draft, s.systems) for s in draftless] == [
        (None, True, ("specter", "lru", "specter-plain-fill")),
        (16.0, True, ("specter",)),
        (16.0, False, ("lru", "specter-plain-fill")),
    ]
    # The first draft load records the routing, a hot-set one included.
    only = _stages(experiment="default", systems=("specter", "spec-lru"), budgets=(24.0,))
    assert [(s.hot_experts, s.routing, s.systems) for s in only][:2] == [
        (True, True, ("specter",)),
        (False, False, ("spec-lru",)),
    ]


def test_budgets_and_config_are_checked():
    assert resolve_budgets(None, 14.0, 20.0) == (14.0, 20.0, None)
    assert resolve_budgets((8.0, None, 8.0), None, None) == (8.0, None)
    with pytest.raises(ValueError, match="no benchmark budgets"):
        resolve_budgets(None, None, None)
    with pytest.raises(ValueError, match="budgets is empty"):
        resolve_budgets((), 1.0, 2.0)
    with pytest.raises(ValueError, match="unknown experiment 'fast'"):
        BenchConfig(model="m", experiment="fast")
    with pytest.raises(ValueError, match="unknown system 'vllm'"):
        BenchConfig(model="m", systems=("vllm",))
    with pytest.raises(ValueError, match="'specter-plain-pipe' no longer runs; use offload"):
        BenchConfig(model="m", systems=("specter-plain-pipe",))
    with pytest.raises(ValueError, match="runs must be an int >= 1"):
        BenchConfig(model="m", runs=0)
    with pytest.raises(ValueError, match="depth of the speculating systems"):
        BenchConfig(model="m", depth=0)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1"):
        BenchConfig(model="m", max_new_tokens=0)
