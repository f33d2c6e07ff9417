"""The model card (README.md) written beside a trained checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import tokenizers
import torch
import transformers

__all__ = ["write_model_card"]


def write_model_card(out: Path, facts: dict) -> None:
    """Writes README.md: what the model is, its corpus, training and measured results."""
    s = facts["settings"]
    corpus = facts["corpus"]
    final = facts["saved_eval"]
    usage = "\n".join(
        f"| {u['layer']} | {u['entropy']:.3f} | {u['max_load']:.2f} | {u['unused_experts']} |"
        for u in final["expert_usage"]
    )
    samples = "\n\n".join(
        f"Prompt `{json.dumps(g['prompt'])}`:\n\n```python\n{g['prompt']}{g['completion']}\n```"
        for g in facts["generations"]
    )
    config = facts["model_config"]
    initial = facts["initial_eval"]
    saved_precision = facts["saved_precision"]
    saved_rule = "lowest held-out loss" if s["keep_best"] else "the last step"
    card = f"""---
license: psf-2.0
library_name: transformers
pipeline_tag: text-generation
tags: [moe, {config["model_type"]}, tiny, demo]
---

# {facts["name"]}

**A tiny demo model.** {facts["description"]}. It was trained for a few minutes on the
Python standard library so that Specter's demo and benchmarks run on trained (not random)
weights. It writes Python-looking code; it is not useful for any real task.

## Architecture

transformers `{config["architectures"][0]}` (model_type `{config["model_type"]}`),
{facts["params"]["parameters"]:,} parameters ({facts["params"]["active_parameters_per_token"]:,}
active per token), weights saved in float16 safetensors.

```json
{json.dumps({k: config[k] for k in facts["config_keys"] if k in config}, indent=1)}
```

## Corpus

The `*.py` files of the standard library of Python {corpus["python_version"]}
({corpus["python_implementation"]}), without test suites (`test/`, `tests/`, `idle_test/`),
site-packages, `pydoc_data/` and the generated codec tables in `encodings/`:
{corpus["train_files"]} training files ({corpus["train_bytes"]:,} bytes) and
{corpus["heldout_files"]} held-out files ({corpus["heldout_bytes"]:,} bytes), split by a
salted SHA-256 of each relative path. Corpus SHA-256: `{corpus["sha256"]}`.
Training tokens: {facts["train_tokens"]:,}; held-out tokens: {facts["heldout_tokens"]:,}.

Tokenizer: byte-level BPE (`tokenizers` {tokenizers.__version__}), vocabulary
{facts["vocab_size"]}, trained on the training split only; `<|endoftext|>` (id 0) is BOS,
EOS and padding and is prepended when encoding. SHA-256 `{facts["tokenizer_sha256"]}`.

## Training

Seed {s["seed"]}; {facts["steps_run"]} AdamW steps{facts["steps_note"]}
(betas 0.9/0.95, weight decay {s["weight_decay"]}), peak learning rate
{s["learning_rate"]}, {s["warmup_steps"]} warm-up steps then cosine to
{s["min_lr_ratio"]}x; batch {s["batch_size"]} x {s["seq_len"]} tokens (packed stream,
random windows); load-balance term weight {s["balance_coef"]};
{facts["tokens_seen"]:,} tokens seen ({facts["epochs_seen"]:.1f} epochs).
Device: {facts["device_name"]}, {facts["precision"]}; experts implementation while
training: `{facts["experts_implementation"]}`. Wall time {facts["wall_s"]:.0f} s.
The saved weights are those of step {facts["saved_step"]} ({saved_rule}).
torch {torch.__version__}, transformers {transformers.__version__}.

## Results

| | held-out loss (nats/token) | perplexity |
|---|---|---|
| at step 0 | {initial["heldout_loss"]:.4f} | {initial["heldout_ppl"]:.1f} |
| saved (reloaded, {saved_precision}) | {final["heldout_loss"]:.4f} | {final["heldout_ppl"]:.2f} |

Expert usage of the saved checkpoint on the held-out tokens (entropy of the expert-load
distribution over log E: 1 is perfectly balanced; max load: busiest expert's share times E):

| layer | entropy | max load | unused experts |
|---|---|---|---|
{usage}

Greedy completions (transformers `generate`, {s["max_new_tokens"]} new tokens at most):

{samples}

## Reproduce

```
{facts["reproduce"]}
```

on Python {corpus["python_version"]} (the corpus is that interpreter's standard library:
another version gives another corpus, recorded by its SHA-256). Runs on a GPU are not
bit-exact (atomic adds in the backward pass). `training_log.jsonl` holds every logged step.
"""
    (out / "README.md").write_text(card, encoding="utf-8")
