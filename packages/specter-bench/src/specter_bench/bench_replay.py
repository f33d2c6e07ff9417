"""The benchmark under a routing replay (``specter bench --routing replay``).

Every engine system of the run computes the experts and accepts the proposals a trace
recorded on a trained model of the same topology (`specter_models.routing_replay`):

* the prompts are the trace's sequences (their token ids, as recorded), taken source by
  source in turn (:func:`replay_order`; with one source prompt ``i`` is sequence ``i``); the
  calibration prompts that choose each budget's hot set are the next ones in that order,
  and their routing is the trace's (no calibration decode runs);
* the replay is attached to every engine load before its CUDA graphs are captured, and
  each generation selects its sequence by its prompt (``EngineSystemRunner``);
* the routing experiments teacher-force the replayed model, so their routing is the
  trace's; their greedy agreement is the trace's flags (the replayed model's own logits
  mean nothing), and the sampled acceptance, which needs the recorded model's
  distributions, is left out;
* every record's identity says ``routing: replay:<trace file name>`` (else ``random``).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from specter_bench.bench_support import EncodedPrompt
from specter_bench.prompt_sources import Prompt

__all__ = ["ReplayedRouting", "replay_order", "routing_label"]


def replay_order(sources: list[str]) -> list[int]:
    """The order a replay takes a trace's sequences in, given each one's prompt source:
    one of each source in turn (sources in order of first appearance, sequences in trace
    order within a source), so the first ``n`` mix the sources evenly.

    Example:
        >>> replay_order(["humaneval", "humaneval", "humaneval", "prose", "prose"])
        [0, 3, 1, 4, 2]
    """
    groups: dict[str, list[int]] = {}
    for index, source in enumerate(sources):
        groups.setdefault(source, []).append(index)
    turns = itertools.zip_longest(*groups.values())
    return [index for turn in turns for index in turn if index is not None]


def routing_label(trace: Any | None) -> str:
    """``random``, or ``replay:<trace file name>``."""
    return "random" if trace is None else f"replay:{trace.name}"


class ReplayedRouting:
    """``BenchRunner``'s routing replay (a mixin: it uses the runner's state)."""

    trace: Any | None = None

    def _replay_prompts(self, vocab: int) -> None:
        """Load the trace of ``config.routing_trace`` and make its sequences the measured
        and calibration prompts, checked against the model (topology, vocabulary) and the
        run (enough sequences, each long enough).

        Raises:
            ValueError: what does not fit, naming the trace and the values.
        """
        from specter_models import RoutingTrace, plan_memory

        cfg = self.config
        trace = RoutingTrace.load(cfg.routing_trace)
        plan = plan_memory(self.hf_config, dtype=cfg.dtype, max_seq_len=64)
        trace.check_topology(
            plan.num_moe_layers, plan.num_experts, int(self.hf_config.num_experts_per_tok),
            cfg.model,
        )  # fmt: skip
        count = len(trace.sequences)
        measured = count if cfg.prompts.limit is None else cfg.prompts.limit
        if measured > count:
            raise ValueError(
                f"--num-prompts {measured}: routing trace {trace.name} holds {count} "
                "sequences; record more (`specter record-routing --num-prompts`, --append) "
                "or measure fewer."
            )
        order = replay_order([s.source for s in trace.sequences])
        chosen = order[: measured + cfg.calibration_prompts]
        prompts = []
        for index in chosen:
            sequence = trace.check_length(index, cfg.max_new_tokens)
            ids = sequence.tokens[: sequence.prompt_len].tolist()
            if max(ids) >= vocab:
                raise ValueError(
                    f"routing trace {trace.name}: sequence {index} holds token id {max(ids)}, "
                    f"outside {cfg.model}'s vocabulary of {vocab}."
                )
            prompts.append(EncodedPrompt(Prompt(sequence.source, sequence.prompt_id, ""), ids))
        self.trace = trace
        self.prompts = prompts[:measured]
        self.calibration = prompts[measured:]
        self._calibration_sequences = [trace.sequences[i] for i in chosen[measured:]]
        if len(self.calibration) < cfg.calibration_prompts:
            self.log(
                f"routing trace {trace.name}: {len(self.calibration)} sequences after the "
                f"{measured} measured ones calibrate the hot sets ({cfg.calibration_prompts} "
                "asked for)"
            )

    def _prompt_source_label(self) -> str:
        """The run's prompt source: the configured one, or under a replay the measured
        sequences' sources (``humaneval,wikitext2``)."""
        if self.trace is None:
            return self.config.prompts.source
        return ",".join(dict.fromkeys(p.prompt.source for p in self.prompts))

    def _attach_replay(self, loaded: Any) -> None:
        """Attach the run's replay to an engine load (before its graphs are captured)."""
        if self.trace is None:
            return
        from specter_models import replay_routing

        replay_routing(loaded, self.trace)
        self.log(f"replaying routing trace {self.trace.name} ({self.trace.model})")

    def _replayed_calibration_routing(self) -> list[torch.Tensor]:
        """``[T, L, k]`` target routing of each calibration sequence's decode, from the
        trace: ``max_new_tokens`` positions from ``prompt_len - 1`` on."""
        routes = []
        for sequence in self._calibration_sequences:
            start = sequence.prompt_len - 1
            routes.append(sequence.target[start : start + self.config.max_new_tokens].long())
        return routes

    def _select_replay(self, loaded: Any, prompt: EncodedPrompt) -> Any | None:
        """Under a replay, fill ``loaded``'s tables with ``prompt``'s sequence and return it
        (a teacher-forced pass then routes as recorded); None without a replay."""
        replay = getattr(getattr(loaded, "runtime", None), "routing_replay", None)
        if replay is None:
            return None
        replay.start(prompt.ids, self.config.max_new_tokens)
        return replay.current()

    @staticmethod
    def _replayed_agreement(sequence: Any, start: int, end: int) -> float:
        """The trace's greedy draft agreement over positions ``start .. end - 1``."""
        return float(sequence.agree[start:end].double().mean())
