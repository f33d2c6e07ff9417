"""gguf_file: a GGUF header's metadata and every tensor's byte size, without its data."""

import pytest

from gguf_samples import F16, F32, Q4_0, Q8_0, deepseek_v2_lite_gguf, write_gguf
from specter_bench.llama_cpp.gguf_file import file_type_name, read_gguf


def test_reads_metadata_and_sizes_each_tensor_by_its_type(tmp_path):
    path = write_gguf(
        tmp_path / "m.gguf",
        {
            "general.architecture": "qwen2moe",
            "general.file_type": 7,
            "qwen2moe.block_count": 24,
            "qwen2moe.rope.freq_base": 1e6,
            "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.merges": ["a b"] * 100,
            "qwen2moe.small_list": [1, 2, 3],
        },
        [
            ("a", (2048, 1408, 60), Q8_0),
            ("b", (2048,), F32),
            ("c", (64, 32), F16),
            ("d", (64, 32), Q4_0),
        ],
    )
    gguf = read_gguf(path)
    assert gguf.architecture == "qwen2moe"
    assert gguf.arch_value("block_count") == 24
    assert gguf.metadata["qwen2moe.rope.freq_base"] == pytest.approx(1e6)
    assert gguf.metadata["tokenizer.ggml.add_bos_token"] is True
    assert gguf.metadata["tokenizer.ggml.merges.length"] == 100  # long arrays: their length
    assert gguf.metadata["qwen2moe.small_list"] == [1, 2, 3]
    assert gguf.file_type == "q8_0"
    sizes = {t.name: t.nbytes for t in gguf.tensors}
    assert sizes == {
        "a": 2048 * 1408 * 60 // 32 * 34,
        "b": 2048 * 4,
        "c": 64 * 32 * 2,
        "d": 64 * 32 // 32 * 18,
    }
    assert gguf.total_bytes == sum(sizes.values())


def test_deepseek_v2_lite_layout_has_its_parameter_count(tmp_path):
    gguf = read_gguf(deepseek_v2_lite_gguf(tmp_path / "dsv2.gguf"))
    assert gguf.vocab_size == 102400
    assert gguf.file_type == "f16"
    # 15.7 B parameters in FP16 (the norms and routers in F32 add a little).
    assert 31.3e9 < gguf.total_bytes < 31.6e9


def test_rejects_what_it_cannot_read(tmp_path):
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        read_gguf(tmp_path / "missing.gguf")
    (tmp_path / "x.bin").write_bytes(b"PK\x03\x04rest")
    with pytest.raises(ValueError, match="not a GGUF file"):
        read_gguf(tmp_path / "x.bin")
    odd = write_gguf(tmp_path / "odd.gguf", {}, [("t", (32,), 99)])
    with pytest.raises(ValueError, match="ggml type 99"):
        read_gguf(odd)
    (tmp_path / "cut.gguf").write_bytes(odd.read_bytes()[:30])
    with pytest.raises(ValueError, match="truncated"):
        read_gguf(tmp_path / "cut.gguf")


def test_file_type_names():
    assert [file_type_name(c) for c in (1, 7, 2, 15, 99)] == [
        "f16",
        "q8_0",
        "q4_0",
        "q4_k_m",
        "ftype99",
    ]
