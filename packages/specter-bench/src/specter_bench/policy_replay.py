"""Replay recorded routing through expert-cache policies, offline on the CPU.

From a routing dump (`specter_bench.routing_dump`: whole sequences, prompt then decode) it
counts, per prompt, the expert loads of the decode (token by token) under each policy at one
slot count per layer, every policy starting from the state the prompt's prefill leaves:

* ``pinned-calib``: ``hot`` experts a layer pinned, the most routed in the calibration
  prompts' decodes, LRU over the other slots (the bench's ``specter`` system).
* ``pinned-prompt a=<prior>``: the same count pinned, chosen at the end of the prefill from
  the prompt's own routing counts plus ``prior`` times the calibration counts (normalised to
  the prompt's token count); LRU over the other slots. ``repin a=<prior>`` counts the newly
  pinned experts the prefill's end state lacks (loads spent before the decode).
* ``lfu decay=<d> a=<prior>``: no pinning; every slot goes to the experts with the highest
  decayed count (prefill and decode routing, decay ``d`` a token); a missing expert is loaded
  over the lowest-count resident one the step does not need.
* ``draft-lookahead h=<h>``: ``lfu`` (decay 0.98, the calibration prior) whose victim is
  first a resident expert the draft's routing of the next ``h`` tokens does not name, and
  which reads a missing expert without a slot when the draft does not name it within ``h``
  and it counts below the victim (the draft's routing is teacher-forced on the target's
  tokens: an upper bound on what rejected proposals would predict). Only with draft routing.
* ``belady``: the fewest loads at the slot count (warm start, as the bench's bound) of any
  policy that keeps what it loads; ``draft-lookahead``'s reads without a slot are outside
  that model and may count fewer.

Routing tensors are int64 ``[T, k]`` for one layer or ``[T, L, k]`` for all layers.
"""

from __future__ import annotations

import collections
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

__all__ = [
    "PolicyReplayConfig",
    "PolicyReplayResult",
    "belady_loads",
    "format_policy_replay",
    "horizon_loads",
    "lfu_loads",
    "lru_loads",
    "prefill_state_lru",
    "replay_policies",
]

LOOKAHEAD_DECAY = 0.98


@dataclass(frozen=True)
class PolicyReplayConfig:
    """What to replay.

    Attributes:
        slots: expert slots per layer (DeepSeek-V2-Lite's 24 GB plan by default).
        hot: experts per layer pinned by the pinned policies (< ``slots``).
        calibration: prompt indices whose decodes count the hot set and the priors, or
            None: every other prompt (leave one out).
        priors: weights of the calibration counts for ``pinned-prompt``.
        decays: per-token decays for ``lfu``.
        horizons: lookahead tokens for ``draft-lookahead``.
        prompts: prompt indices to measure, or None: every prompt not in ``calibration``.
    """

    slots: int = 39
    hot: int = 36
    calibration: tuple[int, ...] | None = (3, 4, 5, 6, 7, 8, 9, 10)
    priors: tuple[float, ...] = (0.0, 0.5, 1.0, 2.0)
    decays: tuple[float, ...] = (1.0, 0.99, 0.95)
    horizons: tuple[int, ...] = (1, 2, 4, 8)
    prompts: tuple[int, ...] | None = None


@dataclass
class PolicyReplayResult:
    """Loads a decoded token per policy: one dict per measured prompt, and their mean."""

    config: PolicyReplayConfig
    prompt_ids: list[str] = field(default_factory=list)
    per_prompt: list[dict[str, float]] = field(default_factory=list)

    def mean(self) -> dict[str, float]:
        """Each policy's mean over the measured prompts."""
        keys = self.per_prompt[0].keys() if self.per_prompt else ()
        return {k: statistics.fmean(row[k] for row in self.per_prompt) for k in keys}

    def median(self) -> dict[str, float]:
        """Each policy's median over the measured prompts."""
        keys = self.per_prompt[0].keys() if self.per_prompt else ()
        return {k: statistics.median(row[k] for row in self.per_prompt) for k in keys}


def layer_counts(routes: Sequence[torch.Tensor], num_experts: int) -> torch.Tensor:
    """``[L, E]`` how often each expert is routed in ``routes`` (``[T, L, k]`` each)."""
    num_layers = routes[0].shape[1]
    counts = torch.zeros(num_layers, num_experts, dtype=torch.float64)
    for r in routes:
        for layer in range(num_layers):
            counts[layer] += torch.bincount(r[:, layer].reshape(-1).long(), minlength=num_experts)
    return counts


