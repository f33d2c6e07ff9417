"""The benchmark's ``tpot`` records: one decode's figures, its greedy cross-checks against
the prompt's reference decodes, and its Belady bound."""

from __future__ import annotations

from typing import Any

from specter_bench.belady import belady_bound
from specter_bench.bench_record import TpotRecord
from specter_bench.bench_support import GB, EncodedPrompt, per_token_ms
from specter_bench.system_run import SystemRun, first_mismatch

__all__ = ["TpotRecords"]


class TpotRecords:
    """``BenchRunner``'s ``tpot`` records (a mixin: it uses the runner's references, routing
    and identity)."""

    def _tpot(
        self, run: SystemRun, prompt: EncodedPrompt, budget: float | None, note: str | None = None
    ) -> TpotRecord:
        pid = prompt.prompt.id
        # The first system to decode a prompt is its reference: hf when it runs (first).
        ref_system, ref_tokens = self.reference.setdefault(pid, (run.system, run.tokens))
        checked = ref_system != run.system
        mismatch = first_mismatch(run.tokens, ref_tokens[: len(run.tokens)]) if checked else None
        # Exactness within the engine: every engine system against the first one of the same
        # arithmetic. CPU-computed experts sum in the host's order, so systems with CPU
        # experts are checked against the first such system at the same budget (the same
        # CPU-homed experts): the promise is exactness to the same placement.
        engine_ref: tuple[str, list[int]] | None = None
        engine_mismatch = None
        if not run.system.startswith("hf"):
            key = pid if not (run.settings or {}).get("cpu_experts") else f"{pid}@cpu{budget}"
            engine_ref = self.engine_reference.setdefault(key, (run.system, run.tokens))
            if engine_ref[1] is run.tokens:
                engine_ref = None  # this run is the engine reference
            else:
                engine_mismatch = first_mismatch(run.tokens, engine_ref[1][: len(run.tokens)])
        n = run.decode_tokens
        cache = run.cache or {}
        gen = run.generation or {}
        tpot_ms = 1e3 * run.tpot_s if run.tpot_s is not None else None
        speculated = run.draft_s is not None
        bound_ms = ratio = None
        bound: dict[str, Any] | None = None
        routes = self.routing.get(pid)
        if (
            routes is not None
            and run.slots_per_layer is not None
            and self.transfer_s
            and routes["target"].shape[0] == len(run.tokens)
        ):
            b = belady_bound(routes["target"], run.slots_per_layer, self.transfer_s)
            bound = b.as_dict()
            bound_ms = b.tpot_ms
            ratio = tpot_ms / bound_ms if tpot_ms is not None and bound_ms > 0 else None
        extra: dict[str, Any] = {"settings": run.settings, "tokens": list(run.tokens)}
        if run.generation is not None:
            extra["generation"] = run.generation
        if run.cache is not None:
            extra["cache"] = run.cache
        if run.prefetcher is not None:
            extra["prefetcher"] = run.prefetcher
        if bound is not None:
            extra["belady"] = bound
        return TpotRecord(
            system=run.system,
            model=self.name,
            budget_gb=budget,
            prompt_source=prompt.prompt.source,
            prompt_id=pid,
            prompt_tokens=len(prompt.ids),
            new_tokens=len(run.tokens),
            tpot_ms=tpot_ms,
            tokens_per_s=1e3 / tpot_ms if tpot_ms else None,
            prefill_ms=1e3 * run.prefill_s,
            decode_ms=1e3 * run.decode_s,
            draft_ms_per_token=per_token_ms(run.draft_s, n),
            verify_ms_per_token=per_token_ms(run.verify_s, n),
            accepted_per_iteration=gen.get("mean_accepted_per_iteration") if speculated else None,
            acceptance_rate=gen.get("acceptance_rate"),
            depth=gen.get("mean_depth"),
            hit_rate=cache.get("hit_rate"),
            prefetch_precision=cache.get("prefetch_precision"),
            prefetch_recall=cache.get("prefetch_recall"),
            h2d_bytes_per_token=cache["bytes_moved"] / n if "bytes_moved" in cache and n else None,
            stall_ms_per_token=per_token_ms(cache.get("stall_seconds"), n),
            peak_gpu_memory_gb=run.peak_gpu_bytes / GB if run.peak_gpu_bytes else None,
            driver_peak_gpu_memory_gb=(
                run.driver_peak_bytes / GB if run.driver_peak_bytes is not None else None
            ),
            ttft_ms=1e3 * run.ttft_s if run.ttft_s is not None else None,
            run_index=run.run_index,
            slots_per_layer=run.slots_per_layer,
            belady_tpot_ms=bound_ms,
            tpot_over_belady=ratio,
            reference_system=ref_system if checked else None,
            matches_reference=mismatch is None if checked else None,
            first_mismatch=mismatch,
            engine_reference_system=engine_ref[0] if engine_ref else None,
            matches_engine_reference=engine_mismatch is None if engine_ref else None,
            engine_first_mismatch=engine_mismatch,
            note=note,
            identity=dict(self.identity),
            extra=extra,
        )  # fmt: skip
