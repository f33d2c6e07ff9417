"""BatchedSpecController: each sequence decodes what it decodes alone (greedy and seeded
sampling), joins and leaves at step boundaries, and bad inputs fail clearly."""

import pytest
import torch

from spec_fakes import RecordingObserver, SharedKVDraft, ShiftedDraft, TableLM, random_table
from specter_spec import (
    AdaptiveDepth,
    AdaptiveDepthConfig,
    BatchedSpecController,
    BatchFullError,
    SamplingConfig,
    SlotModels,
    SlotRows,
    SpecController,
)

VOCAB = 24
TABLE = random_table(VOCAB, period=7, seed=5)
PROMPTS = [[1], [3, 4, 5, 6], [7, 2], [9, 10, 11, 12, 13, 14, 15], [0, 8, 16]]


def _wrong(index: int) -> bool:
    return index % 3 == 0 or index % 5 == 1


def _slot_models(slots: int, draft_kind: str = "shared"):
    """``slots`` targets, and a draft per slot: sharing its target's KV, or one of its own."""
    targets = [TableLM(TABLE) for _ in range(slots)]
    if draft_kind == "none":
        return None, SlotModels(targets)
    if draft_kind == "shared":
        drafts = [SharedKVDraft(target, _wrong) for target in targets]
    else:
        drafts = [ShiftedDraft(TableLM(TABLE), _wrong) for _ in range(slots)]
    return SlotModels(drafts), SlotModels(targets)


def _alone(prompt, max_new, depth, draft_kind="shared", sampling=None, stop=()):
    draft, target = _slot_models(1, draft_kind)
    controller = SpecController(
        None if draft is None else draft.models[0],
        target.models[0],
        depth=depth,
        sampling=sampling,
    )
    return controller.generate(prompt, max_new, stop)


def _run(controller, limit=500):
    events = []
    for _ in range(limit):
        if not controller.active:
            return events
        events.extend(controller.step())
    raise AssertionError("the batch did not finish")


@pytest.mark.parametrize("batch", [2, 3, 5])
@pytest.mark.parametrize(
    ("depth", "draft_kind"),
    [(3, "shared"), (5, "own"), ("auto", "shared"), (0, "none")],
)
def test_greedy_output_of_each_sequence_is_its_output_alone(batch, depth, draft_kind):
    budgets = [12, 5, 17, 9, 14][:batch]  # the second sequence finishes early
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=6)) if depth == "auto" else depth
    draft, target = _slot_models(batch, draft_kind)
    controller = BatchedSpecController(draft, target, depth=policy)
    ids = [controller.add(p, n) for p, n in zip(PROMPTS, budgets, strict=False)]
    events = _run(controller)
    for seq_id, prompt, budget in zip(ids, PROMPTS, budgets, strict=False):
        alone = _alone(prompt, budget, 0, "none").tokens  # target-only greedy
        seq = controller.sequence(seq_id)
        assert seq.tokens == alone, (seq_id, depth)
        assert seq.finish_reason == "max_new_tokens"
        streamed = [t for e in events if e.seq_id == seq_id for t in e.token_ids]
        assert streamed == alone
        finished = [e for e in events if e.seq_id == seq_id and e.finished]
        assert [e.finish_reason for e in finished] == ["max_new_tokens"]
    # The early finisher left: later steps ran fewer sequences.
    actives = [record.active for record in controller.history]
    assert actives[0] == batch
    assert min(actives) < batch
    if depth == 3:
        assert any(0 < it.accepted < it.depth for s in ids
                   for it in controller.sequence(s).stats.iterations)  # fmt: skip


def test_a_stop_token_ends_one_sequence_and_the_others_go_on():
    reference = _alone(PROMPTS[1], 16, 0, "none").tokens
    stop = reference[3]
    draft, target = _slot_models(3)
    controller = BatchedSpecController(draft, target, depth=4)
    first = controller.add(PROMPTS[0], 16)
    stopped = controller.add(PROMPTS[1], 16, stop_token_ids=[stop])
    third = controller.add(PROMPTS[2], 16)
    _run(controller)
    seq = controller.sequence(stopped)
    assert seq.finish_reason == "stop_token"
    assert seq.tokens == reference[: reference.index(stop) + 1]
    for seq_id, prompt in ((first, PROMPTS[0]), (third, PROMPTS[2])):
        assert controller.sequence(seq_id).tokens == _alone(prompt, 16, 0, "none").tokens


@pytest.mark.parametrize(("depth", "draft_kind"), [(3, "shared"), (2, "own"), (0, "none")])
def test_seeded_sampling_draws_what_each_sequence_draws_alone(depth, draft_kind):
    configs = [
        SamplingConfig(temperature=1.0, seed=3),
        SamplingConfig(temperature=0.7, top_k=5, seed=4),
        SamplingConfig.greedy(),
    ]
    draft, target = _slot_models(3, draft_kind)
    controller = BatchedSpecController(draft, target, depth=depth)
    ids = [
        controller.add(prompt, 15, sampling=config)
        for prompt, config in zip(PROMPTS, configs, strict=False)
    ]
    _run(controller)
    for seq_id, prompt, config in zip(ids, PROMPTS, configs, strict=False):
        alone = _alone(prompt, 15, depth, draft_kind, sampling=config).tokens
        assert controller.sequence(seq_id).tokens == alone


