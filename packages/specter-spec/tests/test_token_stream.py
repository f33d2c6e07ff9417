"""TokenStream and its prompt: tokens as they are committed, prompts as lists or tensors."""

import pytest
import torch

from spec_fakes import ShiftedDraft, TableLM, random_table
from specter_spec import SpecController
from specter_spec.token_stream import prompt_tensor


def test_stream_yields_tokens_as_they_are_committed():
    target = TableLM(random_table(vocab=11, period=5, seed=5))
    draft = ShiftedDraft(target, lambda index: index % 7 == 3 or index % 11 == 0)
    controller = SpecController(draft, target, depth=3)
    full = controller.generate([3, 1], 20).tokens
    verifies_total = len(target.calls)
    target.calls.clear()
    stream = controller.stream([3, 1], 20)
    seen = []
    first = next(stream)
    assert stream.stop_reason is None
    assert len(target.calls) < verifies_total  # the rest is not computed yet
    seen.append(first)
    seen.extend(stream)
    assert seen == full
    assert stream.result().tokens == full


def test_new_tokens_grow_while_the_stream_runs():
    target = TableLM(random_table(vocab=11, period=5, seed=5))
    stream = SpecController(None, target, depth=0).stream([3, 1], 4)
    assert stream.new_tokens == []
    token = next(stream)
    assert stream.tokens[:2] == [3, 1]
    assert stream.new_tokens == [token]


def test_tensor_prompts_of_both_shapes_give_the_list_prompts_output():
    target = TableLM(random_table(vocab=9, period=4, seed=1))
    draft = ShiftedDraft(target, lambda index: index % 2 == 1)
    controller = SpecController(draft, target, depth=2)
    expected = controller.generate([1, 3, 2], 6).tokens
    assert controller.generate(torch.tensor([1, 3, 2]), 6).tokens == expected
    assert controller.generate(torch.tensor([[1, 3, 2]]), 6).tokens == expected


@pytest.mark.parametrize(
    ("prompt", "error", "match"),
    [
        ([], ValueError, "prompt_ids is empty"),
        (torch.zeros(2, 3, dtype=torch.long), ValueError, r"got \(2, 3\)"),
        (torch.zeros(3), TypeError, "dtype torch.float32"),
        ([1, True], TypeError, "sequence of int token ids"),
    ],
)
def test_bad_prompts_are_refused_naming_the_value(prompt, error, match):
    with pytest.raises(error, match=match):
        prompt_tensor(prompt, None)


def test_a_prompt_tensor_is_int64_on_the_given_device():
    ids = prompt_tensor(torch.tensor([[4, 5]], dtype=torch.int32), torch.device("cpu"))
    assert ids.dtype == torch.long
    assert ids.tolist() == [4, 5]
