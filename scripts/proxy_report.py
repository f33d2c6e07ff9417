"""Write the trained-proxies section of docs/benchmarks.md from scripts/gpu_proxies.sh's output.

    python scripts/proxy_report.py $OUT/bench-*-proxies-<date>.jsonl \
        $OUT/training-proxies-<date>.jsonl --markdown $OUT/proxies-<date>.md \
        --plot $OUT/working_set_proxies.png --date <date>

Inputs are JSON lines of two kinds, told apart per line: `specter bench` records (a `kind`
field: `working_set`, `routing_agreement`, `policy_hit_rate`, ...) and scripts/train_moe.py
training logs (an `event` field; one run starts at each `config` event, so several logs may
be concatenated). Records of the same model found in `--random` files (default: the
committed random-weight DeepSeek-V2-Lite run) and the figures quoted in shared/BENCHMARK.md
stand beside the proxies' as the random-weight reference, each with its source.

The markdown is written whole to `--markdown` (a section to paste into docs/benchmarks.md,
not a page edit); `--plot` also draws distinct experts per layer against K (needs
matplotlib), linked as `--plot-link` (default `img/<file name>`, relative to docs/).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specter_bench.tables import markdown_table

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RANDOM = ROOT / "benchmarks/results/bench-deepseek-v2-lite-2026-11-29.jsonl"


@dataclass(frozen=True)
class Family:
    """A proxy and the full-size model whose topology it copies."""

    proxy: str
    model: str
    preset: str
    experts: int
    top_k: int


FAMILIES = (
    Family("dsv2-proxy", "DeepSeek-V2-Lite", "deepseek-v2-lite", 64, 6),
    Family("qwen-proxy", "Qwen1.5-MoE-A2.7B", "qwen1.5-moe", 60, 4),
    Family("phi-proxy", "Phi-3.5-MoE", "phi-3.5-moe", 16, 2),
)
FAMILY_BY_PROXY = {f.proxy: f for f in FAMILIES}
FAMILY_BY_PRESET = {f.preset: f for f in FAMILIES}

BENCHMARK_MD = "shared/BENCHMARK.md"
QUOTED_RANDOM = {
    # shared/BENCHMARK.md, "What random weights do to acceptance": full-size models with
    # seeded random weights, INT4 RTN draft vs FP16 target, teacher-forced over 96 tokens.
    "deepseek-v2-lite": {
        "greedy_agreement": 0.875,
        "sampled_acceptance": 0.982,
        "routing_match": 0.970,
        "working_set": {1: 6.0, 4: 17.7, 16: 37.2, 32: 47.2},
    },
    "qwen1.5-moe": {
        "greedy_agreement": 0.990,
        "sampled_acceptance": 0.987,
        "routing_match": 0.966,
        "working_set": {1: 4.0, 4: 4.9, 16: 6.2, 32: 7.7},
    },
    "phi-3.5-moe": {
        "greedy_agreement": 0.000,
        "sampled_acceptance": 0.398,
        "routing_match": 0.304,
        "working_set": {1: 2.0, 4: 6.6, 16: 14.0, 32: 15.6},
    },
}


@dataclass
class TrainingRun:
    """One scripts/train_moe.py run, from its log."""

    arch: str
    source: str
    events: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def first(self, event: str) -> dict[str, Any] | None:
        found = self.events.get(event)
        return found[0] if found else None

    def last(self, event: str) -> dict[str, Any] | None:
        found = self.events.get(event)
        return found[-1] if found else None


@dataclass
class Inputs:
    """Everything read: bench records by source file, and training runs."""

    records: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    training: list[TrainingRun] = field(default_factory=list)


def read_inputs(paths: Iterable[str | Path]) -> Inputs:
    """Reads bench records and training-log events from JSON-lines files.

    Raises:
        FileNotFoundError: a path that does not exist.
        ValueError: a line that is not a JSON object, or one that is neither a bench record
            (`kind`) nor a training-log event (`event`), naming the file and line.
    """
    inputs = Inputs()
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist; pass the JSONL files to read.")
        run: TrainingRun | None = None
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number} is not JSON ({exc}).") from exc
            if not isinstance(item, dict):
                raise ValueError(f"{path}:{number} is not a JSON object.")
            if "kind" in item:
                inputs.records.append((path.name, item))
            elif "event" in item:
                if item["event"] == "config" or run is None:
                    arch = item.get("settings", {}).get("arch", "unknown")
                    run = TrainingRun(arch, path.name)
                    inputs.training.append(run)
                run.events.setdefault(item["event"], []).append(item)
            else:
                raise ValueError(
                    f"{path}:{number} has neither `kind` (a specter bench record) nor `event` "
                    "(a train_moe.py log line)."
                )
    return inputs


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    return markdown_table(headers, rows, digits=3)


def _is_random(record: dict[str, Any]) -> bool:
    weights = str(record.get("identity", {}).get("weights", ""))
    return weights.startswith("random")


def _of_kind(
    records: Iterable[tuple[str, dict[str, Any]]], kind: str
) -> list[tuple[str, dict[str, Any]]]:
    return [(src, r) for src, r in records if r.get("kind") == kind]


def _curve(record: dict[str, Any]) -> dict[int, float]:
    return {int(p["depth"]): float(p["mean"]) for p in record["data"]["curve"]}


def training_table(runs: Sequence[TrainingRun]) -> str:
    """One row per proxy: size, steps, wall time, throughput and held-out loss."""
    rows = []
    for run in runs:
        model = run.first("model") or {}
        summary = run.last("summary") or {}
        schedule = run.first("schedule") or {}
        config = run.first("config") or {}
        evals = run.events.get("eval", [])
        best = min(evals, key=lambda e: e["heldout_loss"]) if evals else None
        trains = run.events.get("train", [])
        speeds = [t["tokens_per_s"] for t in trains[1:] if t.get("tokens_per_s")]
        steps = summary.get("steps", trains[-1]["step"] if trains else None)
        checks = summary.get("checks", {})
        failed = [name for name, ok in checks.items() if not ok]
        rows.append(
            [
                f"`{run.arch}`",
                f"{model['parameters'] / 1e6:.0f} M" if model.get("parameters") else None,
                steps,
                summary.get("schedule_steps", schedule.get("steps")),
                f"{summary['wall_s']:.0f}" if summary.get("wall_s") is not None else None,
                f"{statistics.median(speeds) / 1e3:.0f} k" if speeds else None,
                f"{summary['epochs_seen']:.1f}" if summary.get("epochs_seen") is not None else None,
                (
                    summary.get("initial_heldout_loss")
                    or (evals[0]["heldout_loss"] if evals else None)
                ),
                f"{best['heldout_loss']:.3f} (step {best['step']})" if best else None,
                summary.get("saved_heldout_loss"),
                summary.get("saved_heldout_ppl"),
                ("all passed" if not failed else "failed: " + ", ".join(failed))
                if checks
                else "no summary (cut short)",
                config.get("device_name"),
            ]
        )
    headers = [
        "proxy", "params", "steps", "schedule", "wall s", "tokens/s (median)", "epochs",
        "held-out loss, step 0", "best held-out loss", "saved (fp16) loss", "saved ppl",
        "self-checks", "device",
    ]  # fmt: skip
    return _table(headers, rows)


def agreement_rows(inputs: Inputs, random_inputs: Inputs) -> list[list[Any]]:
    """Acceptance and routing agreement: each proxy, then its random-weight references."""
    rows = []
    trained = {r["model"]: (src, r) for src, r in _of_kind(inputs.records, "routing_agreement")}
    random = {
        r["model"]: (src, r)
        for src, r in _of_kind(random_inputs.records + inputs.records, "routing_agreement")
        if _is_random(r)
    }
    for family in FAMILIES:
        if family.proxy in trained:
            src, r = trained[family.proxy]
            d = r["data"]
            rows.append(_agreement_row(f"`{family.proxy}` (trained)", d, src))
        else:
            rows.append([f"`{family.proxy}` (trained)", *["-"] * 8, "not measured"])
        if family.preset in random:
            src, r = random[family.preset]
            rows.append(_agreement_row(f"{family.model} (random)", r["data"], src))
        quoted = QUOTED_RANDOM[family.preset]
        rows.append(
            [
                f"{family.model} (random)",
                quoted["greedy_agreement"],
                quoted["sampled_acceptance"],
                None,
                quoted["routing_match"],
                None,
                None,
                None,
                None,
                BENCHMARK_MD,
            ]
        )
    return rows


def _agreement_row(label: str, d: dict[str, Any], source: str) -> list[Any]:
    per_layer = d.get("per_layer") or []
    worst = min(range(len(per_layer)), key=per_layer.__getitem__) if per_layer else None
    best = max(range(len(per_layer)), key=per_layer.__getitem__) if per_layer else None
    return [
        label,
        d.get("greedy_agreement"),
        d.get("sampled_acceptance"),
        d.get("sampled_acceptance_t0.7"),
        d.get("mean"),
        d.get("exact_rate"),
        f"{per_layer[worst]:.3f} (#{worst})" if worst is not None else None,
        f"{per_layer[best]:.3f} (#{best})" if best is not None else None,
        d.get("prompts"),
        f"`{source}`",
    ]


def per_layer_lines(inputs: Inputs) -> str:
    """Each proxy's routing match per MoE layer, as one compact line."""
    lines = []
    order = [f.proxy for f in FAMILIES]
    found = _of_kind(inputs.records, "routing_agreement")
    for _, r in sorted(found, key=lambda item: order.index(item[1]["model"])
                       if item[1]["model"] in order else len(order)):  # fmt: skip
        if r["model"] in FAMILY_BY_PROXY:
            values = " ".join(f"{v:.2f}" for v in r["data"].get("per_layer", []))
            lines.append(f"- `{r['model']}`: {values}")
    return "\n".join(lines) + "\n" if lines else "(no routing_agreement records)\n"


