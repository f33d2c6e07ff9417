"""SpecController: greedy exactness, KV contract, stop tokens, streaming, observer, errors."""

import pytest
import torch

from spec_fakes import (
    RecordingObserver,
    RolledLogits,
    SharedKVDraft,
    ShiftedDraft,
    TableLM,
    fake_quantized,
    hf_greedy,
    random_table,
    tiny_causal_lm,
)
from specter_spec import (
    AdaptiveDepth,
    AdaptiveDepthConfig,
    HFCausalLM,
    SamplingConfig,
    SpecController,
)

NEW_TOKENS = 24
MODELS = (("llama", 0), ("llama", 1), ("llama", 2), ("qwen2", 3))  # (architecture, seed)
PROMPT_LENGTHS = (1, 4, 9)  # 1: no prefill at all


@pytest.fixture(scope="module")
def tiny_models():
    """Per model: target, fake-quantized draft, prompts, transformers' greedy output."""
    cases = []
    for arch, seed in MODELS:
        target = tiny_causal_lm(seed, arch=arch)
        draft = fake_quantized(target, bits=4)
        gen = torch.Generator().manual_seed(100 + seed)
        prompts = [torch.randint(0, 64, (n,), generator=gen).tolist() for n in PROMPT_LENGTHS]
        references = [hf_greedy(target, prompt, NEW_TOKENS) for prompt in prompts]
        cases.append((target, draft, prompts, references))
    return cases


def _draft_for(kind, target, quantized):
    if kind == "fake-quantized":
        return HFCausalLM(quantized)
    if kind == "equal":
        return HFCausalLM(target)  # same weights, its own cache
    return RolledLogits(HFCausalLM(target))  # argmax never the target's


@pytest.mark.parametrize("depth", [1, 2, 4, 16, 32])
@pytest.mark.parametrize("draft_kind", ["fake-quantized", "equal", "always-wrong"])
def test_greedy_output_equals_target_only_greedy(tiny_models, depth, draft_kind):
    partly_rejected = 0
    for target, quantized, prompts, references in tiny_models:
        for prompt, reference in zip(prompts, references, strict=True):
            controller = SpecController(
                _draft_for(draft_kind, target, quantized), HFCausalLM(target), depth=depth
            )
            result = controller.generate(prompt, NEW_TOKENS)
            assert result.tokens == reference, (draft_kind, depth, prompt)
            assert result.stop_reason == "max_new_tokens"
            iterations = result.stats.iterations
            assert sum(it.committed for it in iterations) == NEW_TOKENS
            assert all(
                it.depth == min(depth, NEW_TOKENS - 1 - done)
                for it, done in zip(iterations, _done_before(iterations), strict=True)
            )
            if draft_kind == "equal":
                assert all(it.accepted == it.depth and it.bonus for it in iterations)
            elif draft_kind == "always-wrong":
                assert all(it.accepted == 0 and it.committed == 1 for it in iterations)
                assert len(iterations) == NEW_TOKENS
            else:
                partly_rejected += sum(0 < it.accepted < it.depth for it in iterations)
    if draft_kind == "fake-quantized" and depth >= 2:
        assert partly_rejected > 0  # the rejection path was really exercised


def _done_before(iterations):
    done = 0
    for it in iterations:
        yield done
        done += it.committed


def test_depth_zero_and_no_draft_is_plain_greedy_decoding(tiny_models):
    target, _, prompts, references = tiny_models[0]
    result = SpecController(None, HFCausalLM(target), depth=0).generate(prompts[1], NEW_TOKENS)
    assert result.tokens == references[1]
    assert all(it.depth == 0 and it.bonus for it in result.stats.iterations)
    assert result.stats.acceptance_rate is None


