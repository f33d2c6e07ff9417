"""Byte tokenizer, prompt truncation and encoding checks."""

import random

import pytest

from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt, truncate_prompt


def test_byte_tokenizer_round_trips_utf8():
    rng = random.Random(0)
    tok = ByteTokenizer()
    text = "".join(rng.choice("abc def\nπ∑ü€😀") for _ in range(200))
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id
    assert len(ids) == 1 + len(text.encode("utf-8"))
    assert all(3 <= i < tok.vocab_size for i in ids[1:])
    assert tok.decode(ids) == text


def test_truncate_prompt_keeps_start_or_bos_plus_end():
    ids = list(range(100, 120))
    assert truncate_prompt(ids, 50) == ids
    assert truncate_prompt(ids, 5) == ids[:5]
    assert truncate_prompt(ids, 5, keep="end") == [100, 116, 117, 118, 119]
    assert truncate_prompt(ids, 1, keep="end") == [100]
    with pytest.raises(ValueError, match="max_tokens must be an int >= 1"):
        truncate_prompt(ids, 0)
    with pytest.raises(ValueError, match="keep must be"):
        truncate_prompt(ids, 3, keep="middle")


def test_encode_prompt_checks_the_vocabulary():
    tok = ByteTokenizer()
    assert encode_prompt("hello world", tok, max_tokens=4) == tok.encode("hel")  # BOS + 3 bytes
    with pytest.raises(ValueError, match="vocabulary has 100 entries"):
        encode_prompt("hello", tok, vocab_size=100)

    class Empty:
        def encode(self, text):
            return []

    with pytest.raises(ValueError, match="no tokens"):
        encode_prompt("x", Empty())
