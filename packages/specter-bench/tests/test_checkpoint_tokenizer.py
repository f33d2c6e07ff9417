"""checkpoint_tokenizer: a byte-level BPE of exactly the model's vocabulary, with the config's
special ids, that transformers reloads and llama.cpp's converter can be told about."""

import json

import pytest
from transformers import AutoTokenizer

from specter_bench.checkpoint_tokenizer import (
    LLAMA_CPP_PRE_TOKENIZER,
    TOKENIZER_MARKER,
    build_checkpoint_tokenizer,
    read_tokenizer_marker,
    write_checkpoint_tokenizer,
)

TEXTS = [
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for item in range(10):\n    print(item, 'squared is', item * item)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n",
] * 20
PROMPT = 'def quicksort(xs):\n    """Sort a list. ünïcödé ✓"""\n    return sorted(xs)\n'


@pytest.mark.parametrize(
    ("vocab", "bos", "eos"),
    [(102400, 100000, 100001), (151936, 151643, 151643), (32064, 1, 32000)],
    ids=["deepseek-v2-lite", "qwen1.5-moe", "phi-3.5-moe"],
)
def test_vocabulary_is_exactly_the_models_and_text_round_trips(tmp_path, vocab, bos, eos):
    summary = write_checkpoint_tokenizer(
        tmp_path, TEXTS, vocab_size=vocab, bos_token_id=bos, eos_token_id=eos, model_max_length=64
    )
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert len(tokenizer) == vocab
    assert sorted(tokenizer.get_vocab().values()) == list(range(vocab))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (bos, eos)
    ids = tokenizer.encode(PROMPT)
    assert ids[0] == bos  # encoding prepends BOS
    assert tokenizer.decode(ids, skip_special_tokens=True) == PROMPT
    assert len(ids) < len(PROMPT)  # merges learned from the texts apply
    # Only trained tokens come out of encoding: placeholders are unreachable.
    trained_ids = {i for i in range(vocab) if i not in (bos, eos)}
    trained_ids = set(sorted(trained_ids)[: summary.trained_tokens])
    assert set(ids[1:]) <= trained_ids
    specials = 1 if bos == eos else 2
    assert summary.trained_tokens + summary.placeholder_tokens + specials == vocab
    marker = read_tokenizer_marker(tmp_path)
    assert marker["llama_cpp_pre_tokenizer"] == LLAMA_CPP_PRE_TOKENIZER == "gpt-2"
    assert marker["sha256"] == summary.sha256
    assert (tmp_path / TOKENIZER_MARKER).is_file()


def test_pre_tokenizer_is_gpt2s_byte_level_split(tmp_path):
    write_checkpoint_tokenizer(
        tmp_path, TEXTS, vocab_size=300, bos_token_id=299, eos_token_id=299, model_max_length=8
    )
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["pre_tokenizer"]["type"] == "ByteLevel"
    assert saved["pre_tokenizer"]["use_regex"] is True
    assert saved["pre_tokenizer"]["add_prefix_space"] is False
    assert saved["model"]["type"] == "BPE"


def test_the_same_texts_give_the_same_tokenizer(tmp_path):
    a, _ = build_checkpoint_tokenizer(
        TEXTS, vocab_size=1000, bos_token_id=998, eos_token_id=999, model_max_length=8
    )
    b, _ = build_checkpoint_tokenizer(
        TEXTS, vocab_size=1000, bos_token_id=998, eos_token_id=999, model_max_length=8
    )
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()


def test_vocabularies_without_room_are_refused():
    with pytest.raises(ValueError, match="does not fit"):
        build_checkpoint_tokenizer(
            TEXTS, vocab_size=96, bos_token_id=1, eos_token_id=2, model_max_length=8
        )
    with pytest.raises(ValueError, match="does not fit"):
        build_checkpoint_tokenizer(
            TEXTS, vocab_size=1000, bos_token_id=1000, eos_token_id=1, model_max_length=8
        )
    with pytest.raises(ValueError, match="texts is empty"):
        build_checkpoint_tokenizer(
            [], vocab_size=1000, bos_token_id=1, eos_token_id=2, model_max_length=8
        )
    assert read_tokenizer_marker("/nonexistent") is None
