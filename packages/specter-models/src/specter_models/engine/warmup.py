"""Work done once before the first timed decode: graph capture, the adaptive depth's warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from specter_spec import AdaptiveDepth

__all__ = [
    "CAPTURE_AHEAD_POSITIONS",
    "DEPTH_WARMUP_TOKENS",
    "capture_decode_graphs",
    "warm_adaptive_depth",
]

CAPTURE_AHEAD_POSITIONS = 256
"""Decode positions past the prompt whose windows are captured before decoding (a window
spans 256 positions, so one or two windows); later windows capture at first use, once per
key, spread over the hundreds of tokens that reach them."""

DEPTH_WARMUP_TOKENS = 32
"""Tokens of the calibration prompt an adaptive depth decodes once, unrecorded, before the
first generation when every expert is resident (the bench's warm-up is as long)."""


def _silent(line: str) -> None:
    del line


def capture_decode_graphs(
    loaded: Any,
    *,
    prompt_length: int,
    speculate: bool,
    log: Callable[[str], None] = _silent,
) -> dict[str, Any]:
    """Capture, before decoding, the CUDA graphs the decode's steps will replay.

    Without this each new step shape (rows, KV window) pays an eager forward, its kernels'
    first compilation and a capture inside the timed decode: on DeepSeek-V2-Lite at 24 GB
    a 64-token plain decode measured 52 ms a token against 12 with the graphs captured
    ahead. Only the windows of the first :data:`CAPTURE_AHEAD_POSITIONS` decode positions
    (from ``prompt_length`` on) and only rows the decode can verify (1 when decoding
    plainly) are captured; then the model is reset.

    Args:
        loaded: the ``SpecterModel``.
        prompt_length: the prompt's tokens.
        speculate: the decode drafts (its verifications need every row bucket).
        log: where progress lines go.

    Returns:
        ``{"graphs_captured": n, "graph_capture_s": s}``, both None where the model has no
        CUDA graphs (a CPU model).
    """
    if not getattr(loaded, "cuda_graphs", False):
        return {"graphs_captured": None, "graph_capture_s": None}
    log("capturing the decode's CUDA graphs ...")
    started = time.perf_counter()
    captured = loaded.capture_step_graphs(
        prompt_length + CAPTURE_AHEAD_POSITIONS,
        min_length=prompt_length,
        max_rows=None if speculate else 1,
    )
    loaded.reset()  # the capturing forwards' KV rows, counts and cache statistics
    seconds = time.perf_counter() - started
    count = sum(captured.values())
    log(f"captured {count} CUDA graphs in {seconds:.1f} s")
    return {"graphs_captured": count, "graph_capture_s": seconds}


def warm_adaptive_depth(
    controller: Any,
    loaded: Any,
    prompt_ids: list[int],
    tokens: int,
    *,
    every_expert_resident: bool,
    log: Callable[[str], None] = _silent,
) -> float | None:
    """With every expert resident, run an adaptive depth's first iterations before the decode.

    ``AdaptiveDepth`` starts knowing no draft or verify time: it speculates at its initial
    depth and its neighbours until it has measured enough to compare them with plain
    decoding. With every expert resident a draft step costs most of a target step, so on
    DeepSeek-V2-Lite those iterations are the slow part of a short generation (3.65 ms a
    token over 64 tokens without a warm-up, 2.16 after one). So ``controller`` decodes
    ``tokens`` tokens of the prompt, unrecorded, and then the model is reset (KV, counts,
    statistics). Under a budget nothing runs: a warm-up decode would also leave the
    prompt's experts in the cache, which the timed decode would then find.

    Args:
        controller: a greedy ``SpecController`` sharing the decode's depth policy, which
            keeps what it learns.
        loaded: the ``SpecterModel`` (reset afterwards).
        prompt_ids: the tokens to decode from.
        tokens: how many to decode.
        every_expert_resident: every expert has a slot.
        log: where progress lines go.

    Returns:
        The seconds the warm-up took, None where none ran (a fixed depth, some expert
        not resident, or no tokens).
    """
    adaptive = isinstance(controller.depth_policy, AdaptiveDepth)
    if not (adaptive and every_expert_resident and tokens >= 1):
        return None
    log(
        f"warming --depth auto up on {tokens} tokens of the prompt (every expert resident; "
        "not in TPOT) ..."
    )
    started = time.perf_counter()
    controller.generate(prompt_ids, tokens)
    loaded.reset()
    return time.perf_counter() - started
