"""``specter generate`` with several prompts: decoded together through a batch session.

Up to ``--max-batch`` sequences decode at once, each in its own KV slot; a prompt waiting
for a slot joins as soon as a sequence finishes (continuous batching). Each completion is
printed when its sequence finishes, then the batch's statistics; ``--json`` prints one
object with every completion and statistic instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

__all__ = ["all_prompts", "run_batch"]


def all_prompts(args: argparse.Namespace, first: str) -> list[str]:
    """The prompts of a ``specter generate`` run: ``first`` (the positional prompt,
    ``--prompt-file`` or the default one) unless only ``--prompt`` values are given, then
    every ``--prompt``."""
    extra = list(getattr(args, "prompts", None) or [])
    own = args.prompt is not None or args.prompt_file is not None
    texts = ([first] if own or not extra else []) + extra
    for position, text in enumerate(texts):
        if not text:
            from specter_bench.commands.args import CommandError

            raise CommandError(f"prompt {position + 1} is empty; give some text to complete.")
    return texts


def _rows(stats: dict[str, Any]) -> list[tuple[str, Any]]:
    """The batch's statistics in plain words."""
    from specter_bench.tables import format_value

    def mean(values: list[float] | None) -> str:
        return "-" if not values else format_value(sum(values) / len(values))

    accepted = [a for a in stats["acceptance"] if a is not None]
    rows: list[tuple[str, Any]] = [
        ("sequences", f"{stats['sequences']} (at most {stats['max_batch']} at once)"),
        ("tokens generated", stats["tokens_out"]),
        ("decode steps", stats["steps"]),
        ("tokens/s over the batch", stats["tokens_per_s"]),
        ("mean sequences a step", stats["mean_active_batch"]),
    ]
    if stats["mean_depth"]:
        rows += [
            ("mean draft depth K", stats["mean_depth"]),
            ("draft tokens accepted (per sequence)", " / ".join(f"{a:.2f}" for a in accepted)),
        ]
    rows += [
        ("experts a verification needs per layer", mean(stats["working_set_target_per_layer"])),
        ("experts a draft step needs per layer", mean(stats["working_set_draft_per_layer"])),
        ("expert slots per layer", f"{stats['slots_per_layer']}/{stats['num_experts']}"),
    ]
    if stats["peak_gpu_memory_gb"] is not None:
        rows.append(("peak GPU memory (GB)", stats["peak_gpu_memory_gb"]))
    rows.append(("device", stats["device"]))
    return rows


def _print_rows(rows: list[tuple[str, Any]], out: TextIO) -> None:
    from specter_bench.tables import format_value

    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {format_value(value)}".rstrip(), file=out)


def run_batch(args: argparse.Namespace, engine: Any, texts: list[str], sampling: Any) -> int:
    """Decode ``texts`` together on ``engine`` (``--max-new-tokens`` each, ``sampling`` for
    every one: each decodes what ``specter generate`` decodes for it alone), print them and
    the statistics; exit status 0."""
    out = sys.stdout
    session = engine.batch_session()
    waiting = list(enumerate(texts))
    where: dict[int, int] = {}
    results: list[dict[str, Any]] = [{} for _ in texts]
    while waiting or session.active:
        while waiting and session.active < session.max_batch:
            index, text = waiting.pop(0)
            seq = session.add(text, max_new_tokens=args.max_new_tokens, sampling=sampling)
            where[seq] = index
        for chunk in session.step(with_text=False):
            if not chunk.finished:
                continue
            index = where[chunk.index]
            text = session.text(chunk.index)
            results[index] = {
                "prompt": texts[index],
                "text": text,
                "token_ids": session.token_ids(chunk.index),
                "stop_reason": chunk.finish_reason,
                "statistics": session.stats(chunk.index),
            }
            if not args.json:
                print(f"[{index + 1}/{len(texts)}] {texts[index]}{text}", file=out)
                print("-" * 40, file=out)
                out.flush()
    stats = session.batch_stats()
    stats.update(engine.setup_stats)
    if args.json:
        print(json.dumps({"prompts": texts, "results": results, "statistics": stats}), file=out)
    else:
        _print_rows(_rows(stats), out)
    return 0
