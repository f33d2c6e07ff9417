"""ExpertStore: block allocation, put/get, pinning fallback, lazy safetensors loading."""

import pytest
import torch
from safetensors.torch import save_file

from specter_cache import ExpertLayout, ExpertStore
from specter_cache.expert_layout import RECORD_ALIGNMENT
from specter_cache.expert_store import TensorSlice


def test_put_get_round_trip(make_store):
    store, ref = make_store(3, 5, seed=3)
    for (layer, e), tensors in ref.items():
        got = store.get(layer, e)
        assert set(got) == set(tensors)
        for name in tensors:
            assert torch.equal(got[name], tensors[name])
        assert store.is_loaded(layer, e)


def test_experts_share_a_few_large_blocks_not_one_allocation_per_tensor(make_store):
    layout = ExpertLayout({"a": ((8, 8), torch.float32), "b": ((8,), torch.float16)})
    record = layout.record_bytes
    store, _ = make_store(3, 5, layout, block_bytes=4 * record)
    assert store.num_blocks == 4  # 15 records, 4 per block
    storages = {
        store.get(layer, e)[n].untyped_storage().data_ptr()
        for layer in range(3)
        for e in range(5)
        for n in ("a", "b")
    }
    assert len(storages) == store.num_blocks
    assert store.reserved_bytes == 15 * record
    assert store.total_bytes == 15 * layout.payload_bytes
    assert store.expert_bytes(1) == layout.payload_bytes
    # Views sit at aligned offsets of their block: every dtype view is legal and DMA-friendly.
    for layer in range(3):
        for e in range(5):
            for t in store.get(layer, e).values():
                assert (t.data_ptr() - t.untyped_storage().data_ptr()) % RECORD_ALIGNMENT == 0