def working_set_rows(inputs: Inputs, random_inputs: Inputs) -> tuple[list[int], list[list[Any]]]:
    """Distinct experts per layer at each K: proxies (target, draft), then random references."""
    trained = [
        (src, r) for src, r in _of_kind(inputs.records, "working_set")
        if r["model"] in FAMILY_BY_PROXY
    ]  # fmt: skip
    random = [
        (src, r)
        for src, r in _of_kind(random_inputs.records + inputs.records, "working_set")
        if _is_random(r) and r["model"] in FAMILY_BY_PRESET
    ]
    depths = sorted({d for _, r in trained + random for d in _curve(r)} | {1, 4, 16, 32})
    rows = []
    for family in FAMILIES:
        sources = [
            (f"`{family.proxy}` (trained)", src, r)
            for src, r in trained
            if r["model"] == family.proxy
        ]
        sources += [
            (f"{family.model} (random)", src, r) for src, r in random if r["model"] == family.preset
        ]
        for label, src, r in sources:
            curve = _curve(r)
            rows.append(
                [
                    label,
                    r["data"].get("routing", "target"),
                    *[curve.get(d) for d in depths],
                    f"{family.experts}, top-{family.top_k}",
                    f"`{src}`",
                ]
            )
        quoted = QUOTED_RANDOM[family.preset]["working_set"]
        rows.append(
            [
                f"{family.model} (random)",
                "target",
                *[quoted.get(d) for d in depths],
                f"{family.experts}, top-{family.top_k}",
                BENCHMARK_MD,
            ]
        )
    return depths, rows


