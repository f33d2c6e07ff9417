"""StaticKVCache: preallocated rows, rollback by length, and transformers' Cache contract."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from model_helpers import random_prompt, tiny_transformers_model
from specter_models import StaticKVCache


def _cache(layers: int = 2, max_seq_len: int = 16) -> StaticKVCache:
    return StaticKVCache([((2, 4), (2, 3))] * layers, max_seq_len, torch.float64, "cpu")


def test_update_appends_and_returns_the_filled_prefix():
    cache = _cache()
    k1, v1 = (
        torch.randn(1, 2, 5, 4, dtype=torch.float64),
        torch.randn(1, 2, 5, 3, dtype=torch.float64),
    )
    keys, values = cache.update(k1, v1, layer_idx=0)
    assert keys.shape == (1, 2, 5, 4)
    assert values.shape == (1, 2, 5, 3)
    k2, v2 = (
        torch.randn(1, 2, 2, 4, dtype=torch.float64),
        torch.randn(1, 2, 2, 3, dtype=torch.float64),
    )
    keys, values = cache.update(k2, v2, layer_idx=0)
    torch.testing.assert_close(keys, torch.cat([k1, k2], dim=2), rtol=0, atol=0)
    torch.testing.assert_close(values, torch.cat([v1, v2], dim=2), rtol=0, atol=0)
    assert cache.get_seq_length(0) == 7
    assert cache.get_seq_length(1) == 0
    assert cache.get_mask_sizes(3, 0) == (10, 0)


def test_crop_moves_the_length_and_rows_are_rewritten():
    cache = _cache(layers=1)
    rows = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    cache.update(rows, rows[..., :3], layer_idx=0)
    cache.crop_to(2)
    assert cache.length == 2
    new = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    keys, _ = cache.update(new, new[..., :3], layer_idx=0)
    torch.testing.assert_close(keys, torch.cat([rows[:, :, :2], new], dim=2), rtol=0, atol=0)
    cache.crop(-1)  # transformers' spelling: remove one row
    assert cache.length == 4
    cache.crop_to(10)  # beyond the length: no-op
    assert cache.length == 4
    cache.reset()
    assert cache.length == 0


def test_update_refuses_overflow_and_wrong_rows():
    cache = _cache(max_seq_len=4)
    ok = torch.zeros(1, 2, 3, 4, dtype=torch.float64)
    cache.update(ok, ok[..., :3], layer_idx=0)
    with pytest.raises(ValueError, match="max_seq_len=4"):
        cache.update(ok, ok[..., :3], layer_idx=0)
    with pytest.raises(ValueError, match="do not fit the cache rows"):
        cache.update(torch.zeros(1, 3, 1, 4, dtype=torch.float64), ok[:, :, :1, :3], layer_idx=1)
    with pytest.raises(ValueError, match="float32"):
        cache.update(ok.float(), ok[..., :3].float(), layer_idx=1)
    with pytest.raises(ValueError, match=">= 0"):
        cache.crop_to(-1)
    with pytest.raises(ValueError, match="positive"):
        StaticKVCache([((1, 1), (1, 1))], 0, torch.float32, "cpu")


def test_bytes_count_every_buffer():
    cache = _cache(layers=3, max_seq_len=10)
    assert cache.nbytes == 3 * 10 * 2 * (4 + 3) * 8


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_transformers_models_run_on_it_like_on_dynamic_cache(name):
    # The same forwards, crops and rewrites through both caches give the same logits:
    # masks, positions and MLA latents all go through the Cache interface.
    from specter_models import architecture_for

    model = tiny_transformers_model(name, seed=2, dtype=torch.float64)
    model.set_experts_implementation("eager")
    arch = architecture_for(model.config)
    static = StaticKVCache(
        [arch.kv_row_shapes(model.config)] * model.config.num_hidden_layers,
        32,
        torch.float64,
        "cpu",
    )
    dynamic = DynamicCache(config=model.config)
    ids = random_prompt(12, model.config.vocab_size, seed=4)
    steps = [(0, 6), (6, 9), ("crop", 7), (7, 10), (10, 11), ("crop", 8), (8, 12)]
    with torch.no_grad():
        for a, b in steps:
            if a == "crop":
                static.crop_to(b)
                dynamic.crop(b - dynamic.get_seq_length())
                continue
            positions = torch.arange(a, b).unsqueeze(0)
            out = [
                model(ids[:, a:b], position_ids=positions, past_key_values=c, use_cache=True).logits
                for c in (static, dynamic)
            ]
            torch.testing.assert_close(out[0], out[1], rtol=0, atol=1e-12)
    assert static.length == dynamic.get_seq_length() == 12


def test_window_mode_writes_at_device_positions_and_returns_the_window():
    cache = _cache(layers=1, max_seq_len=16)
    first = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    cache.update(first, first[..., :3], layer_idx=0)
    rows = torch.randn(1, 2, 2, 4, dtype=torch.float64)
    with cache.window(8, torch.tensor([5, 6]), end=7):
        keys, values = cache.update(rows, rows[..., :3], layer_idx=0)
        assert cache.get_mask_sizes(2, 0) == (8, 0)
    assert keys.shape == (1, 2, 8, 4)
    assert values.shape == (1, 2, 8, 3)
    torch.testing.assert_close(keys[:, :, :7], torch.cat([first, rows], dim=2), rtol=0, atol=0)
    assert cache.length == 7
    assert cache.get_mask_sizes(1, 0) == (8, 0)  # window mode ended: the filled prefix again


def test_window_mode_refuses_bad_windows_and_rows():
    cache = _cache(layers=1, max_seq_len=16)
    with (
        pytest.raises(ValueError, match="window=4 must hold the 6 filled positions"),
        cache.window(4, torch.tensor([5]), end=6),
    ):
        pass
    with pytest.raises(ValueError, match="max_seq_len=16"), cache.window(32, torch.tensor([5]), 6):
        pass
    rows = torch.zeros(1, 2, 2, 4, dtype=torch.float64)
    with (
        pytest.raises(ValueError, match="2 key rows and 2 value rows for 1 write positions"),
        cache.window(8, torch.tensor([5]), end=6),
    ):
        cache.update(rows, rows[..., :3], layer_idx=0)


def test_set_length_moves_every_layer():
    cache = _cache(layers=3, max_seq_len=16)
    cache.set_length(9)
    assert [layer.length for layer in cache.layers] == [9, 9, 9]
    with pytest.raises(ValueError, match=r"\[0, 16\]"):
        cache.set_length(17)


def test_reserve_hands_out_the_rows_update_would_write():
    # A kernel that writes the rows itself takes them with reserve: the same length moves and
    # the same views as update, in both modes, and no row is written.
    cache = _cache(layers=1, max_seq_len=16)
    layer = cache.layers[0]
    rows, keys, values = layer.reserve(5)
    assert rows == 0
    assert layer.length == 5
    assert keys.data_ptr() == layer.keys.data_ptr()
    assert keys.shape == (1, 2, 5, 4)
    assert values.shape == (1, 2, 5, 3)
    assert (layer.keys == 0).all()
    rows, keys, _ = layer.reserve(3)
    assert rows == 5
    assert keys.shape[2] == 8
    positions = torch.tensor([8, 9])
    with cache.window(12, positions, end=10):
        rows, keys, values = layer.reserve(2)
        assert rows is positions
        assert keys.shape == (1, 2, 12, 4)
        assert values.shape == (1, 2, 12, 3)
        with pytest.raises(ValueError, match="writes 2 positions, got 3 rows"):
            layer.reserve(3)
    assert layer.length == 10
    with pytest.raises(ValueError, match=r"positions 10\.\.16 would overflow"):
        layer.reserve(7)
    assert layer.length == 10  # a refused reserve moves nothing