def test_blocks_are_allocated_lazily():
    layout = ExpertLayout({"a": ((16,), torch.float32)})
    store = ExpertStore(2, 4, layout, block_bytes=2 * layout.record_bytes)
    assert store.allocated_bytes == 0
    store.put(1, 3, {"a": torch.ones(16)})
    assert store.allocated_bytes == 2 * layout.record_bytes
    assert not store.is_loaded(0, 0)
    with pytest.raises(KeyError, match="never put"):
        store.get(0, 0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only fallback")
def test_pinning_falls_back_to_plain_memory_and_says_so(make_store):
    store, _ = make_store(1, 2)
    assert store.is_pinned is False
    assert "unavailable" in store.pinning_note
    with pytest.raises(RuntimeError, match="pin_memory=True"):
        make_store(1, 1, pin_memory=True)


def test_pin_memory_false_is_plain_memory(make_store):
    store, _ = make_store(1, 2, pin_memory=False)
    assert not store.is_pinned
    assert store.get(0, 0)["down"].is_pinned() is False
    assert "pin_memory=False" in store.pinning_note


def test_per_layer_layouts():
    small = ExpertLayout({"w": ((2, 2), torch.float16)})
    big = ExpertLayout({"w": ((8, 4), torch.float16)})
    store = ExpertStore(2, 3, [small, big])
    store.put(1, 2, {"w": torch.ones(8, 4, dtype=torch.float16)})
    assert store.expert_bytes(0) == 8
    assert store.expert_bytes(1) == 64
    with pytest.raises(ValueError, match=r"\(8, 4\)"):
        store.put(0, 0, {"w": torch.ones(8, 4, dtype=torch.float16)})
    with pytest.raises(ValueError, match="one per layer"):
        ExpertStore(2, 3, [small])


@pytest.mark.parametrize(
    ("layer", "expert", "match"),
    [(2, 0, "layer"), (-1, 0, "layer"), (0, 7, "expert"), (0, True, "expert"), ("0", 0, "layer")],
)
def test_bad_indices_are_rejected(make_store, layer, expert, match):
    store, _ = make_store(2, 3)
    with pytest.raises(ValueError, match=match):
        store.get(layer, expert)


def _checkpoint(tmp_path, L, E, inter, H, g):
    """A checkpoint laid out as HF MoE models store it: gate, up, down per expert."""
    tensors = {}
    for layer in range(L):
        for e in range(E):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            tensors[f"{p}.gate_proj.weight"] = torch.randn(inter, H, generator=g).to(torch.bfloat16)
            tensors[f"{p}.up_proj.weight"] = torch.randn(inter, H, generator=g).to(torch.bfloat16)
            tensors[f"{p}.down_proj.weight"] = torch.randn(H, inter, generator=g).to(torch.bfloat16)
    # Split over two files like sharded checkpoints.
    keys = sorted(tensors)
    files = [tmp_path / "model-0.safetensors", tmp_path / "model-1.safetensors"]
    save_file({k: tensors[k] for k in keys[::2]}, str(files[0]))
    save_file({k: tensors[k] for k in keys[1::2]}, str(files[1]))
    where = {k: files[0] if i % 2 == 0 else files[1] for i, k in enumerate(keys)}
    return tensors, where


def test_lazy_safetensors_load_concatenates_gate_up_and_converts_dtype(tmp_path):
    L, E, inter, H = 2, 3, 5, 4
    g = torch.Generator().manual_seed(5)
    tensors, where = _checkpoint(tmp_path, L, E, inter, H, g)
    layout = ExpertLayout(
        {"gate_up": ((2 * inter, H), torch.float16), "down": ((H, inter), torch.float16)}
    )
    sources = {}
    for layer in range(L):
        for e in range(E):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            sources[(layer, e, "gate_up")] = [
                TensorSlice(where[f"{p}.gate_proj.weight"], f"{p}.gate_proj.weight"),
                TensorSlice(where[f"{p}.up_proj.weight"], f"{p}.up_proj.weight"),
            ]
            sources[(layer, e, "down")] = (where[f"{p}.down_proj.weight"], f"{p}.down_proj.weight")
    store = ExpertStore.from_safetensors(L, E, layout, sources)
    assert store.allocated_bytes == 0
    assert not any(store.is_loaded(layer, e) for layer in range(L) for e in range(E))
    got = store.get(1, 2)  # reads exactly this expert
    assert [(layer, e) for layer in range(L) for e in range(E) if store.is_loaded(layer, e)] == [
        (1, 2)
    ]
    p = "model.layers.1.mlp.experts.2"
    expect = torch.cat([tensors[f"{p}.gate_proj.weight"], tensors[f"{p}.up_proj.weight"]])
    assert torch.equal(got["gate_up"], expect.to(torch.float16))
    assert torch.equal(got["down"], tensors[f"{p}.down_proj.weight"].to(torch.float16))
    store.load_all()
    for layer in range(L):
        for e in range(E):
            p = f"model.layers.{layer}.mlp.experts.{e}"
            assert torch.equal(store.get(layer, e)["down"], tensors[f"{p}.down_proj.weight"].half())
    store.close()
    assert torch.equal(
        store.get(0, 0)["down"], tensors["model.layers.0.mlp.experts.0.down_proj.weight"].half()
    )


def test_stacked_expert_tensors_are_read_by_index(tmp_path):
    L, E = 2, 4
    g = torch.Generator().manual_seed(6)
    stacked = {f"layers.{layer}.w": torch.randn(E, 3, 2, generator=g) for layer in range(L)}
    path = tmp_path / "stacked.safetensors"
    save_file(stacked, str(path))
    layout = ExpertLayout({"w": ((3, 2), torch.float32)})
    sources = {
        (layer, e, "w"): TensorSlice(path, f"layers.{layer}.w", index=e)
        for layer in range(L)
        for e in range(E)
    }
    store = ExpertStore.from_safetensors(L, E, layout, sources, load=True)
    for layer in range(L):
        for e in range(E):
            assert torch.equal(store.get(layer, e)["w"], stacked[f"layers.{layer}.w"][e])


def test_bad_sources_are_rejected_up_front(tmp_path):
    path = tmp_path / "w.safetensors"
    save_file({"a": torch.zeros(3, 2), "b": torch.zeros(2, 2)}, str(path))
    layout = ExpertLayout({"w": ((3, 2), torch.float32), "v": ((2, 2), torch.float32)})
    with pytest.raises(ValueError, match="lack tensors"):
        ExpertStore.from_safetensors(1, 1, layout, {(0, 0, "w"): (path, "a")})
    with pytest.raises(ValueError, match="layout expects"):
        ExpertStore.from_safetensors(
            1, 1, layout, {(0, 0, "w"): (path, "b"), (0, 0, "v"): (path, "b")}
        )
    with pytest.raises(KeyError, match="no tensor"):
        ExpertStore.from_safetensors(
            1, 1, layout, {(0, 0, "w"): (path, "zz"), (0, 0, "v"): (path, "b")}
        )
    with pytest.raises(KeyError, match="not in the layout"):
        ExpertStore.from_safetensors(1, 1, layout, {(0, 0, "x"): (path, "a")})
    with pytest.raises(TypeError, match="TensorSlice"):
        ExpertStore.from_safetensors(1, 1, layout, {(0, 0, "w"): path, (0, 0, "v"): (path, "b")})
    with pytest.raises(ValueError, match="concatenate"):
        ExpertStore.from_safetensors(
            1,
            1,
            layout,
            {
                (0, 0, "w"): [TensorSlice(path, "a"), TensorSlice(path, "b")],
                (0, 0, "v"): (path, "b"),
            },
        )
