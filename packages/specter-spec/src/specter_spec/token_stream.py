"""The iterator over committed tokens that :class:`SpecController` returns, and its prompt."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from specter_spec.statistics import GenerationResult, GenerationStats

if TYPE_CHECKING:
    from specter_spec.controller import SpecController

__all__ = ["TokenStream", "prompt_tensor"]


def prompt_tensor(prompt_ids: Any, device: torch.device | None) -> torch.Tensor:
    """``[P]`` int64 prompt on ``device`` from a list, a ``[P]`` or a ``[1, P]`` tensor."""
    if isinstance(prompt_ids, torch.Tensor):
        ids = prompt_ids
        if ids.dim() == 2 and ids.shape[0] == 1:
            ids = ids[0]
        if ids.dim() != 1:
            raise ValueError(
                f"prompt_ids must have shape [P] or [1, P] (batch size one), "
                f"got {tuple(prompt_ids.shape)}."
            )
        if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise TypeError(f"prompt_ids must hold integer token ids, got dtype {ids.dtype}.")
        ids = ids.to(dtype=torch.long, device=device if device is not None else ids.device)
    else:
        tokens = list(prompt_ids)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise TypeError("prompt_ids must be a sequence of int token ids or a LongTensor.")
        ids = torch.tensor(tokens, dtype=torch.long, device=device)
    if ids.numel() == 0:
        raise ValueError("prompt_ids is empty; give at least one token (e.g. a BOS token).")
    return ids


class TokenStream:
    """Iterator over tokens as :class:`SpecController` commits them.

    Attributes:
        tokens: every committed token so far, prompt first (a Python list).
        stats: statistics so far.
        stop_reason: None while running, then ``"stop_token"`` or ``"max_new_tokens"``.
    """

    def __init__(
        self,
        controller: SpecController,
        prompt: torch.Tensor,
        max_new_tokens: int,
        stop: frozenset[int],
        generator: torch.Generator | None,
    ) -> None:
        self.prompt_length = prompt.numel()
        self.tokens: list[int] = []
        self.stats = GenerationStats(prompt_length=self.prompt_length)
        self.stop_reason: str | None = None
        self._tokens = controller._decode(self, prompt, max_new_tokens, stop, generator)

    def __iter__(self) -> Iterator[int]:
        return self

    def __next__(self) -> int:
        return next(self._tokens)

    @property
    def new_tokens(self) -> list[int]:
        """Tokens generated so far (prompt excluded)."""
        return self.tokens[self.prompt_length :]

    def result(self) -> GenerationResult:
        """Run to the end and return the tokens and statistics."""
        for _ in self._tokens:
            pass
        return GenerationResult(
            tokens=self.new_tokens, stop_reason=self.stop_reason or "", stats=self.stats
        )