def policy_rows(inputs: Inputs) -> list[list[Any]]:
    """Cache hit rate per policy for each proxy, budget and window."""
    rows = []
    order = [f.proxy for f in FAMILIES]
    found = [(s, r) for s, r in _of_kind(inputs.records, "policy_hit_rate") if r["model"] in order]
    found.sort(
        key=lambda item: (
            order.index(item[1]["model"]),
            item[1]["data"].get("window", 0),
            item[1].get("budget_gb") or 0.0,
        )
    )
    for _, r in found:
        d = r["data"]
        policies = d.get("policies", {})
        rows.append(
            [
                f"`{r['model']}`",
                f"{d.get('slots_per_layer')}/{d.get('num_experts')}",
                d.get("window"),
                *[
                    policies.get(p, {}).get("hit_rate")
                    for p in ("lru", "lfu", "predictive", "belady")
                ],
            ]
        )
    return rows


def measurement_facts(inputs: Inputs) -> str:
    """One sentence on what the bench measured (prompts, tokens, device), from the records."""
    agreement = [r for _, r in _of_kind(inputs.records, "routing_agreement")]
    sets = [r for _, r in _of_kind(inputs.records, "working_set")]
    if not agreement and not sets:
        return "No bench records were found: nothing was measured."
    first = (agreement or sets)[0]
    identity = first.get("identity", {})
    tokens = sets[0]["data"].get("tokens_per_prompt") if sets else None
    gpu = identity.get("gpu") or identity.get("device") or "?"
    dtype = {"float16": "FP16", "bfloat16": "BF16", "float32": "FP32"}.get(
        identity.get("dtype"), str(identity.get("dtype"))
    )
    return (
        f"Measured with `specter bench --experiment routing` on {gpu}: "
        f"{first['data'].get('prompts', '?')} {identity.get('prompt_source', '?')} prompts, "
        f"{tokens if tokens is not None else '?'} greedy tokens each "
        f"(`max_new_tokens` {identity.get('max_new_tokens', '?')}), teacher-forced through the "
        f"{dtype} target and its INT4 draft (RTN round-to-nearest, shared non-expert weights) "
        "with every expert resident."
    )


