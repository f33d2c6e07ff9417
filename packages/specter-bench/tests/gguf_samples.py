"""GGUF headers for the tests: a writer of the format's header (metadata and tensor records,
no tensor data, which the reader never touches) and a file laid out as llama.cpp's
converter lays out DeepSeek-V2-Lite."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value: Any) -> tuple[int, bytes]:
    if isinstance(value, bool):
        return 7, struct.pack("<?", value)
    if isinstance(value, int):
        return 4, struct.pack("<I", value)
    if isinstance(value, float):
        return 6, struct.pack("<f", value)
    if isinstance(value, str):
        return 8, _string(value)
    if isinstance(value, list):
        kinds = {_value(v)[0] for v in value} or {8}
        (kind,) = kinds
        body = b"".join(_value(v)[1] for v in value)
        return 9, struct.pack("<IQ", kind, len(value)) + body
    raise TypeError(f"no GGUF type for {value!r}")


def write_gguf(
    path: Path, metadata: dict[str, Any], tensors: list[tuple[str, tuple[int, ...], int]]
) -> Path:
    """A GGUF v3 header with ``metadata`` and ``(name, ggml dims, ggml type)`` tensors."""
    out = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    for key, value in metadata.items():
        kind, body = _value(value)
        out += [_string(key), struct.pack("<I", kind), body]
    offset = 0
    for name, dims, ggml_type in tensors:
        out += [_string(name), struct.pack("<I", len(dims))]
        out += [struct.pack("<Q", d) for d in dims]
        out += [struct.pack("<IQ", ggml_type, offset)]
        offset += 32
    path.write_bytes(b"".join(out))
    return path


def deepseek_v2_lite_gguf(path: Path, weights: int = F16, vocab: int = 102400) -> Path:
    """DeepSeek-V2-Lite's tensors as the converter writes them: 27 blocks, block 0 dense,
    64 routed experts of 1408 in blocks 1-26, two shared experts, MLA attention."""
    H, E, F = 2048, 64, 1408  # hidden, experts, expert intermediate
    tensors: list[tuple[str, tuple[int, ...], int]] = [
        ("token_embd.weight", (H, vocab), weights),
        ("output.weight", (H, vocab), weights),
        ("output_norm.weight", (H,), F32),
    ]
    for b in range(27):
        p = f"blk.{b}."
        tensors += [
            (p + "attn_norm.weight", (H,), F32),
            (p + "attn_q.weight", (H, 16 * 192), weights),
            (p + "attn_kv_a_mqa.weight", (H, 576), weights),
            (p + "attn_kv_a_norm.weight", (512,), F32),
            (p + "attn_k_b.weight", (128, 512, 16), weights),
            (p + "attn_v_b.weight", (512, 128, 16), weights),
            (p + "attn_output.weight", (16 * 128, H), weights),
            (p + "ffn_norm.weight", (H,), F32),
        ]
        if b == 0:
            tensors += [
                (p + f"ffn_{n}.weight", (H, 10944) if n != "down" else (10944, H), weights)
                for n in ("gate", "up", "down")
            ]
            continue
        tensors += [
            (p + "ffn_gate_inp.weight", (H, E), F32),
            (p + "ffn_gate_exps.weight", (H, F, E), weights),
            (p + "ffn_up_exps.weight", (H, F, E), weights),
            (p + "ffn_down_exps.weight", (F, H, E), weights),
            (p + "ffn_gate_shexp.weight", (H, 2 * F), weights),
            (p + "ffn_up_shexp.weight", (H, 2 * F), weights),
            (p + "ffn_down_shexp.weight", (2 * F, H), weights),
        ]
    metadata = {
        "general.architecture": "deepseek2",
        "general.file_type": {F16: 1, Q8_0: 7, Q4_0: 2}[weights],
        "deepseek2.block_count": 27,
        "deepseek2.embedding_length": H,
        "deepseek2.attention.head_count": 16,
        "deepseek2.attention.head_count_kv": 1,
        "deepseek2.attention.key_length": 576,
        "deepseek2.attention.value_length": 512,
        "deepseek2.leading_dense_block_count": 1,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)],
    }
    return write_gguf(path, metadata, tensors)
