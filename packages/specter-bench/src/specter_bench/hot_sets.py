"""The pinned hot set of ``specter generate`` (``specter_models.load(hot_experts=)``).

``--hot-experts FILE`` takes the hot set a benchmark chose, and the pruned experts its
record names (:func:`read_hot_set`): a results file of ``specter bench`` (JSON lines; its
``hot_experts`` record at the asked budget, or its only one), a JSON object
``{"hot_experts": [[ids of layer 0], ...]}``, or the bare list of lists. ``--hot-experts
auto`` chooses one on the prompt itself (:func:`choose_prompt_engine`): a target-only load
at the budget decodes the prompt's first :data:`CONTINUATION_TOKENS` tokens greedily, and
the target's routing of the prompt and that continuation goes through
``specter_models.choose_hot_experts`` as the benchmark's calibration routing does. A
prompt's own routing predicts its decode's experts worse than decoded tokens do: on
DeepSeek-V2-Lite's recorded routing of 16 HumanEval sequences at 24 GB
(``scripts/policy_replay.py``), a hot set counted on the prompt alone moved 22.6 experts a
token over the decode after the first 32 tokens, one counted on the prompt and those 32
tokens 21.4. With ``compare_plain`` (``generate``'s ``--depth auto`` under a budget) the
same routing is replayed through plain decoding's draftless slots too, and the decode goes
without the draft where that costs less link time (plain decoding's loads weighted by
:data:`IN_PLACE_READ_COST`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CONTINUATION_TOKENS",
    "IN_PLACE_READ_COST",
    "PromptChoice",
    "choose_prompt_engine",
    "read_hot_set",
]

CONTINUATION_TOKENS = 32
"""Greedy tokens ``generate --hot-experts auto`` decodes after the prompt to choose on (the
default of ``--hot-set-tokens``)."""


def _as_hot_set(value: Any, path: Path) -> list[list[int]]:
    ok = isinstance(value, list) and all(
        isinstance(layer, list) and all(isinstance(i, int) and i >= 0 for i in layer)
        for layer in value
    )
    if not ok or not value:
        raise ValueError(
            f"{path}: the hot set must be a non-empty list with one list of expert ids "
            "(ints >= 0) per MoE layer, e.g. [[0, 5], [3, 7]]; got "
            f"{json.dumps(value)[:80]}"
        )
    return [list(layer) for layer in value]


def read_hot_set(
    path: str | Path, budget_gb: float | None = None
) -> tuple[list[list[int]], list[list[int]] | None]:
    """``(hot set, pruned experts)`` stored in ``path``; the pruned experts are None when
    the file names none (a bare list, a JSON object without ``pruned_experts``, a record
    written before the pruned draft).

    Args:
        path: a ``specter bench`` results file (JSON lines), a JSON object with a
            ``hot_experts`` key, or a JSON list of per-layer id lists.
        budget_gb: in a results file with hot sets at several budgets, the one to take.

    Raises:
        FileNotFoundError: no such file.
        ValueError: no hot set in it, several and no (or no matching) budget, or a
            malformed one; the message says which.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"--hot-experts {path}: no such file (give a `specter bench` results file with a "
            'hot_experts record, or a JSON file {"hot_experts": [[...], ...]})'
        )
    text = path.read_text(encoding="utf-8")
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return _as_hot_set(whole, path), None
    if isinstance(whole, dict) and "hot_experts" in whole:
        return _as_hot_set(whole["hot_experts"], path), _pruned_of(whole, path)
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path}: line {number} is not JSON ({error.msg}); expected a `specter bench` "
                "results file or a JSON hot set"
            ) from None
        if isinstance(record, dict) and record.get("kind") == "hot_experts":
            records.append(record)
    if not records:
        raise ValueError(f"{path}: no hot_experts record or 'hot_experts' key in it")
    if budget_gb is not None:
        records = [r for r in records if r.get("budget_gb") == budget_gb] or records[:0]
        if not records:
            raise ValueError(f"{path}: no hot_experts record at {budget_gb:g} GB")
    budgets = sorted({r.get("budget_gb") for r in records}, key=str)
    if len(budgets) > 1:
        raise ValueError(
            f"{path} holds hot sets at several budgets ({budgets}); give --gpu-memory-gb "
            "to pick one"
        )
    data = records[-1]["data"]
    return _as_hot_set(data["hot_experts"], path), _pruned_of(data, path)


def _pruned_of(data: dict, path: Path) -> list[list[int]] | None:
    """A hot set record's pruned experts (None: none named, or an empty list per layer)."""
    pruned = data.get("pruned_experts")
    if not pruned or not any(pruned):
        return None
    return _as_hot_set(pruned, path)


IN_PLACE_READ_COST = 1.65
"""How many of speculation's expert loads one of plain decoding's costs in link time, in
``generate --depth auto``'s comparison: plain streamed decoding reads its missing experts in
place inside the expert kernel, at about 32 GB/s over a step (DeepSeek-V2-Lite at 24 GB on
the H200: 280 MB a token in 9.7 ms, thirty-second and thirty-sixth sessions), where most of
speculation's are prefetched by the copy engine at up to 52.8 GB/s while the draft runs.
Comparing bare counts (the rule until the thirty-sixth session) chose plain decoding at 24 GB
with the pruned draft, 9.7 ms a token, where the bench's specter took 7.25."""


