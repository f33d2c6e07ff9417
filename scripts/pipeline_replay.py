"""Replay recorded routing through speculative decoding's cache pipeline, offline on the CPU.

``scripts/policy_replay.py`` counts loads token by token; this one follows `specter`'s
iterations, so the prefetches the draft plans and the verification's window count as they
do in the engine. Each iteration at committed position ``p``: the draft's routing of its
``K`` steps (positions ``p .. p+K-1``, from the dump's teacher-forced draft routing) is the
plan, prefetched into slots (a load for each planned expert not resident; no prefetch where
no slot can be freed); the verification needs the target's routing of ``p .. p+K`` (the
dump's, also for proposals that get rejected: an approximation), and each needed expert not
resident is streamed (a load, nothing kept). Then ``a + 1`` tokens commit, ``a`` drawn from
a per-token acceptance ``--acceptance`` (the same draws for every policy). Policies, at
``--slots`` slots a layer:

* ``pinned``: ``--hot`` experts a layer pinned (the calibration decodes' most routed, as the
  bench's ``specter``), prefetches into the other slots, evicting the least recently used
  expert the plan does not name (today's engine).
* ``moving``: every slot movable (a hot set whose INT4 copies follow it, see
  docs/benchmarks.md's thirty-fourth session): prefetches evict the resident expert with the
  lowest decayed count (calibration prior, the prompt's prefill and the committed tokens,
  decay ``--decay`` a token, 1.0 by default: counts that never decay moved the fewest) that
  the plan does not name; a streamed expert is kept (a fill, no
  extra transfer) where it counts above such a victim.

Prints loads a committed token per policy and depth, the mean over the measured prompts.

    python3 scripts/pipeline_replay.py \
        benchmarks/results/routing-deepseek-v2-lite-2026-12-04-humaneval24.pt
"""

from __future__ import annotations

import collections
import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from policy_replay import (
    decayed_counts,
    layer_counts,
    prefill_state_lru,
    replay_parser,
    split_dump,
    top,
)


def schedule(tokens: int, depth: int, acceptance: float, seed: int) -> list[tuple[int, int]]:
    """``(p, a)`` per iteration: its first position and how many proposals it accepts."""
    rng = random.Random(seed)
    out, p = [], 0
    while p < tokens:
        a = 0
        while a < depth and rng.random() < acceptance:
            a += 1
        out.append((p, a))
        p += a + 1
    return out


def window_and_plan(
    target: torch.Tensor, draft: torch.Tensor, p: int, depth: int
) -> tuple[set[int], set[int]]:
    """``(need, plan)`` of the iteration at ``p``: the experts the verification of positions
    ``p .. p+depth`` needs (the target's routing) and those the draft's ``depth`` steps
    (positions ``p .. p+depth-1``) name."""
    T = target.shape[0]
    need = {e for t in range(p, min(T, p + depth + 1)) for e in target[t].tolist()}
    plan = {e for t in range(p, min(T, p + depth)) for e in draft[t].tolist()}
    return need, plan


def pinned_loads(
    prefill: torch.Tensor,
    target: torch.Tensor,
    draft: torch.Tensor,
    iterations: list[tuple[int, int]],
    depth: int,
    slots: int,
    pinned: set[int],
) -> int:
    """Loads of one layer under today's engine (see the module docstring)."""
    free = slots - len(pinned)
    lru = collections.OrderedDict((e, None) for e in prefill_state_lru(prefill, pinned, free))
    loads = 0
    for p, _ in iterations:
        need, plan = window_and_plan(target, draft, p, depth)
        plan -= pinned
        for e in sorted(plan):
            if e in lru:
                lru.move_to_end(e)
                continue
            if len(lru) >= free:
                victim = next((r for r in lru if r not in plan), None)
                if victim is None:
                    continue  # nothing to evict: streamed at the verification if needed
                del lru[victim]
            if free:
                lru[e] = None
                loads += 1
        for e in need - pinned:
            if e in lru:
                lru.move_to_end(e)
            else:
                loads += 1  # streamed
    return loads


def moving_loads(
    prefill: torch.Tensor,
    target: torch.Tensor,
    draft: torch.Tensor,
    iterations: list[tuple[int, int]],
    depth: int,
    slots: int,
    prior: torch.Tensor,
    decay: float = 1.0,
) -> int:
    """Loads of one layer with every slot movable (see the module docstring)."""
    score = decayed_counts(prefill, decay, prior)
    resident = set(top(score, slots))
    T, loads = target.shape[0], 0

    def victim(keep: set[int]) -> int | None:
        choices = [r for r in resident if r not in keep]
        return min(choices, key=lambda r: (float(score[r]), r)) if choices else None

    for p, a in iterations:
        need, plan = window_and_plan(target, draft, p, depth)
        for e in sorted(plan, key=lambda e: (-float(score[e]), e)):
            if e in resident:
                continue
            v = victim(plan)
            if v is None:
                continue
            resident.discard(v)
            resident.add(e)
            loads += 1
        for e in sorted(need - resident):
            loads += 1  # streamed
            v = victim(need | plan)
            if v is not None and float(score[e]) > float(score[v]):
                resident.discard(v)  # a fill: kept for no extra transfer
                resident.add(e)
        for t in range(p, min(T, p + a + 1)):  # the committed tokens count
            score *= decay
            score[target[t].long()] += 1.0
    return loads


def main() -> int:
    p = replay_parser(__doc__)
    p.add_argument("--calibration", default="3,4,5,6,7,8,9,10")
    p.add_argument("--prompts", default="0,1,2,11,12,13,14,15,16,17,18,19,20,21,22,23")
    p.add_argument("--depths", type=int, nargs="*", default=[1, 2, 4])
    p.add_argument("--acceptance", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--decay", type=float, default=1.0, help="the moving hot set's count decay a token"
    )
    args = p.parse_args()
    d = torch.load(args.dump)
    prefills, decodes, draft_decodes = split_dump(d)
    E = int(max(int(t.max()) for t in prefills + decodes)) + 1
    L = decodes[0].shape[1]
    cal = layer_counts([decodes[int(i)] for i in args.calibration.split(",")], E)
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for i in (int(x) for x in args.prompts.split(",")):
        pre = layer_counts([prefills[i]], E)
        T = decodes[i].shape[0]
        for depth in args.depths:
            its = schedule(T, depth, args.acceptance, args.seed + i)
            row = collections.Counter()
            for layer in range(L):
                pinned = set(top(cal[layer], args.hot))
                prior = pre[layer].sum() / max(cal[layer].sum(), 1.0) * cal[layer]
                args_ = (prefills[i][:, layer], decodes[i][:, layer], draft_decodes[i][:, layer])
                row["pinned"] += pinned_loads(*args_, its, depth, args.slots, pinned)
                row["moving"] += moving_loads(*args_, its, depth, args.slots, prior, args.decay)
            for name, loads in row.items():
                totals[f"{name} K={depth}"].append(loads / T)
        print(d["prompt_ids"][i], {k: round(v[-1], 1) for k, v in totals.items()}, flush=True)
    print(f"\nloads a committed token (slots {args.slots}, hot {args.hot}, acceptance "
          f"{args.acceptance}), mean over {len(totals[next(iter(totals))])} prompts:")  # fmt: skip
    for k, v in totals.items():
        print(f"  {k:16s} {statistics.fmean(v):6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
