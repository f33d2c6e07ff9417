"""What ``specter generate`` prints after a completion: the speed, the speculation, the
cache and the memory of its statistics, one row each (``--verbose``: every figure)."""

from __future__ import annotations

from typing import Any, TextIO

__all__ = ["print_summary"]


def _full_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every statistic, for ``--verbose``."""
    rows = [
        ("tokens", summary["new_tokens"]),
        ("TPOT (ms, decode only)", summary["tpot_ms"]),
        ("tokens/s", summary["tokens_per_s"]),
        ("steady TPOT (ms, after the first iteration)", summary.get("steady_tpot_ms")),
        ("prefill (ms)", summary["prefill_ms"]),
        ("first iteration (ms, in TPOT)", summary["first_iteration_ms"]),
        ("acceptance (per proposed token)", summary["acceptance_rate"]),
        ("accepted per iteration", summary["accepted_per_iteration"]),
        ("mean depth K", summary["mean_depth"]),
        ("expert cache hit rate", summary["hit_rate"]),
        (
            "prefetch precision / recall",
            (summary["prefetch_precision"], summary["prefetch_recall"]),
        ),
        ("host-to-device MB per token", summary["h2d_mb_per_token"]),
        ("transfer stall ms per token", summary["stall_ms_per_token"]),
        ("experts without a slot are", _miss_path_words(summary["miss_path"])),
        ("streamed MB per token", summary["streamed_mb_per_token"]),
        (
            "slots filled by streamed experts (most per layer)",
            (summary["streamed_fills"], summary["stream_fills"]),
        ),
        ("staged experts per layer (cap)", summary["stream_staging"]),
        ("expert slots per layer", f"{summary['slots_per_layer']}/{summary['num_experts']}"),
        ("pinned hot experts per layer", summary["hot_experts_per_layer"]),
        *_cpu_rows(summary),
        ("pruned draft experts per layer", summary.get("draft_pruned_per_layer", 0)),
        ("peak GPU memory (GB)", summary["peak_gpu_memory_gb"]),
        ("CUDA graphs captured ahead", summary.get("graphs_captured")),
        ("graph capture s (not in TPOT)", summary.get("graph_capture_s")),
        ("hot-set choice s (not in TPOT)", summary.get("hot_set_choice_s")),
        ("depth warm-up s (not in TPOT)", summary.get("depth_warmup_s")),
        ("depth costs (adaptive depth)", summary.get("depth_costs")),
        ("speculation", summary.get("speculation")),
        ("stopped because", summary.get("stop_reason")),
        ("device", summary["device"]),
    ]
    auto = summary.get("auto_choice")
    if auto:
        rows.insert(
            -1,
            (
                "auto: replayed loads draft / plain",
                f"{auto['draft_loads']} / {auto['plain_loads']} -> {auto['decoded']}",
            ),
        )
    return rows


def _cpu_rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """How the experts a token needed were met, and the host's share, with the CPU path."""
    cpu, split = summary.get("cpu_experts"), summary.get("placement")
    if not cpu or not split:
        return []
    tokens = max(summary["new_tokens"], 1)
    each = " / ".join(
        f"{split[k] / tokens:.1f}" for k in ("resident", "transferred", "streamed", "cpu")
    )
    return [
        ("experts a token: resident / moved / streamed / CPU", each),
        (
            "host CPU time a token",
            f"{cpu['busy_ms_per_token']:.2f} ms on {cpu['threads']} threads "
            f"({cpu['homed_experts']} experts CPU-homed)",
        ),
    ]


def _miss_path_words(path: str) -> str:
    return {"stream": "read from host memory", "load": "copied into a slot"}.get(path, path)


_STOP_WORDS = {
    "max_new_tokens": "--max-new-tokens reached",
    "stop_token": "end-of-text token",
    "cancelled": "cancelled",
    "max_positions": "the KV cache's positions are full",
}


def _rows(summary: dict[str, Any]) -> list[tuple[str, Any]]:
    """The statistics that apply to this run, in plain words: steady decoding first, then
    the one-time costs apart from it."""
    tokens = summary["new_tokens"]
    steady = summary.get("steady_tpot_ms")
    rows: list[tuple[str, Any]] = [("tokens generated", tokens)]
    if steady is not None:
        rows.append(("steady decoding", f"{steady:.1f} ms a token ({1e3 / steady:.1f} tokens/s)"))
    if summary["tpot_ms"] is not None:
        tpot = summary["tpot_ms"]
        rows.append(("whole decode, first step included", f"{tpot:.1f} ms a token"))
    speculation = summary.get("speculation") or ""
    if speculation.startswith("off (depth auto"):
        rows.append(("speculation", speculation))  # the adaptive depth's choice, and why
    speculated = bool(summary["mean_depth"])
    if speculated:
        rows += [
            ("draft tokens accepted", f"{100 * summary['acceptance_rate']:.0f}%"),
            ("tokens per target step", 1 + summary["accepted_per_iteration"]),
            ("mean draft depth K", summary["mean_depth"]),
        ]
    slots, experts = summary["slots_per_layer"], summary["num_experts"]
    if slots < experts:
        rows += [
            ("experts held on the GPU per layer", f"{slots} of {experts}"),
            ("expert cache hit rate", summary["hit_rate"]),
            ("experts without a GPU slot are", _miss_path_words(summary["miss_path"])),
            ("host-to-GPU MB a token", summary["h2d_mb_per_token"]),
        ]
        if summary["miss_path"] == "stream":
            rows.append(("streamed MB a token", summary["streamed_mb_per_token"]))
        if summary["hot_experts_per_layer"]:
            rows.append(("experts pinned per layer", summary["hot_experts_per_layer"]))
        rows += _cpu_rows(summary)
    if summary["peak_gpu_memory_gb"] is not None:
        rows.append(("peak GPU memory (GB)", summary["peak_gpu_memory_gb"]))
    rows.append(("stopped because", _STOP_WORDS.get(summary.get("stop_reason"), "-")))
    rows.append(("device", summary["device"]))
    once = [
        ("prompt processing (prefill)", summary["prefill_ms"], "ms"),
        ("first decode step (first use of the kernels)", summary["first_iteration_ms"], "ms"),
        ("CUDA graph capture", summary.get("graph_capture_s"), "s"),
        ("hot-set choice", summary.get("hot_set_choice_s"), "s"),
        ("depth warm-up", summary.get("depth_warmup_s"), "s"),
    ]
    rows.append(("one-time costs (not in steady decoding):", ""))
    rows += [(f"  {name}", f"{value:.1f} {unit}") for name, value, unit in once if value]
    return rows


def print_summary(summary: dict[str, Any], out: TextIO, *, verbose: bool = False) -> None:
    from specter_bench.tables import format_value

    rows = _full_rows(summary) if verbose else _rows(summary)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        if isinstance(value, tuple):
            value = " / ".join(format_value(v) for v in value)
        print(f"{name:<{width}}  {format_value(value)}".rstrip(), file=out)
