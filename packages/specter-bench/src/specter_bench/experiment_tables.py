"""Tables of the experiments beside TPOT: memory, hot sets, working set against K,
draft/target routing agreement, cache hit rate per policy, depth and hot-count sweeps, the
routed-expert kernels."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from specter_bench.bench_record import budget_label
from specter_bench.table_format import budget_key, markdown_table, with_record_runs

__all__ = [
    "agreement_table",
    "depth_sweep_table",
    "hot_experts_table",
    "hot_sweep_table",
    "kernel_table",
    "memory_table",
    "policy_table",
    "working_set_table",
]


def _experiments(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == kind]


def _by_model_and_budget(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The ``kind`` records sorted by model, then budget (unlimited last)."""
    return sorted(
        _experiments(records, kind), key=lambda r: (r["model"], budget_key(r["budget_gb"]))
    )


def working_set_table(records: Iterable[dict[str, Any]]) -> str:
    """Distinct experts per layer against depth K, per model (mean [p10, p90])."""
    rows, row_records = [], []
    for r in _experiments(records, "working_set"):
        for point in r["data"]["curve"]:
            row_records.append(r)
            rows.append(
                [
                    r["model"],
                    r["data"].get("routing", "target"),
                    point["depth"],
                    point["mean"],
                    point["p10"],
                    point["p90"],
                    point["minimum"],
                    point["maximum"],
                    r["data"].get("prompts"),
                ]
            )
    headers = ["model", "routing", "K", "mean", "p10", "p90", "min", "max", "prompts"]
    return markdown_table(*with_record_runs(headers, rows, row_records))


def agreement_table(records: Iterable[dict[str, Any]]) -> str:
    """Draft/target agreement per model: routing match (mean, worst/best layer, per request),
    greedy agreement and the sampled acceptance of speculative sampling at T = 1 and 0.7."""
    rows = []
    recs = _experiments(records, "routing_agreement")
    for r in recs:
        d = r["data"]
        per_layer = d["per_layer"]
        per_request = d.get("per_request", [])
        rows.append(
            [
                r["model"],
                d["mean"],
                d.get("exact_rate"),
                min(per_layer) if per_layer else None,
                max(per_layer) if per_layer else None,
                min(per_request) if per_request else None,
                max(per_request) if per_request else None,
                len(per_request),
                d.get("greedy_agreement"),
                d.get("sampled_acceptance"),
                d.get("sampled_acceptance_t0.7"),
            ]
        )
    headers = [
        "model",
        "match rate",
        "exact sets",
        "worst layer",
        "best layer",
        "worst request",
        "best request",
        "requests",
        "greedy agreement",
        "sampled acceptance T=1",
        "sampled acceptance T=0.7",
    ]
    return markdown_table(*with_record_runs(headers, rows, recs))


def policy_table(records: Iterable[dict[str, Any]]) -> str:
    """Cache hit rate and expert loads per policy (LRU, LFU, predictive, Belady).

    With a pinned hot set: ``pinned`` (the hot set pinned, LRU over its plan's other slots)
    and Belady at that plan's slots, warm-started as the bound is (records that carry it).

    A step is ``window`` tokens (1: plain decoding; K + 1: one verification). Hit rates count
    what the cache found resident when a step asked for it, so the predictive policy's
    prefetches (the draft's routing of the step, loaded before it) count as hits; Belady's is
    the optimal on-demand schedule. Loads (transfers) compare every policy: none can load
    fewer experts than Belady.
    """
    recs = sorted(
        _experiments(records, "policy_hit_rate"),
        key=lambda r: (r["model"], budget_key(r["budget_gb"]), r["data"].get("window", 1)),
    )
    pinned = any("pinned" in r["data"]["policies"] for r in recs)
    at_pins = any("belady_pinned_slots" in r["data"]["policies"] for r in recs)
    policies = (
        "lru", "lfu", "predictive", "belady", *(("pinned",) if pinned else ()),
        *(("belady_pinned_slots",) if at_pins else ()),
    )  # fmt: skip
    names = {"belady_pinned_slots": "belady at the pinned slots (warm)"}
    rows = []
    for r in recs:
        d = r["data"]
        row = [
            r["model"],
            budget_label(r["budget_gb"]),
            d.get("window", 1),
            d.get("slots_per_layer"),
            *[d["policies"].get(p, {}).get("hit_rate") for p in policies],
            " / ".join(str(d["policies"].get(p, {}).get("loads", "-")) for p in policies),
        ]
        if pinned:
            conf = d.get("pinned")
            row.append(f"{conf['experts_per_layer']} / {conf['slots_per_layer']}" if conf else "-")
        rows.append(row)
    headers = [
        "model",
        "budget",
        "window",
        "slots",
        *[f"{names.get(p, p)} hit rate" for p in policies],
        "loads (" + " / ".join(names.get(p, p) for p in policies) + ")",
        *(["pinned experts / slots"] if pinned else []),
    ]
    return markdown_table(*with_record_runs(headers, rows, recs))


