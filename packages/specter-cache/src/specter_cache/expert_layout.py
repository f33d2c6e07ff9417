"""The fixed layout of one expert: named tensors of fixed shapes and dtypes.

specter-cache never knows what an expert's tensors mean. A layout only says which named
tensors make up one expert of a layer, e.g. ``{"gate_up": [2I, H] fp16, "down": [H, I] fp16}``,
and where each one sits inside the expert's contiguous host record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

# Host records and the tensors inside them start on 512-byte boundaries: DMA engines move
# aligned buffers at full rate, and every dtype view of an aligned byte range is legal.
RECORD_ALIGNMENT = 512


def _align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class TensorSpec:
    """Shape and dtype of one named tensor of an expert.

    Attributes:
        shape: the tensor's shape, e.g. ``(2816, 2048)``.
        dtype: the tensor's dtype, e.g. ``torch.float16``.
    """

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"TensorSpec dtype must be a torch.dtype, got {self.dtype!r}")
        shape = tuple(self.shape)
        if any(not isinstance(d, int) or isinstance(d, bool) or d < 0 for d in shape):
            raise ValueError(
                f"TensorSpec shape must be non-negative ints, got {self.shape!r}; "
                "pass e.g. (2816, 2048)"
            )
        object.__setattr__(self, "shape", shape)

    @property
    def numel(self) -> int:
        """Number of elements."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        return self.numel * self.dtype.itemsize


class ExpertLayout:
    """Named tensors of fixed shapes making up one expert of a layer.

    Args:
        tensors: name -> ``TensorSpec`` or ``(shape, dtype)``, e.g.
            ``{"gate_up": ((2816, 2048), torch.float16), "down": ((2048, 1408), torch.float16)}``.
            Order is kept: it is the order tensors sit in a host record and are copied in.

    Raises:
        ValueError: no tensors, or a name that is not a non-empty string.
        TypeError: a spec that is neither a ``TensorSpec`` nor a ``(shape, dtype)`` pair.

    Example:
        >>> layout = ExpertLayout({"w": ((4, 8), torch.float16)})
        >>> layout.payload_bytes
        64
    """

    def __init__(self, tensors: Mapping[str, TensorSpec | tuple[Sequence[int], torch.dtype]]):
        if not isinstance(tensors, Mapping) or len(tensors) == 0:
            raise ValueError(
                f"ExpertLayout needs a non-empty mapping name -> (shape, dtype), got {tensors!r}"
            )
        specs: dict[str, TensorSpec] = {}
        for name, spec in tensors.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"expert tensor names must be non-empty strings, got {name!r}")
            if isinstance(spec, TensorSpec):
                specs[name] = spec
            elif isinstance(spec, tuple | list) and len(spec) == 2:
                specs[name] = TensorSpec(tuple(spec[0]), spec[1])
            else:
                raise TypeError(
                    f"expert tensor {name!r}: expected a TensorSpec or (shape, dtype), got {spec!r}"
                )
        self._specs = specs
        offsets: dict[str, int] = {}
        cursor = 0
        for name, spec in specs.items():
            offsets[name] = cursor
            cursor = _align_up(cursor + spec.nbytes, RECORD_ALIGNMENT)
        self._offsets = offsets
        self._record_bytes = max(cursor, RECORD_ALIGNMENT)
        self._payload_bytes = sum(s.nbytes for s in specs.values())

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor]) -> ExpertLayout:
        """The layout of an example expert given as named tensors."""
        return cls({name: (tuple(t.shape), t.dtype) for name, t in tensors.items()})

    @property
    def names(self) -> tuple[str, ...]:
        """Tensor names in record order."""
        return tuple(self._specs)

    @property
    def specs(self) -> Mapping[str, TensorSpec]:
        """name -> TensorSpec."""
        return dict(self._specs)

    def spec(self, name: str) -> TensorSpec:
        """The spec of tensor ``name``.

        Raises:
            KeyError: ``name`` is not part of the layout.
        """
        try:
            return self._specs[name]
        except KeyError:
            raise KeyError(
                f"expert tensor {name!r} is not in the layout; known names: {self.names}"
            ) from None

    def offset(self, name: str) -> int:
        """Byte offset of tensor ``name`` inside an expert's host record."""
        self.spec(name)
        return self._offsets[name]

    @property
    def payload_bytes(self) -> int:
        """Bytes of one expert's tensor data: what one load moves to the device."""
        return self._payload_bytes

    @property
    def record_bytes(self) -> int:
        """Bytes one expert occupies in host memory, alignment padding included."""
        return self._record_bytes

    def check(self, tensors: Mapping[str, torch.Tensor], where: str) -> None:
        """Check that ``tensors`` match this layout exactly (names, shapes, dtypes).

        Raises:
            ValueError: a missing or unexpected name, or a shape or dtype mismatch.
        """
        if not isinstance(tensors, Mapping):
            raise TypeError(f"{where}: expected a mapping name -> tensor, got {type(tensors)}")
        missing = [n for n in self._specs if n not in tensors]
        extra = [n for n in tensors if n not in self._specs]
        if missing or extra:
            raise ValueError(
                f"{where}: tensor names {sorted(tensors)} do not match the layout "
                f"{list(self.names)} (missing {missing}, unexpected {extra})"
            )
        for name, spec in self._specs.items():
            t = tensors[name]
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{where}: {name!r} must be a torch.Tensor, got {type(t)}")
            if tuple(t.shape) != spec.shape or t.dtype != spec.dtype:
                raise ValueError(
                    f"{where}: {name!r} is {tuple(t.shape)} {t.dtype}, the layout expects "
                    f"{spec.shape} {spec.dtype}"
                )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ExpertLayout) and self._specs == other._specs

    def __hash__(self) -> int:
        return hash(tuple(self._specs.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {list(s.shape)} {s.dtype}" for n, s in self._specs.items())
        return f"ExpertLayout({{{inner}}})"
