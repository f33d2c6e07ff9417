"""The pieces of a training loop: schedule, batches, losses, evaluation, optimizer, log.

Token windows are ``[B, L + 1]`` int64 (inputs ``[:, :-1]``, targets ``[:, 1:]``); the packed
streams they are cut from are int32 ``[N]`` on the training device.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specter_bench.training.config import RunSettings
from specter_bench.training.router_stats import RouterMonitor

__all__ = [
    "TrainingLog",
    "autocast_for",
    "evaluate",
    "heldout_windows",
    "learning_rate_at",
    "make_optimizer",
    "parameter_counts",
    "sample_batch",
    "token_losses",
]


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
