"""Attention one sequence at a time inside a forward over several sequences' rows.

A batched decoding step packs the new rows of ``B`` sequences into one "sequence" of
``N`` rows (``[1, N, H]``): embeddings, norms, projections, routers, experts and the LM
head then see ``N`` rows at once, and the routed experts of a layer are the union of every
row's. Attention is the one part whose rows depend on other rows; each sequence's rows must
attend to that sequence's own keys only, at its own positions.

:func:`install_segmented_attention` wraps every attention module's forward (once): while a
plan is active (:meth:`SegmentedAttention.segments`), the wrapper cuts the hidden states
into the plan's segments and calls the module's own forward, fusions and batch-invariance
scope included, on each segment alone, with that sequence's KV cache slot, its mask and its
rows of the position embeddings (computed by the model for all ``N`` rows from per-row
position ids; a rotary frequency is one product per element, the same bits for any row
count). The outputs are joined in order. A segment's attention is thus the single-sequence
code on the same inputs, so it gives the bits a forward of that sequence alone gives, and
its keys and values go to its own slot. With no plan the wrapper calls the forward as is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from specter_models.kv_cache import StaticKVCache
from specter_models.module_patches import patch_forwards

__all__ = ["AttentionSegment", "SegmentedAttention", "install_segmented_attention"]

_HOLDER = "_specter_segmented_attention"
_CACHE_KEYWORDS = ("past_key_values", "cache")


@dataclass(frozen=True)
class AttentionSegment:
    """One sequence's rows of a packed forward.

    Attributes:
        begin: its first row among the forward's ``N`` rows.
        end: one past its last row.
        cache: its KV cache slot (in window mode for the forward: see ``batch_forward``).
        mask: its ``[1, 1, rows, window]`` attention mask (bool or additive).
    """

    begin: int
    end: int
    cache: StaticKVCache
    mask: torch.Tensor


class SegmentedAttention:
    """The plan the attention wrappers of one model read (see the module docstring)."""

    def __init__(self) -> None:
        self.plan: tuple[AttentionSegment, ...] | None = None
        self.modules = 0

    @contextlib.contextmanager
    def segments(self, plan: Sequence[AttentionSegment]) -> Iterator[None]:
        """Attend per segment of ``plan`` inside the block.

        Raises:
            ValueError: an empty plan, or segments that are not consecutive from row 0.
        """
        plan = tuple(plan)
        if not plan:
            raise ValueError("a segmented forward needs at least one segment")
        row = 0
        for segment in plan:
            if segment.begin != row or segment.end <= segment.begin:
                raise ValueError(
                    f"attention segments must cover rows 0..N-1 in order, each at least one "
                    f"row; got rows {segment.begin}..{segment.end - 1} after row {row - 1}"
                )
            row = segment.end
        previous, self.plan = self.plan, plan
        try:
            yield
        finally:
            self.plan = previous


def is_attention(module: nn.Module) -> bool:
    """A transformers attention module of a decoder layer (its class name ends with
    ``Attention`` and it knows its layer)."""
    return type(module).__name__.endswith("Attention") and hasattr(module, "layer_idx")


def install_segmented_attention(model: nn.Module) -> SegmentedAttention:
    """Wrap ``model``'s attention modules (once) and return the plan holder they read.

    Install it after every other patch of the attention modules (fusions, invariance
    scopes): each segment then runs all of them.
    """
    holder = model.__dict__.get(_HOLDER)
    if holder is None:
        holder = SegmentedAttention()
        model.__dict__[_HOLDER] = holder
    holder.modules += patch_forwards(
        model,
        is_attention,
        "_specter_segmented",
        lambda module, plain: _segmented_forward(plain, holder),
    )
    return holder


def _rows(value: Any, begin: int, end: int, total: int) -> Any:
    """``value``'s rows ``begin..end-1`` along dim 1 where it is a ``[1, N, ...]`` tensor (or
    a tuple of them, as rotary ``(cos, sin)``); anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value[:, begin:end] if value.dim() >= 2 and value.shape[1] == total else value
    if isinstance(value, tuple):
        return tuple(_rows(v, begin, end, total) for v in value)
    return value


def _segmented_forward(plain: Callable[..., Any], holder: SegmentedAttention) -> Callable[..., Any]:
    def forward(*args: Any, **kwargs: Any) -> Any:
        plan = holder.plan
        if plan is None:
            return plain(*args, **kwargs)
        if "hidden_states" in kwargs:
            hidden = kwargs.pop("hidden_states")
        elif args:
            hidden, args = args[0], args[1:]
        else:
            raise TypeError("an attention forward without hidden_states")
        if args:
            raise TypeError(
                "segmented attention takes the decoder layer's keyword arguments only; this "
                f"call passed {len(args)} more positional ones"
            )
        total = hidden.shape[1]
        if plan[-1].end != total:
            raise ValueError(
                f"the attention segments cover {plan[-1].end} rows, the forward has {total}"
            )
        keyword = next((k for k in _CACHE_KEYWORDS if k in kwargs), _CACHE_KEYWORDS[0])
        outputs = []
        for segment in plan:
            call = {
                name: _rows(value, segment.begin, segment.end, total)
                for name, value in kwargs.items()
            }
            call[keyword] = segment.cache
            call["attention_mask"] = segment.mask
            out = plain(hidden_states=hidden[:, segment.begin : segment.end], **call)
            outputs.append(out[0])
        joined = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        return joined, None

    return forward
