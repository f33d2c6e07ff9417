"""The ``ttft`` experiment: time to first token of each engine system at each budget, for
prompts of exactly ``--prompt-lengths`` tokens.

A length's prompt is the measured prompts' text, joined and repeated until it encodes to
at least that many tokens, then cut to exactly that many. Each system warms up as in the
``tpot`` experiment, then decodes each length once unrecorded (a prompt of a new length
runs the prefill's kernels at new shapes, which may compile or autotune them) and then
``--runs`` times recorded. Time to first token is from the decode's call to its first token
on the host: the prefill and the first decode iteration (for a speculating system, its
first draft and verification). Lengths the model's positions cannot hold, with the new
tokens and one verification of the largest depth, are recorded as skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from tqdm import tqdm

from specter_bench.bench_record import ExperimentRecord
from specter_bench.bench_support import (
    GB,
    PROMPT_WARMUP_TOKENS,
    BenchResult,
    EncodedPrompt,
    budget_text,
)
from specter_bench.prompt_sources import Prompt
from specter_bench.system_run import SystemRun, first_mismatch

__all__ = ["TtftStages", "ttft_prompt_ids"]

SEPARATOR = "\n\n"


def ttft_prompt_ids(texts: list[str], tokenizer: Any, length: int) -> list[int]:
    """Exactly ``length`` token ids: ``texts`` joined, repeated until they encode to at least
    ``length`` tokens, and cut.

    Raises:
        ValueError: no text, or text that encodes to no tokens.
    """
    joined = SEPARATOR.join(t for t in texts if t)
    once = list(tokenizer.encode(joined)) if joined else []
    if not once:
        raise ValueError("the ttft prompts repeat the measured prompts' text; they have none.")
    repeats = math.ceil(length / len(once)) + 1
    ids = list(tokenizer.encode(SEPARATOR.join([joined] * repeats)))
    return ids[:length]


class TtftStages:
    """``BenchRunner``'s ``ttft`` decodes (a mixin: it uses the runner's prompts, tokenizer,
    config and records)."""

    def _ttft_lengths(self) -> tuple[list[int], list[int]]:
        """``(lengths that fit, lengths that do not)``: a length fits when it, the new
        tokens and one verification of the largest depth fit the model's positions."""
        limit = getattr(self.hf_config, "max_position_embeddings", None)
        fits, unfit = [], []
        for n in sorted(set(self.config.prompt_lengths)):
            need = n + self.config.max_new_tokens + self.config.max_depth + 2
            (fits if limit is None or need <= limit else unfit).append(n)
        return fits, unfit

    def _ttft_prompts(self, lengths: list[int]) -> list[EncodedPrompt]:
        """One prompt per length (see :func:`ttft_prompt_ids`)."""
        texts = [p.prompt.text for p in self.prompts]
        source = f"{self.config.prompts.source} (repeated)"
        return [
            EncodedPrompt(
                Prompt(source, f"length-{n}", ""),
                ttft_prompt_ids(texts, self.tokenizer, n),
            )
            for n in lengths
        ]

    def _ttft_decodes(
        self,
        system: str,
        generate: Callable[[list[int], int], SystemRun],
        bar: tqdm,
        result: BenchResult,
        budget: float | None,
        after_warmup: Callable[[], str | None] | None = None,
    ) -> list[ExperimentRecord]:
        """``system``'s ``ttft`` records at ``budget``: a warm-up, then per length one
        unrecorded decode and ``--runs`` recorded ones."""
        cfg = self.config
        prompts = self.ttft_prompts
        generate = self._timed(generate)
        self._warm_up(generate, cfg.max_new_tokens, prompts[:1])
        if after_warmup is not None and (reason := after_warmup()) is not None:
            self.log(f"{system} at {budget_text(budget)}: {reason}")
            bar.update(cfg.runs * len(prompts))
            return []
        records = []
        for prompt in prompts:
            if self._deadline.expired():
                self._skip(result, f"ttft of {system} at {prompt.prompt.id}", "--max-minutes",
                           budget)  # fmt: skip
                bar.update(cfg.runs)
                continue
            generate(prompt.ids, min(cfg.max_new_tokens, PROMPT_WARMUP_TOKENS))
            for run_index in range(cfg.runs):
                bar.set_postfix_str(f"ttft {system} {budget_text(budget)} {prompt.prompt.id}")
                run = generate(prompt.ids, cfg.max_new_tokens)
                records.append(self._ttft_record(run, prompt, budget, run_index))
                bar.update(1)
        return records

    def _ttft_record(
        self, run: SystemRun, prompt: EncodedPrompt, budget: float | None, run_index: int
    ) -> ExperimentRecord:
        # The first system to decode a length is its reference: greedy tokens must agree.
        reference = self.ttft_reference.setdefault(prompt.prompt.id, (run.system, run.tokens))
        checked = reference[1] is not run.tokens
        mismatch = first_mismatch(run.tokens, reference[1]) if checked else None
        data = {
            "system": run.system,
            "prompt_tokens": len(prompt.ids),
            "run_index": run_index,
            "ttft_ms": 1e3 * run.ttft_s if run.ttft_s is not None else None,
            "prefill_ms": 1e3 * run.prefill_s,
            "tpot_ms": 1e3 * run.tpot_s if run.tpot_s is not None else None,
            "new_tokens": len(run.tokens),
            "peak_gpu_memory_gb": run.peak_gpu_bytes / GB if run.peak_gpu_bytes else None,
            "driver_peak_gpu_memory_gb": (
                run.driver_peak_bytes / GB if run.driver_peak_bytes is not None else None
            ),
            "speculation": run.settings.get("speculation"),
            "slots_per_layer": run.slots_per_layer,
            "reference_system": reference[0] if checked else None,
            "matches_reference": (mismatch is None) if checked else None,
            "prompt_source": prompt.prompt.source,
        }
        return self._experiment("ttft", budget, data)