def top(counts: torch.Tensor, n: int) -> list[int]:
    """The ``n`` experts with the highest counts (ties: lower id)."""
    order = sorted(range(counts.numel()), key=lambda e: (-float(counts[e]), e))
    return order[:n]


def prefill_state_lru(prefill: torch.Tensor, pinned: set[int], free: int) -> list[int]:
    """LRU order (oldest first) of the ``free`` unpinned slots after the prefill ``[T, k]``."""
    last: dict[int, int] = {}
    for t in range(prefill.shape[0]):
        for e in prefill[t].tolist():
            if e not in pinned:
                last[e] = t
    order = sorted(last, key=lambda e: last[e])
    return order[-free:] if free else []


def lru_loads(decode: torch.Tensor, pinned: set[int], lru: list[int], free: int) -> int:
    """Loads of the decode steps ``[T, k]`` with ``pinned`` resident and LRU over ``free``
    slots starting from ``lru`` (oldest first); with no free slot nothing is kept."""
    order = collections.OrderedDict((e, None) for e in lru)
    loads = 0
    for t in range(decode.shape[0]):
        need = [e for e in decode[t].tolist() if e not in pinned]
        for e in need:
            if e in order:
                order.move_to_end(e)
                continue
            loads += 1
            if free == 0:
                continue  # streamed, nothing kept
            if len(order) >= free:
                for victim in order:
                    if victim not in need:
                        del order[victim]
                        break
            order[e] = None
    return loads


def decayed_counts(prefill: torch.Tensor, decay: float, prior: torch.Tensor) -> torch.Tensor:
    """``[E]`` counts of the prefill's routing ``[T, k]`` on top of ``prior``, each token's
    older counts multiplied by ``decay``."""
    score = prior.clone()
    for t in range(prefill.shape[0]):
        score *= decay
        score[prefill[t].long()] += 1.0
    return score


def horizon_loads(
    prefill: torch.Tensor,
    decode: torch.Tensor,
    slots: int,
    horizon: int,
    decay: float,
    prior: torch.Tensor,
    bypass: bool,
    predicted: torch.Tensor | None = None,
) -> int:
    """Loads under a lookahead policy: the victim is the resident expert not needed within
    the next ``horizon`` tokens (by ``predicted`` routing when given, else the true one) with
    the lowest decayed count; with ``bypass`` a missing expert is read without a slot when
    it is not needed within the horizon and counts below every resident."""
    future = decode if predicted is None else predicted
    score = decayed_counts(prefill, decay, prior)
    resident = set(top(score, slots))
    loads = 0
    steps = decode.shape[0]
    for t in range(steps):
        need = decode[t].tolist()
        score *= decay
        score[decode[t].long()] += 1.0
        soon: dict[int, int] = {}
        for u in range(t + 1, min(steps, t + 1 + horizon)):
            for e in future[u].tolist():
                soon.setdefault(e, u)
        for e in need:
            if e in resident:
                continue
            loads += 1
            victims = [r for r in resident if r not in need]
            keys = {r: (-soon.get(r, steps + 1), float(score[r]), r) for r in [*victims, e]}
            victim = min(victims, key=keys.__getitem__)
            if bypass and e not in soon and keys[e] < keys[victim]:
                continue
            resident.discard(victim)
            resident.add(e)
    return loads


def lfu_loads(
    prefill: torch.Tensor, decode: torch.Tensor, slots: int, decay: float, prior: torch.Tensor
) -> int:
    """Loads of the decode under decayed-count LFU: a missing expert is loaded over the
    lowest-count resident one the step does not need."""
    return horizon_loads(prefill, decode, slots, 0, decay, prior, bypass=False)


def belady_loads(decode: torch.Tensor, slots: int) -> int:
    """Belady's fewest loads of the decode ``[T, k]``, warm-started as the bench's bound."""
    from specter_bench.belady import warm_belady_loads

    return warm_belady_loads([[frozenset(step.tolist()) for step in decode]], slots)


