"""files: conversion through the runner (which names the pre-tokenizer), quantization, and
what each GGUF records of its origin."""

import json

import pytest

from llama_cpp_fakes import calls, make_build, make_source
from specter_bench.checkpoint_tokenizer import TOKENIZER_MARKER
from specter_bench.llama_cpp.files import (
    check_free_disk,
    convert_checkpoint,
    quantize_gguf,
    read_origin,
    tokenizer_copy,
)
from specter_bench.llama_cpp.gguf_file import read_gguf
from specter_bench.llama_cpp.invocations import LlamaCppError, LlamaCppTree
from specter_models.checkpoint_writer import write_random_checkpoint


@pytest.fixture
def tree(tmp_path):
    return LlamaCppTree(make_source(tmp_path / "src"), make_build(tmp_path / "build"))


@pytest.fixture
def checkpoint(tmp_path):
    folder = tmp_path / "tiny-qwen2-moe"
    write_random_checkpoint("tiny-qwen2-moe", folder, seed=1, device="cpu")
    (folder / "tokenizer.json").write_text("{}")
    marker = {"llama_cpp_pre_tokenizer": "gpt-2", "sha256": "abc"}
    (folder / TOKENIZER_MARKER).write_text(json.dumps(marker))
    return folder


def test_convert_names_the_pre_tokenizer_and_records_the_origin(tree, checkpoint, tmp_path):
    out = tmp_path / "models" / "m-f16.gguf"
    convert_checkpoint(tree, checkpoint, "f16", out, log_dir=tmp_path / "logs", say=lambda _: None)
    # The fake converter refuses unknown tokenizers unless the runner named the pre-tokenizer.
    assert out.read_bytes().endswith(b"pre=gpt-2")
    assert read_gguf(out).architecture == "deepseek2"
    origin = read_origin(out)
    assert origin["weights"] == "f16"
    assert origin["checkpoint"]["preset"] == "tiny-qwen2-moe"
    assert origin["checkpoint"]["seed"] == 1
    assert origin["tokenizer"]["sha256"] == "abc"
    assert tokenizer_copy(out) is not None
    assert not out.with_name(out.name + ".partial").exists()
    with pytest.raises(FileExistsError, match="exists"):
        convert_checkpoint(tree, checkpoint, "f16", out, log_dir=tmp_path / "logs")


def test_a_failed_conversion_leaves_no_file_that_looks_finished(tree, checkpoint, tmp_path):
    (checkpoint / TOKENIZER_MARKER).unlink()  # no name given: the converter refuses it
    out = tmp_path / "m-f16.gguf"
    with pytest.raises(LlamaCppError, match="pre-tokenizer was not recognized"):
        convert_checkpoint(tree, checkpoint, "f16", out, log_dir=tmp_path / "logs")
    assert not out.exists()
    with pytest.raises(FileNotFoundError, match=r"holds no config\.json"):
        convert_checkpoint(tree, tmp_path, "f16", out, log_dir=tmp_path / "logs")


def test_quantize_copies_the_origin_with_the_new_type(tree, checkpoint, tmp_path):
    f16 = tmp_path / "m-f16.gguf"
    convert_checkpoint(tree, checkpoint, "f16", f16, log_dir=tmp_path, say=lambda _: None)
    q8 = tmp_path / "m-q8_0.gguf"
    quantize_gguf(tree, f16, "q8_0", q8, log_dir=tmp_path, threads=4, say=lambda _: None)
    assert calls(tree.build)[-1].endswith(f"{q8}.partial Q8_0 4")
    origin = read_origin(q8)
    assert origin["weights"] == "q8_0"
    assert origin["quantized_from"] == str(f16)
    assert origin["checkpoint"]["preset"] == "tiny-qwen2-moe"
    assert tokenizer_copy(q8) is not None
    with pytest.raises(FileNotFoundError, match="convert the checkpoint first"):
        quantize_gguf(tree, tmp_path / "none.gguf", "q8_0", tmp_path / "x.gguf", log_dir=tmp_path)


def test_too_little_disk_is_refused_before_starting(tmp_path):
    with pytest.raises(LlamaCppError, match=r"needs about .* GB free at"):
        check_free_disk(tmp_path, 1e18, "the F16 GGUF")
    check_free_disk(tmp_path, 1, "a byte")