def depth_sweep_table(records: Iterable[dict[str, Any]]) -> str:
    """TPOT and acceptance against depth K, per model and budget (best depth marked)."""
    rows, row_records = [], []
    recs = _by_model_and_budget(records, "depth_sweep")
    for r in recs:
        d = r["data"]
        best = d.get("best_depth")
        for point in d["points"]:
            row_records.append(r)
            rows.append(
                [
                    r["model"],
                    budget_label(r["budget_gb"]),
                    point["depth"],
                    point["tpot_ms"],
                    point.get("acceptance_rate"),
                    point.get("accepted_per_iteration"),
                    "best" if point["depth"] == best else "",
                ]
            )
    headers = ["model", "budget", "K", "TPOT ms", "acceptance", "accepted/iter", ""]
    return markdown_table(*with_record_runs(headers, rows, row_records))


def memory_table(records: Iterable[dict[str, Any]]) -> str:
    """Memory accounting per model and budget: planned parts, slots, expected and measured peak."""
    columns: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("non-expert GB", lambda d: d.get("non_expert_gb")),
        ("INT4 draft GB", lambda d: d.get("draft_gb")),
        ("KV GB", lambda d: d.get("kv_gb")),
        ("buffers GB", lambda d: d.get("buffers_gb")),
        ("slots GB", lambda d: d.get("slots_gb")),
        ("slots/layer", lambda d: d.get("slots_per_layer")),
        ("expected peak GB", lambda d: d.get("expected_peak_gb")),
        ("measured peak GB", lambda d: d.get("measured_peak_gb")),
    ]
    recs = _by_model_and_budget(records, "memory")
    rows = [
        [
            r["model"],
            budget_label(r["budget_gb"]),
            _draft_label(r["data"]),
            *[get(r["data"]) for _, get in columns],
        ]
        for r in recs
    ]
    headers = ["model", "budget", "draft", *[name for name, _ in columns]]
    return markdown_table(*with_record_runs(headers, rows, recs))


def _draft_label(data: dict[str, Any]) -> str:
    """``int4``, ``int4 + h hot`` (a pinned hot set), ``..., p pruned`` (experts the draft
    skips) or ``none`` (a target-only load)."""
    if not data.get("with_draft", True):
        return "none"
    hot = data.get("hot_experts_per_layer") or 0
    pruned = data.get("pruned_experts_per_layer") or 0
    label = f"int4 + {hot} hot" if hot else "int4"
    return f"{label}, {pruned} pruned" if pruned else label


def hot_experts_table(records: Iterable[dict[str, Any]]) -> str:
    """The pinned hot set chosen per model and budget, with the replayed loads behind it:
    the draft's (``specter``) and, without a draft, ``offload``'s."""
    recs = _by_model_and_budget(records, "hot_experts")
    rows = []
    for r in recs:
        d = r["data"]
        counts = sorted(d["loads"].items(), key=lambda item: int(item[0]))
        loads = ", ".join(f"{h}: {n}" for h, n in counts)
        rows.append(
            [
                r["model"],
                budget_label(r["budget_gb"]),
                "int4" if d.get("with_draft", True) else "none (offload)",
                d["per_layer"],
                d.get("pruned_per_layer", 0),
                d["slots_per_layer"],
                d.get("window"),
                ", ".join(d.get("calibration_prompts", [])),
                loads,
            ]
        )
    headers = ["model", "budget", "draft", "pinned/layer", "pruned/layer", "slots/layer",
               "window", "calibration", "replayed loads (pinned: loads)"]  # fmt: skip
    return markdown_table(*with_record_runs(headers, rows, recs))


def hot_sweep_table(records: Iterable[dict[str, Any]]) -> str:
    """specter's TPOT against the pinned hot count, per model and budget (the chosen count
    marked)."""
    rows, row_records = [], []
    recs = _by_model_and_budget(records, "hot_sweep")
    for r in recs:
        d = r["data"]
        for point in d["points"]:
            matches = [m for m in point.get("matches_engine", []) if m is not None]
            row_records.append(r)
            rows.append(
                [
                    r["model"],
                    budget_label(r["budget_gb"]),
                    point["hot_experts_per_layer"],
                    point["slots_per_layer"],
                    point["tpot_ms"],
                    point.get("acceptance_rate"),
                    point.get("hit_rate"),
                    point.get("h2d_mb_per_token"),
                    point.get("replayed_loads"),
                    f"{sum(matches)}/{len(matches)}" if matches else "-",
                    "chosen" if point["hot_experts_per_layer"] == d.get("chosen") else "",
                ]
            )
    headers = ["model", "budget", "pinned/layer", "slots/layer", "TPOT ms", "acceptance",
               "hit rate", "H2D MB/tok", "replayed loads", "= engine", ""]  # fmt: skip
    return markdown_table(*with_record_runs(headers, rows, row_records))


def kernel_table(records: Iterable[dict[str, Any]]) -> str:
    """``kernel-bench`` timings: one row per (model, T, path), with the error checked first."""
    rows = [
        [t["model"], t["tokens"], t["path"], t["median_ms"], f"{t['relative_error']:.1e}"]
        for r in _experiments(records, "kernel")
        for t in r["data"]["timings"]
    ]
    return markdown_table(["model", "T", "path", "median ms", "rel. error"], rows)