def _check(config: PolicyReplayConfig, num_prompts: int, top_k: int) -> list[int]:
    """The measured prompt indices, after checking the config against the dump."""
    if not 0 <= config.hot < config.slots:
        raise ValueError(
            f"--hot {config.hot} must be >= 0 and below --slots {config.slots} (the pinned "
            "policies keep at least one LRU slot)."
        )
    if config.slots < top_k:
        raise ValueError(
            f"--slots {config.slots} is below the {top_k} experts a token routes to; give at "
            f"least {top_k}."
        )
    named = [*(config.calibration or ()), *(config.prompts or ())]
    bad = [i for i in named if not 0 <= i < num_prompts]
    if bad:
        raise ValueError(
            f"prompt indices {bad} are outside the dump's {num_prompts} prompts (0 to "
            f"{num_prompts - 1})."
        )
    if config.prompts is not None:
        measured = list(config.prompts)
    else:
        calibration = set(config.calibration or ())
        measured = [i for i in range(num_prompts) if i not in calibration]
    if not measured:
        raise ValueError("no prompt is left to measure; name --prompts or fewer --calibration.")
    if config.calibration is None and num_prompts < 2:
        raise ValueError("leave-one-out calibration needs a dump of at least 2 prompts.")
    return measured


def replay_policies(
    dump: dict,
    config: PolicyReplayConfig,
    progress: Callable[[str, dict[str, float]], None] | None = None,
) -> PolicyReplayResult:
    """Loads a decoded token of every policy (module docstring) for each measured prompt.

    Args:
        dump: a routing dump (`specter_bench.routing_dump.check_dump` describes it).
        config: slots, hot set, calibration and the policies' parameters.
        progress: called with each prompt's id and row as it is done.

    Raises:
        ValueError: a malformed dump, or a config that does not fit it.
    """
    from specter_bench.routing_dump import check_dump, split_dump

    check_dump(dump)
    targets = dump["target"]
    num_experts = int(max(int(t.max()) for t in targets)) + 1
    num_layers, top_k = targets[0].shape[1], targets[0].shape[2]
    measured = _check(config, len(targets), top_k)
    prefills, decodes, draft_decodes = split_dump(dump)
    slots, hot = config.slots, config.hot
    result = PolicyReplayResult(config)
    for i in measured:
        calibration = (
            [j for j in range(len(targets)) if j != i]
            if config.calibration is None
            else list(config.calibration)
        )
        cal = layer_counts([decodes[j] for j in calibration], num_experts)
        pre = layer_counts([prefills[i]], num_experts)
        tokens = decodes[i].shape[0]
        row: dict[str, float] = collections.Counter()
        for layer in range(num_layers):
            dec = decodes[i][:, layer]
            pf = prefills[i][:, layer]
            pinned = set(top(cal[layer], hot))
            lru = prefill_state_lru(pf, pinned, slots - hot)
            row["pinned-calib"] += lru_loads(dec, pinned, lru, slots - hot)
            norm = pre[layer].sum() / max(float(cal[layer].sum()), 1.0)
            for a in config.priors:
                chosen = set(top(pre[layer] + a * norm * cal[layer], hot))
                after = pinned | set(lru)  # what the prefill leaves resident
                row[f"pinned-prompt a={a}"] += lru_loads(
                    dec, chosen, prefill_state_lru(pf, chosen, slots - hot), slots - hot
                )
                row[f"repin a={a}"] += len(chosen - after)
            for decay in config.decays:
                for a in (0.0, 1.0):
                    row[f"lfu decay={decay} a={a}"] += lfu_loads(
                        pf, dec, slots, decay, a * norm * cal[layer]
                    )
            if draft_decodes:
                for h in config.horizons:
                    row[f"draft-lookahead h={h}"] += horizon_loads(
                        pf,
                        dec,
                        slots,
                        h,
                        LOOKAHEAD_DECAY,
                        norm * cal[layer],
                        True,
                        draft_decodes[i][:, layer],
                    )
            row["belady"] += belady_loads(dec, slots)
        per_token = {k: v / tokens for k, v in row.items()}
        prompt_id = str(dump["prompt_ids"][i])
        result.prompt_ids.append(prompt_id)
        result.per_prompt.append(per_token)
        if progress is not None:
            progress(prompt_id, per_token)
    return result


def format_policy_replay(result: PolicyReplayResult) -> str:
    """A markdown table of each policy's mean and median loads a token."""
    from specter_bench.tables import markdown_table

    mean, median = result.mean(), result.median()
    c = result.config
    return "\n".join(
        [
            f"loads a decoded token over {len(result.per_prompt)} prompts "
            f"(slots {c.slots} a layer, hot {c.hot}):",
            "",
            markdown_table(
                ["policy", "mean", "median"], [[k, mean[k], median[k]] for k in mean], digits=2
            ),
        ]
    )
