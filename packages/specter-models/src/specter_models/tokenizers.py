"""Tokenizers: a checkpoint's own, or UTF-8 bytes for models that have none.

The full-size presets have seeded random weights and no tokenizer. Their prompts are still
real text, so :class:`ByteTokenizer` maps each UTF-8 byte to one id, which fits every
model's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["ByteTokenizer", "TextTokenizer"]


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