def test_adaptive_depth_keeps_greedy_output_exact(tiny_models):
    target, quantized, prompts, references = tiny_models[1]
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=8, initial_depth=4, probe_interval=3))
    controller = SpecController(HFCausalLM(quantized), HFCausalLM(target), depth=policy)
    depths = set()
    for prompt, reference in zip(prompts, references, strict=True):
        result = controller.generate(prompt, NEW_TOKENS)
        assert result.tokens == reference
        depths |= {it.depth for it in result.stats.iterations}
    assert len(depths) > 1  # the policy did change K between iterations


# -- KV contract with recording fake models -------------------------------------------------


def _greedy_reference(table_lm, prompt, count):
    tokens = list(prompt)
    for _ in range(count):
        tokens.append(int(table_lm.next_probs(tokens).argmax()))
    return tokens[len(prompt) :]


def _wrong(index):
    # A mix of fully accepted, partly rejected and fully rejected iterations at depth 4.
    return index % 7 == 3 or index % 11 == 0 or 30 <= index <= 33


@pytest.mark.parametrize("draft_kind", ["separate-kv", "shared-kv"])
def test_kv_contract_holds_after_every_iteration(draft_kind):
    target = TableLM(random_table(vocab=11, period=5, seed=0))
    draft = (
        ShiftedDraft(target, _wrong)
        if draft_kind == "separate-kv"
        else SharedKVDraft(target, _wrong)
    )
    prompt = [1, 2, 3]
    controller = SpecController(draft, target, depth=4)
    stream = controller.stream(prompt, 48)
    for _ in stream:
        # Tokens are yielded after their iteration committed: the contract holds here.
        committed = stream.tokens
        assert target.kv == committed[:-1]  # exactly the committed tokens but the last
        if draft_kind == "separate-kv":
            assert draft.kv == committed[: len(draft.kv)]  # a committed prefix, nothing rejected
            assert len(draft.kv) <= len(committed) - 1
        else:
            assert draft.scratch == []  # scratch dropped
            assert draft.kv_length == target.kv_length
    kinds = {
        "all accepted"
        if it.accepted == it.depth
        else "none accepted"
        if it.accepted == 0
        else "some"
        for it in stream.stats.iterations
    }
    assert kinds == {"all accepted", "none accepted", "some"}
    assert stream.new_tokens == _greedy_reference(target, prompt, 48)


def test_separate_kv_draft_catches_up_after_a_fully_accepted_iteration():
    target = TableLM(random_table(vocab=9, period=4, seed=1))
    draft = ShiftedDraft(target, lambda index: False)  # everything accepted
    SpecController(draft, target, depth=3).generate([5, 6], 12)
    # Prefill [5], then each iteration feeds the tokens the draft has not cached:
    # after a fully accepted iteration that is the last proposal plus the bonus token.
    starts = [start for start, _ in draft.calls]
    fed = [len(tokens) for _, tokens in draft.calls]
    assert starts[0] == 0
    assert fed[0] == 1  # the draft's prefill: the prompt but its last token
    assert fed[1] == 1  # first iteration: only the last prompt token
    assert fed[4] == 2  # second iteration: d3 of the first iteration and its bonus token
    assert all(start == sum(fed[:i]) for i, start in enumerate(starts))


class _NoTruncate(TableLM):
    def truncate(self, length):
        pass


def test_target_that_keeps_a_rejected_suffix_breaks_the_contract_loudly():
    target = _NoTruncate(random_table(vocab=7, period=3, seed=2))
    draft = ShiftedDraft(TableLM(target.table), lambda index: True)
    with pytest.raises(RuntimeError, match="KV contract broken after commit: the target holds"):
        SpecController(draft, target, depth=3).generate([1, 2], 8)


def test_draft_that_keeps_a_rejected_suffix_breaks_the_contract_loudly():
    target = TableLM(random_table(vocab=7, period=3, seed=2))

    class Draft(ShiftedDraft):
        def truncate(self, length):
            pass

    with pytest.raises(RuntimeError, match="the draft holds"):
        SpecController(Draft(target, lambda index: True), target, depth=3).generate([1, 2], 8)


# -- stop tokens and budgets -------------------------------------------------------------------


