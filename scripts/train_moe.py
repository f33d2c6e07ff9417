"""Train a small Mixture-of-Experts language model on the Python standard library.

Reproducible and offline: the corpus is the running interpreter's standard library
(train_corpus.py), the tokenizer is byte-level BPE trained on its training split
(train_tokenizer.py), and the model is transformers' own DeepSeek-V2, Qwen2-MoE or PhiMoE
(train_presets.py). The output folder is a Hugging Face checkpoint (fp16 safetensors,
config, tokenizer) with a model card and the JSON-lines training log.

    # CPU smoke run (about a minute; asserts the loss fell and the folder reloads)
    .venv/bin/python scripts/train_moe.py --smoke --out /tmp/specter-smoke

    # GPU run of the built-in demo model (see docs/training.md)
    source scripts/gpu-env.sh && python3 scripts/train_moe.py --out $OUT/specter-code-tiny

The step count is --steps, or else --epochs over the training tokens shortened to fit the
--max-minutes wall-clock budget; that choice is made from timed steps inside the warm-up,
before the schedule depends on it, so rerunning with the logged --steps repeats the run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import tokenizers
import torch
import torch.nn.functional as F
import transformers
from torch import nn
from train_corpus import Corpus, load_stdlib_corpus
from train_experts import choose_experts_implementation
from train_presets import PRESETS, SpecialTokens, get_preset
from train_routing import RouterMonitor, find_moe_routers
from train_tokenizer import (
    END_OF_TEXT,
    encode_stream,
    tokenizer_sha256,
    train_bpe_tokenizer,
)
from transformers import AutoModelForCausalLM, AutoTokenizer

GENERATION_PROMPTS = (
    "def fibonacci(n):",
    "import os\n\ndef ",
    "class Stack:\n    def __init__(self",
)
MAX_POSITIONS = 1024  # position limit written into the config (training uses seq_len)
FINALIZE_RESERVE_S = 45.0  # wall time kept for saving, reloading, evaluating, generating
CALIBRATION_STEPS = (5, 25)  # timed steps (inside the warm-up) that size the step count


@dataclass(frozen=True)
class RunSettings:
    """Everything that determines a run, after presets, flags and --smoke are combined."""

    arch: str
    seed: int
    steps: int | None
    epochs: float
    max_minutes: float
    batch_size: int
    seq_len: int
    learning_rate: float
    min_lr_ratio: float
    warmup_steps: int
    weight_decay: float
    grad_clip: float
    balance_coef: float
    vocab_size: int
    heldout_fraction: float
    max_files: int | None
    tokenizer_dir: str | None
    evals: int
    eval_windows: int
    log_every: int
    device: str
    experts_impl: str
    max_new_tokens: int
    keep_best: bool
    smoke: bool


class TrainingLog:
    """JSON-lines log: one record per event, each with the seconds since start."""

    def __init__(self, path: Path, start: float):
        self.path = path
        self.start = start
        self.records: list[dict] = []
        self._file = path.open("w", encoding="utf-8")

    def write(self, event: str, **fields) -> dict:
        record = {"event": event, "time_s": round(time.perf_counter() - self.start, 2), **fields}
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        return record

    def close(self) -> None:
        self._file.close()


def say(message: str) -> None:
    print(f"[train_moe] {message}", flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a small MoE LM on the Python standard library (offline, seeded). "
        "Flags marked 'preset' default to the --arch preset's value (docs/training.md).",
    )
    add = parser.add_argument
    add("--out", required=True, type=Path, help="output folder: the HF checkpoint and its log")
    add("--arch", default="dsv2-tiny", choices=sorted(PRESETS), help="default: dsv2-tiny")
    add("--seed", type=int, default=0, help="initialisation and batch sampling (default: 0)")
    add("--steps", type=int, default=None, help="optimizer steps (default: from --epochs)")
    add("--epochs", type=float, default=None, help="passes over the training tokens (preset)")
    add("--max-minutes", type=float, default=8.0, help="whole-run wall-clock budget (8)")
    add("--batch-size", type=int, default=None, help="sequences per step (preset)")
    add("--seq-len", type=int, default=None, help="tokens per sequence (preset)")
    add("--lr", type=float, default=None, help="peak learning rate (preset)")
    add("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr (0.1)")
    add("--warmup-steps", type=int, default=None, help="linear warm-up steps (preset)")
    add("--weight-decay", type=float, default=0.1, help="AdamW decay of matrices (0.1)")
    add("--grad-clip", type=float, default=1.0, help="gradient-norm clip (1.0)")
    add("--balance-coef", type=float, default=None, help="load-balance weight, 0 = off (preset)")
    add("--vocab-size", type=int, default=4096, help="BPE vocabulary size (4096)")
    add("--heldout-fraction", type=float, default=None, help="share of files held out (0.02)")
    add("--max-files", type=int, default=None, help="use a hash-chosen subset of the files")
    add("--tokenizer", default=None, help="reuse this tokenizer folder instead of training one")
    add("--evals", type=int, default=16, help="held-out evaluations during training (16)")
    add("--eval-windows", type=int, default=256, help="most held-out windows per eval (256)")
    add("--log-every", type=int, default=10, help="steps between training-log records (10)")
    add("--device", default=None, help="cuda or cpu (default: cuda when available)")
    add(
        "--experts-impl",
        default="auto",
        help="auto (grouped GEMM when it matches eager on a probe batch), eager, or "
        "specter_train_grouped_mm (default: auto)",
    )
    add("--max-new-tokens", type=int, default=64, help="tokens per generation check (64)")
    add("--no-keep-best", action="store_true", help="save the last step, not the best held-out")
    add("--overwrite", action="store_true", help="replace the files of a non-empty --out")
    add("--smoke", action="store_true", help="quick CPU run with self-checks (about a minute)")
    return parser.parse_args(argv)


def resolve_settings(args: argparse.Namespace) -> RunSettings:
    """Combines preset defaults, flags and --smoke; validates the result.

    Raises:
        ValueError: If a setting is out of range, naming it and the accepted range.
    """
    preset = get_preset(args.arch)
    defaults = preset.defaults
    smoke = args.smoke

    def pick(value, default, smoke_value=None):
        if value is not None:
            return value
        return smoke_value if smoke and smoke_value is not None else default

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = RunSettings(
        arch=args.arch,
        seed=args.seed,
        steps=pick(args.steps, None, 30),
        epochs=pick(args.epochs, defaults.epochs),
        max_minutes=args.max_minutes if not smoke else min(args.max_minutes, 4.0),
        batch_size=pick(args.batch_size, defaults.batch_size, 8),
        seq_len=pick(args.seq_len, defaults.seq_len, 128),
        learning_rate=pick(args.lr, defaults.learning_rate),
        min_lr_ratio=args.min_lr_ratio,
        warmup_steps=pick(args.warmup_steps, defaults.warmup_steps, 5),
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        balance_coef=pick(args.balance_coef, defaults.balance_coef),
        vocab_size=args.vocab_size,
        heldout_fraction=pick(args.heldout_fraction, 0.02, 0.1),
        max_files=pick(args.max_files, None, 80),
        tokenizer_dir=args.tokenizer,
        evals=args.evals if not smoke else min(args.evals, 3),
        eval_windows=args.eval_windows if not smoke else min(args.eval_windows, 16),
        log_every=args.log_every if not smoke else min(args.log_every, 5),
        device=device,
        experts_impl=args.experts_impl,
        max_new_tokens=args.max_new_tokens if not smoke else min(args.max_new_tokens, 24),
        keep_best=not args.no_keep_best,
        smoke=smoke,
    )
    positive = {
        "--batch-size": settings.batch_size,
        "--seq-len": settings.seq_len,
        "--lr": settings.learning_rate,
        "--epochs": settings.epochs,
        "--max-minutes": settings.max_minutes,
        "--evals": settings.evals,
        "--eval-windows": settings.eval_windows,
        "--log-every": settings.log_every,
        "--max-new-tokens": settings.max_new_tokens,
    }
    for flag, value in positive.items():
        if value <= 0:
            raise ValueError(f"{flag}={value} must be positive.")
    if settings.steps is not None and settings.steps < 1:
        raise ValueError(f"--steps={settings.steps} must be at least 1 (or left out).")
    if settings.seq_len > MAX_POSITIONS:
        raise ValueError(
            f"--seq-len={settings.seq_len} exceeds the position limit {MAX_POSITIONS}."
        )
    if not 0.0 <= settings.min_lr_ratio <= 1.0:
        raise ValueError(f"--min-lr-ratio={settings.min_lr_ratio} must lie in [0, 1].")
    if settings.warmup_steps < 0 or settings.balance_coef < 0 or settings.weight_decay < 0:
        raise ValueError("--warmup-steps, --balance-coef and --weight-decay must be >= 0.")
    if settings.steps is None and settings.warmup_steps < CALIBRATION_STEPS[1]:
        raise ValueError(
            f"--warmup-steps={settings.warmup_steps} is shorter than the {CALIBRATION_STEPS[1]} "
            "timed steps that size the run; raise it or pass --steps explicitly."
        )
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {settings.device} was asked for but torch sees no CUDA GPU.")
    return settings


def learning_rate_at(step: int, settings: RunSettings, total_steps: int | None) -> float:
    """Linear warm-up, then cosine decay to min_lr_ratio of the peak at total_steps."""
    peak = settings.learning_rate
    if step < settings.warmup_steps:
        return peak * (step + 1) / settings.warmup_steps
    if total_steps is None:
        raise RuntimeError(f"step {step} is past the warm-up but the step count is not set yet.")
    progress = min(
        1.0, (step - settings.warmup_steps) / max(1, total_steps - settings.warmup_steps)
    )
    ratio = settings.min_lr_ratio
    return peak * (ratio + (1.0 - ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def sample_batch(
    stream: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """Random windows of the packed training stream, drawn on its device.

    Args:
        stream: Token ids `[N]` (int32, on the training device).
        batch_size: Windows B.
        seq_len: Inputs per window L (each window holds L + 1 tokens).
        generator: Seeded generator on the stream's device.

    Returns:
        Windows `[B, L + 1]` as int64.
    """
    starts = torch.randint(
        0, stream.numel() - seq_len, (batch_size,), device=stream.device, generator=generator
    )
    offsets = torch.arange(seq_len + 1, device=stream.device)
    return stream[starts[:, None] + offsets].long()


def heldout_windows(stream: torch.Tensor, seq_len: int, max_windows: int) -> torch.Tensor:
    """Consecutive non-overlapping windows of the held-out stream.

    Returns:
        Windows `[W, L + 1]` (int64), the first max_windows of them.

    Raises:
        ValueError: If the held-out stream is shorter than one window.
    """
    count = min((stream.numel() - 1) // seq_len, max_windows)
    if count < 1:
        raise ValueError(
            f"the held-out split has {stream.numel()} tokens, fewer than one window of "
            f"{seq_len + 1}; raise --heldout-fraction or lower --seq-len."
        )
    starts = torch.arange(count, device=stream.device) * seq_len
    offsets = torch.arange(seq_len + 1, device=stream.device)
    return stream[starts[:, None] + offsets].long()


def autocast_for(device: str):
    """bf16 autocast on CUDA; plain fp32 on the CPU."""
    if device.startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def token_losses(model: nn.Module, windows: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of every position.

    Args:
        model: A causal LM.
        windows: Token windows `[B, L + 1]`.

    Returns:
        Losses `[B * L]` in fp32.
    """
    logits = model(input_ids=windows[:, :-1], use_cache=False).logits  # [B, L, V]
    return F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1), reduction="none"
    )


