"""The host copy of every (layer, expert), in large pinned blocks.

Each expert is one contiguous, aligned record inside a block; its tensors are views into that
record. Blocks are allocated lazily (on the first write into them) and hold as many whole
records as fit in ``block_bytes``, across layers, so a model's experts cost a handful of
pinned allocations rather than one per tensor. Experts come from tensors given to ``put`` or,
lazily, from safetensors files read through a memory map one expert at a time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from specter_cache.expert_layout import ExpertLayout
from specter_cache.safetensors_file import SafetensorsFile

DEFAULT_BLOCK_BYTES = 1 << 30


@dataclass(frozen=True)
class TensorSlice:
    """Where one piece of an expert tensor lives in a safetensors file.

    Attributes:
        path: the ``.safetensors`` file.
        key: the tensor's key in that file.
        index: when set, take ``tensor[index]`` of a stacked ``[N, ...]`` tensor (e.g. all
            experts of a layer stored in one tensor).
    """

    path: str | os.PathLike[str]
    key: str
    index: int | None = None


# A source is one slice, a (path, key) pair, or several slices concatenated along dim 0
# (e.g. a checkpoint's separate gate and up projections forming one "gate_up" tensor).
TensorSource = TensorSlice | tuple[str | os.PathLike[str], str] | Sequence[TensorSlice]


def _as_slices(source: object, where: str) -> list[TensorSlice]:
    if isinstance(source, TensorSlice):
        return [source]
    if (
        isinstance(source, tuple)
        and len(source) == 2
        and isinstance(source[0], str | os.PathLike)
        and isinstance(source[1], str)
    ):
        return [TensorSlice(source[0], source[1])]
    if isinstance(source, Sequence) and source and all(isinstance(s, TensorSlice) for s in source):
        return list(source)
    raise TypeError(
        f"{where}: a source must be a TensorSlice, a (path, key) pair or a non-empty list of "
        f"TensorSlice, got {source!r}"
    )


class ExpertStore:
    """Host copy of every (layer, expert), pinned when the platform allows it.

    Args:
        num_layers: number of MoE layers ``L`` (indices ``0..L-1``).
        num_experts: routed experts per layer ``E``.
        layout: one ``ExpertLayout`` for every layer, or a sequence of ``L`` layouts.
        pin_memory: ``True`` requires pinned memory, ``False`` uses plain memory, ``None``
            (default) pins when possible and falls back to plain memory otherwise (CPU-only
            torch); ``is_pinned`` and ``pinning_note`` say which happened.
        block_bytes: size of one host allocation; each holds as many whole expert records as
            fit (at least one). Keep it a power of two: torch's pinned allocator rounds
            allocations up to one.

    Raises:
        ValueError: non-positive sizes, or a layout list of the wrong length.
        RuntimeError: ``pin_memory=True`` where pinning is not available.

    Example:
        >>> layout = ExpertLayout({"w": ((4, 8), torch.float16)})
        >>> store = ExpertStore(num_layers=2, num_experts=3, layout=layout)
        >>> store.put(0, 1, {"w": torch.ones(4, 8, dtype=torch.float16)})
        >>> store.get(0, 1)["w"].sum().item()
        32.0
    """

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        layout: ExpertLayout | Sequence[ExpertLayout],
        *,
        pin_memory: bool | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
    ):
        for name, value in (("num_layers", num_layers), ("num_experts", num_experts)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(block_bytes, int) or block_bytes < 1:
            raise ValueError(f"block_bytes must be a positive int, got {block_bytes!r}")
        if isinstance(layout, ExpertLayout):
            layouts = [layout] * num_layers
        else:
            layouts = list(layout)
            if len(layouts) != num_layers or not all(isinstance(x, ExpertLayout) for x in layouts):
                raise ValueError(
                    f"layout must be one ExpertLayout or {num_layers} of them (one per layer), "
                    f"got {layout!r}"
                )
        self._num_layers = num_layers
        self._num_experts = num_experts
        self._layouts = layouts
        self._pin_request = pin_memory
        self._pinned: bool | None = None
        self._pinning_note = "no block allocated yet"

        # Pack records into blocks in (layer, expert) order.
        self._record_block: list[int] = []
        self._record_offset: list[int] = []
        self._block_sizes: list[int] = []
        fill = block_bytes  # forces a new block for the first record
        for lay in layouts:
            rec = lay.record_bytes
            for _ in range(num_experts):
                if fill + rec > max(block_bytes, rec) or not self._block_sizes:
                    self._block_sizes.append(0)
                    fill = 0
                self._record_block.append(len(self._block_sizes) - 1)
                self._record_offset.append(fill)
                fill += rec
                self._block_sizes[-1] = fill
        self._blocks: list[torch.Tensor | None] = [None] * len(self._block_sizes)
        self._views: list[dict[str, torch.Tensor] | None] = [None] * (num_layers * num_experts)
        self._loaded = [False] * (num_layers * num_experts)
        self._sources: dict[tuple[int, int], dict[str, list[TensorSlice]]] = {}
        self._files: dict[str, SafetensorsFile] = {}

    # ----------------------------------------------------------------- construction helpers
    @classmethod
    def from_safetensors(
        cls,
        num_layers: int,
        num_experts: int,
        layout: ExpertLayout | Sequence[ExpertLayout],
        sources: Mapping[tuple[int, int, str], TensorSource],
        *,
        pin_memory: bool | None = None,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        load: bool = False,
    ) -> ExpertStore:
        """A store whose experts are read lazily from safetensors files.

        Args:
            sources: ``(layer, expert, name) -> source`` for every expert tensor; a source is
                a ``TensorSlice``, a ``(path, key)`` pair, or a list of slices concatenated
                along dim 0. Headers are checked now (keys, shapes); data is read through a
                memory map one expert at a time, on the first ``get`` or by ``load_all``.
                A dtype different from the layout's is converted while copying.
            load: read every expert now (``load_all``).

        Raises:
            ValueError: a missing or unknown (layer, expert, name), or a shape mismatch.
            KeyError: a key that is not in its file.
        """
        store = cls(num_layers, num_experts, layout, pin_memory=pin_memory, block_bytes=block_bytes)
        store.set_sources(sources)
        if load:
            store.load_all()
        return store

    def set_sources(self, sources: Mapping[tuple[int, int, str], TensorSource]) -> None:
        """Attach safetensors sources for experts not yet filled (see ``from_safetensors``)."""
        grouped: dict[tuple[int, int], dict[str, list[TensorSlice]]] = {}
        for k, source in sources.items():
            if not (isinstance(k, tuple) and len(k) == 3):
                raise ValueError(f"source keys must be (layer, expert, name), got {k!r}")
            layer, expert, name = k
            self._check_index(layer, expert)
            self._layouts[layer].spec(name)
            grouped.setdefault((layer, expert), {})[name] = _as_slices(source, f"source {k}")
        for (layer, expert), named in grouped.items():
            missing = [n for n in self._layouts[layer].names if n not in named]
            if missing:
                raise ValueError(
                    f"sources for layer {layer} expert {expert} lack tensors {missing}; "
                    "give a source for every name of the layout"
                )
            for name, slices in named.items():
                self._check_slices(layer, name, slices)
        self._sources.update(grouped)

    def _file(self, path: str | os.PathLike[str]) -> SafetensorsFile:
        key = os.fspath(path)
        if key not in self._files:
            self._files[key] = SafetensorsFile(key)
        return self._files[key]

    def _check_slices(self, layer: int, name: str, slices: list[TensorSlice]) -> None:
        spec = self._layouts[layer].spec(name)
        rows = 0
        rest: tuple[int, ...] | None = None
        for s in slices:
            shape = self._file(s.path).entry(s.key).shape
            if s.index is not None:
                if not shape or not 0 <= s.index < shape[0]:
                    raise ValueError(
                        f"{s.path}: index {s.index} out of range for {s.key!r} {shape}"
                    )
                shape = shape[1:]
            if len(slices) == 1:
                if shape != spec.shape:
                    raise ValueError(
                        f"layer {layer} {name!r}: {s.path}:{s.key} has shape {shape}, "
                        f"the layout expects {spec.shape}"
                    )
                return
            if not shape or (rest is not None and shape[1:] != rest):
                raise ValueError(
                    f"layer {layer} {name!r}: pieces to concatenate along dim 0 must agree on "
                    f"the other dims; {s.path}:{s.key} has shape {shape}"
                )
            rest = shape[1:]
            rows += shape[0]
        if (rows, *(rest or ())) != spec.shape:
            raise ValueError(
                f"layer {layer} {name!r}: pieces concatenate to {(rows, *(rest or ()))}, "
                f"the layout expects {spec.shape}"
            )

    # ----------------------------------------------------------------------- properties
    @property
    def num_layers(self) -> int:
        """Number of MoE layers ``L``."""
        return self._num_layers

    @property
    def num_experts(self) -> int:
        """Routed experts per layer ``E``."""
        return self._num_experts

    def layout(self, layer: int) -> ExpertLayout:
        """The expert layout of ``layer``."""
        self._check_index(layer, 0)
        return self._layouts[layer]

    def expert_bytes(self, layer: int) -> int:
        """Payload bytes of one expert of ``layer``: what one load moves."""
        return self.layout(layer).payload_bytes

    @property
    def total_bytes(self) -> int:
        """Payload bytes of every expert of every layer."""
        return sum(lay.payload_bytes for lay in self._layouts) * self._num_experts

    @property
    def reserved_bytes(self) -> int:
        """Host bytes the store needs once every block is allocated."""
        return sum(self._block_sizes)

    @property
    def allocated_bytes(self) -> int:
        """Host bytes allocated so far (blocks are allocated on first write)."""
        return sum(
            size for size, b in zip(self._block_sizes, self._blocks, strict=True) if b is not None
        )

    @property
    def num_blocks(self) -> int:
        """Number of host blocks (allocated or not)."""
        return len(self._block_sizes)

    @property
    def is_pinned(self) -> bool:
        """Whether the store's memory is pinned (page-locked).

        Decided when the first block is allocated; before that, whether it will be.
        """
        if self._pinned is None:
            return self._pin_request is not False and _pinning_available()
        return self._pinned

    @property
    def pinning_note(self) -> str:
        """Why the memory is or is not pinned, in words."""
        return self._pinning_note

    def is_loaded(self, layer: int, expert: int) -> bool:
        """Whether the expert's data is in host memory (put, or read from its source)."""
        self._check_index(layer, expert)
        return self._loaded[layer * self._num_experts + expert]

    # ----------------------------------------------------------------------- data access
    def put(self, layer: int, expert: int, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy one expert's tensors into the store.

        Args:
            tensors: name -> tensor, exactly the layout's names, shapes and dtypes (any device).

        Raises:
            ValueError: bad indices, or tensors that do not match the layout.
        """
        self._check_index(layer, expert)
        self._layouts[layer].check(tensors, f"put(layer={layer}, expert={expert})")
        views = self._record(layer, expert)
        for name, t in tensors.items():
            views[name].copy_(t)
        self._loaded[layer * self._num_experts + expert] = True

    def get(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        """The expert's tensors: views into the store's (pinned) memory.

        Reads the expert from its safetensors source first if it has one and was not read.

        Raises:
            ValueError: bad indices.
            KeyError: the expert was never put and has no source.
        """
        self._check_index(layer, expert)
        g = layer * self._num_experts + expert
        if not self._loaded[g]:
            self.load(layer, expert)
        return self._views[g]  # type: ignore[return-value]

    def load(self, layer: int, expert: int) -> None:
        """Read one expert from its safetensors source into the store (no-op when loaded).

        Raises:
            KeyError: the expert has no source.
        """
        self._check_index(layer, expert)
        g = layer * self._num_experts + expert
        if self._loaded[g]:
            return
        named = self._sources.get((layer, expert))
        if named is None:
            raise KeyError(
                f"layer {layer} expert {expert} was never put into the store and has no "
                "safetensors source; call put() or give sources (ExpertStore.from_safetensors)"
            )
        views = self._record(layer, expert)
        for name, slices in named.items():
            out = views[name]
            row = 0
            for s in slices:
                f = self._file(s.path)
                if len(slices) == 1:
                    f.read_into(s.key, out, s.index)
                    break
                shape = f.entry(s.key).shape
                rows = shape[1] if s.index is not None else shape[0]
                f.read_into(s.key, out[row : row + rows], s.index)
                row += rows
        self._loaded[g] = True

    def load_all(self) -> None:
        """Read every expert that has a source and is not loaded yet, one at a time."""
        for layer, expert in sorted(self._sources):
            self.load(layer, expert)

    def close(self) -> None:
        """Close the memory-mapped files (loaded experts stay usable)."""
        for f in self._files.values():
            f.close()
        self._files.clear()

    # --------------------------------------------------------------------------- internals
    def _check_index(self, layer: object, expert: object) -> None:
        if (
            not isinstance(layer, int)
            or isinstance(layer, bool)
            or not 0 <= layer < self._num_layers
        ):
            raise ValueError(f"layer must be an int in [0, {self._num_layers}), got {layer!r}")
        if (
            not isinstance(expert, int)
            or isinstance(expert, bool)
            or not 0 <= expert < self._num_experts
        ):
            raise ValueError(f"expert must be an int in [0, {self._num_experts}), got {expert!r}")

    def _allocate(self, size: int) -> torch.Tensor:
        if self._pin_request is False:
            self._pinned, self._pinning_note = False, "pin_memory=False was requested"
            return torch.empty(size, dtype=torch.uint8)
        try:
            block = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            self._pinned, self._pinning_note = True, "pinned (page-locked) host memory"
            return block
        except RuntimeError as exc:
            if self._pin_request is True:
                raise RuntimeError(
                    f"pin_memory=True but pinned memory is unavailable here ({exc}); "
                    "pass pin_memory=None to fall back to plain memory"
                ) from exc
            self._pinned = False
            self._pinning_note = f"plain memory: pinning is unavailable here ({exc})"
            return torch.empty(size, dtype=torch.uint8)

    def _record(self, layer: int, expert: int) -> dict[str, torch.Tensor]:
        g = layer * self._num_experts + expert
        views = self._views[g]
        if views is None:
            b = self._record_block[g]
            block = self._blocks[b]
            if block is None:
                block = self._blocks[b] = self._allocate(self._block_sizes[b])
            base = self._record_offset[g]
            lay = self._layouts[layer]
            views = {}
            for name, spec in lay.specs.items():
                start = base + lay.offset(name)
                raw = block[start : start + spec.nbytes]
                views[name] = raw.view(spec.dtype).view(spec.shape)
            self._views[g] = views
        return views

    def __repr__(self) -> str:
        return (
            f"ExpertStore(layers={self._num_layers}, experts={self._num_experts}, "
            f"total={self.total_bytes / 1e9:.3f} GB, blocks={self.num_blocks}, "
            f"pinned={self.is_pinned})"
        )


def _pinning_available() -> bool:
    # Cheap probe without allocating: pinning needs an accelerator runtime.
    return torch.cuda.is_available()
