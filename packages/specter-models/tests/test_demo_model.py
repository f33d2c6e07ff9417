"""The shipped demo checkpoint (specter-code-tiny): trained weights, the real loading path,
and exact greedy speculation against transformers' own generate on the same files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specter_models
from specter_models.loader import load_model
from specter_spec import SpecController

FOLDER = Path(specter_models.__file__).parent / "data" / "specter-code-tiny"
pytestmark = pytest.mark.skipif(not FOLDER.is_dir(), reason="demo checkpoint not shipped")


def test_demo_model_is_trained_on_code():
    # Unseen Python (this file) must be far more likely than under a uniform model:
    # random or wrongly loaded weights sit near log(V) nats per token.
    tok = AutoTokenizer.from_pretrained(FOLDER)
    model = AutoModelForCausalLM.from_pretrained(FOLDER, dtype=torch.float32).eval()
    ids = tok(Path(__file__).read_text(), return_tensors="pt")["input_ids"][:, :256]
    with torch.no_grad():
        nll = model(ids, labels=ids).loss.item()
    uniform = torch.log(torch.tensor(float(model.config.vocab_size))).item()
    assert nll < uniform - 2.0, f"{nll:.2f} nats/token vs uniform {uniform:.2f}"


def test_demo_speculative_greedy_equals_transformers_generate():
    lm = load_model("specter-code-tiny", device="cpu", dtype=torch.float64, slots_per_layer=8)
    prompt = lm.tokenizer("def fibonacci(n):")["input_ids"]
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4).generate(prompt, 40)
    reference = AutoModelForCausalLM.from_pretrained(
        FOLDER,
        dtype=torch.float64,
        experts_implementation="eager",  # no float64 grouped_mm
    ).eval()
    reference.generation_config.eos_token_id = None
    with torch.no_grad():
        expected = reference.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=40,
            do_sample=False,
        )[0].tolist()
    assert prompt + spec.tokens == expected
    stats = spec.stats
    assert stats.acceptance_rate > 0.5  # the INT4 draft of a trained model agrees often
    assert lm.cache.stats()["total"]["misses"] > 0  # 8 of 16 slots: the cache did work
