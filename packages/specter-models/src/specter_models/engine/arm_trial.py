"""Plain or speculative decoding under a budget, chosen by timing both at load.

Under a memory budget the INT4 draft costs FP16 expert slots, and whether speculation pays
for them depends on the machine, the budget and the model's routing: on one H100,
DeepSeek-V2-Lite with random weights decoded faster without the draft at 24 and 16 GB, and
with routing replayed from a trained model faster with it at 24 GB but not at 16. No
constant weighing of expert loads predicted all four. So an adaptive depth under a budget
(``SpeculationConfig.depth="auto"``) with a calibration prompt times both decodings: the
engine is built without the draft (its memory as slots, misses streamed: the bench's
``offload``), decodes the calibration prompt twice (the first warms it) and is released;
then built with the draft, timed the same way; the faster one is kept, rebuilt where it was
the plain one. Its statistics say which was kept and why (``speculation``, ``arm_trial``).

The trial costs one more load (two where plain decoding wins) and ``2 x trial_tokens``
decoded tokens per arm; ``SpeculationConfig.trial_tokens=0`` skips it and decides as before
load (``hot_sets``' replayed expert loads).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["DEFAULT_TRIAL_TOKENS", "choose_by_trial", "trial_tokens_of"]

DEFAULT_TRIAL_TOKENS = 32
"""Tokens each arm decodes in its timed trial (after as many to warm it) on a CUDA device."""


def trial_tokens_of(config: Any, calibration_prompt: object) -> int:
    """The trial's tokens for ``config`` (an ``EngineConfig``): 0 where no trial runs (a
    fixed depth, ``keep_draft``, no budget, no calibration prompt), else
    ``SpeculationConfig.trial_tokens``, whose default (None) is
    :data:`DEFAULT_TRIAL_TOKENS` on a CUDA device and 0 elsewhere (CPU timings of tiny
    models choose nothing a user runs)."""
    spec, memory = config.speculation, config.memory
    budgeted = memory.gpu_memory_gb is not None or memory.slots_per_layer is not None
    if spec.depth != "auto" or spec.keep_draft or not budgeted or calibration_prompt is None:
        return 0
    if spec.trial_tokens is not None:
        return spec.trial_tokens
    return DEFAULT_TRIAL_TOKENS if str(config.load.device).startswith("cuda") else 0


def trial_ms(engine: Any, prompt: str | Sequence[int], tokens: int) -> float:
    """Milliseconds a token of ``engine``'s greedy decode of ``prompt`` for ``tokens``
    tokens, after one unrecorded decode of the same: the time after its first iteration
    (``steady_tpot_ms``; that iteration carries the prefill's queued work), or over every
    token where there was one iteration only."""
    engine.generate(prompt, max_new_tokens=tokens, stop_token_ids=[]).result()
    stats = engine.generate(prompt, max_new_tokens=tokens, stop_token_ids=[]).result().stats
    steady = stats.get("steady_tpot_ms")
    return float(stats["tpot_ms"] if steady is None else steady)


def choose_by_trial(
    build: Callable[[Any], Any],
    config: Any,
    prompt: str | Sequence[int],
    tokens: int,
    log: Callable[[str], None],
    *,
    timed: Callable[[Any, str | Sequence[int], int], float] | None = None,
) -> Any:
    """The faster of the engines ``build`` makes of ``config`` without and with the draft
    (see the module docstring).

    Args:
        build: makes an engine of an ``EngineConfig`` (without a trial of its own).
        config: the asked configuration (an adaptive depth under a budget).
        prompt: the calibration prompt both arms decode.
        tokens: tokens of each timed decode.
        log: receives one line per arm and the choice.
        timed: times one arm (default :func:`trial_ms`).
    """
    timed = timed or trial_ms
    spec = config.speculation
    plain_config = dataclasses.replace(
        config, speculation=dataclasses.replace(spec, depth=0, keep_draft=False)
    )
    draft_config = dataclasses.replace(
        config, speculation=dataclasses.replace(spec, keep_draft=True)
    )
    log(f"auto: timing plain decoding and speculation on the calibration prompt ({tokens} tokens)")
    plain = build(plain_config)
    plain_ms = timed(plain, prompt, tokens)
    log(f"auto: plain decoding (no draft) {plain_ms:.2f} ms a token")
    plain.release()
    del plain
    drafted = build(draft_config)
    draft_ms = timed(drafted, prompt, tokens)
    log(f"auto: speculation (INT4 draft) {draft_ms:.2f} ms a token")
    trial = {"tokens": tokens, "plain_ms": plain_ms, "speculative_ms": draft_ms}
    if draft_ms <= plain_ms:
        trial["kept"] = "speculative"
        drafted.setup_stats["speculation"] = (
            f"on (depth auto measured {draft_ms:.2f} ms a token with the draft against "
            f"{plain_ms:.2f} without it)"
        )
        drafted.setup_stats["arm_trial"] = trial
        return drafted
    drafted.release()
    del drafted
    log("auto: decoding plainly, without the INT4 draft (--keep-draft speculates anyway)")
    kept = build(plain_config)
    trial["kept"] = "plain"
    kept.setup_stats["speculation"] = (
        f"off (depth auto measured plain decoding faster: {plain_ms:.2f} ms a token against "
        f"{draft_ms:.2f} with the draft)"
    )
    kept.setup_stats["arm_trial"] = trial
    return kept
