"""transformers' batched ``generate``: the ``hf`` system of the ``batch`` experiment.

B prompts decode in one ``generate`` call, left-padded to the longest (transformers derives
each row's positions from its attention mask), greedy, no stop token, in ``hf``'s fastest
configuration (:class:`~specter_bench.hf_baseline.HFRunner`: static KV cache sized once for
every call, compiled, the experts implementation chosen by expert size); every weight on the
device. A compiled decode step is specialised on the batch size, so each batch size is
warmed up before it is measured, and dynamo may compile one decode step per batch size.

Timing: a streamer stamps the host clock when each step's tokens (one per row) reach it;
the first step ends the prefill, and every row's TPOT is the time from it to the last step
over the steps after the first (:mod:`~specter_bench.batch_run`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from specter_bench.batch_run import BatchRun, SequenceClock
from specter_bench.hf_baseline import (
    BATCHED_MM_MAX_GATHER_BYTES,
    HFRunner,
    _allow_one_compile_per_layer,
)

__all__ = ["BATCHED_MM_CAPPED", "BATCHED_MM_MAX_GATHER_BYTES", "HFBatchRunner", "left_padded"]

BATCHED_MM_CAPPED = "specter_batched_mm_capped"
"""The experts implementation the batched runner registers in place of ``batched_mm``."""


def capped_batched_mm_forward(
    module: torch.nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """transformers' ``batched_mm`` experts where the gathered copies of
    ``top_k_index [T, k]``'s experts fit :data:`BATCHED_MM_MAX_GATHER_BYTES`, else
    ``grouped_mm`` (``hidden_states [T, H]``)."""
    from transformers.integrations import moe

    gate_up, down = module.gate_up_proj, module.down_proj
    per_copy = (gate_up[0].numel() + down[0].numel()) * gate_up.element_size()
    if top_k_index.numel() * per_copy <= BATCHED_MM_MAX_GATHER_BYTES:
        return moe.batched_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)
    return moe.grouped_mm_experts_forward(module, hidden_states, top_k_index, top_k_weights)


def left_padded(
    prompts: Sequence[Sequence[int]], pad_token_id: int, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(input_ids [B, T], attention_mask [B, T])``: each prompt right-aligned to the
    longest, padded on the left with ``pad_token_id`` (mask 0 there).

    Raises:
        ValueError: no prompts, or an empty one.
    """
    if not prompts:
        raise ValueError("no prompts to batch; give at least one.")
    if any(len(p) == 0 for p in prompts):
        raise ValueError("a prompt of the batch is empty; give at least one token each.")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
        mask[row, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


class _StepStreamer:
    """Stamps every row of each step's tokens on a :class:`SequenceClock` (transformers
    streamer API; ``generate`` puts the prompt first)."""

    def __init__(self, clock: SequenceClock) -> None:
        self.clock = clock
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        now = time.perf_counter()
        for row, token in enumerate(value.reshape(-1).tolist()):
            self.clock.stamp(row, [token], at=now)

    def end(self) -> None:
        """Nothing to flush."""


class HFBatchRunner:
    """Greedy batched ``generate`` of ``runner``'s model in ``runner``'s configuration.

    Args:
        runner: an :class:`HFRunner` of system ``hf`` (its model, cache and experts
            settings, compilation switch and cache length).
        batch_sizes: how many batch sizes will be decoded (dynamo's recompile limit is
            raised to compile one decode step per layer for each).
    """

    def __init__(self, runner: HFRunner, *, batch_sizes: int = 1) -> None:
        self.runner = runner
        if runner.settings.get("experts_implementation") == "batched_mm":
            from transformers.integrations.moe import ExpertsInterface

            ExpertsInterface.register(BATCHED_MM_CAPPED, capped_batched_mm_forward)
            runner.model.set_experts_implementation(BATCHED_MM_CAPPED)
            runner.settings["experts_implementation"] = BATCHED_MM_CAPPED
        self.settings = dict(runner.settings)
        if self.settings.get("compile"):
            limit = _allow_one_compile_per_layer(runner.model, shapes=batch_sizes)
            self.settings["recompile_limit"] = limit

    def generate(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> BatchRun:
        """Decode exactly ``max_new_tokens`` greedy tokens for each prompt, in one call.

        Raises:
            ValueError: no prompts, an empty prompt, or ``max_new_tokens < 1``.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}.")
        runner = self.runner
        ids, mask = left_padded(prompts, runner.pad_token_id, runner.device)
        kwargs: dict[str, object] = {}
        if self.settings["cache_implementation"] == "static":
            kwargs["cache_implementation"] = "static"
            if runner.max_cache_len is not None:
                kwargs["max_cache_len"] = max(runner.max_cache_len, ids.shape[1] + max_new_tokens)
            if not self.settings["compile"]:
                kwargs["disable_compile"] = True
        cuda = runner.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(runner.device)
            torch.cuda.reset_peak_memory_stats(runner.device)
        started = time.perf_counter()
        clock = SequenceClock(len(prompts), started)
        with torch.no_grad():
            runner.model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=None,  # every row decodes exactly max_new_tokens tokens
                pad_token_id=runner.pad_token_id,
                streamer=_StepStreamer(clock),
                **kwargs,
            )
        prefill_s, decode_s, decode_tokens = clock.window()
        return BatchRun(
            system=runner.system,
            tokens=clock.tokens,
            prefill_s=prefill_s,
            decode_s=decode_s,
            decode_tokens=decode_tokens,
            tpot_s=clock.tpot_s(),
            peak_gpu_bytes=torch.cuda.max_memory_allocated(runner.device) if cuda else None,
            settings={**self.settings, "padding": "left"},
        )
