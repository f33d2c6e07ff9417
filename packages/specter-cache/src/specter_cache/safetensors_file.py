"""A minimal reader of the safetensors format over a memory map.

The format: 8 bytes little-endian header length ``N``, then ``N`` bytes of JSON mapping each
tensor key to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the end
of the header; an optional ``"__metadata__"`` entry holds strings), then the raw little-endian
data. Reading through ``mmap`` lets a caller copy one expert's bytes straight from the page
cache into its own (pinned) buffer and then drop those pages, so the weights never sit twice
in host memory. No dependency beyond torch.
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "I16": torch.int16,
    "U16": torch.uint16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F32": torch.float32,
    "F64": torch.float64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}

# A header larger than this is not a safetensors file to trust (the reference
# implementation uses the same 100 MB limit).
_MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor of a safetensors file.

    Attributes:
        dtype: element type.
        shape: tensor shape.
        begin: absolute byte offset of the data in the file.
        end: absolute byte offset one past the data.
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """Header of one safetensors file plus lazily memory-mapped data.

    Args:
        path: the ``.safetensors`` file.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ValueError: the file is not well-formed safetensors (the message says what is wrong).
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        size = self.path.stat().st_size
        with self.path.open("rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{self.path}: {size} bytes is too short for a safetensors file")
            (header_len,) = struct.unpack("<Q", head)
            if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
                raise ValueError(
                    f"{self.path}: header length {header_len} does not fit the file size {size}; "
                    "is this a safetensors file?"
                )
            raw = f.read(header_len)
        try:
            header = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{self.path}: header is not valid JSON ({exc})") from None
        if not isinstance(header, dict):
            raise ValueError(f"{self.path}: header must be a JSON object, got {type(header)}")
        data_start = 8 + header_len
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._entries: dict[str, SafetensorsEntry] = {}
        for key, info in header.items():
            self._entries[key] = self._parse_entry(key, info, data_start, size)
        self._file = None
        self._map: mmap.mmap | None = None

    def _parse_entry(self, key: str, info: object, data_start: int, size: int) -> SafetensorsEntry:
        if not isinstance(info, dict) or {"dtype", "shape", "data_offsets"} - info.keys():
            raise ValueError(f"{self.path}: entry {key!r} lacks dtype/shape/data_offsets: {info}")
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        if dtype is None:
            raise ValueError(
                f"{self.path}: tensor {key!r} has dtype {info['dtype']!r}; supported: "
                f"{sorted(SAFETENSORS_DTYPES)}"
            )
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if not 0 <= begin <= end or end - begin != numel * dtype.itemsize:
            raise ValueError(
                f"{self.path}: tensor {key!r} data_offsets {[begin, end]} do not hold "
                f"{shape} {info['dtype']} ({numel * dtype.itemsize} bytes)"
            )
        if data_start + end > size:
            raise ValueError(
                f"{self.path}: tensor {key!r} ends at byte {data_start + end}, past the file "
                f"end {size}; the file is truncated"
            )
        return SafetensorsEntry(dtype, shape, data_start + begin, data_start + end)

    def keys(self) -> list[str]:
        """Tensor keys in the file."""
        return list(self._entries)

    def entry(self, key: str) -> SafetensorsEntry:
        """The header entry of ``key``.

        Raises:
            KeyError: ``key`` is not in the file.
        """
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(
                f"{self.path}: no tensor {key!r}; it holds {len(self._entries)} tensors, "
                f"e.g. {sorted(self._entries)[:5]}"
            ) from None

    def _mapped(self) -> mmap.mmap:
        if self._map is None:
            self._file = self.path.open("rb")
            # ACCESS_COPY (a private mapping) makes the buffer writable for torch.frombuffer
            # without a warning; nothing is ever written, so no page is ever copied.
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_COPY)
        return self._map

    def read_into(self, key: str, out: torch.Tensor, index: int | None = None) -> None:
        """Copy tensor ``key`` (or its row ``index`` along dim 0) into ``out``.

        Bytes are copied straight from the memory map into ``out``; when the dtypes differ
        (e.g. a bf16 checkpoint into an fp16 store) the copy converts.

        Args:
            key: tensor key in the file.
            out: destination, contiguous, with the source's shape (or the row's shape).
            index: select ``tensor[index]`` of a stacked tensor ``[N, ...]``.

        Raises:
            KeyError: unknown key.
            ValueError: shape mismatch, index out of range, or ``out`` not contiguous.
        """
        entry = self.entry(key)
        shape, begin = entry.shape, entry.begin
        if index is not None:
            if not shape or not 0 <= index < shape[0]:
                raise ValueError(
                    f"{self.path}: index {index} out of range for {key!r} of shape {shape}"
                )
            row_bytes = (entry.end - entry.begin) // shape[0]
            shape, begin = shape[1:], begin + index * row_bytes
        if tuple(out.shape) != shape:
            raise ValueError(
                f"{self.path}: {key!r}{'' if index is None else f'[{index}]'} has shape {shape}, "
                f"the destination has {tuple(out.shape)}"
            )
        if not out.is_contiguous():
            raise ValueError("read_into needs a contiguous destination tensor")
        numel = out.numel()
        if numel == 0:
            return
        buf = self._mapped()
        if out.dtype == entry.dtype:
            nbytes = numel * entry.dtype.itemsize
            src = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=begin)
            out.view(-1).view(torch.uint8).copy_(src)
        else:
            src = torch.frombuffer(buf, dtype=entry.dtype, count=numel, offset=begin)
            out.copy_(src.view(shape))
        del src  # an exported buffer would keep the map from closing
        self.drop_pages(begin, begin + numel * entry.dtype.itemsize)

    def drop_pages(self, begin: int, end: int) -> None:
        """Tell the kernel the mapped pages of ``[begin, end)`` are no longer needed.

        Why: the bytes now live in the caller's buffer; keeping the mapped pages resident
        would hold the expert twice in host memory.
        """
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        start = begin // page * page
        length = min(end, len(self._map)) - start
        if length > 0:
            self._map.madvise(mmap.MADV_DONTNEED, start, length)

    def close(self) -> None:
        """Unmap and close the file. Safe to call twice."""
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