def _accept_all_pair(seed=3):
    target = TableLM(random_table(vocab=13, period=5, seed=seed))
    return ShiftedDraft(target, lambda index: False), target


def test_stop_token_inside_accepted_prefix_ends_generation_there():
    draft, target = _accept_all_pair()
    prompt = [4]
    reference = _greedy_reference(target, prompt, 30)
    stop_index = next(i for i in range(2, 30) if reference[i] not in reference[:i])
    stop = reference[stop_index]
    result = SpecController(draft, target, depth=8).generate(prompt, 30, stop_token_ids=[stop])
    assert result.tokens == reference[: stop_index + 1]
    assert result.stop_reason == "stop_token"
    last = result.stats.iterations[-1]
    assert last.accepted == last.depth  # the stop token was an accepted proposal ...
    assert last.committed < last.accepted + 1  # ... and the rest of the prefix was dropped
    assert target.kv == prompt + result.tokens[:-1]
    assert draft.kv == (prompt + result.tokens)[: len(draft.kv)]


def test_stop_token_as_correction_token():
    target = TableLM(random_table(vocab=13, period=5, seed=4))
    draft = ShiftedDraft(target, lambda index: True)  # every token is a correction
    prompt = [2, 7]
    reference = _greedy_reference(target, prompt, 20)
    stop_index = next(i for i in range(3, 20) if reference[i] not in reference[:i])
    result = SpecController(draft, target, depth=2).generate(
        prompt, 20, stop_token_ids=[reference[stop_index]]
    )
    assert result.tokens == reference[: stop_index + 1]
    assert result.stop_reason == "stop_token"
    assert result.stats.iterations[-1].correction


def test_stop_token_in_the_prompt_does_not_stop_generation():
    draft, target = _accept_all_pair(seed=5)
    prompt = [6, 2]
    reference = _greedy_reference(target, prompt, 16)
    result = SpecController(draft, target, depth=3).generate(prompt, 16, stop_token_ids=[2])
    expected = reference[: reference.index(2) + 1] if 2 in reference else reference
    assert result.tokens == expected
    assert len(result.tokens) >= 1


def test_budget_caps_depth_and_output_length():
    draft, target = _accept_all_pair()
    result = SpecController(draft, target, depth=8).generate([1, 2, 3], 5)
    assert len(result.tokens) == 5
    assert [it.depth for it in result.stats.iterations] == [4]  # min(8, 5 - 1)
    assert SpecController(draft, target, depth=8).generate([1], 0).tokens == []
    one = SpecController(draft, target, depth=8).generate([1], 1)
    assert len(one.tokens) == 1
    assert one.stats.iterations[0].depth == 0


# -- streaming and observer --------------------------------------------------------------------


def test_observer_sees_every_phase_in_order():
    target = TableLM(random_table(vocab=11, period=5, seed=6))
    observer = RecordingObserver()
    controller = SpecController(ShiftedDraft(target, _wrong), target, cache=observer, depth=3)
    stats = controller.generate([1, 2, 3], 25).stats
    expected = []
    for it in stats.iterations:
        expected.append(("draft_start", it.depth))
        expected += [("draft_token", i) for i in range(it.depth)]
        expected += [("verify_start", it.depth + 1), ("verify_end", it.accepted)]
    assert observer.events == expected


# -- bad input -------------------------------------------------------------------------------


def _pair():
    target = TableLM(random_table(vocab=5, period=2, seed=7))
    return ShiftedDraft(target, lambda index: False), target


@pytest.mark.parametrize(
    ("depth", "error", "match"),
    [
        (-1, ValueError, "depth must be >= 0"),
        (1.5, TypeError, "got 1.5 of type float"),
        (True, TypeError, "got True"),
        ("4", TypeError, "got '4'"),
    ],
)
def test_bad_depth_is_a_clear_error(depth, error, match):
    draft, target = _pair()
    with pytest.raises(error, match=match):
        SpecController(draft, target, depth=depth)