@torch.no_grad()
def evaluate(
    model: nn.Module,
    windows: torch.Tensor,
    batch_size: int,
    device: str,
    monitor: RouterMonitor | None,
    autocast: bool = True,
) -> dict:
    """Mean held-out token cross-entropy, perplexity and per-layer expert usage.

    Args:
        model: The model (put in eval mode for the call, then restored).
        windows: Held-out windows `[W, L + 1]`.
        batch_size: Windows per forward.
        device: Training device (selects autocast).
        monitor: Router hooks whose usage counts are reported, or None.
        autocast: Use bf16 autocast on CUDA (off for an fp16 model).

    Returns:
        {"heldout_loss", "heldout_ppl", "heldout_tokens", "expert_usage"}.
    """
    was_training = model.training
    model.eval()
    if monitor is not None:
        monitor.reset_usage()
        monitor.count_usage = True
    total = torch.zeros((), dtype=torch.float64, device=windows.device)
    context = autocast_for(device) if autocast else contextlib.nullcontext()
    for start in range(0, windows.shape[0], batch_size):
        with context:
            total += token_losses(model, windows[start : start + batch_size]).double().sum()
    tokens = windows.shape[0] * (windows.shape[1] - 1)
    loss = float(total) / tokens  # host sync: once per evaluation
    usage = []
    if monitor is not None:
        monitor.count_usage = False
        usage = monitor.usage()
    model.train(was_training)
    return {
        "heldout_loss": round(loss, 5),
        "heldout_ppl": round(math.exp(min(loss, 50.0)), 3),
        "heldout_tokens": tokens,
        "expert_usage": usage,
    }


