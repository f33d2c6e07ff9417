"""Prompt text to token ids: a model's tokenizer, or UTF-8 bytes for tokenizer-less models.

The full-size presets have seeded random weights and no tokenizer. Their prompts are still
real text (HumanEval), so every system sees the same realistic token sequence:
:class:`ByteTokenizer` maps each UTF-8 byte to one id, which fits every model's vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence

from specter_models.tokenizers import ByteTokenizer, TextTokenizer

__all__ = ["ByteTokenizer", "TextTokenizer", "encode_prompt", "truncate_prompt"]


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
