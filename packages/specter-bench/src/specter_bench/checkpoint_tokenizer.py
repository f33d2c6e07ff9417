"""A byte-level BPE tokenizer whose vocabulary is exactly a model's, for written checkpoints.

The full-size presets have no tokenizer; a checkpoint folder written from one
(``specter write-checkpoint``) gets this one, so that Specter, transformers and llama.cpp
(whose converter needs a tokenizer of the checkpoint's vocabulary size) all encode a prompt
into the same ids.

Layout: the config's BOS and EOS ids hold the special tokens (one ``<|endoftext|>`` when
they are the same id, as in Qwen1.5-MoE); the lowest other ids hold the BPE vocabulary
trained with the ``tokenizers`` library on the given texts (the demo corpus: the Python
standard library's sources), in training order; every id left is a placeholder entry
``<|pad_N|>`` that no merge produces, because a few megabytes of text supply fewer merges
than a 100k vocabulary (DeepSeek-V2-Lite 102,400 ids, Qwen1.5-MoE 151,936). Placeholders
are plain vocabulary entries rather than added tokens: tens of thousands of added tokens
would make transformers and llama.cpp scan every prompt for each of them. Encoding
prepends BOS.

The pre-tokenizer is GPT-2's byte-level split, which llama.cpp implements as the
pre-tokenizer ``gpt-2``: llama.cpp's converter recognises a tokenizer by a hash of the ids
it gives a probe text, so a newly trained one is told to it by name
(:data:`LLAMA_CPP_PRE_TOKENIZER`, recorded in :data:`TOKENIZER_MARKER`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from specter_bench.training.tokenizer import tokenizer_sha256

__all__ = [
    "LLAMA_CPP_PRE_TOKENIZER",
    "TOKENIZER_MARKER",
    "TokenizerSummary",
    "build_checkpoint_tokenizer",
    "read_tokenizer_marker",
    "write_checkpoint_tokenizer",
]

LLAMA_CPP_PRE_TOKENIZER = "gpt-2"
"""llama.cpp's name for the pre-tokenizer these tokenizers use (GPT-2's regex split)."""
TOKENIZER_MARKER = "specter_tokenizer.json"
_BYTE_SYMBOLS = 256


@dataclass(frozen=True)
class TokenizerSummary:
    """What :func:`write_checkpoint_tokenizer` wrote (the marker file's content).

    Attributes:
        vocab_size: ids in the vocabulary (the model's ``vocab_size``).
        trained_tokens: byte symbols plus merges learned from the texts.
        placeholder_tokens: ``<|pad_N|>`` entries filling the rest.
        bos_token_id, eos_token_id: where BOS and EOS are.
        llama_cpp_pre_tokenizer: the name llama.cpp's converter is given.
        sha256: digest of ``tokenizer.json``'s content (vocabulary, merges, processors).
        corpus: what the BPE was trained on.
        seconds: time taken.
    """

    vocab_size: int
    trained_tokens: int
    placeholder_tokens: int
    bos_token_id: int
    eos_token_id: int
    llama_cpp_pre_tokenizer: str
    sha256: str
    corpus: dict
    seconds: float


def build_checkpoint_tokenizer(
    texts: Sequence[str],
    *,
    vocab_size: int,
    bos_token_id: int,
    eos_token_id: int,
    model_max_length: int,
) -> tuple[PreTrainedTokenizerFast, int]:
    """A byte-level BPE tokenizer of exactly ``vocab_size`` ids.

    Args:
        texts: training documents.
        vocab_size: the model's vocabulary size.
        bos_token_id, eos_token_id: the config's BOS and EOS ids (may be equal).
        model_max_length: the longest sequence the model takes.

    Returns:
        ``(tokenizer, trained)``: ``len(tokenizer) == vocab_size``, and the number of ids the
        BPE learned (the rest are placeholders and the special tokens).

    Raises:
        ValueError: no texts, or a vocabulary without room for the 256 byte symbols and
            the special ids.
    """
    if not texts:
        raise ValueError("texts is empty; the tokenizer needs at least one training document")
    specials = (
        {bos_token_id: "<|endoftext|>"}
        if bos_token_id == eos_token_id
        else {bos_token_id: "<|begin_of_text|>", eos_token_id: "<|end_of_text|>"}
    )
    if vocab_size < _BYTE_SYMBOLS + len(specials) or not all(0 <= i < vocab_size for i in specials):
        raise ValueError(
            f"a byte-level BPE of {vocab_size} ids with BOS {bos_token_id} and EOS "
            f"{eos_token_id} does not fit: it needs the 256 byte symbols and the special ids "
            "inside the vocabulary; a model this small has no use for one"
        )
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(specials),
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer, length=len(texts))
    trained = json.loads(bpe.to_str())["model"]
    merges = [tuple(pair) for pair in trained["merges"]]
    # Trained tokens take the ids below and around the special ones, in training order.
    free = (i for i in range(vocab_size) if i not in specials)
    by_rank = sorted(trained["vocab"].items(), key=lambda item: item[1])
    vocab: dict[str, int] = {text: next(free) for text, _ in by_rank}
    for token_id, text in specials.items():
        vocab[text] = token_id
    for token_id in free:
        vocab[_placeholder(token_id, vocab)] = token_id
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(text, special=True, normalized=False) for text in specials.values()]
    )
    bos, eos = specials[bos_token_id], specials[eos_token_id]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A $B:1",
        special_tokens=[(bos, bos_token_id)],
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=eos,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    return wrapped, len(trained["vocab"])


def write_checkpoint_tokenizer(
    folder: str | os.PathLike[str],
    texts: Sequence[str],
    *,
    vocab_size: int,
    bos_token_id: int,
    eos_token_id: int,
    model_max_length: int,
    corpus: dict | None = None,
) -> TokenizerSummary:
    """Train, pad and save the tokenizer into a checkpoint folder, with its marker.

    Writes ``tokenizer.json``, ``tokenizer_config.json`` (and what ``save_pretrained`` adds)
    and :data:`TOKENIZER_MARKER` last. Arguments as :func:`build_checkpoint_tokenizer`;
    ``corpus`` describes the texts in the marker.

    Raises:
        ValueError: as :func:`build_checkpoint_tokenizer`.
    """
    start = time.perf_counter()
    tokenizer, trained = build_checkpoint_tokenizer(
        texts,
        vocab_size=vocab_size,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        model_max_length=model_max_length,
    )
    folder = Path(folder)
    tokenizer.save_pretrained(folder)
    specials = 1 if bos_token_id == eos_token_id else 2
    summary = TokenizerSummary(
        vocab_size=vocab_size,
        trained_tokens=trained,
        placeholder_tokens=vocab_size - trained - specials,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        llama_cpp_pre_tokenizer=LLAMA_CPP_PRE_TOKENIZER,
        sha256=tokenizer_sha256(tokenizer),
        corpus=dict(corpus or {}),
        seconds=time.perf_counter() - start,
    )
    (folder / TOKENIZER_MARKER).write_text(json.dumps(asdict(summary), indent=2) + "\n")
    return summary


def read_tokenizer_marker(folder: str | os.PathLike[str]) -> dict | None:
    """The :data:`TOKENIZER_MARKER` of a checkpoint folder, or None where it has none."""
    path = Path(folder) / TOKENIZER_MARKER
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else None


def _placeholder(token_id: int, vocab: dict[str, int]) -> str:
    """``<|pad_N|>``, made unique against the trained vocabulary."""
    text = f"<|pad_{token_id}|>"
    while text in vocab:
        text = "_" + text
    return text