@dataclass(frozen=True)
class PromptChoice:
    """What the prompt's routing chose at a budget.

    Attributes:
        hot: ``specter_models.HotExpertChoice``: the hot set for speculative decoding.
        plain: ``specter_models.PlainReplay`` of plain decoding (no INT4 draft), or None
            when not compared.
        routing_tokens: positions whose routing chose (the prompt's and its greedy
            continuation's but the last token's).
    """

    hot: Any
    plain: Any | None = None
    routing_tokens: int = 0

    @property
    def draft_loads(self) -> int | None:
        """The chosen hot set's replayed loads (None: nothing was replayed)."""
        return self.hot.loads.get(self.hot.per_layer)

    @property
    def decode_plainly(self) -> bool:
        """Plain decoding's replayed loads, each weighted by :data:`IN_PLACE_READ_COST`, cost
        strictly less than the hot set's."""
        loads = self.draft_loads
        return (
            self.plain is not None
            and loads is not None
            and IN_PLACE_READ_COST * self.plain.loads < loads
        )

    def as_dict(self) -> dict[str, object]:
        """The comparison for ``generate``'s statistics."""
        return {
            "decoded": "plain" if self.decode_plainly else "speculative",
            "in_place_read_cost": IN_PLACE_READ_COST,
            "draft_loads": self.draft_loads,
            "draft_slots_per_layer": self.hot.slots_per_layer,
            "draft_hot_experts_per_layer": self.hot.per_layer,
            "draft_pruned_per_layer": self.hot.pruned_per_layer,
            "plain_loads": None if self.plain is None else self.plain.loads,
            "plain_slots_per_layer": None if self.plain is None else self.plain.slots_per_layer,
            "routing_tokens": self.routing_tokens,
        }


def choose_prompt_engine(
    load_target: Callable[[], Any],
    gpu_memory_gb: float,
    prompt_ids: list[int],
    *,
    dtype: torch.dtype,
    max_seq_len: int,
    compare_plain: bool = False,
    staging_slots: int = 0,
    continuation_tokens: int = 0,
    pruned_per_layer: int | str = 0,
) -> PromptChoice:
    """Choose the hot set at ``gpu_memory_gb`` on the target's routing of the prompt (and of
    its first ``continuation_tokens`` greedy tokens, decoded plainly by the same load), and
    with ``compare_plain`` replay the same routing through the budget's draftless slots
    (``specter_models.replay_plain_decoding``; ``staging_slots`` sizes that plan), so the
    caller can decode without the draft where that moves fewer experts.

    Args:
        load_target: loads the target alone at the budget (a ``SpecterModel``; released
            before this returns).
        gpu_memory_gb: the budget the hot set is for.
        prompt_ids: the prompt's token ids (at least two: the choice scores each half of
            the routing on the other).
        dtype, max_seq_len: those of the load the hot set is for (they size its plan).
        compare_plain: also replay plain decoding's side.
        staging_slots: the staging buffer plain decoding's plan holds.
        continuation_tokens: greedy tokens to decode after the prompt and route too (0:
            the prompt alone); the load's KV must hold the prompt and them.
        pruned_per_layer: experts per layer the draft skips, the routing's least routed
            (``choose_hot_experts``' ``pruned_per_layer``: an int or ``"auto"``).

    Returns:
        ``PromptChoice``: ``.hot`` is a ``specter_models.HotExpertChoice`` (``per_layer`` 0:
        pinning does not pay here), ``.plain`` a ``PlainReplay`` with ``compare_plain``.

    Raises:
        ValueError: a prompt of fewer than two tokens, or a negative ``continuation_tokens``.
        MemoryBudgetError: the budget cannot hold the model.
    """
    from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
    from specter_bench.model_loading import release_memory
    from specter_bench.routing_recorder import RoutingRecorder, teacher_forced_pass
    from specter_models import choose_hot_experts, replay_plain_decoding

    if continuation_tokens < 0:
        raise ValueError(
            f"continuation_tokens must be >= 0 (greedy tokens to route after the prompt), got "
            f"{continuation_tokens}"
        )

    if len(prompt_ids) < 2:
        raise ValueError(
            f"--hot-experts auto chooses on the prompt's routing, which needs at least 2 "
            f"tokens; this prompt has {len(prompt_ids)}. Give a longer prompt or a hot-set file."
        )
    loaded = load_target()
    recorder = RoutingRecorder(loaded.model)
    try:
        sequence = list(prompt_ids)
        if continuation_tokens:
            runner = EngineSystemRunner(loaded, ENGINE_SYSTEMS["lru"], 0)
            # The last token's routing would come from a position no decode step computes.
            sequence += runner.generate(sequence, continuation_tokens).tokens[:-1]
            del runner
        routing = teacher_forced_pass(recorder, loaded.target, sequence, 0, loaded.reset).routing
        config = loaded.config
    finally:
        recorder.remove()
        del loaded, recorder
        release_memory()
    hot = choose_hot_experts(
        config, gpu_memory_gb, [routing], dtype=dtype, max_seq_len=max_seq_len,
        pruned_per_layer=pruned_per_layer,
    )  # fmt: skip
    plain = None
    if compare_plain:
        plain = replay_plain_decoding(
            config, gpu_memory_gb, [routing], dtype=dtype, max_seq_len=max_seq_len,
            staging_slots=staging_slots,
        )  # fmt: skip
    return PromptChoice(hot, plain, int(routing.shape[0]))
