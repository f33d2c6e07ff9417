"""What a GGUF file holds, read from its header: metadata and the byte size of every tensor.

GGUF (llama.cpp's model format, version 2 and 3) starts with ``GGUF``, a version, the tensor
and key-value counts, the key-values (typed scalars, strings and arrays) and one record per
tensor (name, dimensions, ggml type, offset). That is all the GPU memory sizing needs, so
this reader stops there and never touches the tensor data; long arrays (the token list) are
skipped and kept as their length.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = ["GGML_TYPES", "GgufFile", "GgufTensor", "file_type_name", "read_gguf"]

GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("f32", 1, 4),
    1: ("f16", 1, 2),
    2: ("q4_0", 32, 18),
    3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22),
    7: ("q5_1", 32, 24),
    8: ("q8_0", 32, 34),
    9: ("q8_1", 32, 40),
    10: ("q2_k", 256, 84),
    11: ("q3_k", 256, 110),
    12: ("q4_k", 256, 144),
    13: ("q5_k", 256, 176),
    14: ("q6_k", 256, 210),
    15: ("q8_k", 256, 292),
    20: ("iq4_nl", 32, 18),
    23: ("iq4_xs", 256, 136),
    24: ("i8", 1, 1),
    25: ("i16", 1, 2),
    26: ("i32", 1, 4),
    27: ("i64", 1, 8),
    28: ("f64", 1, 8),
    30: ("bf16", 1, 2),
}
"""ggml tensor type id -> (name, elements per block, bytes per block)."""

_FILE_TYPES = {
    0: "f32",
    1: "f16",
    2: "q4_0",
    3: "q4_1",
    7: "q8_0",
    8: "q5_0",
    9: "q5_1",
    10: "q2_k",
    12: "q3_k_m",
    15: "q4_k_m",
    17: "q5_k_m",
    18: "q6_k",
    32: "bf16",
}
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9
_KEEP_ARRAY = 64  # arrays up to this length keep their values; longer ones their length


@dataclass(frozen=True)
class GgufTensor:
    """One tensor's record.

    Attributes:
        name: llama.cpp's tensor name (``blk.3.ffn_up_exps.weight``, ...).
        shape: ggml dimensions, innermost first.
        type_name: its ggml type (``f16``, ``q8_0``, ...).
        nbytes: bytes of its data.
    """

    name: str
    shape: tuple[int, ...]
    type_name: str
    nbytes: int


@dataclass(frozen=True)
class GgufFile:
    """A GGUF file's header.

    Attributes:
        path: the file.
        version: the GGUF version.
        metadata: key -> value; an array longer than 64 elements is its length (an int)
            under ``key + ".length"`` instead.
        tensors: every tensor record, in file order.
    """

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[GgufTensor] = field(default_factory=list)

    @property
    def architecture(self) -> str:
        """``general.architecture`` (``deepseek2``, ``qwen2moe``, ...)."""
        return str(self.metadata.get("general.architecture", ""))

    def arch_value(self, key: str, default: Any = None) -> Any:
        """``{architecture}.{key}`` of the metadata, e.g. ``block_count``."""
        return self.metadata.get(f"{self.architecture}.{key}", default)

    @property
    def vocab_size(self) -> int | None:
        """Tokens in ``tokenizer.ggml.tokens`` (None without a vocabulary)."""
        length = self.metadata.get("tokenizer.ggml.tokens.length")
        if length is None and isinstance(self.metadata.get("tokenizer.ggml.tokens"), list):
            length = len(self.metadata["tokenizer.ggml.tokens"])
        return length

    @property
    def file_type(self) -> str:
        """The weights' type as llama.cpp names files (``f16``, ``q8_0``, ...)."""
        code = self.metadata.get("general.file_type")
        if code is None:
            return "unknown"
        return _FILE_TYPES.get(int(code), f"ftype{int(code)}")

    @property
    def total_bytes(self) -> int:
        """Bytes of every tensor's data."""
        return sum(t.nbytes for t in self.tensors)


def file_type_name(code: int) -> str:
    """llama.cpp's name of a ``general.file_type`` code (``7`` -> ``q8_0``)."""
    return _FILE_TYPES.get(int(code), f"ftype{int(code)}")


def read_gguf(path: str | os.PathLike[str]) -> GgufFile:
    """The header of a GGUF file.

    Raises:
        FileNotFoundError: no such file.
        ValueError: not a GGUF file, an unsupported version, or a tensor of a ggml type this
            reader does not size (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file at {path}")
    with open(path, "rb") as handle:
        if handle.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it does not start with 'GGUF')")
        version = _unpack(handle, "<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}; this reader knows 2 and 3")
        n_tensors = _unpack(handle, "<Q")
        n_kv = _unpack(handle, "<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = _string(handle)
            value_type = _unpack(handle, "<I")
            if value_type == _ARRAY:
                values, length = _array(handle)
                if values is None:
                    metadata[key + ".length"] = length
                else:
                    metadata[key] = values
            else:
                metadata[key] = _value(handle, value_type)
        tensors = []
        for _ in range(n_tensors):
            name = _string(handle)
            n_dims = _unpack(handle, "<I")
            shape = tuple(_unpack(handle, "<Q") for _ in range(n_dims))
            type_id = _unpack(handle, "<I")
            _unpack(handle, "<Q")  # offset in the data section
            if type_id not in GGML_TYPES:
                raise ValueError(
                    f"{path}: tensor {name!r} has ggml type {type_id}, which this reader "
                    f"cannot size (known: {', '.join(t[0] for t in GGML_TYPES.values())})"
                )
            type_name, block, block_bytes = GGML_TYPES[type_id]
            count = 1
            for dim in shape:
                count *= dim
            tensors.append(GgufTensor(name, shape, type_name, count // block * block_bytes))
    return GgufFile(path=path, version=version, metadata=metadata, tensors=tensors)


def _unpack(handle: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise ValueError(f"{getattr(handle, 'name', 'GGUF file')}: truncated header")
    return struct.unpack(fmt, data)[0]


def _string(handle: IO[bytes]) -> str:
    length = _unpack(handle, "<Q")
    data = handle.read(length)
    if len(data) != length:
        raise ValueError(f"{getattr(handle, 'name', 'GGUF file')}: truncated header")
    return data.decode("utf-8", errors="replace")


def _value(handle: IO[bytes], value_type: int) -> Any:
    if value_type == _STRING:
        return _string(handle)
    if value_type in _SCALARS:
        return _unpack(handle, _SCALARS[value_type])
    raise ValueError(f"{getattr(handle, 'name', 'GGUF file')}: unknown value type {value_type}")


def _array(handle: IO[bytes]) -> tuple[list[Any] | None, int]:
    """``(values, length)``; values None for an array longer than ``_KEEP_ARRAY``."""
    element_type = _unpack(handle, "<I")
    length = _unpack(handle, "<Q")
    if length <= _KEEP_ARRAY:
        return [_value(handle, element_type) for _ in range(length)], length
    if element_type == _STRING:
        for _ in range(length):
            handle.seek(_unpack(handle, "<Q"), os.SEEK_CUR)
    elif element_type in _SCALARS:
        handle.seek(length * struct.calcsize(_SCALARS[element_type]), os.SEEK_CUR)
    else:
        for _ in range(length):  # nested arrays: none in llama.cpp's files, read to skip
            _value(handle, element_type) if element_type != _ARRAY else _array(handle)
    return None, length
