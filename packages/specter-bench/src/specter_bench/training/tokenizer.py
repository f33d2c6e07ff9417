"""A byte-level BPE tokenizer trained on the corpus, and the packed token stream.

The tokenizer is trained with the `tokenizers` library on the training split only and
wrapped as a transformers fast tokenizer, so `AutoTokenizer.from_pretrained(dir)` loads it
offline. One special token, <|endoftext|>, is BOS, EOS and PAD at once (GPT-2's
convention): the packed stream puts it before every file, and encoding a prompt prepends
it, so a prompt looks like the start of a file.
"""

from __future__ import annotations

import hashlib

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

END_OF_TEXT = "<|endoftext|>"
# 256 byte symbols plus the special token: the smallest vocabulary byte-level BPE can have.
MIN_VOCAB_SIZE = 257


def train_bpe_tokenizer(
    texts: list[str], vocab_size: int, model_max_length: int
) -> PreTrainedTokenizerFast:
    """Trains a byte-level BPE tokenizer.

    Args:
        texts: Training documents (the training split's files).
        vocab_size: Target vocabulary size including <|endoftext|>.
        model_max_length: Longest sequence the model accepts (its position limit).

    Returns:
        A fast tokenizer whose id 0 is <|endoftext|> and whose encoding prepends it.

    Raises:
        ValueError: If vocab_size is below 257 or texts is empty.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size={vocab_size} is too small for byte-level BPE; pass at least "
            f"{MIN_VOCAB_SIZE} (256 bytes + {END_OF_TEXT})."
        )
    if not texts:
        raise ValueError("texts is empty; the tokenizer needs at least one training document.")
    tokenizer = Tokenizer(models.BPE())
    # GPT-2's pre-tokenizer keeps runs of indentation together, which BPE then merges.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    eot_id = tokenizer.token_to_id(END_OF_TEXT)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{END_OF_TEXT} $A",
        pair=f"{END_OF_TEXT} $A {END_OF_TEXT} $B:1",
        special_tokens=[(END_OF_TEXT, eot_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=END_OF_TEXT,
        eos_token=END_OF_TEXT,
        pad_token=END_OF_TEXT,
        model_max_length=model_max_length,
        # Code: never collapse spaces before punctuation when decoding.
        clean_up_tokenization_spaces=False,
    )


def tokenizer_sha256(tokenizer: PreTrainedTokenizerFast) -> str:
    """Digest of the tokenizer's serialized form (vocabulary, merges, processors)."""
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> np.ndarray:
    """Tokenizes documents into one packed stream, each preceded by <|endoftext|>.

    Args:
        tokenizer: The trained tokenizer.
        texts: Documents in a fixed order.

    Returns:
        Token ids `[N]` as uint16 when the vocabulary fits, else int32.
    """
    eot_id = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    pieces: list[np.ndarray] = []
    for encoding in encodings:
        pieces.append(np.asarray([eot_id], dtype=np.int64))
        pieces.append(np.asarray(encoding.ids, dtype=np.int64))
    stream = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
    dtype = np.uint16 if len(tokenizer) <= np.iinfo(np.uint16).max + 1 else np.int32
    return stream.astype(dtype)
