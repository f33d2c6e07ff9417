"""profile_depth on a synthetic cost model driven by a virtual clock."""

import pytest

from spec_fakes import RecordingObserver, ShiftedDraft, TableLM, VirtualClock, random_table
from specter_spec import SpecController, profile_depth

DRAFT_COST = 0.3  # seconds per draft forward
VERIFY_FIXED, VERIFY_PER_TOKEN = 1.0, 0.3  # verify of n rows: 1.0 + 0.3 n
COLD_PENALTY = 100.0  # first decode-time forward of fresh models (think: compilation)
DEPTHS = [0, 1, 2, 3, 4, 6, 8, 12, 16]
PROMPTS = [[1, 2, 3], [4] * 7, [5, 6] * 6]
NEW_TOKENS = 40


def _wrong(index):
    return index % 7 == 2 or index % 5 == 0


def _simulated_tpot(depth, prompt_len):
    """The controller's loop, replayed on paper: greedy, deterministic acceptance."""
    n, generated, seconds = prompt_len, 0, 0.0
    while generated < NEW_TOKENS:
        k = min(depth, NEW_TOKENS - generated - 1)
        accepted = 0
        while accepted < k and not _wrong(n + accepted):
            accepted += 1
        count = min(accepted + 1, NEW_TOKENS - generated)
        seconds += k * DRAFT_COST + VERIFY_FIXED + VERIFY_PER_TOKEN * (k + 1)
        n += count
        generated += count
    return seconds / NEW_TOKENS


def _factory(table, made):
    def make(depth):
        clock = VirtualClock()
        cold = {"target": True, "draft": True}

        def cost(role, base):
            def charge(tokens, start_pos):
                penalty = 0.0
                if cold[role] and start_pos > 0:  # past the prefill, which TPOT excludes
                    penalty, cold[role] = COLD_PENALTY, False
                return penalty + base(tokens)

            return charge

        target = TableLM(
            table, clock=clock, cost=cost("target", lambda t: VERIFY_FIXED + VERIFY_PER_TOKEN * t)
        )
        draft = ShiftedDraft(target, _wrong, clock=clock, cost=cost("draft", lambda t: DRAFT_COST))
        made.append(depth)
        return SpecController(draft, target, depth=depth, clock=clock)

    return make


def test_profiler_picks_the_true_best_depth_and_excludes_warm_up():
    table = random_table(vocab=17, period=6, seed=0)
    made, resets = [], []
    profile = profile_depth(
        _factory(table, made),
        PROMPTS,
        DEPTHS,
        max_new_tokens=NEW_TOKENS,
        warmup=1,
        repeats=2,
        reset=lambda: resets.append(1),
    )
    truth = {d: sum(_simulated_tpot(d, len(p)) for p in PROMPTS) / len(PROMPTS) for d in DEPTHS}
    best = min(DEPTHS, key=lambda d: (truth[d], d))
    assert best not in (DEPTHS[0], DEPTHS[-1])  # an interior optimum: the sweep matters
    assert profile.best_depth == best
    for depth in DEPTHS:
        # Cold penalties fell in warm-up runs only: measured equals the cost model.
        assert profile.mean_tpot_s[depth] == pytest.approx(truth[depth], rel=1e-9)
        assert len(profile.tpot_s[depth]) == len(PROMPTS) * 2
    assert sorted(made) == DEPTHS  # one controller per depth
    assert len(resets) == len(DEPTHS) * (1 + len(PROMPTS) * 2)  # before every run
    assert profile.acceptance_rate[0] is None
    assert 0 < profile.acceptance_rate[4] < 1
    assert profile.as_dict()["best_depth"] == best


def test_without_warm_up_the_cold_start_is_measured():
    table = random_table(vocab=17, period=6, seed=0)
    profile = profile_depth(_factory(table, []), PROMPTS, [2], max_new_tokens=NEW_TOKENS, warmup=0)
    truth = sum(_simulated_tpot(2, len(p)) for p in PROMPTS) / len(PROMPTS)
    # The penalty lands in the first run's decode: warmup=1 above really excluded it.
    cold_share = 2 * COLD_PENALTY / NEW_TOKENS / len(PROMPTS)
    assert profile.mean_tpot_s[2] == pytest.approx(truth + cold_share, rel=1e-9)


def test_draft_target_pair_form_uses_the_given_cache():
    target = TableLM(random_table(vocab=9, period=3, seed=1))
    draft = ShiftedDraft(target, _wrong)
    observer = RecordingObserver()
    profile = profile_depth(
        (draft, target), [[1, 2]], [0, 3], max_new_tokens=8, warmup=0, cache=observer
    )
    assert profile.best_depth in (0, 3)
    assert ("draft_start", 3) in observer.events
    assert ("draft_start", 0) in observer.events


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"candidate_depths": []}, ValueError, "candidate_depths is empty"),
        ({"candidate_depths": [2, -1]}, ValueError, "must be >= 0"),
        ({"candidate_depths": [1.5]}, TypeError, "must be an int"),
        ({"prompts": []}, ValueError, "prompts is empty"),
        ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be an int >= 1"),
        ({"repeats": 0}, ValueError, "repeats must be an int >= 1"),
        ({"warmup": -1}, ValueError, "warmup must be an int >= 0"),
        ({"models": "draft and target"}, TypeError, r"\(draft, target\) pair"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, error, match):
    target = TableLM(random_table(vocab=5, period=2, seed=2))
    arguments = {
        "models": (ShiftedDraft(target, _wrong), target),
        "prompts": [[1]],
        "candidate_depths": [1, 2],
        **kwargs,
    }
    models = arguments.pop("models")
    prompts = arguments.pop("prompts")
    depths = arguments.pop("candidate_depths")
    with pytest.raises(error, match=match):
        profile_depth(models, prompts, depths, **arguments)
