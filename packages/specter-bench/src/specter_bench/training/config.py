"""What a training run is asked for (`TrainConfig`) and what it resolves to (`RunSettings`).

`TrainConfig` mirrors ``specter train``'s flags: a field left ``None`` takes the ``arch``
preset's default (see `specter_bench.training.architectures`). `resolve_settings` combines
the preset, the fields and ``smoke`` into a fully determined, validated `RunSettings`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specter_bench.training.architectures import get_preset
from specter_bench.training.tokenizer import MIN_VOCAB_SIZE

__all__ = [
    "CALIBRATION_STEPS",
    "FINALIZE_RESERVE_S",
    "MAX_POSITIONS",
    "RunSettings",
    "TrainConfig",
    "resolve_settings",
]

MAX_POSITIONS = 1024  # position limit written into the config (training uses seq_len)
FINALIZE_RESERVE_S = 45.0  # wall time kept for saving, reloading, evaluating, generating
CALIBRATION_STEPS = (5, 25)  # timed steps (inside the warm-up) that size the step count


@dataclass(frozen=True)
class TrainConfig:
    """A training run as asked for; ``None`` fields take the preset's (or smoke's) default.

    Attributes:
        arch: architecture preset (``dsv2-tiny``, ``dsv2-proxy``, ``qwen-proxy``, ``phi-proxy``).
        seed: initialisation and batch sampling.
        steps: optimizer steps; ``None`` derives them from ``epochs`` and ``max_minutes``.
        epochs: passes over the training tokens (preset).
        max_minutes: whole-run wall-clock budget.
        batch_size: sequences per step (preset).
        seq_len: tokens per sequence (preset).
        learning_rate: peak learning rate (preset).
        min_lr_ratio: final lr / peak lr.
        warmup_steps: linear warm-up steps (preset).
        weight_decay: AdamW decay of matrices.
        grad_clip: gradient-norm clip.
        balance_coef: load-balance weight, 0 = off (preset).
        vocab_size: BPE vocabulary size.
        heldout_fraction: share of files held out (0.02).
        max_files: use a hash-chosen subset of the corpus files.
        tokenizer_dir: reuse this tokenizer folder instead of training one.
        evals: held-out evaluations during training.
        eval_windows: most held-out windows per evaluation.
        log_every: steps between training-log records.
        device: ``cuda`` or ``cpu``; ``None`` = CUDA when available.
        experts_impl: ``auto``, ``eager`` or ``specter_train_grouped_mm``.
        max_new_tokens: tokens per generation check.
        keep_best: save the step with the lowest held-out loss (else the last step).
        smoke: a quick CPU run with self-checks (30 steps on 80 files unless overridden).
    """

    arch: str = "dsv2-tiny"
    seed: int = 0
    steps: int | None = None
    epochs: float | None = None
    max_minutes: float = 8.0
    batch_size: int | None = None
    seq_len: int | None = None
    learning_rate: float | None = None
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    balance_coef: float | None = None
    vocab_size: int = 4096
    heldout_fraction: float | None = None
    max_files: int | None = None
    tokenizer_dir: str | None = None
    evals: int = 16
    eval_windows: int = 256
    log_every: int = 10
    device: str | None = None
    experts_impl: str = "auto"
    max_new_tokens: int = 64
    keep_best: bool = True
    smoke: bool = False


@dataclass(frozen=True)
class RunSettings:
    """Everything that determines a run, after the preset, the config and smoke are combined."""

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


def resolve_settings(config: TrainConfig) -> RunSettings:
    """Combines preset defaults, the config's fields and ``smoke``; validates the result.

    Raises:
        ValueError: a setting out of range, naming its flag and the accepted range.
    """
    preset = get_preset(config.arch)
    defaults = preset.defaults
    smoke = config.smoke

    def pick(value, default, smoke_value=None):
        if value is not None:
            return value
        return smoke_value if smoke and smoke_value is not None else default

    device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
    settings = RunSettings(
        arch=config.arch,
        seed=config.seed,
        steps=pick(config.steps, None, 30),
        epochs=pick(config.epochs, defaults.epochs),
        max_minutes=config.max_minutes if not smoke else min(config.max_minutes, 4.0),
        batch_size=pick(config.batch_size, defaults.batch_size, 8),
        seq_len=pick(config.seq_len, defaults.seq_len, 128),
        learning_rate=pick(config.learning_rate, defaults.learning_rate),
        min_lr_ratio=config.min_lr_ratio,
        warmup_steps=pick(config.warmup_steps, defaults.warmup_steps, 5),
        weight_decay=config.weight_decay,
        grad_clip=config.grad_clip,
        balance_coef=pick(config.balance_coef, defaults.balance_coef),
        vocab_size=config.vocab_size,
        heldout_fraction=pick(config.heldout_fraction, 0.02, 0.1),
        max_files=pick(config.max_files, None, 80),
        tokenizer_dir=config.tokenizer_dir,
        evals=config.evals if not smoke else min(config.evals, 3),
        eval_windows=config.eval_windows if not smoke else min(config.eval_windows, 16),
        log_every=config.log_every if not smoke else min(config.log_every, 5),
        device=device,
        experts_impl=config.experts_impl,
        max_new_tokens=config.max_new_tokens if not smoke else min(config.max_new_tokens, 24),
        keep_best=config.keep_best,
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
    if settings.tokenizer_dir is None and settings.vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"--vocab-size={settings.vocab_size} is too small for byte-level BPE; pass at least "
            f"{MIN_VOCAB_SIZE} (256 bytes and <|endoftext|>)."
        )
    if settings.experts_impl not in ("auto", "eager", "specter_train_grouped_mm"):
        raise ValueError(
            f"--experts-impl {settings.experts_impl!r} is not one of auto, eager, "
            "specter_train_grouped_mm."
        )
    if settings.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {settings.device} was asked for but torch sees no CUDA GPU.")
    return settings
