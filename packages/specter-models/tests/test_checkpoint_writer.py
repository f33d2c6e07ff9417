"""checkpoint_writer: a preset's seeded weights on disk load back bit for bit, and the folder
is what save_pretrained writes."""

import json

import pytest
import torch

from model_helpers import TINY_ARCHS, reference_from_checkpoint
from specter_models import (
    Engine,
    EngineConfig,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
)
from specter_models.architecture import ARCHITECTURES
from specter_models.checkpoint import CheckpointFiles
from specter_models.checkpoint_writer import (
    MARKER_FILE,
    checkpoint_key,
    plan_tensors,
    read_marker,
    remove_checkpoint,
    write_random_checkpoint,
)
from specter_models.loader import load_model
from specter_models.reference_model import build_reference_model

PROMPT = [5, 17, 42, 8, 23, 11]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """preset -> a float64 checkpoint of it (seed 3), in several shards."""
    root = tmp_path_factory.mktemp("written")
    for name in TINY_ARCHS:
        write_random_checkpoint(
            name, root / name, seed=3, dtype=torch.float64, device="cpu", max_shard_bytes=300_000
        )
    return {name: root / name for name in TINY_ARCHS}


@pytest.mark.parametrize("preset", TINY_ARCHS)
def test_every_weight_equals_the_in_memory_preset(written, preset):
    in_memory = load_model(preset, device="cpu", dtype=torch.float64, seed=3, slots_per_layer=2)
    loaded = load_model(written[preset], device="cpu", dtype=torch.float64, slots_per_layer=2)
    params = dict(loaded.model.named_parameters())
    for name, param in in_memory.model.named_parameters():
        assert torch.equal(param, params[name]), name
    for layer, module in enumerate(in_memory.experts):
        for e in range(module.num_experts):
            want, got = in_memory.cache.store.get(layer, e), loaded.cache.store.get(layer, e)
            assert all(torch.equal(want[k], got[k]) for k in want), (layer, e)
    ids = torch.tensor([PROMPT])
    assert torch.equal(in_memory.target.forward(ids, 0), loaded.target.forward(ids, 0))


def test_engine_from_the_folder_decodes_the_presets_greedy_tokens(written):
    def engine(model: str) -> Engine:
        config = EngineConfig(
            LoadConfig(model, device="cpu", dtype="float64", weights_seed=3),
            MemoryConfig(slots_per_layer=3, max_seq_len=128),
            KernelConfig(),
            SpeculationConfig(depth=3, depth_memory=False),
        )
        return Engine.from_config(config, calibration_prompt=PROMPT)

    want = engine("tiny-deepseek-v2").generate(PROMPT, max_new_tokens=16, stop_token_ids=[])
    got = engine(str(written["tiny-deepseek-v2"])).generate(
        PROMPT, max_new_tokens=16, stop_token_ids=[]
    )
    assert got.result().token_ids == want.result().token_ids


@pytest.mark.parametrize("preset", TINY_ARCHS)
def test_transformers_reads_the_folder_as_its_own_checkpoint(written, preset):
    reference = build_reference_model(preset, seed=3, device="cpu", dtype=torch.float64)
    from_disk = reference_from_checkpoint(written[preset]).state_dict()
    state = reference.state_dict()
    assert set(state) == set(from_disk)
    for name, tensor in state.items():
        assert torch.equal(tensor, from_disk[name]), name


def test_folder_layout_is_save_pretrained_s(written):
    folder = written["tiny-phimoe"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1
    assert shards[0].endswith(f"-of-{len(shards):05d}.safetensors")
    names = CheckpointFiles(folder).names()
    assert "model.layers.0.block_sparse_moe.experts.7.w3.weight" in names
    assert "model.layers.0.block_sparse_moe.gate.weight" in names
    assert not any(".mlp." in n or n.endswith("gate_up_proj") for n in names)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["PhimoeForCausalLM"]
    assert config["dtype"] == "float64"
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]
    marker = read_marker(folder)
    assert marker["preset"] == "tiny-phimoe"
    assert marker["seed"] == 3
    assert marker["device"] == "cpu"
    assert marker["shards"] == len(shards)


def test_a_single_shard_is_model_safetensors(tmp_path):
    summary = write_random_checkpoint("tiny-qwen2-moe", tmp_path / "one", device="cpu")
    assert summary.shards == 1
    assert summary.dtype == "float16"
    assert (tmp_path / "one" / "model.safetensors").is_file()
    assert not (tmp_path / "one" / "model.safetensors.index.json").exists()
    assert CheckpointFiles(tmp_path / "one").dtype("lm_head.weight") == torch.float16


def test_plan_counts_every_parameter_of_the_full_size_preset():
    specs, config = plan_tensors(
        "deepseek-v2-lite", seed=0, dtype=torch.float16, device="cpu"
    )  # nothing is generated: only shapes
    total = sum(torch.Size(s.shape).numel() for s in specs)
    assert 15.6e9 < total < 15.8e9  # 15.7 B parameters (docs/benchmarking.md)
    assert len({s.key for s in specs}) == len(specs)
    experts = [s for s in specs if ".mlp.experts." in s.key]
    assert len(experts) == 26 * 64 * 3
    assert config.vocab_size == 102400


def test_refuses_a_folder_in_use_and_bad_arguments(tmp_path):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_random_checkpoint("tiny-qwen2-moe", tmp_path / "used", device="cpu")
    with pytest.raises(TypeError, match="dtype must be one of"):
        write_random_checkpoint("tiny-qwen2-moe", tmp_path / "a", dtype=torch.int8)
    with pytest.raises(KeyError, match="no preset named"):
        write_random_checkpoint("no-such-model", tmp_path / "b", device="cpu")
    with pytest.raises(ValueError, match="holds no " + MARKER_FILE):
        remove_checkpoint(tmp_path / "used")
    assert (tmp_path / "used" / "notes.txt").is_file()


def test_remove_checkpoint_deletes_a_written_folder(tmp_path):
    write_random_checkpoint("tiny-qwen2-moe", tmp_path / "gone", device="cpu")
    remove_checkpoint(tmp_path / "gone")
    assert not (tmp_path / "gone").exists()


def test_checkpoint_key_undoes_the_load_renames():
    phimoe = ARCHITECTURES["phimoe"]
    assert (
        checkpoint_key(phimoe, "model.layers.3.mlp.router.weight")
        == "model.layers.3.block_sparse_moe.gate.weight"
    )
    qwen = ARCHITECTURES["qwen2_moe"]
    assert checkpoint_key(qwen, "model.layers.3.mlp.gate.weight") == (
        "model.layers.3.mlp.gate.weight"
    )


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_written_on_cuda_equals_the_engines_cuda_build(tmp_path):
    # CUDA's generator differs from the CPU's: a folder written on the GPU holds what the
    # engine builds there, in float16.
    folder = tmp_path / "cuda"
    summary = write_random_checkpoint("tiny-deepseek-v2", folder, seed=4, device="cuda")
    assert summary.device == "cuda"
    in_memory = load_model("tiny-deepseek-v2", device="cuda", seed=4, slots_per_layer=2)
    loaded = load_model(folder, device="cuda", slots_per_layer=2)
    params = dict(loaded.model.named_parameters())
    for name, param in in_memory.model.named_parameters():
        assert torch.equal(param, params[name]), name
    for layer, module in enumerate(in_memory.experts):
        for e in range(module.num_experts):
            want, got = in_memory.cache.store.get(layer, e), loaded.cache.store.get(layer, e)
            assert all(torch.equal(want[k], got[k]) for k in want), (layer, e)