def test_bad_construction_is_a_clear_error():
    draft, target = _pair()
    with pytest.raises(ValueError, match="draft is None"):
        SpecController(None, target, depth=2)
    with pytest.raises(TypeError, match="target model str does not follow the SpecModel protocol"):
        SpecController(draft, "model", depth=2)
    with pytest.raises(TypeError, match="missing on_draft_token, on_verify_start, on_verify_end"):
        SpecController(draft, target, cache=type("C", (), {"on_draft_start": print})())
    with pytest.raises(TypeError, match="SamplingConfig"):
        SpecController(draft, target, sampling={"temperature": 1.0})
    with pytest.raises(ValueError, match="same object"):
        SpecController(target, target)


@pytest.mark.parametrize(
    ("prompt", "max_new", "stop", "error", "match"),
    [
        ([], 4, (), ValueError, "empty"),
        (torch.zeros(2, 3, dtype=torch.long), 4, (), ValueError, "batch size one"),
        (torch.zeros(3), 4, (), TypeError, "integer token ids"),
        ([1, 2], -1, (), ValueError, "max_new_tokens must be >= 0"),
        ([1, 2], 2.0, (), TypeError, "max_new_tokens must be an int"),
        ([1, 2], 4, ["a"], TypeError, "stop_token_ids"),
    ],
)
def test_bad_generate_arguments_are_clear_errors(prompt, max_new, stop, error, match):
    draft, target = _pair()
    with pytest.raises(error, match=match):
        SpecController(draft, target).generate(prompt, max_new, stop)


def test_policy_choosing_a_negative_depth_is_a_clear_error():
    draft, target = _pair()

    class Broken:
        def choose_depth(self):
            return -2

        def observe(self, iteration):
            pass

    with pytest.raises(ValueError, match="the depth policy's choice must be >= 0"):
        SpecController(draft, target, depth=Broken()).generate([1, 2], 4)


class _RowCuttingTarget(TableLM):
    """A target that, when allowed, verifies only its first ``keep`` rows: the rest of its
    logits are garbage (what a miss-aware truncation leaves there)."""

    allow_row_truncation = False

    def __init__(self, table, keep: int) -> None:
        super().__init__(table)
        self.keep = keep
        self.verified_rows = None
        self.allowed_at: list[tuple[int, int, bool]] = []  # (start, rows, allowed)

    def forward(self, input_ids, start_pos):
        logits = super().forward(input_ids, start_pos)
        rows = input_ids.shape[1]
        self.allowed_at.append((start_pos, rows, self.allow_row_truncation))
        self.verified_rows = None
        if self.allow_row_truncation and rows > self.keep:
            logits = logits.clone()
            logits[0, self.keep :] = torch.randn_like(logits[0, self.keep :]) * 100
            self.verified_rows = self.keep
        return logits


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_a_target_verifying_leading_rows_only_keeps_greedy_output(keep):
    table = random_table(vocab=11, period=5, seed=4)
    target = _RowCuttingTarget(table, keep)
    draft = ShiftedDraft(TableLM(table), lambda index: index % 7 == 0)
    prompt = [3, 1, 4, 1]
    result = SpecController(draft, target, depth=4).generate(prompt, 30)
    assert result.tokens == _greedy_reference(TableLM(table), prompt, 30)
    prefill, *verifies = target.allowed_at
    assert prefill == (0, len(prompt) - 1, False)  # a prefill is never offered for cutting
    assert all(allowed for *_, allowed in verifies)
    assert not target.allow_row_truncation  # reset after each verification
    for it in result.stats.iterations:
        assert it.verified == min(it.depth, keep - 1)
        assert it.accepted <= it.verified
        assert it.bonus == (it.accepted == it.verified)
        assert it.as_dict()["verified"] == it.verified


def test_sampling_controllers_never_allow_row_truncation():
    table = random_table(vocab=11, period=5, seed=4)
    target = _RowCuttingTarget(table, keep=1)
    draft = ShiftedDraft(TableLM(table), lambda index: False)
    controller = SpecController(draft, target, depth=3, sampling=SamplingConfig(temperature=1.0))
    result = controller.generate([2, 7], 12, generator=torch.Generator().manual_seed(0))
    assert not any(allowed for *_, allowed in target.allowed_at)
    assert all(it.verified == it.depth for it in result.stats.iterations)


