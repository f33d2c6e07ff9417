"""load_model() on real checkpoints written by save_pretrained: logits and greedy output equal
transformers' own, per architecture, plus every load error."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, PreTrainedTokenizerFast

import specter_models
from model_helpers import (
    TINY_ARCHS,
    random_prompt,
    reference_from_checkpoint,
    save_tiny_checkpoint,
    speculate_beside_transformers,
    tiny_transformers_model,
)
from specter_models import MemoryBudgetError, plan_memory
from specter_models.loader import load_model


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def _chunked_logits(model, ids: torch.Tensor, cuts: list[int]) -> torch.Tensor:
    """transformers' logits computed in the same row chunks (its own DynamicCache).

    Equal row shapes on both sides: DeepSeek's router runs in float32 even in a float64
    model, so rows computed in different batch shapes may round routing weights apart.
    """
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    bounds = [0, *cuts, ids.shape[1]]
    out = []
    with torch.no_grad():
        for a, b in itertools.pairwise(bounds):
            out.append(model(ids[:, a:b], past_key_values=cache, use_cache=True).logits)
    return torch.cat(out, dim=1)


def test_save_pretrained_writes_original_per_expert_names(checkpoints, arch_name):
    # The real path must read what save_pretrained writes: per-expert tensors, not stacks.
    from specter_models.checkpoint import CheckpointFiles

    names = CheckpointFiles(checkpoints[arch_name]).names()
    assert not any(n.endswith("gate_up_proj") for n in names)
    expected = {
        "tiny-deepseek-v2": "model.layers.1.mlp.experts.0.gate_proj.weight",
        "tiny-qwen2-moe": "model.layers.0.mlp.experts.0.up_proj.weight",
        "tiny-phimoe": "model.layers.0.block_sparse_moe.experts.0.w3.weight",
    }[arch_name]
    assert expected in names


@pytest.mark.parametrize("slots", [8, 3, 1])
def test_target_logits_equal_transformers(checkpoints, arch_name, slots):
    folder = checkpoints[arch_name]
    lm = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=slots)
    reference = reference_from_checkpoint(folder)
    ids = random_prompt(11, lm.config.vocab_size, seed=slots)
    expected = _chunked_logits(reference, ids, [7, 8])
    # Prefill, then two decode steps: the KV cache path as well as the prompt.
    got = torch.cat(
        [
            lm.target.forward(ids[:, :7], 0),
            lm.target.forward(ids[:, 7:8], 7),
            lm.target.forward(ids[:, 8:], 8),
        ],
        dim=1,
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    # One prefill of all rows: equal within float32 rounding of DeepSeek's router.
    torch.testing.assert_close(got, _logits(reference, ids), rtol=1e-5, atol=1e-7)
    assert lm.target.kv_length == 11
    misses = lm.cache.stats()["total"]["misses"]
    assert misses > 0 if slots < 8 else misses == 0  # all-resident loads nothing on demand


@pytest.mark.parametrize("depth", [0, 1, 3, 6])
def test_greedy_speculation_equals_transformers_generate(checkpoints, arch_name, depth):
    folder = checkpoints[arch_name]
    lm = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=3)
    prompt = random_prompt(6, lm.config.vocab_size, seed=depth + 100)
    result, expected = speculate_beside_transformers(lm, folder, prompt, depth, 24)
    assert result.tokens == expected
    if depth:
        stats = result.stats
        assert stats.iterations
        assert all(it.depth <= depth for it in stats.iterations)


def test_speculation_exercises_rejections(checkpoints):
    # The equality above must cover rolled-back suffixes, not only fully accepted drafts.
    lm = load_model(
        checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float64, slots_per_layer=3
    )
    result = lm.generate(random_prompt(5, 96, seed=3)[0].tolist(), 24, depth=4)
    accepted = [it.accepted for it in result.stats.iterations]
    assert any(a < it.depth for a, it in zip(accepted, result.stats.iterations, strict=True))


def test_fp16_kernel_path_is_close_to_float64(checkpoints, arch_name):
    # float16 runs specter-kernels (their torch references on the CPU) end to end.
    folder = checkpoints[arch_name]
    lm = load_model(folder, device="cpu", dtype=torch.float16, slots_per_layer=3)
    reference = reference_from_checkpoint(folder)
    ids = random_prompt(9, lm.config.vocab_size, seed=1)
    expected = _logits(reference, ids)
    got = lm.target.forward(ids, 0).double()
    scale = expected.abs().max()
    assert (got - expected).abs().max() < 0.02 * scale


def test_sharded_checkpoint_loads_like_single_file(tmp_path, checkpoints):
    single = checkpoints["tiny-qwen2-moe"]
    sharded = save_tiny_checkpoint(
        "tiny-qwen2-moe", tmp_path / "sharded", seed=11, max_shard_size="40KB"
    )
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    ids = random_prompt(7, 96, seed=5)
    a = load_model(single, device="cpu", dtype=torch.float64).target.forward(ids, 0)
    b = load_model(sharded, device="cpu", dtype=torch.float64).target.forward(ids, 0)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_stacked_expert_layout_loads(tmp_path):
    # transformers' in-memory names (gate_up_proj [E, 2I, H]) written by another tool.
    model = tiny_transformers_model("tiny-deepseek-v2", seed=4)
    folder = tmp_path / "stacked"
    folder.mkdir()
    model.config.save_pretrained(folder)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["lm_head.weight"] = model.lm_head.weight.detach().clone()
    save_file(state, folder / "model.safetensors")
    lm = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=2)
    ids = random_prompt(6, 96, seed=2)
    model.double().set_experts_implementation("eager")
    torch.testing.assert_close(lm.target.forward(ids, 0), _logits(model, ids), rtol=0, atol=1e-10)


def test_tied_embeddings_and_tokenizer(tmp_path):
    model = tiny_transformers_model("tiny-deepseek-v2", seed=8, tie_word_embeddings=True)
    model.tie_weights()
    folder = tmp_path / "tied"
    model.save_pretrained(folder)
    _tiny_tokenizer(vocab=96).save_pretrained(folder)
    lm = load_model(folder, device="cpu", dtype=torch.float64)
    assert lm.model.lm_head.weight is lm.model.model.embed_tokens.weight
    assert lm.tokenizer is not None
    ids = torch.tensor([lm.tokenizer("a b c")["input_ids"]])
    reference = reference_from_checkpoint(folder)
    torch.testing.assert_close(
        lm.target.forward(ids, 0), _logits(reference, ids), rtol=0, atol=1e-10
    )


def _tiny_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {chr(ord("a") + i): i + 3 for i in range(26)}
    words.update({"<unk>": 0, "<s>": 1, "</s>": 2})
    backend = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    assert len(words) <= vocab
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")


def test_checkpoint_without_tokenizer_has_none(checkpoints):
    assert (
        load_model(checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float32).tokenizer is None
    )


def test_unsupported_model_type_names_the_supported_ones(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ValueError, match="llama") as info:
        load_model(folder, device="cpu")
    for name in ("deepseek_v2", "qwen2_moe", "phimoe"):
        assert name in str(info.value)


def test_unknown_source_and_missing_weights(tmp_path, checkpoints):
    with pytest.raises(ValueError, match="neither a checkpoint folder nor a preset"):
        load_model("no-such-model", device="cpu")
    folder = tmp_path / "config-only"
    shutil.copytree(checkpoints["tiny-qwen2-moe"], folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="no safetensors weights"):
        load_model(folder, device="cpu")


def test_a_missing_path_or_a_file_is_named_as_such(tmp_path):
    missing = tmp_path / "no" / "checkpoint"
    with pytest.raises(ValueError, match=r"no checkpoint folder at .*nothing exists there"):
        load_model(missing, device="cpu")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ValueError, match="is a file, not a checkpoint folder"):
        load_model(weights, device="cpu")
    from specter_models.presets import get_preset

    with pytest.raises(KeyError, match=r"no checkpoint folder at '\./models/dsv2'"):
        get_preset("./models/dsv2")
    with pytest.raises(KeyError, match="no preset named 'dsv3'"):
        get_preset("dsv3")


def test_checkpoint_lacking_an_expert_is_refused(tmp_path):
    model = tiny_transformers_model("tiny-qwen2-moe", seed=3)
    folder = tmp_path / "broken"
    model.save_pretrained(folder)
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    del state["model.layers.1.mlp.experts.5.down_proj.weight"]
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"routed expert 5 of decoder layer 1"):
        load_model(folder, device="cpu", dtype=torch.float32)


def test_checkpoint_with_unknown_tensor_is_refused(tmp_path, checkpoints):
    folder = tmp_path / "extra"
    shutil.copytree(checkpoints["tiny-qwen2-moe"], folder)
    from safetensors.torch import load_file

    state = load_file(folder / "model.safetensors")
    state["model.layers.0.mlp.mystery.weight"] = torch.zeros(3)
    save_file(state, folder / "model.safetensors")
    with pytest.raises(ValueError, match="mystery"):
        load_model(folder, device="cpu", dtype=torch.float32)


def test_budget_too_small_says_what_is_needed(checkpoints):
    with pytest.raises(MemoryBudgetError, match=r"needs at least [0-9.]+ GB") as info:
        load_model(checkpoints["tiny-deepseek-v2"], device="cpu", gpu_memory_gb=0.001)
    message = str(info.value)
    for part in ("non-expert weights", "INT4 draft experts", "KV cache", "buffers", "slot"):
        assert part in message


@pytest.mark.parametrize("slots", [1, 5])
def test_budget_sets_slots(checkpoints, slots):
    folder = checkpoints["tiny-deepseek-v2"]
    config = load_model(folder, device="cpu", dtype=torch.float32).config
    sizing = plan_memory(config, dtype=torch.float32, max_seq_len=64)
    budget = sizing.fixed_bytes + slots * sizing.num_moe_layers * sizing.expert_bytes
    gb = (budget + 10) / 1e9  # a few bytes short of the next slot
    lm = load_model(folder, device="cpu", dtype=torch.float32, gpu_memory_gb=gb, max_seq_len=64)
    plan = lm.memory.plan
    assert plan.slots_per_layer == slots
    assert lm.cache.slots_per_layer == (slots,) * plan.num_moe_layers
    assert plan.expected_peak_bytes <= plan.budget_bytes
    one_byte_short = sizing.fixed_bytes + sizing.num_moe_layers * sizing.expert_bytes - 1
    with pytest.raises(MemoryBudgetError):
        load_model(
            folder,
            device="cpu",
            dtype=torch.float32,
            gpu_memory_gb=one_byte_short / 1e9,
            max_seq_len=64,
        )


def test_conflicting_arguments(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    with pytest.raises(ValueError, match="not both"):
        load_model(folder, device="cpu", gpu_memory_gb=1, slots_per_layer=2)
    with pytest.raises(TypeError, match="dtype"):
        load_model(folder, device="cpu", dtype=torch.int8)


def test_memory_report_and_phases(checkpoints):
    lm = load_model(
        checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float32, slots_per_layer=2
    )
    report = lm.memory.as_dict()
    assert report["host_store_bytes"] >= lm.memory.plan.all_experts_bytes
    load_peaks = report["load"]
    assert load_peaks["host_rss_peak"] >= load_peaks["host_rss_before"] > 0
    assert set(report["load_seconds"]) >= {"non_expert", "experts_and_draft", "cache", "total"}


def test_the_prefetcher_is_warmed_up_once_at_load(checkpoints, monkeypatch):
    from specter_cache import SpeculativePrefetcher

    warmed = []
    warm_up = SpeculativePrefetcher.warm_up
    monkeypatch.setattr(
        SpeculativePrefetcher, "warm_up", lambda self: warmed.append(self) or warm_up(self)
    )
    loaded = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", slots_per_layer=2)
    assert warmed == [loaded.prefetcher]
    assert int(loaded.counter.counts.sum()) == 0  # nothing counted by the warm-up


def test_demo_checkpoint_resolves_or_says_it_is_missing():
    if not (Path(specter_models.__file__).parent / "data" / "specter-code-tiny").is_dir():
        with pytest.raises(FileNotFoundError, match="specter-code-tiny"):
            specter_models.demo_model_path()
        with pytest.raises(FileNotFoundError, match="specter-code-tiny"):
            load_model("specter-code-tiny", device="cpu")
        return
    folder = specter_models.demo_model_path()
    lm = load_model("specter-code-tiny", device="cpu", dtype=torch.float32)
    assert Path(lm.source) == folder
    assert lm.tokenizer is not None


def test_tokenizer_roundtrip_helper():
    # The helper tokenizer above must itself work, or the tokenizer test proves nothing.
    tok = _tiny_tokenizer(96)
    assert tok.decode(tok("a b")["input_ids"]) == "a b"
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert AutoTokenizer is not None


def test_all_presets_listed():
    assert set(TINY_ARCHS) <= set(specter_models.PRESETS)
