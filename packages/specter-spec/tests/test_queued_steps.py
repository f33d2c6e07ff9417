"""Plain (K = 0) steps queued one ahead of their token's read-back (``pipeline_plain``)."""

import pytest
import torch

from spec_fakes import (
    RecordingObserver,
    ShiftedDraft,
    TableLM,
    VirtualClock,
    hf_greedy,
    random_table,
    tiny_causal_lm,
)
from specter_spec import HFCausalLM, SamplingConfig, SpecController
from specter_spec.queued_steps import QueuedPlainStep, TokenReadback
from specter_spec.statistics import IterationStats

VOCAB, PERIOD = 16, 5


class ScriptedDepth:
    """A depth policy that plays a fixed list of depths (then 0) and records what it saw."""

    def __init__(self, depths: list[int]) -> None:
        self.depths = list(depths)
        self.observed: list[IterationStats] = []

    def choose_depth(self) -> int:
        return self.depths.pop(0) if self.depths else 0

    def observe(self, iteration: IterationStats) -> None:
        self.observed.append(iteration)


class OverlapObserver(RecordingObserver):
    """An observer that lets plain steps overlap (or not), recording every phase."""

    def __init__(self, allow: bool) -> None:
        super().__init__()
        self.allow = allow

    def plain_steps_may_overlap(self) -> bool:
        return self.allow


def _table_target(seed: int = 0, **kwargs) -> TableLM:
    return TableLM(random_table(VOCAB, PERIOD, seed, scale=3.0), **kwargs)


def _generate(target, depth, pipeline, *, draft=None, cache=None, stop=(), new=12, **kwargs):
    controller = SpecController(
        draft, target, cache=cache, depth=depth, pipeline_plain=pipeline, **kwargs
    )
    return controller.generate([3, 1, 4], max_new_tokens=new, stop_token_ids=stop)


def _forwards_at_each_token(target: TableLM, pipeline: bool | None, new: int) -> list[int]:
    """Target forwards issued (prefill excluded) when each token reaches the consumer."""
    stream = SpecController(None, target, depth=0, pipeline_plain=pipeline).stream(
        [3, 1, 4], max_new_tokens=new
    )
    return [len(target.calls) - 1 for _ in stream]


def test_plain_steps_are_queued_one_ahead_of_the_token_read():
    queued = _forwards_at_each_token(_table_target(), True, 6)
    # Token i is read (and yielded) after step i + 1 was queued; the last has no successor.
    assert queued == [2, 3, 4, 5, 6, 6]
    in_order = _forwards_at_each_token(_table_target(), False, 6)
    assert in_order == [1, 2, 3, 4, 5, 6]


def test_cpu_default_keeps_plain_steps_in_order():
    assert _forwards_at_each_token(_table_target(), None, 4) == [1, 2, 3, 4]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_queued_greedy_equals_transformers_greedy(seed):
    model = tiny_causal_lm(seed)
    gen = torch.Generator().manual_seed(seed)
    for length in (1, 5):
        prompt = torch.randint(0, 64, (length,), generator=gen).tolist()
        reference = hf_greedy(model, prompt, 10)
        controller = SpecController(None, HFCausalLM(model), depth=0, pipeline_plain=True)
        result = controller.generate(prompt, max_new_tokens=10)
        assert result.tokens == reference
        assert [it.committed for it in result.stats.iterations] == [1] * 10


@pytest.mark.parametrize("new", [1, 2, 3, 7])
def test_queued_steps_stop_at_the_token_budget(new):
    target = _table_target()
    result = _generate(target, 0, True, new=new)
    assert result.tokens == _generate(_table_target(), 0, False, new=new).tokens
    assert len(result.tokens) == new
    assert result.stop_reason == "max_new_tokens"
    assert len(target.calls) - 1 == new  # no step queued past the budget
    assert target.kv_length == 3 + new - 1


def test_a_stop_token_drops_the_step_queued_after_it():
    reference = _generate(_table_target(), 0, False, new=12).tokens
    # The first token (after two) that did not occur before: generation stops right there.
    stop_at = next(i for i in range(2, 12) if reference[i] not in reference[:i])
    stop = reference[stop_at]
    observer = OverlapObserver(allow=True)
    target = _table_target()
    result = _generate(target, 0, True, cache=observer, stop={stop}, new=12)
    assert result.tokens == reference[: stop_at + 1]
    assert result.stop_reason == "stop_token"
    # One step ran past the stop token (it was queued before the stop was read) and its KV
    # is gone again: the target holds every committed token but the last.
    assert len(target.calls) - 1 == stop_at + 2
    assert target.kv_length == 3 + len(result.tokens) - 1
    starts = [e for e in observer.events if e[0] == "draft_start"]
    ends = [e for e in observer.events if e[0] == "verify_end"]
    assert len(starts) == len(ends) == stop_at + 2  # the dropped step's window is closed
    assert len(result.stats.iterations) == stop_at + 1


def test_queued_sampling_draws_the_same_tokens_as_in_order_sampling():
    sampling = SamplingConfig(temperature=1.0, seed=7)
    queued = _generate(_table_target(), 0, True, sampling=sampling, new=20).tokens
    in_order = _generate(_table_target(), 0, False, sampling=sampling, new=20).tokens
    assert queued == in_order
    assert len(set(queued)) > 3  # really sampled, not a constant