class _PrefillingLM(TableLM):
    """A TableLM with the optional ``prefill``: the same KV as ``forward``, no logits."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefills: list[tuple[int, list[int]]] = []

    def prefill(self, input_ids, start_pos):
        self.prefills.append((start_pos, input_ids[0].tolist()))
        self.forward(input_ids, start_pos)
        self.calls.pop()  # counted as a prefill, not a forward


class _PrefillingDraft(ShiftedDraft, _PrefillingLM):
    pass


@pytest.mark.parametrize("depth", [0, 3])
def test_prompts_go_through_prefill_where_a_model_has_it(depth):
    table = random_table(vocab=11, period=5, seed=4)
    prompt = [1, 2, 3, 4, 5]
    reference = SpecController(None, TableLM(table), depth=0).generate(prompt, 20).tokens
    target = _PrefillingLM(table)
    draft = _PrefillingDraft(target, _wrong) if depth else None
    result = SpecController(draft, target, depth=depth).generate(prompt, 20)
    assert result.tokens == reference
    assert target.prefills == [(0, prompt[:-1])]
    assert all(start > 0 for start, _ in target.calls)  # every forward came after the prompt
    if draft is not None:
        assert draft.prefills == [(0, prompt[:-1])]
        assert all(start > 0 for start, _ in draft.calls)


class _ArgmaxLM(TableLM):
    """A TableLM with the optional ``argmax``: counts its calls and returns ``torch.argmax``'s
    tokens, or ``pick`` everywhere when given (to see whose argmax chose the tokens)."""

    def __init__(self, *args, pick: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.argmax_rows = 0
        self.pick = pick

    def argmax(self, logits):
        self.argmax_rows += logits[..., 0].numel()
        if self.pick is None:
            return logits.argmax(dim=-1)
        return torch.full(logits.shape[:-1], self.pick, dtype=torch.long)


class _ArgmaxDraft(ShiftedDraft, _ArgmaxLM):
    pass


@pytest.mark.parametrize("depth", [0, 3])
def test_greedy_tokens_come_from_a_models_own_argmax(depth):
    table = random_table(vocab=11, period=5, seed=4)
    prompt = [1, 2, 3]
    reference = SpecController(None, TableLM(table), depth=0).generate(prompt, 20).tokens
    target = _ArgmaxLM(table)
    draft = _ArgmaxDraft(target, _wrong) if depth else None
    result = SpecController(draft, target, depth=depth).generate(prompt, 20)
    assert result.tokens == reference
    iterations = result.stats.iterations
    assert target.argmax_rows == sum(it.verified + 1 for it in iterations)  # every row verified
    if draft is not None:
        assert draft.argmax_rows == sum(it.depth for it in iterations)  # one a proposal
    # A model's argmax decides: one that always answers 7 makes every new token 7.
    stubborn = _ArgmaxLM(table, pick=7)
    assert set(SpecController(None, stubborn, depth=0).generate(prompt, 6).tokens) == {7}


def test_sampling_never_calls_a_models_argmax():
    table = random_table(vocab=11, period=5, seed=4)
    target = _ArgmaxLM(table)
    draft = _ArgmaxDraft(target, _wrong)
    controller = SpecController(draft, target, depth=3, sampling=SamplingConfig(temperature=1.0))
    controller.generate([2, 7], 12, generator=torch.Generator().manual_seed(0))
    assert target.argmax_rows == draft.argmax_rows == 0


def test_an_argmax_that_is_not_callable_is_refused():
    target = TableLM(random_table(vocab=11, period=5, seed=4))
    target.argmax = 3
    with pytest.raises(TypeError, match=r"TableLM.argmax must be callable .* got int"):
        SpecController(None, target, depth=0)