def parameter_counts(model: nn.Module, routers: list) -> dict:
    """Total parameters (tied weights once), routed-expert parameters and active per token."""
    total = sum(p.numel() for p in model.parameters())
    routed = sum(
        p.numel()
        for n, p in model.named_parameters()
        if n.endswith(("experts.gate_up_proj", "experts.down_proj"))
    )
    share = routers[0].top_k / routers[0].num_experts
    return {
        "parameters": total,
        "routed_expert_parameters": routed,
        "active_parameters_per_token": int(total - routed + routed * share),
        "fp16_bytes_estimate": 2 * total,
    }


def make_optimizer(model: nn.Module, settings: RunSettings) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not norms, biases or 1-D gates)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = settings.device.startswith("cuda")
    return torch.optim.AdamW(groups, lr=settings.learning_rate, betas=(0.9, 0.95), fused=fused)


def reproduce_command(argv: list[str], total_steps: int) -> str:
    """This run's command line with the chosen --steps pinned and --out left to the user."""
    kept, skip_next = [], False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg in ("--steps", "--out"):
            skip_next = True
            continue
        if arg.startswith(("--steps=", "--out=")) or arg == "--overwrite":
            continue
        kept.append(shlex.quote(arg))
    return " ".join(["python3 scripts/train_moe.py", *kept, f"--steps {total_steps} --out OUT"])


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prepare_output(out: Path, overwrite: bool) -> None:
    """Creates the output folder, refusing to mix a new run into an old one.

    Raises:
        ValueError: If out is a file, or a non-empty folder without --overwrite.
    """
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; pass a folder path.")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ValueError(
                f"--out {out} is not empty; pass --overwrite to replace it or choose a new folder."
            )
        for child in out.iterdir():
            if child.is_dir():
                raise ValueError(f"--out {out} holds a folder {child.name}; remove it by hand.")
            child.unlink()
    out.mkdir(parents=True, exist_ok=True)


