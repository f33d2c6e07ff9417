"""Prompt text to token ids: a model's tokenizer, or UTF-8 bytes for tokenizer-less models.

The full-size presets have seeded random weights and no tokenizer. Their prompts are still
real text (HumanEval), so every system sees the same realistic token sequence:
:class:`ByteTokenizer` maps each UTF-8 byte to one id, which fits every model's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["ByteTokenizer", "TextTokenizer", "encode_prompt", "truncate_prompt"]


class TextTokenizer(Protocol):
    """What the benchmark needs of a tokenizer (transformers tokenizers fit)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, special tokens included as the tokenizer adds them."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``."""
        ...


class ByteTokenizer:
    """One id per UTF-8 byte, after a BOS id: ``id = byte + offset``.

    A vocabulary smaller than ``256 + offset`` (the tiny test presets) folds bytes into it:
    ``id = offset + byte % (vocab_size - offset)``; decoding is then lossy.

    Args:
        offset: id of byte 0 (ids below it are special: 0 is BOS/EOS).
        vocab_size: the model's vocabulary (None: ``256 + offset``, no folding).

    Raises:
        ValueError: ``offset`` < 1 or a vocabulary without room for one byte id.

    Example:
        >>> tok = ByteTokenizer()
        >>> tok.encode("hi")
        [0, 107, 108]
        >>> tok.decode(tok.encode("hi"))
        'hi'
    """

    name = "bytes"

    def __init__(self, offset: int = 3, vocab_size: int | None = None) -> None:
        if offset < 1:
            raise ValueError(f"offset must be >= 1 (id 0 is BOS), got {offset}.")
        if vocab_size is not None and vocab_size <= offset:
            raise ValueError(f"vocab_size={vocab_size} leaves no id for bytes after {offset}.")
        self.offset = offset
        self.bos_token_id = 0
        self.eos_token_id = 0
        self.vocab_size = min(256 + offset, vocab_size or 256 + offset)
        self._span = self.vocab_size - offset

    def encode(self, text: str) -> list[int]:
        """``[BOS, byte + offset, ...]`` (bytes folded into a small vocabulary)."""
        return [self.bos_token_id, *(b % self._span + self.offset for b in text.encode("utf-8"))]

    def decode(self, ids: Sequence[int]) -> str:
        """Bytes of the ids in the byte range (others, such as specials, are skipped)."""
        data = bytes(i - self.offset for i in ids if self.offset <= i < self.offset + self._span)
        return data.decode("utf-8", errors="replace")


def truncate_prompt(ids: Sequence[int], max_tokens: int, keep: str = "start") -> list[int]:
    """Cut a token sequence to at most ``max_tokens`` ids.

    Args:
        ids: the prompt's token ids.
        max_tokens: the budget (>= 1).
        keep: ``"start"`` keeps the first ``max_tokens`` ids (a document's beginning, its
            BOS included); ``"end"`` keeps the first id (BOS) and the last ``max_tokens - 1``
            (the text right before generation starts).

    Raises:
        ValueError: ``max_tokens`` < 1 or an unknown ``keep``.
    """
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}.")
    ids = list(ids)
    if len(ids) <= max_tokens:
        return ids
    if keep == "start":
        return ids[:max_tokens]
    if keep == "end":
        return ids[:1] + ids[len(ids) - (max_tokens - 1) :] if max_tokens > 1 else ids[:1]
    raise ValueError(f"keep must be 'start' or 'end', got {keep!r}.")


def encode_prompt(
    text: str,
    tokenizer: TextTokenizer,
    max_tokens: int | None = None,
    *,
    vocab_size: int | None = None,
    keep: str = "start",
) -> list[int]:
    """Encode ``text`` and cut it to ``max_tokens``.

    Args:
        text: the prompt.
        tokenizer: anything with ``encode(text) -> list[int]``.
        max_tokens: token budget (None: no cut).
        vocab_size: the model's vocabulary; ids at or above it raise instead of indexing
            out of range later.
        keep: see :func:`truncate_prompt`.

    Raises:
        ValueError: an empty encoding, or ids outside the model's vocabulary.
    """
    ids = list(tokenizer.encode(text))
    if not ids:
        raise ValueError(f"the tokenizer encoded {text[:40]!r} to no tokens; give a longer prompt.")
    if max_tokens is not None:
        ids = truncate_prompt(ids, max_tokens, keep)
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ValueError(
            f"the tokenizer produced id {max(ids)} but the model's vocabulary has {vocab_size} "
            "entries; use the model's own tokenizer (or bytes for random-weight models)."
        )
    return ids