def skipped_lines(inputs: Inputs) -> str:
    lines = [
        f"- `{r['model']}` {r['data'].get('what', '')}: {r['data'].get('reason', '')}"
        for _, r in _of_kind(inputs.records, "skipped")
    ]
    return "\n".join(lines) + "\n" if lines else ""


def plot_working_sets(inputs: Inputs, random_inputs: Inputs, path: Path) -> Path | None:
    """Distinct experts per layer against K, one panel per family (log-2 K axis).

    Returns:
        The PNG path, or None when there is nothing to draw or matplotlib is missing.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print("proxy_report: matplotlib is missing; no plot", file=sys.stderr)
        return None
    depths, rows = working_set_rows(inputs, random_inputs)
    drawn = [f for f in FAMILIES if any(row[0].startswith(f"`{f.proxy}`") for row in rows)]
    if not drawn:
        return None
    fig = Figure(figsize=(5.0 * len(drawn), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    fig.suptitle("Distinct experts per layer over K tokens (mean over windows and layers)")
    for i, family in enumerate(drawn):
        ax = fig.add_subplot(1, len(drawn), i + 1)
        for row in rows:
            if family.model not in row[0] and family.proxy not in row[0]:
                continue
            points = [
                (d, v)
                for d, v in zip(depths, row[2 : 2 + len(depths)], strict=True)
                if v is not None
            ]
            if not points:
                continue
            trained = "trained" in row[0]
            style = "-" if trained else ":"
            marker = "o" if row[1] == "target" else "x"
            source = "" if trained else f", {Path(str(row[-1]).strip('`')).name}"
            label = f"{'trained proxy' if trained else 'random full-size'} {row[1]}{source}"
            ax.plot(*zip(*points, strict=True), style, marker=marker, label=label)
        ax.axhline(family.experts, color="grey", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("K (tokens)")
        ax.set_ylabel("distinct experts per layer")
        ax.set_title(
            f"{family.proxy} / {family.model} ({family.experts} experts, top-{family.top_k})"
        )
        ax.legend(fontsize="x-small")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=100)
    return path


def render(
    inputs: Inputs, random_inputs: Inputs, *, plot_link: str | None = None, title_date: str = ""
) -> str:
    """The markdown section."""
    depths, ws_rows = working_set_rows(inputs, random_inputs)
    policies = policy_rows(inputs)
    parts = [
        f"## Trained topology proxies{f' ({title_date})' if title_date else ''}\n",
        "The three proxies of docs/training.md (the real models' layers, routed and shared "
        "experts and top-k, hidden 256, a 4096-token code vocabulary) trained for a few "
        "minutes each on the Python standard library, beside the same figures for the "
        "full-size models with seeded random weights. Trained weights are the realistic "
        "regime for acceptance and routing; random weights measure the machinery only.\n",
        "### Training\n",
        training_table(inputs.training) if inputs.training else "(no training logs)\n",
        "Held-out loss: mean token cross-entropy (nats) on held-out standard-library files; "
        "the saved weights are those of the lowest held-out loss (keep-best).\n",
        "### INT4 draft acceptance and routing agreement\n",
        measurement_facts(inputs) + " Greedy agreement: the draft's argmax equals the "
        "target's. Sampled acceptance: the expected acceptance probability of speculative "
        "sampling, sum_x min(p_target(x), q_draft(x)) = 1 - total variation, at temperature "
        "1 and 0.7 (float32 softmax), averaged over positions. Routing match: share of the "
        "target's top-k experts the draft also chose (per token and MoE layer); exact sets: "
        "both chose the same experts; layers are numbered among MoE layers from 0.\n",
        _table(
            [
                "model",
                "greedy agreement",
                "sampled acceptance T=1",
                "T=0.7",
                "routing match",
                "exact sets",
                "worst layer",
                "best layer",
                "prompts",
                "source",
            ],
            agreement_rows(inputs, random_inputs),
        ),
        "Routing match per MoE layer (first to last):\n",
        per_layer_lines(inputs),
        "### Distinct experts per layer against depth K\n",
        "Mean over every window of K consecutive generated tokens and every MoE layer: what "
        "one verification of K proposals needs resident (K = 1: top-k).\n",
        _table(["model", "routing", *[f"K={d}" for d in depths], "experts", "source"], ws_rows),
    ]
    if plot_link:
        parts.append(f"![distinct experts per layer against K]({plot_link})\n")
    if policies:
        parts += [
            "### Cache hit rate per policy (trained proxies)\n",
            "The target's routing replayed through specter-cache with a quarter and half of "
            "each layer's experts as slots; window 1: plain decoding, 9: one verification of "
            "K = 8; predictive: the draft's routing of the step prefetched.\n",
            _table(["proxy", "slots", "window", "lru", "lfu", "predictive", "belady"], policies),
        ]
    skipped = skipped_lines(inputs)
    if skipped:
        parts += ["Not measured:\n", skipped]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", help="bench records and training logs (JSONL)")
    parser.add_argument("--markdown", required=True, help="file to write the section to")
    parser.add_argument(
        "--random",
        action="append",
        default=None,
        help=f"bench records of random-weight full-size models (default {DEFAULT_RANDOM.name} "
        "when it exists; repeatable)",
    )
    parser.add_argument("--plot", default=None, help="also write this PNG (working set vs K)")
    parser.add_argument("--plot-link", default=None, help="link to the PNG (default img/<name>)")
    parser.add_argument("--date", default="", help="date shown in the section title")
    args = parser.parse_args(argv)
    random_paths = args.random
    if random_paths is None:
        random_paths = [DEFAULT_RANDOM] if DEFAULT_RANDOM.is_file() else []
    try:
        inputs = read_inputs(args.inputs)
        random_inputs = read_inputs(random_paths)
    except (FileNotFoundError, ValueError) as exc:
        print(f"proxy_report: error: {exc}", file=sys.stderr)
        return 2
    link = None
    if args.plot:
        drawn = plot_working_sets(inputs, random_inputs, Path(args.plot))
        if drawn is not None:
            link = args.plot_link or f"img/{drawn.name}"
            print(f"wrote {drawn}")
    text = render(inputs, random_inputs, plot_link=link, title_date=args.date)
    out = Path(args.markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(
        f"wrote {out} ({len(inputs.records)} bench records, {len(inputs.training)} training runs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