def load_tokenizer(settings: RunSettings, corpus: Corpus):
    """Trains the tokenizer on the training split, or loads --tokenizer."""
    if settings.tokenizer_dir is None:
        return train_bpe_tokenizer(
            [f.text for f in corpus.train], settings.vocab_size, MAX_POSITIONS
        )
    tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer_dir)
    if tokenizer.convert_tokens_to_ids(END_OF_TEXT) is None or tokenizer.eos_token != END_OF_TEXT:
        raise ValueError(
            f"--tokenizer {settings.tokenizer_dir} has no {END_OF_TEXT} EOS token; pass a folder "
            "written by this script."
        )
    return tokenizer


@torch.no_grad()
def generation_check(model: nn.Module, tokenizer, device: str, max_new_tokens: int) -> list[dict]:
    """Greedy completions of a few code prompts with plain transformers `generate`."""
    samples = []
    for prompt in GENERATION_PROMPTS:
        encoded = tokenizer(prompt, return_tensors="pt").to(device)
        output = model.generate(
            **encoded,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        new_tokens = output[0, encoded["input_ids"].shape[1] :]
        completion = tokenizer.decode(new_tokens, skip_special_tokens=True)
        samples.append({"prompt": prompt, "completion": completion, "tokens": len(new_tokens)})
        say(f"generation: {prompt!r} -> {completion!r}")
    return samples


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


def run(settings: RunSettings, out: Path, start: float, argv: list[str]) -> int:
    """Trains, saves, reloads and checks one model. Returns the process exit code."""
    preset = get_preset(settings.arch)
    device = settings.device
    log = TrainingLog(out / "training_log.jsonl", start)
    transformers.set_seed(settings.seed)
    if device.startswith("cuda"):
        torch.set_float32_matmul_precision("high")
        device_name = torch.cuda.get_device_name(device)
    else:
        device_name = f"CPU ({platform.machine()}, {torch.get_num_threads()} threads)"
    log.write(
        "config",
        settings=asdict(settings),
        argv=argv,
        python=sys.version.split()[0],
        torch=torch.__version__,
        transformers=transformers.__version__,
        tokenizers=tokenizers.__version__,
        device_name=device_name,
    )
    say(f"{settings.arch} on {device_name}, seed {settings.seed}, out {out}")

    corpus = load_stdlib_corpus(settings.heldout_fraction, settings.max_files)
    corpus_facts = corpus.describe()
    log.write("corpus", **corpus_facts)
    say(
        f"corpus: Python {corpus.python_version}, {len(corpus.train)} train / "
        f"{len(corpus.heldout)} held-out files, sha256 {corpus.sha256[:16]}"
    )

    tokenizer = load_tokenizer(settings, corpus)
    sample_text = corpus.heldout[0].text[:2000]  # well under model_max_length tokens
    roundtrip = tokenizer.decode(tokenizer(sample_text)["input_ids"], skip_special_tokens=True)
    if roundtrip != sample_text:
        raise RuntimeError("the tokenizer does not round-trip held-out code; refusing to train.")
    train_np = encode_stream(tokenizer, [f.text for f in corpus.train])
    heldout_np = encode_stream(tokenizer, [f.text for f in corpus.heldout])
    vocab_size = len(tokenizer)
    log.write(
        "tokenizer",
        vocab_size=vocab_size,
        sha256=tokenizer_sha256(tokenizer),
        trained=settings.tokenizer_dir is None,
        train_tokens=int(train_np.size),
        heldout_tokens=int(heldout_np.size),
        train_bytes_per_token=round(corpus_facts["train_bytes"] / max(train_np.size, 1), 3),
        stream_dtype=str(train_np.dtype),
    )
    say(
        f"tokenizer: vocab {vocab_size}; tokens: {train_np.size:,} train, "
        f"{heldout_np.size:,} held out"
    )
    # int32 on the device: 4 bytes a token is a few MB here, and every indexing op supports it.
    train_stream = torch.from_numpy(train_np.astype(np.int32)).to(device)
    heldout_stream = torch.from_numpy(heldout_np.astype(np.int32)).to(device)
    if train_stream.numel() <= settings.seq_len + 1:
        raise ValueError(
            f"the training split has {train_stream.numel()} tokens, too few for --seq-len "
            f"{settings.seq_len}; use more files or a shorter sequence."
        )
    eval_windows = heldout_windows(heldout_stream, settings.seq_len, settings.eval_windows)

    eot = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    config = preset.build_config(vocab_size, SpecialTokens(eot, eot), MAX_POSITIONS)
    model = AutoModelForCausalLM.from_config(config)  # seeded init, on the CPU
    model.to(device)
    routers = find_moe_routers(model)
    monitor = RouterMonitor(routers)
    params = parameter_counts(model, routers)
    log.write("model", config=config.to_dict(), **params)
    say(
        f"model: {type(model).__name__}, {params['parameters']:,} params "
        f"({params['active_parameters_per_token']:,} active), "
        f"~{params['fp16_bytes_estimate'] / 1e6:.1f} MB in fp16"
    )
    if preset.size_limit_bytes and params["fp16_bytes_estimate"] > preset.size_limit_bytes:
        raise ValueError(
            f"{settings.arch} would save ~{params['fp16_bytes_estimate']:,} bytes, over its limit "
            f"{preset.size_limit_bytes:,}; lower --vocab-size."
        )

    generator = torch.Generator(device=device).manual_seed(settings.seed)
    probe_windows = eval_windows[: min(4, eval_windows.shape[0])]

    def probe_loss(probe_model: nn.Module) -> torch.Tensor:
        with autocast_for(device):
            return token_losses(probe_model, probe_windows).mean()

    with torch.random.fork_rng(devices=[torch.device(device)] if device.startswith("cuda") else []):
        experts_choice = choose_experts_implementation(
            model, probe_loss, settings.experts_impl, say
        )
    monitor.clear()
    log.write("experts_implementation", **experts_choice)

    optimizer = make_optimizer(model, settings)
    tokens_per_step = settings.batch_size * settings.seq_len
    planned_by_epochs = max(1, math.ceil(settings.epochs * train_stream.numel() / tokens_per_step))
    total_steps = settings.steps
    eval_every = max(1, total_steps // settings.evals) if total_steps else None

    eval_start = time.perf_counter()
    initial_eval = evaluate(model, eval_windows, settings.batch_size, device, monitor)
    eval_seconds = time.perf_counter() - eval_start
    log.write("eval", step=0, **initial_eval, eval_seconds=round(eval_seconds, 3))
    say(f"step 0: held-out loss {initial_eval['heldout_loss']:.4f}")
    train_deadline = start + settings.max_minutes * 60.0 - FINALIZE_RESERVE_S - 2 * eval_seconds

    best_loss, best_step, best_state = initial_eval["heldout_loss"], 0, None
    last_eval_step, last_eval = 0, initial_eval
    logged_losses: list[float] = []
    loss_sum = torch.zeros((), device=device)
    balance_sum = torch.zeros((), device=device)
    interval_steps, interval_start = 0, time.perf_counter()
    calibration_start = None
    stopped_by_budget = False
    model.train()
    step = 0
    while total_steps is None or step < total_steps:
        if total_steps is None and step == CALIBRATION_STEPS[0]:
            if device.startswith("cuda"):
                torch.cuda.synchronize()  # host sync: timing the calibration window
            calibration_start = time.perf_counter()
        if total_steps is None and step == CALIBRATION_STEPS[1]:
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            now = time.perf_counter()
            seconds_per_step = (now - calibration_start) / (
                CALIBRATION_STEPS[1] - CALIBRATION_STEPS[0]
            )
            budget = train_deadline - now - settings.evals * eval_seconds
            affordable = step + max(0, int(budget / seconds_per_step))
            total_steps = min(planned_by_epochs, affordable)
            if total_steps > 100:
                total_steps -= total_steps % 10
            total_steps = max(total_steps, settings.warmup_steps + 1, step + 1)
            eval_every = max(1, total_steps // settings.evals)
            log.write(
                "schedule",
                seconds_per_step=round(seconds_per_step, 5),
                planned_by_epochs=planned_by_epochs,
                affordable_by_time=affordable,
                steps=total_steps,
                eval_every=eval_every,
            )
            say(
                f"schedule: {total_steps} steps ({planned_by_epochs} by epochs, {affordable} fit "
                f"the budget at {seconds_per_step * 1000:.1f} ms/step); "
                f"rerun with --steps {total_steps}"
            )

        lr = learning_rate_at(step, settings, total_steps)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = sample_batch(train_stream, settings.batch_size, settings.seq_len, generator)
        monitor.collect_logits = settings.balance_coef > 0
        with autocast_for(device):
            lm_loss = token_losses(model, batch).mean()
            balance = monitor.balance_loss() if monitor.collect_logits else None
            loss = lm_loss if balance is None else lm_loss + settings.balance_coef * balance
        monitor.collect_logits = False
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        loss_sum += lm_loss.detach()
        if balance is not None:
            balance_sum += balance.detach()
        interval_steps += 1

        # Step 1 is always logged: the self-check compares later losses with it.
        if step == 1 or step % settings.log_every == 0 or step == total_steps:
            mean_loss = float(loss_sum) / interval_steps  # host sync: once per log interval
            now = time.perf_counter()
            record = log.write(
                "train",
                step=step,
                loss=round(mean_loss, 5),
                balance=round(float(balance_sum) / interval_steps, 5),
                grad_norm=round(float(grad_norm), 4),
                lr=lr,
                tokens_per_s=round(interval_steps * tokens_per_step / (now - interval_start)),
            )
            if not math.isfinite(mean_loss):
                raise RuntimeError(
                    f"training loss became {mean_loss} by step {step}; lower --lr or --grad-clip."
                )
            logged_losses.append(mean_loss)
            say(
                f"step {step}/{total_steps or '?'}: loss {mean_loss:.4f}, lr {lr:.2e}, "
                f"{record['tokens_per_s']:,} tok/s"
            )
            loss_sum.zero_()
            balance_sum.zero_()
            interval_steps, interval_start = 0, now
            if now > train_deadline:
                stopped_by_budget = True
                say(f"wall-clock budget reached at step {step}; stopping early")
                break

        if eval_every and (step % eval_every == 0 or step == total_steps):
            last_eval = evaluate(model, eval_windows, settings.batch_size, device, monitor)
            last_eval_step = step
            log.write("eval", step=step, **last_eval)
            entropies = [u["entropy"] for u in last_eval["expert_usage"]]
            say(
                f"step {step}: held-out loss {last_eval['heldout_loss']:.4f}, expert-usage "
                f"entropy per layer {entropies}"
            )
            if last_eval["heldout_loss"] < best_loss:
                best_loss, best_step = last_eval["heldout_loss"], step
                if settings.keep_best:
                    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            interval_start = time.perf_counter()  # evaluation time is not training throughput

    steps_run = step
    if last_eval_step != steps_run:
        last_eval = evaluate(model, eval_windows, settings.batch_size, device, monitor)
        log.write("eval", step=steps_run, **last_eval)
        if last_eval["heldout_loss"] < best_loss:
            best_loss, best_step, best_state = last_eval["heldout_loss"], steps_run, None
    saved_step = steps_run
    if settings.keep_best and best_state is not None and best_step != steps_run:
        model.load_state_dict(best_state)
        saved_step = best_step
    del best_state
    monitor.remove()

    # Save in fp16 with the default experts implementation (nothing training-only persists).
    model.eval()
    model.set_experts_implementation("eager")
    model.to(torch.float16)
    nonfinite = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
    if nonfinite:
        raise RuntimeError(f"fp16 weights overflowed in {nonfinite[:5]}; train with a lower --lr.")
    model.generation_config.bos_token_id = eot
    model.generation_config.eos_token_id = eot
    model.generation_config.pad_token_id = eot
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    del model, optimizer
    if device.startswith("cuda"):
        torch.cuda.empty_cache()

    # Reload from disk exactly as a user would, and measure what was saved.
    saved_dtype = torch.float16 if device.startswith("cuda") else torch.float32
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=saved_dtype).to(device)
    reloaded_tokenizer = AutoTokenizer.from_pretrained(out)
    reloaded.eval()
    saved_monitor = RouterMonitor(find_moe_routers(reloaded))
    try:
        saved_eval = evaluate(
            reloaded, eval_windows, settings.batch_size, device, saved_monitor, autocast=False
        )
        saved_experts = reloaded.config._experts_implementation
    except RuntimeError as error:
        # The checkpoint is already on disk; measure it with the portable loop instead.
        say(f"reloaded model failed with its default experts implementation ({error}); eager")
        reloaded.set_experts_implementation("eager")
        saved_eval = evaluate(
            reloaded, eval_windows, settings.batch_size, device, saved_monitor, autocast=False
        )
        saved_experts = "eager (default failed)"
    saved_monitor.remove()
    log.write(
        "saved_eval",
        step=saved_step,
        dtype=str(saved_dtype),
        experts_implementation=saved_experts,
        **saved_eval,
    )
    say(f"saved checkpoint (step {saved_step}): held-out loss {saved_eval['heldout_loss']:.4f}")
    generations = generation_check(reloaded, reloaded_tokenizer, device, settings.max_new_tokens)
    log.write("generation", samples=generations)

    wall_s = time.perf_counter() - start
    reproduce = reproduce_command(argv, total_steps)
    facts = {
        "name": out.name,
        "description": preset.description,
        "settings": asdict(settings),
        "corpus": corpus_facts,
        "model_config": json.loads((out / "config.json").read_text()),
        "config_keys": [
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "first_k_dense_replace",
            "intermediate_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
            "n_routed_experts",
            "num_experts",
            "num_local_experts",
            "num_experts_per_tok",
            "n_shared_experts",
            "routed_scaling_factor",
            "topk_method",
            "norm_topk_prob",
            "num_attention_heads",
            "num_key_value_heads",
            "kv_lora_rank",
            "q_lora_rank",
            "qk_nope_head_dim",
            "qk_rope_head_dim",
            "v_head_dim",
            "tie_word_embeddings",
        ],
        "params": params,
        "vocab_size": vocab_size,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "train_tokens": int(train_np.size),
        "heldout_tokens": int(heldout_np.size),
        "steps_run": steps_run,
        "steps_note": (
            f" of a {total_steps}-step schedule (the wall-clock budget stopped it)"
            if stopped_by_budget
            else ""
        ),
        "saved_step": saved_step,
        "tokens_seen": steps_run * tokens_per_step,
        "epochs_seen": steps_run * tokens_per_step / train_np.size,
        "device_name": device_name,
        "precision": "bf16 autocast, fp32 weights" if device.startswith("cuda") else "fp32",
        "saved_precision": str(saved_dtype).replace("torch.", ""),
        "experts_implementation": experts_choice["experts_implementation"],
        "wall_s": wall_s,
        "initial_eval": initial_eval,
        "saved_eval": saved_eval,
        "generations": generations,
        "reproduce": reproduce,
    }
    write_model_card(out, facts)

    trained_loss = last_eval["heldout_loss"] if saved_step == steps_run else best_loss
    checks = {
        "train_loss_decreased": len(logged_losses) >= 2 and logged_losses[-1] < logged_losses[0],
        "heldout_loss_decreased": saved_eval["heldout_loss"] < initial_eval["heldout_loss"],
        "reloaded_class": type(reloaded).__name__ == config.architectures[0]
        if config.architectures
        else True,
        "tokenizer_roundtrip": reloaded_tokenizer.decode(
            reloaded_tokenizer(sample_text)["input_ids"], skip_special_tokens=True
        )
        == sample_text,
        # fp16 storage moves the loss by rounding only; a large gap means the save broke.
        "saved_matches_trained": abs(saved_eval["heldout_loss"] - trained_loss) < 0.05,
    }
    size = folder_bytes(out) + 4096  # room for the summary line written below
    if preset.size_limit_bytes:
        checks["under_size_limit"] = size <= preset.size_limit_bytes
    summary = log.write(
        "summary",
        steps=steps_run,
        schedule_steps=total_steps,
        saved_step=saved_step,
        stopped_by_budget=stopped_by_budget,
        tokens_seen=facts["tokens_seen"],
        epochs_seen=round(facts["epochs_seen"], 2),
        initial_heldout_loss=initial_eval["heldout_loss"],
        best_heldout_loss=best_loss,
        final_step_heldout_loss=last_eval["heldout_loss"],
        saved_heldout_loss=saved_eval["heldout_loss"],
        saved_heldout_ppl=saved_eval["heldout_ppl"],
        folder_bytes=size,
        size_limit_bytes=preset.size_limit_bytes,
        wall_s=round(wall_s, 1),
        checks=checks,
        reproduce=reproduce,
    )
    log.close()
    say(f"summary: {json.dumps({k: v for k, v in summary.items() if k != 'event'})}")
    failed = [name for name, ok in checks.items() if not ok]
    if failed:
        say(f"SELF-CHECK FAILED: {failed}")
        return 1
    say(f"self-checks passed; checkpoint in {out} ({size / 1e6:.2f} MB)")
    return 0


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    raw_argv = sys.argv[1:] if argv is None else argv
    args = parse_args(raw_argv)
    try:
        settings = resolve_settings(args)
        prepare_output(args.out, args.overwrite)
    except ValueError as error:
        print(f"train_moe.py: error: {error}", file=sys.stderr)
        return 2
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    transformers.utils.logging.disable_progress_bar()
    return run(settings, args.out, start, raw_argv)


if __name__ == "__main__":
    sys.exit(main())
