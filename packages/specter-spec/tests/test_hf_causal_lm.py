"""HFCausalLM: a transformers causal LM behind the SpecModel protocol."""

import inspect
import types

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


def _call_inner(inner, input_ids, position_ids, cache, use_cache):
    """``inner``'s forward with the cache under the keyword this transformers names it."""
    keyword = (
        "cache" if "cache" in inspect.signature(inner.forward).parameters else "past_key_values"
    )
    return inner(
        input_ids=input_ids, position_ids=position_ids, use_cache=use_cache, **{keyword: cache}
    )


class _NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no ``logits_to_keep`` keyword."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, position_ids, past_key_values, use_cache):
        return _call_inner(self.inner, input_ids, position_ids, past_key_values, use_cache)


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


def _tiny_config(transformers, kind, **kwargs):
    return getattr(transformers, kind)(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("kind", "model_class", "kwargs", "match"),
    [
        ("MistralConfig", "MistralForCausalLM", {"sliding_window": 4}, r"sliding_window=4\b"),
        (
            "Qwen2Config",
            "Qwen2ForCausalLM",
            {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
            r"sliding_window=4 and layer types \['sliding_attention'\]",
        ),
    ],
    ids=["mistral", "qwen2-sliding-layers"],
)
def test_sliding_window_models_are_refused_up_front(kind, model_class, kwargs, match):
    transformers = pytest.importorskip("transformers")
    model = getattr(transformers, model_class)(_tiny_config(transformers, kind, **kwargs))
    with pytest.raises(ValueError, match=match) as refused:
        HFCausalLM(model)
    assert "config.sliding_window=None" in str(refused.value)


def test_a_sliding_window_model_loaded_with_full_attention_rolls_back():
    transformers = pytest.importorskip("transformers")
    config = _tiny_config(transformers, "MistralConfig", sliding_window=None)
    torch.manual_seed(0)
    model = transformers.MistralForCausalLM(config).to(torch.float64).eval()
    lm = HFCausalLM(model)
    lm.forward(torch.tensor([list(range(10))]), 0)
    lm.truncate(3)
    logits = lm.forward(torch.tensor([[7, 8]]), 3)[0]
    expected = _full_logits(model, [0, 1, 2, 7, 8])[3:]
    torch.testing.assert_close(logits, expected, rtol=1e-9, atol=1e-9)


class _CacheKeyword(torch.nn.Module):
    """A causal LM whose forward takes the cache as ``cache`` and returns it as ``.cache``."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.calls: list[str] = []

    def forward(self, input_ids, position_ids, use_cache, cache=None):
        self.calls.append("cache")
        out = _call_inner(self.inner, input_ids, position_ids, cache, use_cache)
        returned = getattr(out, "cache", None)
        if returned is None:
            returned = out.past_key_values
        return types.SimpleNamespace(logits=out.logits, cache=returned)


@pytest.mark.parametrize("wrapper", [_CacheKeyword, _NoLogitsToKeep])
def test_the_cache_goes_through_the_keyword_the_model_names(model, wrapper):
    wrapped = wrapper(model)
    lm = HFCausalLM(wrapped)
    tokens = [5, 9, 2, 7]
    lm.forward(torch.tensor([tokens[:3]]), 0)
    logits = lm.forward(torch.tensor([tokens[3:]]), 3)[0]
    assert lm.kv_length == 4
    torch.testing.assert_close(logits, _full_logits(model, tokens)[3:], rtol=1e-9, atol=1e-9)
    if isinstance(wrapped, _CacheKeyword):
        assert wrapped.calls == ["cache", "cache"]
