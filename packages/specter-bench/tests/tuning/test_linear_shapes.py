"""A model's linear shapes come from its config, fused projections and fp32 routers
included."""

import pytest
import torch

from specter_bench.tuning.linear_shapes import linear_shapes
from specter_models.engine.model_source import model_config


def _shapes(model):
    return {
        (s.N, s.K, str(s.dtype).removeprefix("torch.")) for s in linear_shapes(model_config(model))
    }


def test_deepseek_v2_lite_has_its_fused_projections_router_and_lm_head():
    shapes = _shapes("deepseek-v2-lite")
    expected = {
        (3648, 2048, "float16"),  # q_proj + kv_a_proj_with_mqa
        (3072, 2048, "float16"),
        (576, 2048, "float16"),
        (4096, 512, "float16"),  # kv_b_proj
        (2048, 2048, "float16"),  # o_proj
        (2816, 2048, "float16"),  # shared experts' gate, up
        (2048, 2816, "float16"),
        (64, 2048, "float32"),  # router
        (21888, 2048, "float16"),  # dense layer's gate_up
        (2048, 10944, "float16"),
        (102400, 2048, "float16"),  # lm_head
    }
    assert expected <= shapes


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("qwen1.5-moe", {(2048, 2048, "float16"), (11264, 2048, "float16"),
                         (2048, 5632, "float16"), (60, 2048, "float32"), (1, 2048, "float32"),
                         (151936, 2048, "float16")}),
        ("phi-3.5-moe", {(4096, 4096, "float16"), (1024, 4096, "float16"),
                         (16, 4096, "float32"), (32064, 4096, "float16")}),
    ],
)  # fmt: skip
def test_the_other_models_shapes(model, expected):
    assert expected <= _shapes(model)


def test_shapes_are_distinct_and_the_dtype_is_the_models():
    shapes = linear_shapes(model_config("tiny-deepseek-v2"), torch.bfloat16)
    keys = [(s.N, s.K, s.dtype) for s in shapes]
    assert len(keys) == len(set(keys))
    assert {s.dtype for s in shapes} == {torch.bfloat16, torch.float32}


def test_an_unknown_model_type_is_refused():
    class Config:
        model_type = "llama"
        hidden_size = 64

    with pytest.raises(ValueError, match="model type 'llama'"):
        linear_shapes(Config())
