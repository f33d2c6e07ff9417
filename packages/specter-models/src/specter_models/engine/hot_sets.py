"""The engine's pinned hot set: read from a file, or chosen on a calibration prompt.

A hot-set file gives the hot set a benchmark chose, and the pruned experts its record
names (:func:`read_hot_set`): a results file of ``specter bench`` (JSON lines; its
``hot_experts`` record at the asked budget, or its only one), a JSON object
``{"hot_experts": [[ids of layer 0], ...]}``, or the bare list of lists. ``"auto"`` chooses
one on the calibration prompt (:func:`choose_prompt_engine`): a target-only load at the
budget decodes the prompt's first :data:`CONTINUATION_TOKENS` tokens greedily, and the
target's routing of the prompt and that continuation goes through
``specter_models.choose_hot_experts`` as the benchmark's calibration routing does. A
prompt's own routing predicts its decode's experts worse than decoded tokens do: on
DeepSeek-V2-Lite's recorded routing of 16 HumanEval sequences at 24 GB, a hot set counted
on the prompt alone moved 22.6 experts a token over the decode after the first 32 tokens,
one counted on the prompt and those 32 tokens 21.4. With ``compare_plain`` (an adaptive
depth under a budget) the same routing is replayed through plain decoding's draftless
slots too, and the decode goes without the draft where that costs less link time (plain
decoding's loads weighted by :data:`IN_PLACE_READ_COST`).
"""

from __future__ import annotations

import gc
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
    "pruned_from_file",
    "read_hot_set",
    "resolve_hot_experts",
]

CONTINUATION_TOKENS = 32
"""Greedy tokens an auto hot set decodes after the calibration prompt to choose on (the
default of ``MemoryConfig.hot_set_tokens``)."""


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
"""How many of speculation's expert loads one of plain decoding's costs in link time, in an
adaptive depth's plain-or-draft comparison: plain streamed decoding reads its missing
experts in place inside the expert kernel, at about 32 GB/s over a step (DeepSeek-V2-Lite
at 24 GB on one H200: 280 MB a token in 9.7 ms), where most of speculation's are
prefetched by the copy engine at up to 52.8 GB/s while the draft runs. Comparing bare
counts chose plain decoding at 24 GB with the pruned draft, 9.7 ms a token, where the
bench's specter took 7.25."""


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
        """The comparison for the generation statistics."""
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
    max_batch: int = 1,
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
        dtype, max_seq_len, max_batch: those of the load the hot set is for (they size its
            plan).
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
    import specter_models
    from specter_models.routing_recorder import RoutingRecorder, teacher_forced_pass

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
            # The last token's routing would come from a position no decode step computes.
            sequence += greedy_target_tokens(loaded, sequence, continuation_tokens)[:-1]
        routing = teacher_forced_pass(recorder, loaded.target, sequence, 0, loaded.reset).routing
        config = loaded.config
    finally:
        recorder.remove()
        del loaded, recorder
        release_memory()
    hot = specter_models.choose_hot_experts(
        config, gpu_memory_gb, [routing], dtype=dtype, max_seq_len=max_seq_len,
        pruned_per_layer=pruned_per_layer, max_batch=max_batch,
    )  # fmt: skip
    plain = None
    if compare_plain:
        plain = specter_models.replay_plain_decoding(
            config, gpu_memory_gb, [routing], dtype=dtype, max_seq_len=max_seq_len,
            staging_slots=staging_slots, max_batch=max_batch,
        )  # fmt: skip
    return PromptChoice(hot, plain, int(routing.shape[0]))


def greedy_target_tokens(loaded: Any, prompt_ids: list[int], tokens: int) -> list[int]:
    """``tokens`` greedy tokens of the target alone after ``prompt_ids``, decoded with the
    model's cache as plain LRU decoding that acquires its misses; the model is reset before."""
    from specter_models.engine.decode_window import DecodeWindow
    from specter_spec import SpecController

    loaded.reset()
    loaded.verification = "expert"
    settings = {"miss_path": "load", "stream_fills": 0, "stream_staging": 0, "stream_waits": True}
    for name, value in settings.items():
        if hasattr(loaded, name):
            setattr(loaded, name, value)
    runtime = getattr(loaded, "runtime", None)
    if runtime is not None and hasattr(runtime, "row_truncation"):
        runtime.row_truncation = None
    record = getattr(runtime, "stream_record", None)
    if record is not None and hasattr(record, "pipelined"):
        record.pipelined = False
    policy = loaded.cache.policy
    if hasattr(policy, "clear_plan"):
        policy.clear_plan()
    prefetcher = getattr(loaded, "prefetcher", None)
    if prefetcher is not None and hasattr(prefetcher, "verify_lead"):
        prefetcher.verify_lead = None
    if prefetcher is not None and hasattr(prefetcher, "layerwise"):
        prefetcher.layerwise = False
    controller = SpecController(
        None, loaded.target, cache=DecodeWindow(loaded.cache, None), depth=0
    )
    return list(controller.generate(prompt_ids, tokens).tokens)


def release_memory() -> None:
    """Collect garbage and return cached device memory (after a load that is dropped)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def resolve_hot_experts(
    choice: str | None,
    *,
    speculate: bool,
    budget_gb: float | None,
    prompt_tokens: int,
    holds_every_expert: bool = False,
) -> str | None:
    """``MemoryConfig.hot_experts`` with its default resolved.

    By default a speculative decode under a memory budget pins a hot set chosen on the
    routing of the calibration prompt and its first greedy tokens (``"auto"``), as the
    bench's ``specter`` pins one: pinned experts need no INT4 draft copy, so the budget
    holds more FP16 slots, and the draft computes them exactly. On DeepSeek-V2-Lite at
    24 GB without one, generation measured 28.3 ms a token with 30 slots a layer, where the
    bench's ``specter`` takes 10-11. No hot set without a budget or with one that holds
    every expert beside the draft (nothing to pin), when decoding plainly (no draft), or
    for a calibration prompt of fewer than two tokens (``"auto"`` scores each half of the
    routing on the other).

    Args:
        choice: None (not given), ``"none"``, ``"auto"`` or a file.
        speculate: the decode drafts (depth other than 0).
        budget_gb: the budget (None: none).
        prompt_tokens: the calibration prompt's length in tokens (0: none given).
        holds_every_expert: the budget's plan with the draft has a slot for every expert.

    Returns:
        ``"auto"``, a file path, or None (no hot set).
    """
    if choice is None:
        pays = speculate and budget_gb is not None and not holds_every_expert
        return "auto" if pays and prompt_tokens >= 2 else None
    return None if choice == "none" else choice


def pruned_from_file(
    stored: list[list[int]] | None, asked: int | str, path: str
) -> list[list[int]] | None:
    """The pruned experts of a hot-set file's decode: the file's own with ``asked="auto"``
    (none if it names none), none with 0, and with a count the file's if it names that many
    (there is no routing to choose others on).

    Raises:
        ValueError: a count the file does not name.
    """
    if asked == "auto":
        return stored
    if asked == 0:
        return None
    have = len(stored[0]) if stored else 0
    if have != asked:
        raise ValueError(
            f"draft_pruned={asked} (--draft-pruned) with the hot-set file {path}: that file names "
            f"{have} pruned experts per layer, and a hot-set file gives no routing to choose "
            "others on. Give draft_pruned 'auto' (the file's) or 0, or hot_experts 'auto' to "
            "choose on the calibration prompt."
        )
    return stored
