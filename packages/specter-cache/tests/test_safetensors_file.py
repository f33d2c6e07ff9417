"""SafetensorsFile: specter-cache's reader against files written by the safetensors package."""

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from specter_cache.safetensors_file import SafetensorsFile

DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
]


def _random(shape, dtype, g):
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    return torch.randint(0, 100, shape, generator=g).to(dtype)


def test_reads_every_dtype_bit_exactly(tmp_path):
    g = torch.Generator().manual_seed(1)
    tensors = {f"t_{i}": _random((3, 5 + i), dt, g) for i, dt in enumerate(DTYPES)}
    path = tmp_path / "a.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    with SafetensorsFile(path) as f:
        assert sorted(f.keys()) == sorted(tensors)
        assert f.metadata == {"format": "pt"}
        for key, ref in tensors.items():
            out = torch.empty_like(ref)
            f.read_into(key, out)
            assert torch.equal(out, ref), key
            # Reading again after the pages were dropped gives the same bytes.
            out2 = torch.full_like(ref, 0)
            f.read_into(key, out2)
            assert torch.equal(out2, ref), key


def test_index_selects_a_row_of_a_stacked_tensor_and_casts(tmp_path):
    g = torch.Generator().manual_seed(2)
    stacked = torch.randn(4, 3, 2, generator=g).to(torch.bfloat16)
    path = tmp_path / "s.safetensors"
    save_file({"experts": stacked}, str(path))
    with SafetensorsFile(path) as f:
        for i in torch.randperm(4, generator=g).tolist():
            out = torch.empty(3, 2, dtype=torch.bfloat16)
            f.read_into("experts", out, index=i)
            assert torch.equal(out, stacked[i])
            cast = torch.empty(3, 2, dtype=torch.float16)
            f.read_into("experts", cast, index=i)
            assert torch.equal(cast, stacked[i].to(torch.float16))
        with pytest.raises(ValueError, match="index 4 out of range"):
            f.read_into("experts", torch.empty(3, 2, dtype=torch.bfloat16), index=4)
        with pytest.raises(ValueError, match="shape"):
            f.read_into("experts", torch.empty(2, 3, dtype=torch.bfloat16), index=0)
        with pytest.raises(KeyError, match="no tensor 'nope'"):
            f.entry("nope")


def _write_raw(path, header: bytes, data: bytes = b"", length: int | None = None):
    n = len(header) if length is None else length
    path.write_bytes(struct.pack("<Q", n) + header + data)


@pytest.mark.parametrize(
    ("header", "data", "length", "match"),
    [
        (b"{}", b"", 10_000, "does not fit"),
        (b"{not json", b"", None, "not valid JSON"),
        (b"[1, 2]", b"", None, "JSON object"),
        (
            json.dumps({"a": {"dtype": "Q7", "shape": [1], "data_offsets": [0, 1]}}).encode(),
            b"x",
            None,
            "dtype 'Q7'",
        ),
        (
            json.dumps({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 2]}}).encode(),
            b"xx",
            None,
            "do not hold",
        ),
        (
            json.dumps({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}}).encode(),
            b"xx",
            None,
            "truncated",
        ),
        (json.dumps({"a": {"dtype": "F16", "shape": [2]}}).encode(), b"xxxx", None, "lacks"),
    ],
)
def test_malformed_files_are_rejected_with_the_reason(tmp_path, header, data, length, match):
    path = tmp_path / "bad.safetensors"
    _write_raw(path, header, data, length)
    with pytest.raises(ValueError, match=match):
        SafetensorsFile(path)


def test_too_short_file(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(ValueError, match="too short"):
        SafetensorsFile(path)
