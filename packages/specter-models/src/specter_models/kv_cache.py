"""A preallocated KV cache for transformers models whose rollback is moving a length.

``StaticKVCache`` implements transformers' ``Cache`` interface (what the models call:
``update``, ``get_seq_length``, ``get_mask_sizes``) over one buffer per layer, allocated
once at ``max_seq_len``. Appending copies the new rows in place; rolling back (``crop_to``)
only moves a host-side length, as in gpt-fast: no copy, no allocation, no device sync.

Unlike transformers' ``StaticCache``, ``update`` returns views of the filled prefix only
(``[:, :, :length]``) and reports masks of that size, exactly as ``DynamicCache`` does, so
attention reads no padding and transformers' mask creation treats it like the dynamic cache.
The length is a Python int known on the host, which is what keeps the controller's
``kv_length`` free of device syncs.

DeepSeek-V2 caches its compressed MLA latents through the same ``update``: the normed
``kv_lora_rank`` latent as the "keys" and the rotary part as the "values", one head each.

**Window mode** (``StaticKVCache.window``), for forwards captured as CUDA graphs: shapes and
addresses may not depend on the length, so ``update`` writes its rows at device-side
positions (``index_copy_``) and returns the first ``window`` rows whatever the length; the
caller masks the rows past each query's position (``window_mask``). Rows beyond the length
hold stale but finite values (zeros, or rows of a rolled-back suffix), which the mask hides.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Sequence

import torch
from transformers.cache_utils import Cache, CacheLayerMixin


class KVCacheFullError(ValueError):
    """A write past the KV cache's ``max_seq_len`` positions."""


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword ``model``'s forward takes its cache by: ``"cache"`` (newer transformers)
    or ``"past_key_values"`` (older ones, and where the signature cannot be read). Read
    once per model, then kept on it: forwards on the decode path call this."""
    known = model.__dict__.get("_specter_cache_keyword")
    if known is None:
        try:
            parameters = inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            parameters = {}
        known = "cache" if "cache" in parameters else "past_key_values"
        model.__dict__["_specter_cache_keyword"] = known
    return known


RowShape = tuple[tuple[int, int], tuple[int, int]]
"""``((key_heads, key_dim), (value_heads, value_dim))`` of one cached position."""


class StaticKVLayer(CacheLayerMixin):
    """One layer's preallocated keys ``[1, Hk, S, Dk]`` and values ``[1, Hv, S, Dv]``.

    Args:
        row_shape: ``((Hk, Dk), (Hv, Dv))``.
        max_seq_len: ``S``, positions the buffers hold.
        dtype: element type of the cached states.
        device: where the buffers live.
        storage: ``(keys, values)`` to use as the buffers instead of new ones, of the shapes
            above (a slot of ``KVSlots``' batched buffers); None allocates them.

    Raises:
        ValueError: ``storage`` of other shapes, dtype or device.
    """

    is_compileable = False
    is_sliding = False
    is_croppable = True

    def __init__(
        self,
        row_shape: RowShape,
        max_seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        storage: tuple[torch.Tensor, torch.Tensor] | None = None,
    ):
        super().__init__()
        (hk, dk), (hv, dv) = row_shape
        self.max_seq_len = max_seq_len
        self.dtype, self.device = dtype, torch.device(device)
        if storage is None:
            self.keys = torch.zeros(1, hk, max_seq_len, dk, dtype=dtype, device=self.device)
            self.values = torch.zeros(1, hv, max_seq_len, dv, dtype=dtype, device=self.device)
        else:
            self.keys, self.values = storage
            shapes = ((1, hk, max_seq_len, dk), (1, hv, max_seq_len, dv))
            for name, buf, shape in zip(("keys", "values"), storage, shapes, strict=True):
                if tuple(buf.shape) != shape or buf.dtype != dtype or buf.device != self.device:
                    raise ValueError(
                        f"StaticKVLayer storage {name} is {tuple(buf.shape)} {buf.dtype} on "
                        f"{buf.device}; expected {shape} {dtype} on {self.device}"
                    )
        self.length = 0
        self.is_initialized = True
        self._window: tuple[int, torch.Tensor, int] | None = None  # see StaticKVCache.window

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to do: the buffers exist from construction."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``T`` rows and return the filled prefix.

        Args:
            key_states: ``[1, Hk, T, Dk]``.
            value_states: ``[1, Hv, T, Dv]``.

        Returns:
            Views ``keys[:, :, :length + T]`` and ``values[:, :, :length + T]``.

        Raises:
            ValueError: shapes, dtype or device differ from the buffers, or the rows would
                run past ``max_seq_len``.
        """
        if self._window is not None:
            return self._update_window(key_states, value_states)
        start = self.length
        end = start + key_states.shape[-2]
        for name, new, buf in (
            ("keys", key_states, self.keys),
            ("values", value_states, self.values),
        ):
            if (
                new.dim() != 4
                or new.shape[0] != 1
                or new.shape[1] != buf.shape[1]
                or new.shape[3] != buf.shape[3]
                or new.shape[2] != end - start
            ):
                raise ValueError(
                    f"StaticKVLayer.update: {name} of shape {tuple(new.shape)} do not fit the "
                    f"cache rows [1, {buf.shape[1]}, T, {buf.shape[3]}] (batch size one)"
                )
            if new.dtype != buf.dtype or new.device != buf.device:
                raise ValueError(
                    f"StaticKVLayer.update: {name} are {new.dtype} on {new.device}, the cache "
                    f"holds {buf.dtype} on {buf.device}; build the cache with the model's dtype"
                )
        _, keys, values = self.reserve(end - start)
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        return keys, values

    def reserve(self, rows: int) -> tuple[int | torch.Tensor, torch.Tensor, torch.Tensor]:
        """Take the next ``rows`` positions for the caller to write itself (a kernel that
        computes and stores the rows in one launch), moving the length as ``update`` does.

        Returns:
            ``(where, keys, values)``: ``where`` is the first position of the rows (an int),
            or in window mode the ``[rows]`` device positions; ``keys`` and ``values`` are the
            views ``update`` would return (the filled prefix, or the window).

        Raises:
            ValueError: the rows would run past ``max_seq_len``, or in window mode their
                count differs from the window's write positions.
        """
        if self._window is not None:
            window, positions, end = self._window
            if rows != positions.numel():
                raise ValueError(
                    f"StaticKVLayer in window mode writes {positions.numel()} positions, got "
                    f"{rows} rows"
                )
            self.length = end
            return positions, self.keys[:, :, :window], self.values[:, :, :window]
        start, end = self.length, self.length + rows
        if end > self.max_seq_len:
            raise KVCacheFullError(
                f"the KV cache holds at most max_seq_len={self.max_seq_len} positions; writing "
                f"positions {start}..{end - 1} would overflow it. Load the model with a larger "
                "max_seq_len."
            )
        self.length = end
        return start, self.keys[:, :, :end], self.values[:, :, :end]

    def _update_window(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Window mode: rows go to the device-side positions, the first ``window`` rows come
        back (no host-side length in any shape or index)."""
        _, positions, _ = self._window
        if key_states.shape[-2] != positions.numel() or value_states.shape[-2] != positions.numel():
            raise ValueError(
                f"StaticKVLayer.update in window mode: {key_states.shape[-2]} key rows and "
                f"{value_states.shape[-2]} value rows for {positions.numel()} write positions"
            )
        positions, keys, values = self.reserve(positions.numel())
        self.keys.index_copy_(2, positions, key_states)
        self.values.index_copy_(2, positions, value_states)
        return keys, values

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """``(kv_length, kv_offset)`` for a query of ``query_length`` rows (as DynamicLayer;
        the window in window mode)."""
        if self._window is not None:
            return self._window[0], 0
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        """Filled positions (a host int)."""
        return self.length

    def get_max_length(self) -> int:
        """``max_seq_len``."""
        return self.max_seq_len

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' crop: a negative count removes that many rows, a positive one keeps
        that many (its deprecated meaning)."""
        if tokens_to_remove < 0:
            self.length = max(0, self.length + tokens_to_remove)
        else:
            self.length = min(self.length, tokens_to_remove)

    def reset(self) -> None:
        """Forget every row (the buffers keep their stale contents; they are never read)."""
        self.length = 0

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("StaticKVCache holds one sequence (batch size one): no beams")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("StaticKVCache holds one sequence (batch size one)")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("StaticKVCache holds one sequence (batch size one)")

    def offload(self) -> None:
        raise NotImplementedError("StaticKVCache stays on its device")

    def prefetch(self) -> None:
        """Nothing to prefetch: the buffers never leave their device."""


class StaticKVCache(Cache):
    """Preallocated per-layer KV buffers behind transformers' ``Cache`` interface.

    Args:
        row_shapes: one ``((Hk, Dk), (Hv, Dv))`` per decoder layer.
        max_seq_len: positions each layer holds.
        dtype: the model's dtype.
        device: the model's device.
        storage: one ``(keys, values)`` per layer to use as its buffers (see
            ``StaticKVLayer``), or None to allocate them.

    Raises:
        ValueError: no layer, a non-positive ``max_seq_len``, or ``storage`` that does not
            fit.

    Example:
        >>> cache = StaticKVCache(
        ...     [((2, 8), (2, 8))] * 3, max_seq_len=16, dtype=torch.float32, device="cpu"
        ... )
        >>> k = torch.randn(1, 2, 5, 8)
        >>> keys, values = cache.update(k, k, layer_idx=0)
        >>> keys.shape[2], cache.layers[0].length
        (5, 5)
    """

    def __init__(
        self,
        row_shapes: Sequence[RowShape],
        max_seq_len: int,
        dtype: torch.dtype,
        device: torch.device | str,
        storage: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ):
        if not row_shapes:
            raise ValueError("StaticKVCache needs at least one layer")
        if not isinstance(max_seq_len, int) or max_seq_len < 1:
            raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
        if storage is not None and len(storage) != len(row_shapes):
            raise ValueError(
                f"StaticKVCache storage holds {len(storage)} layers for {len(row_shapes)} row "
                "shapes; give one (keys, values) per layer"
            )
        parts = [None] * len(row_shapes) if storage is None else list(storage)
        layers = [
            StaticKVLayer(shape, max_seq_len, dtype, device, part)
            for shape, part in zip(row_shapes, parts, strict=True)
        ]
        super().__init__(layers=layers)
        self.max_seq_len = max_seq_len

    @property
    def length(self) -> int:
        """Positions held (every layer holds the same number between forwards)."""
        return self.layers[0].length

    def crop_to(self, length: int) -> None:
        """Drop every position ``>= length`` in every layer (moves lengths, copies nothing).

        Raises:
            ValueError: ``length`` is negative.
        """
        if length < 0:
            raise ValueError(f"crop_to length must be >= 0, got {length}")
        for layer in self.layers:
            layer.length = min(layer.length, length)

    def set_length(self, length: int) -> None:
        """Declare every layer filled up to ``length`` (after a replayed CUDA graph wrote the
        rows: the replay runs no Python, so no ``update`` moved the lengths).

        Raises:
            ValueError: ``length`` outside ``[0, max_seq_len]``.
        """
        if not 0 <= length <= self.max_seq_len:
            raise ValueError(f"length must be in [0, {self.max_seq_len}], got {length}")
        for layer in self.layers:
            layer.length = length

    @contextlib.contextmanager
    def window(self, window: int, positions: torch.Tensor, end: int) -> Iterator[None]:
        """Run the block's forward in window mode (see the module docstring).

        Args:
            window: rows every ``update`` returns, ``end <= window <= max_seq_len``.
            positions: ``[T]`` int64 device positions the ``T`` new rows are written to.
            end: the length once the rows are written (a host int: the positions' last + 1).

        Raises:
            ValueError: a window outside ``[end, max_seq_len]``.
        """
        if not end <= window <= self.max_seq_len:
            raise ValueError(
                f"window={window} must hold the {end} filled positions and fit "
                f"max_seq_len={self.max_seq_len}"
            )
        for layer in self.layers:
            layer._window = (window, positions, end)
        try:
            yield
        finally:
            for layer in self.layers:
                layer._window = None

    @property
    def nbytes(self) -> int:
        """Device bytes of every layer's buffers."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)
