"""Replay recorded routing through expert-cache policies, offline on the CPU.

Reads ``scripts/routing_trace_probe.py``'s dump (whole sequences: prompt, then decode) and
counts, per prompt, the expert loads of the decode (window 1, token by token) under each
policy at one slot count per layer, every policy starting from the state the prompt's
prefill leaves:

* ``pinned-calib``: the bench's ``specter`` today: ``--hot`` experts a layer pinned, the
  most routed in the calibration prompts' decodes, LRU over the other slots.
* ``pinned-prompt``: the same count pinned, chosen at the end of the prefill from the
  prompt's own routing counts plus ``--prior`` times the calibration counts (normalised to
  the prompt's token count); LRU over the other slots. Its ``repin`` column counts the
  newly pinned experts the prefill's end state lacks (loads spent before the decode).
* ``lfu``: no pinning; every slot goes to the experts with the highest decayed count
  (prefill and decode routing, decay ``--decay`` a token), an expert missing when needed
  is loaded over the lowest-count resident one not needed by the step.
* ``draft-lookahead``: ``lfu`` (decay 0.98, the calibration prior) whose victim is first
  a resident expert the draft's routing of the next ``h`` tokens does not name, and which
  reads a missing expert without a slot when the draft does not name it within ``h`` and
  it counts below the victim (the draft's routing here is teacher-forced on the target's
  tokens: an upper bound on what proposals that get rejected would predict).
* ``belady``: the fewest loads at the slot count (warm start, as the bench's bound).

    python3 scripts/policy_replay.py routing34.pt --slots 39 --hot 36
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch


def layer_counts(routes: list[torch.Tensor], num_experts: int) -> torch.Tensor:
    """``[L, E]`` how often each expert is routed in ``routes`` (``[T, L, k]`` each)."""
    L = routes[0].shape[1]
    counts = torch.zeros(L, num_experts, dtype=torch.float64)
    for r in routes:
        for layer in range(L):
            counts[layer] += torch.bincount(r[:, layer].reshape(-1).long(), minlength=num_experts)
    return counts


def split_dump(d: dict) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    """``(prefills, decodes, draft decodes)`` of a ``routing_trace_probe`` dump, per prompt:
    the target's routing before position ``prompt_len - 1``, the target's and the draft's
    from it on (each decode step's input), as int64 ``[T, L, k]``."""
    lens = d["prompt_lens"]
    targets = [t.long() for t in d["target"]]
    drafts = [t.long() for t in d["draft"]]
    prefills = [t[: n - 1] for t, n in zip(targets, lens, strict=True)]
    decodes = [t[n - 1 :] for t, n in zip(targets, lens, strict=True)]
    draft_decodes = [t[n - 1 :] for t, n in zip(drafts, lens, strict=True)]
    return prefills, decodes, draft_decodes


def top(counts: torch.Tensor, n: int) -> list[int]:
    """The ``n`` experts with the highest counts (ties: lower id)."""
    order = sorted(range(counts.numel()), key=lambda e: (-float(counts[e]), e))
    return order[:n]


def prefill_state_lru(prefill: torch.Tensor, pinned: set[int], free: int) -> list[int]:
    """LRU order (oldest first) of the ``free`` unpinned slots after the prefill's tokens."""
    last: dict[int, int] = {}
    for t in range(prefill.shape[0]):
        for e in prefill[t].tolist():
            if e not in pinned:
                last[e] = t
    order = sorted(last, key=lambda e: last[e])
    return order[-free:] if free else []


def lru_loads(decode: torch.Tensor, pinned: set[int], lru: list[int], free: int) -> int:
    """Loads of the decode steps ``[T, k]`` with ``pinned`` resident and LRU over ``free``."""
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


def lfu_loads(
    prefill: torch.Tensor, decode: torch.Tensor, slots: int, decay: float, prior: torch.Tensor
) -> int:
    """Loads of the decode under decayed-count LFU (see the module docstring): a missing
    expert is loaded over the lowest-count resident one the step does not need."""
    return horizon_loads(prefill, decode, slots, 0, decay, prior, bypass=False)


def belady_loads(decode: torch.Tensor, slots: int) -> int:
    """Belady's fewest loads of the decode ``[T, k]``, warm-started as the bench's bound
    (``specter_bench.belady.warm_belady_loads``)."""
    from specter_bench.belady import warm_belady_loads

    return warm_belady_loads([[frozenset(step.tolist()) for step in decode]], slots)


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
    T = decode.shape[0]
    for t in range(T):
        need = decode[t].tolist()
        score *= decay
        score[decode[t].long()] += 1.0
        soon: dict[int, int] = {}
        for u in range(t + 1, min(T, t + 1 + horizon)):
            for e in future[u].tolist():
                soon.setdefault(e, u)
        for e in need:
            if e in resident:
                continue
            loads += 1
            victims = [r for r in resident if r not in need]
            keys = {r: (-soon.get(r, T + 1), float(score[r]), r) for r in [*victims, e]}
            victim = min(victims, key=keys.__getitem__)
            if bypass and e not in soon and keys[e] < keys[victim]:
                continue
            resident.discard(victim)
            resident.add(e)
    return loads


def replay_parser(doc: str) -> argparse.ArgumentParser:
    """A replay script's parser: the routing dump, ``--slots`` a layer and ``--hot`` pinned
    (DeepSeek-V2-Lite's 24 GB plan by default)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("dump")
    p.add_argument("--slots", type=int, default=39)
    p.add_argument("--hot", type=int, default=36)
    return p


def main() -> int:
    p = replay_parser(__doc__)
    p.add_argument(
        "--calibration",
        default="3,4,5,6,7,8,9,10",
        help="prompt indices whose decodes count the hot set (default: the 8 after the bench's "
        "3 measured prompts, as its default calibration), or 'loo' (every other prompt)",
    )
    p.add_argument("--prior", type=float, nargs="*", default=[0.0, 0.5, 1.0, 2.0])
    p.add_argument("--decay", type=float, nargs="*", default=[1.0, 0.99, 0.95])
    p.add_argument("--horizons", type=int, nargs="*", default=[1, 2, 4, 8])
    p.add_argument("--prompts", default="all")
    args = p.parse_args()
    d = torch.load(args.dump)
    targets, lens = d["target"], d["prompt_lens"]
    E = int(max(int(t.max()) for t in targets)) + 1
    L = targets[0].shape[1]
    prefills, decodes, draft_decodes = split_dump(d)
    calib = None if args.calibration == "loo" else [int(i) for i in args.calibration.split(",")]
    measured = (
        [i for i in range(len(targets)) if calib is None or i not in calib]
        if args.prompts == "all"
        else [int(i) for i in args.prompts.split(",")]
    )
    S, H = args.slots, args.hot
    totals: dict[str, list[float]] = collections.defaultdict(list)
    for i in measured:
        others = [j for j in range(len(targets)) if j != i] if calib is None else calib
        cal = layer_counts([decodes[j] for j in others], E)
        pre = layer_counts([prefills[i]], E)
        tokens = decodes[i].shape[0]
        row: dict[str, float] = collections.Counter()
        for layer in range(L):
            dec = decodes[i][:, layer]
            pf = prefills[i][:, layer]
            pinned = set(top(cal[layer], H))
            lru = prefill_state_lru(pf, pinned, S - H)
            row["pinned-calib"] += lru_loads(dec, pinned, lru, S - H)
            norm = pre[layer].sum() / max(cal[layer].sum(), 1.0)
            for a in args.prior:
                chosen = set(top(pre[layer] + a * norm * cal[layer], H))
                after = pinned | set(lru)  # what the prefill leaves resident
                row[f"pinned-prompt a={a}"] += lru_loads(
                    dec, chosen, prefill_state_lru(pf, chosen, S - H), S - H
                )
                row[f"repin a={a}"] += len(chosen - after)
            for decay in args.decay:
                for a in (0.0, 1.0):
                    row[f"lfu decay={decay} a={a}"] += lfu_loads(
                        pf, dec, S, decay, a * norm * cal[layer]
                    )
            for h in args.horizons:
                row[f"draft-lookahead h={h}"] += horizon_loads(
                    pf, dec, S, h, 0.98, norm * cal[layer], True, draft_decodes[i][:, layer]
                )
            row["belady"] += belady_loads(dec, S)
        for k, v in row.items():
            totals[k].append(v / tokens)
        print(
            f"{d['prompt_ids'][i]:>14} len {lens[i]:4d}",
            " ".join(f"{k.split()[0][:8]}:{v / tokens:5.1f}" for k, v in row.items()),
            flush=True,
        )
    print(f"\nloads a token, mean over {len(measured)} prompts (slots {S}, hot {H}):")
    for k, v in totals.items():
        print(f"  {k:28s} {statistics.fmean(v):6.2f}  (median {statistics.median(v):6.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
