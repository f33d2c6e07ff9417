"""HFCausalLM: a transformers causal LM behind the SpecModel protocol."""

import pytest
import torch

from spec_fakes import tiny_causal_lm
from specter_spec import HFCausalLM, SpecModel


@pytest.fixture(params=["llama", "qwen2"])
def model(request):
    return tiny_causal_lm(seed=3, arch=request.param)


def _full_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]


def test_follows_the_protocol(model):
    assert isinstance(HFCausalLM(model), SpecModel)


def test_chunked_forwards_equal_one_full_forward(model):
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (12,), generator=gen).tolist()
    lm = HFCausalLM(model)
    pieces, start = [], 0
    for size in (5, 1, 3, 1, 2):
        pieces.append(lm.forward(torch.tensor([tokens[start : start + size]]), start)[0])
        start += size
        assert lm.kv_length == start
    torch.testing.assert_close(torch.cat(pieces), _full_logits(model, tokens), rtol=1e-9, atol=1e-9)


def test_truncate_rolls_back_so_a_different_suffix_sees_no_trace_of_the_old(model):
    gen = torch.Generator().manual_seed(1)
    prefix = torch.randint(0, 64, (6,), generator=gen).tolist()
    rejected = torch.randint(0, 64, (4,), generator=gen).tolist()
    accepted = torch.randint(0, 64, (3,), generator=gen).tolist()
    lm = HFCausalLM(model)
    lm.forward(torch.tensor([prefix + rejected]), 0)
    lm.truncate(len(prefix))
    assert lm.kv_length == len(prefix)
    logits = lm.forward(torch.tensor([accepted]), len(prefix))[0]
    expected = _full_logits(model, prefix + accepted)[len(prefix) :]
    torch.testing.assert_close(logits, expected, rtol=1e-9, atol=1e-9)


def test_truncate_beyond_length_is_a_no_op_and_zero_empties(model):
    lm = HFCausalLM(model)
    lm.truncate(0)
    assert lm.kv_length == 0
    lm.forward(torch.tensor([[1, 2, 3]]), 0)
    lm.truncate(10)
    assert lm.kv_length == 3
    lm.truncate(0)
    assert lm.kv_length == 0
    torch.testing.assert_close(
        lm.forward(torch.tensor([[4, 5]]), 0)[0], _full_logits(model, [4, 5]), rtol=0, atol=0
    )


def test_bad_calls_name_the_problem(model):
    lm = HFCausalLM(model)
    lm.forward(torch.tensor([[1, 2]]), 0)
    with pytest.raises(ValueError, match=r"start_pos=1 but the cache holds 2"):
        lm.forward(torch.tensor([[3]]), 1)
    with pytest.raises(ValueError, match=r"shape \[1, T\]"):
        lm.forward(torch.tensor([3]), 2)
    with pytest.raises(ValueError, match=">= 0"):
        lm.truncate(-1)
    with pytest.raises(TypeError, match="transformers causal LM"):
        HFCausalLM("not a model")


def test_device_is_the_models():
    assert HFCausalLM(tiny_causal_lm(seed=0)).device == torch.device("cpu")


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` keyword."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids, past_key_values, use_cache):
        return self.inner(
            input_ids=input_ids,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )


@pytest.mark.parametrize("wrapped", [False, True], ids=["logits_to_keep", "without-it"])
def test_prefill_writes_forwards_kv_and_skips_the_prompts_logits(model, wrapped):
    gen = torch.Generator().manual_seed(2)
    prompt = torch.randint(0, 64, (9,), generator=gen).tolist()
    head_rows: list[int] = []
    model.lm_head.register_forward_hook(
        lambda module, args, out: head_rows.append(args[0].shape[1])
    )
    lm = HFCausalLM(_NoLogitsToKeep(model) if wrapped else model)
    assert lm.prefill(torch.tensor([prompt[:-1]]), 0) is None
    assert lm.kv_length == len(prompt) - 1
    assert head_rows == [len(prompt) - 1 if wrapped else 1]
    last = lm.forward(torch.tensor([prompt[-1:]]), len(prompt) - 1)[0]
    torch.testing.assert_close(last, _full_logits(model, prompt)[-1:], rtol=1e-9, atol=1e-9)