def test_a_sequence_joins_mid_run_and_a_cancelled_one_leaves_at_the_next_step():
    draft, target = _slot_models(2)
    controller = BatchedSpecController(draft, target, depth=3)
    first = controller.add(PROMPTS[0], 20)
    second = controller.add(PROMPTS[1], 20)
    with pytest.raises(BatchFullError, match="all 2 slots hold active sequences"):
        controller.add(PROMPTS[2], 5)
    controller.step()
    kept = list(controller.sequence(second).tokens)
    controller.cancel(second)
    events = controller.step()
    leaving = [e for e in events if e.seq_id == second]
    assert leaving == [type(leaving[0])(second, [], True, "cancelled")]
    assert controller.sequence(second).tokens == kept  # nothing committed after the cancel
    assert controller.active == 1
    joined = controller.add(PROMPTS[3], 11)  # the freed slot
    assert controller.sequence(joined).slot == controller.sequence(second).slot
    _run(controller)
    assert controller.sequence(first).tokens == _alone(PROMPTS[0], 20, 0, "none").tokens
    assert controller.sequence(joined).tokens == _alone(PROMPTS[3], 11, 0, "none").tokens
    controller.cancel(first)  # finished already: nothing changes
    assert controller.sequence(first).finish_reason == "max_new_tokens"


def test_the_observer_sees_one_draft_and_one_verification_per_step():
    observer = RecordingObserver()
    draft, target = _slot_models(2)
    controller = BatchedSpecController(draft, target, cache=observer, depth=3)
    controller.add(PROMPTS[0], 10)
    controller.add(PROMPTS[1], 2)  # drafts at most one proposal
    controller.step()
    accepted = sum(controller.sequence(i).stats.iterations[0].accepted for i in (0, 1))
    assert observer.events == [
        ("draft_start", 3),
        ("draft_token", 0),
        ("draft_token", 1),
        ("draft_token", 2),
        ("verify_start", 4 + 2),
        ("verify_end", accepted),
    ]


def test_the_depth_policy_learns_costs_once_a_step():
    class Recording:
        def __init__(self):
            self.seen = []

        def choose_depth(self):
            return 2

        def observe(self, iteration):
            self.seen.append(iteration)

    policy = Recording()
    draft, target = _slot_models(3)
    controller = BatchedSpecController(draft, target, depth=policy)
    for prompt in PROMPTS[:3]:
        controller.add(prompt, 9)
    controller.step()  # every sequence's first step: no costs
    assert [it.first for it in policy.seen] == [True] * 3
    controller.step()
    timed = [it for it in policy.seen[3:] if not it.first]
    assert len(policy.seen) == 6
    assert [it.depth for it in timed] == [2]


def test_bad_inputs_fail_clearly():
    draft, target = _slot_models(2)
    with pytest.raises(ValueError, match="draft is None but depth=3"):
        BatchedSpecController(None, target, depth=3)
    with pytest.raises(ValueError, match="holds 1 slots and the target 2"):
        BatchedSpecController(_slot_models(1)[0], target, depth=2)
    with pytest.raises(TypeError, match="does not follow the BatchSpecModel protocol"):
        BatchedSpecController(None, TableLM(TABLE), depth=0)
    same = TableLM(TABLE)
    with pytest.raises(ValueError, match="same model object for two slots"):
        SlotModels([same, same])
    controller = BatchedSpecController(draft, target, depth=2)
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        controller.add([], 4)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 0"):
        controller.add([1], -1)
    with pytest.raises(TypeError, match="sampling must be a SamplingConfig"):
        controller.add([1], 3, sampling="greedy")
    with pytest.raises(KeyError, match="no sequence 7"):
        controller.cancel(7)
    assert controller.active == 0  # nothing half-added
    zero = controller.add([1, 2], 0)
    assert controller.step()[0].finish_reason == "max_new_tokens"
    assert controller.sequence(zero).tokens == []


def test_a_slot_that_is_not_rolled_back_breaks_the_kv_contract():
    class NoTruncate(SlotModels):
        def truncate(self, slot, length):
            if length:  # a slot's rollback is ignored
                return
            super().truncate(slot, length)

    targets = NoTruncate([TableLM(TABLE), TableLM(TABLE)])
    drafts = SlotModels([ShiftedDraft(TableLM(TABLE), _wrong) for _ in range(2)])
    controller = BatchedSpecController(drafts, targets, depth=4)
    controller.add(PROMPTS[1], 12)
    with pytest.raises(RuntimeError, match="KV contract broken after commit"):
        _run(controller)


def test_slot_models_run_each_sequence_at_its_own_position():
    targets = SlotModels([TableLM(TABLE), TableLM(TABLE)])
    targets.prefill(1, torch.tensor([[4, 5, 6]]), 0)
    logits = targets.forward_batch(
        [SlotRows(0, torch.tensor([1, 2]), 0), SlotRows(1, torch.tensor([7]), 3)]
    )
    assert logits.shape == (3, VOCAB)
    assert torch.equal(logits[2], TABLE[7, 3])
    assert (targets.kv_length(0), targets.kv_length(1)) == (2, 4)
