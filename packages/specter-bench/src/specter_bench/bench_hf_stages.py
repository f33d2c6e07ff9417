"""The benchmark's transformers stages: ``hf`` with every weight on the GPU and
``hf-offload`` with accelerate's offloading."""

from __future__ import annotations

import time

import torch
from tqdm import tqdm

from specter_bench.bench_support import (
    BenchResult,
    hf_run,
    pad_id,
)
from specter_bench.experiments import Stage
from specter_bench.hf_baseline import HFRunner, offload_model
from specter_bench.model_loading import (
    build_hf_model,
    release_memory,
)
from specter_bench.system_run import SystemRun

__all__ = ["HFStages"]


class HFStages:
    """``BenchRunner``'s transformers stages (a mixin: it uses the runner's state)."""

    def _hf_stage(self, stage: Stage, result: BenchResult, bar: tqdm) -> None:
        cfg = self.config
        started = time.perf_counter()
        model = build_hf_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        build_s = time.perf_counter() - started
        records = []
        try:
            for system in stage.systems:
                runner = HFRunner(
                    model,
                    system,
                    pad_token_id=pad_id(self.hf_config),
                    compile=cfg.hf_compile,
                    max_cache_len=self.max_seq_len,
                    decode_experts=cfg.hf_decode_experts,
                )

                def generate(ids: list[int], n: int, runner: HFRunner = runner) -> SystemRun:
                    return hf_run(runner.system, runner.generate(ids, n), build_s=build_s)

                if cfg.device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                runs = self._decode_all(
                    system, generate, cfg.max_new_tokens, self.prompts, bar, result, None,
                    warm_each_prompt=bool(runner.settings.get("compile")),
                )  # fmt: skip
                records += [self._tpot(run, prompt, None) for prompt, run in runs]
        finally:
            del model
            # Compiled decode steps hold the model's weights; drop them with the model.
            torch._dynamo.reset()
            self._write(result, records)

    def _offload_stage(self, stage: Stage, result: BenchResult, bar: tqdm) -> None:
        cfg = self.config
        if not cfg.device.startswith("cuda"):
            raise RuntimeError("hf-offload measures GPU offloading; this run is on the CPU")
        release_memory(host=True)  # cached pinned blocks of the expert stores back to the system
        model = build_hf_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        model = model.to("cpu")
        release_memory()
        device_map = offload_model(model, stage.budget_gb or 0.0)
        runner = HFRunner(
            model, "hf-offload", pad_token_id=pad_id(self.hf_config), device=cfg.device
        )
        on_gpu = sum(1 for where in device_map.values() if where not in ("cpu", "disk"))
        prompts = self.prompts[: cfg.offload_prompts]
        n = min(cfg.offload_new_tokens, cfg.max_new_tokens)
        note = (
            f"very slow: measured on {len(prompts)} prompt(s) x {n} new tokens (others: "
            f"{len(self.prompts)} x {cfg.max_new_tokens}); accelerate placed {on_gpu} of "
            f"{len(device_map)} modules on the GPU"
        )

        def generate(ids: list[int], count: int) -> SystemRun:
            gen = runner.generate(ids, count)
            return hf_run("hf-offload", gen, device_map_modules_on_gpu=on_gpu)

        records = []
        try:
            torch.cuda.reset_peak_memory_stats()
            runs = self._decode_all(
                "hf-offload", generate, n, prompts, bar, result, stage.budget_gb, warmup=0, runs=1
            )
            records = [self._tpot(run, prompt, stage.budget_gb, note=note) for prompt, run in runs]
        finally:
            del model
            self._write(result, records)
