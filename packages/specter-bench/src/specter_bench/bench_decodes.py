"""The benchmark's decode loop: a system's warm-up, then its measured passes over the prompts,
repeated ``--runs`` times on the same load."""

from __future__ import annotations

import time
from collections.abc import Callable

from tqdm import tqdm

from specter_bench.bench_support import (
    PROMPT_WARMUP_TOKENS,
    BenchResult,
    EncodedPrompt,
    budget_text,
)
from specter_bench.system_run import SystemRun

__all__ = ["DecodeLoop"]


class DecodeLoop:
    """``BenchRunner``'s decodes (a mixin: it uses the runner's config, deadline and log)."""

    first_token_s: float | None = None
    """Seconds from the process's start to the first token of the current load's first
    decode (warm-up included); reset by each load."""

    def _timed(
        self, generate: Callable[[list[int], int], SystemRun]
    ) -> Callable[[list[int], int], SystemRun]:
        """``generate`` noting the first token of the load's first decode
        (:attr:`first_token_s`)."""

        def decode(ids: list[int], count: int) -> SystemRun:
            run = generate(ids, count)
            started, ttft = getattr(run, "started_s", None), getattr(run, "ttft_s", None)
            if self.first_token_s is None and started is not None and ttft:
                self.first_token_s = started + ttft
            return run

        return decode

    def _warm_up(
        self,
        generate: Callable[[list[int], int], SystemRun],
        max_new_tokens: int,
        prompts: list[EncodedPrompt],
        warmup: int | None = None,
    ) -> float:
        """Unrecorded decodes of the first prompt (compilation, autotuning, cache filling,
        the adaptive depth's first estimates); returns their seconds."""
        warmup = self.config.warmup if warmup is None else warmup
        started = time.perf_counter()
        if warmup and not self._deadline.expired():
            for _ in range(warmup):
                generate(prompts[0].ids, min(max_new_tokens, self.config.warmup_tokens))
        return time.perf_counter() - started

    def _decode_all(
        self,
        system: str,
        generate: Callable[[list[int], int], SystemRun],
        max_new_tokens: int,
        prompts: list[EncodedPrompt],
        bar: tqdm,
        result: BenchResult,
        budget: float | None,
        *,
        warmup: int | None = None,
        warm_each_prompt: bool = False,
        runs: int | None = None,
        after_warmup: Callable[[], str | None] | None = None,
    ) -> list[tuple[EncodedPrompt, SystemRun]]:
        """Warm up on the first prompt, then decode every prompt, recorded, ``runs`` times
        (default ``--runs``) in a row; each decode carries its ``run_index``.

        ``warm_each_prompt``: also run ``PROMPT_WARMUP_TOKENS`` unrecorded tokens of each
        prompt right before its measured run (compiled ``hf``: a prompt of a new length can
        recompile the decode step inside the measured decode, seen on one H200 as one prompt
        at 23.7 ms per token beside 7.5 ms).

        ``after_warmup``: called once the warm-up is done; a reason it returns stops the
        system there (nothing measured, the progress bar advanced past its decodes).
        """
        generate = self._timed(generate)
        runs = self.config.runs if runs is None else runs
        warmup_s = self._warm_up(generate, max_new_tokens, prompts, warmup)
        if after_warmup is not None and (reason := after_warmup()) is not None:
            self.log(f"{system} at {budget_text(budget)}: {reason}")
            bar.update(runs * len(prompts))
            return []
        done = []
        for run_index in range(runs):
            for prompt in prompts:
                if self._deadline.expired():
                    self._skip(
                        result, f"{system} at {budget_text(budget)} on {prompt.prompt.id} "
                        f"(run {run_index})", "--max-minutes reached", budget,
                    )  # fmt: skip
                    bar.update(1)
                    continue
                bar.set_postfix_str(f"{system} {budget_text(budget)} {prompt.prompt.id}")
                if warm_each_prompt:
                    generate(prompt.ids, min(max_new_tokens, PROMPT_WARMUP_TOKENS))
                run = generate(prompt.ids, max_new_tokens)
                run.settings["warmup_s"] = warmup_s
                run.run_index = run_index
                done.append((prompt, run))
                bar.update(1)
        return done
