"""Prompts from several sources: ``--prompts humaneval,prose`` splits the count across them.

N prompts over S sources: each source gives ``N // S`` and the first ``N % S`` sources (in
the order given) one more, so ``--num-prompts 10 --prompts humaneval,prose`` measures the
first five HumanEval tasks and the first five prose passages. The calibration prompts (whose
routing chooses the hot sets) are split the same way, each source's taken right after its
own measured ones, so a hot set is never chosen on text that is measured. Measured prompts
come source by source, in the order given; each keeps its source, which its records name.
"""

from __future__ import annotations

import dataclasses

from specter_bench.prompt_sources import (
    LOCAL_SOURCES,
    PROMPT_SOURCES,
    Prompt,
    PromptSourceConfig,
    load_prompts,
)

__all__ = ["load_prompt_mix", "source_names", "split_count"]


def source_names(text: str) -> tuple[str, ...]:
    """The sources of ``text`` (``"humaneval,prose"``), checked.

    Raises:
        ValueError: an unknown or repeated source, or none.
    """
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise ValueError(
            f"no prompt source in {text!r}; expected e.g. humaneval or humaneval,prose."
        )
    for name in names:
        if name not in PROMPT_SOURCES:
            raise ValueError(
                f"unknown prompt source {name!r} in {text!r}; expected some of "
                f"{', '.join(PROMPT_SOURCES)}, comma-separated."
            )
    if len(set(names)) != len(names):
        raise ValueError(f"prompt sources {text!r} name a source twice; give each once.")
    local = [n for n in names if n in LOCAL_SOURCES]
    if len(local) > 1:
        raise ValueError(
            f"prompt sources {text!r} read {len(local)} sets of local files "
            f"({', '.join(local)}) but there is one --prompts-path; mix at most one of them."
        )
    return names


def split_count(total: int, parts: int) -> list[int]:
    """``total`` split over ``parts``: ``total // parts`` each, one more for the first
    ``total % parts``."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def load_prompt_mix(
    config: PromptSourceConfig, calibration: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """``(measured, calibration)`` prompts of ``config`` (one source or a comma list).

    Args:
        config: the sources; ``limit`` is the measured prompts in all (None: every prompt
            of every source, and no calibration prompts).
        calibration: prompts after the measured ones (per source, split as ``limit`` is).

    Raises:
        ValueError, FileNotFoundError, ImportError: as :func:`load_prompts`, or a source
            with fewer prompts than its share (then the calibration prompts are fewer).
    """
    names = source_names(config.source)
    if config.limit is None:
        measured: list[Prompt] = []
        for name in names:
            measured += load_prompts(dataclasses.replace(config, source=name))
        return measured, []
    shares = split_count(config.limit, len(names))
    extras = split_count(calibration, len(names))
    measured, extra = [], []
    for name, share, more in zip(names, shares, extras, strict=True):
        if share + more == 0:
            continue
        prompts = load_prompts(dataclasses.replace(config, source=name, limit=share + more))
        measured += prompts[:share]
        extra += prompts[share : share + more]
    return measured, extra