@pytest.mark.parametrize("sampling", [None, SamplingConfig(temperature=1.0, seed=3)])
def test_mixed_depths_drain_the_queue_and_keep_the_output(sampling):
    script = [0, 0, 3, 0, 0, 0, 2, 0, 1, 0, 0]
    outputs = []
    for pipeline in (False, True):
        target = _table_target()
        draft = ShiftedDraft(target, wrong=lambda index: index % 4 == 0)
        policy = ScriptedDepth(script)
        result = _generate(
            target, policy, pipeline, draft=draft, sampling=sampling, new=20, check_kv=True
        )
        depths = [it.depth for it in result.stats.iterations]
        assert depths[: len(script)] == script  # one choice per iteration, in order
        assert [it.depth for it in policy.observed] == depths
        assert sum(it.committed for it in result.stats.iterations) == len(result.tokens) == 20
        outputs.append(result.tokens)
    assert outputs[0] == outputs[1]
    if sampling is None:
        reference = _generate(_table_target(), 0, False, new=20).tokens
        assert outputs[1] == reference


def test_an_observer_decides_whether_plain_steps_overlap():
    for observer, overlaps in (
        (OverlapObserver(allow=True), True),
        (OverlapObserver(allow=False), False),
        (RecordingObserver(), False),  # no plain_steps_may_overlap: keep the order
    ):
        target = _table_target()
        stream = SpecController(None, target, cache=observer, depth=0, pipeline_plain=True).stream(
            [3, 1, 4], max_new_tokens=3
        )
        queued = [len(target.calls) - 1 for _ in stream]
        assert queued == ([2, 3, 3] if overlaps else [1, 2, 3])
        # Every plain window is opened and closed, with one row verified.
        events = observer.events
        assert events.count(("draft_start", 0)) == events.count(("verify_end", 0)) == 3
        assert events.count(("verify_start", 1)) == 3


def test_queued_iteration_times_sum_to_the_decode_time():
    clock = VirtualClock()
    target = _table_target(cost=lambda rows, start: 0.010, clock=clock)
    controller = SpecController(None, target, depth=0, clock=clock, pipeline_plain=True)
    stream = controller.stream([3, 1, 4], max_new_tokens=8)
    tokens = list(stream)
    assert len(tokens) == 8
    decode_start = 0.010  # the prefill's forward
    times = [it.total_time_s for it in stream.stats.iterations]
    assert sum(times) == pytest.approx(clock.now - decode_start)
    # The virtual device runs a step per forward call, so in steady state a step's time is
    # one forward (the first also covers the step queued behind it before its read).
    assert times[0] == pytest.approx(0.020)
    assert times[1:-1] == pytest.approx([0.010] * 6)


def test_token_readback_ring_returns_each_slots_token():
    readback = TokenReadback(torch.device("cpu"), slots=3)
    steps = []
    for position, value in enumerate([5, 9, 2, 7]):
        slot, ready = readback.push(torch.tensor([value]))
        assert ready is None  # off CUDA the copy is synchronous
        steps.append(QueuedPlainStep(position=position, slot=slot, ready=ready, queued_at=0.0))
    assert [s.slot for s in steps] == [0, 1, 2, 0]
    assert [readback.read(s) for s in steps[1:]] == [9, 2, 7]


def test_pipeline_plain_must_be_a_bool_or_none():
    with pytest.raises(TypeError, match="pipeline_plain"):
        SpecController(None, _table_target(), depth=0, pipeline_plain="yes")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sampling", [None, SamplingConfig(temperature=1.0, seed=5)])
def test_cuda_queued_steps_equal_in_order_steps(sampling):
    model = tiny_causal_lm(4).to("cuda")
    prompt = [5, 17, 2, 40]
    outputs = []
    for pipeline in (None, False):  # None: on, since the target lives on CUDA
        controller = SpecController(
            None, HFCausalLM(model), depth=0, sampling=sampling, pipeline_plain=pipeline
        )
        assert controller._pipelines_plain_steps(torch.device("cuda")) is (pipeline is None)
        result = controller.generate(prompt, max_new_tokens=16)
        assert len(result.tokens) == 16
        assert all(it.total_time_s > 0 for it in result.stats.iterations)
        outputs.append(result.tokens)
    assert outputs[0] == outputs[1]
    if sampling is None:
        assert outputs[0] == hf_greedy(model, prompt, 16)


def test_queued_steps_after_the_first_of_a_run_are_flagged_pipelined():
    script = [0, 0, 0, 2, 0, 0]
    target = _table_target()
    draft = ShiftedDraft(target, wrong=lambda index: False)
    result = _generate(target, ScriptedDepth(script), True, draft=draft, new=12)
    flags = [(it.depth, it.pipelined) for it in result.stats.iterations]
    # A run's first step found the device idle; the speculative iteration ends the run.
    assert flags[:6] == [(0, False), (0, True), (0, True), (2, False), (0, False), (0, True)]
    in_order = _generate(_table_target(), ScriptedDepth(script), False, draft=draft, new=12)
    assert not any(it.pipelined for it in in_order.stats.iterations)


@pytest.mark.parametrize("pipeline", [True, False])
@pytest.mark.parametrize("script", [[0, 2, 0], [3, 0, 0]])
def test_each_generations_first_iteration_and_only_it_is_flagged_first(pipeline, script):
    target = _table_target()
    draft = ShiftedDraft(target, wrong=lambda index: False)
    policy = ScriptedDepth(script + script)
    controller = SpecController(draft, target, depth=policy, pipeline_plain=pipeline)
    for _ in range(2):  # a second generation's first iteration is first again
        result = controller.generate([3, 1, 4], max_new_tokens=8)
        firsts = [it.first for it in result.stats.iterations]
        assert firsts == [True] + [False] * (len(firsts) - 1)
        assert result.stats.iterations[0].as_dict()["first"] is True
    assert [it.first for it in policy.observed].count(True) == 2
