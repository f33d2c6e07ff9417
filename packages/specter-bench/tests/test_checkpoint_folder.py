"""checkpoint_folder: weights and tokenizer written together; Specter and the bench read the
folder's tokenizer, not bytes."""

import dataclasses

import pytest
import torch

from specter_bench.checkpoint_folder import is_complete, write_checkpoint_folder
from specter_bench.model_loading import load_tokenizer
from specter_models import presets
from specter_models.checkpoint_writer import read_marker
from specter_models.loader import load_model
from specter_models.tokenizers import ByteTokenizer


@pytest.fixture
def wide_vocab_preset(monkeypatch):
    """A tiny Qwen2-MoE whose vocabulary (400) has room for a byte-level BPE."""
    base = presets.PRESETS["tiny-qwen2-moe"]

    def make_config():
        config = base.make_config()
        config.vocab_size, config.bos_token_id, config.eos_token_id = 400, 399, 399
        return config

    preset = dataclasses.replace(base, name="tiny-wide-vocab", make_config=make_config)
    monkeypatch.setitem(presets.PRESETS, "tiny-wide-vocab", preset)
    return "tiny-wide-vocab"


def test_folder_carries_a_tokenizer_that_every_reader_uses(tmp_path, wide_vocab_preset):
    lines = []
    out = tmp_path / "ckpt"
    written = write_checkpoint_folder(
        wide_vocab_preset, out, seed=2, dtype=torch.float32, device="cpu", say=lines.append
    )
    assert is_complete(out)
    assert not (tmp_path / "ckpt.partial").exists()
    assert written.tokenizer.vocab_size == 400
    assert read_marker(out)["seed"] == 2
    tokenizer = load_tokenizer(str(out), 400)  # what specter bench encodes prompts with
    assert not isinstance(tokenizer, ByteTokenizer)
    assert len(tokenizer) == 400
    loaded = load_model(out, device="cpu", dtype=torch.float32, slots_per_layer=2)
    assert loaded.tokenizer is not None
    assert loaded.tokenizer.encode("def f(x):") == tokenizer.encode("def f(x):")
    assert any(line.startswith("tokenizer: ") for line in lines)


def test_tiny_vocabularies_get_no_tokenizer_and_say_so(tmp_path):
    lines = []
    written = write_checkpoint_folder(
        "tiny-deepseek-v2", tmp_path / "t", device="cpu", say=lines.append
    )
    assert written.tokenizer is None
    assert is_complete(tmp_path / "t")
    assert any("no tokenizer" in line for line in lines)
    assert isinstance(load_tokenizer(str(tmp_path / "t"), 96), ByteTokenizer)


def test_an_interrupted_write_is_replaced_and_a_used_folder_refused(tmp_path):
    (tmp_path / "m.partial").mkdir()
    (tmp_path / "m.partial" / "model-00001-of-00002.safetensors").write_bytes(b"cut")
    write_checkpoint_folder("tiny-qwen2-moe", tmp_path / "m", device="cpu", say=lambda _: None)
    assert is_complete(tmp_path / "m")
    assert not (tmp_path / "m.partial").exists()
    with pytest.raises(FileExistsError, match="not an empty folder"):
        write_checkpoint_folder("tiny-qwen2-moe", tmp_path / "m", device="cpu")
