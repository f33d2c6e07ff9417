"""``specter llama-cpp``: llama.cpp on the same weights as Specter, measured as Specter is.

    specter llama-cpp convert --checkpoint DIR --outtype f16 --out FILE
    specter llama-cpp quantize --gguf FILE --type q8_0 --out FILE
    specter llama-cpp plan --gguf FILE --gpu-memory-gb 24,16
    specter llama-cpp bench --gguf FILE --gpu-memory-gb unlimited,24 --n-cpu-moe auto \\
        --prompt-tokens 128 --new-tokens 128 --repetitions 3 [--draft FILE]
    specter llama-cpp all --model deepseek-v2-lite --gpu-memory-gb unlimited,24,16

The llama.cpp source tree (``--source``, default ``.llama.cpp/src``) provides the converter;
its CUDA build (``--build``, default ``.llama.cpp/build``) provides ``llama-bench``,
``llama-quantize`` and ``llama-speculative-simple``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specter_bench.commands.args import (
    CommandError,
    add_prompt_source_args,
    non_negative_int,
    parse_budget_list,
    positive_int,
)

__all__ = ["register", "run_all", "run_bench", "run_convert", "run_plan", "run_quantize"]


def _n_cpu_moe(text: str) -> int | str:
    if text == "auto":
        return "auto"
    try:
        return non_negative_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"--n-cpu-moe takes auto or a block count >= 0, got {text!r}"
        ) from None


def _budgets(text: str) -> list[float | None]:
    budgets = parse_budget_list(text)
    if budgets == "default" or not budgets:
        raise argparse.ArgumentTypeError(
            "--gpu-memory-gb takes GB or unlimited, comma-separated (24,16,unlimited), got "
            f"{text!r}"
        )
    return list(budgets)


def _tree_args(p: argparse.ArgumentParser) -> None:
    from specter_bench.llama_cpp.invocations import DEFAULT_BUILD, DEFAULT_SOURCE

    p.add_argument(
        "--source", default=DEFAULT_SOURCE, help=f"llama.cpp source tree ({DEFAULT_SOURCE})"
    )
    p.add_argument(
        "--build", default=DEFAULT_BUILD, help=f"its CUDA build folder ({DEFAULT_BUILD})"
    )


def _measure_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpu-memory-gb",
        type=_budgets,
        default=[None],
        help="GPU memory budgets, comma-separated GB or unlimited (default unlimited)",
    )
    p.add_argument(
        "--n-cpu-moe",
        type=_n_cpu_moe,
        default="auto",
        help="blocks whose routed experts stay on the CPU: auto (sized to each budget from "
        "the GGUF's tensor sizes, docs/benchmarking.md) or a count for every budget",
    )
    p.add_argument(
        "--prompt-tokens",
        type=positive_int,
        default=128,
        help="llama-bench -p: the prompt, and the depth the decode starts at (128: HumanEval "
        "prompts are about 120 tokens with a written checkpoint's tokenizer)",
    )
    p.add_argument("--new-tokens", type=positive_int, default=128, help="tokens decoded (128)")
    p.add_argument("--repetitions", type=positive_int, default=3, help="timed runs (3)")
    p.add_argument("--draft-max", type=positive_int, default=4, help="tokens drafted a step (4)")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads")
    p.add_argument("--flash-attn", default="auto", choices=("auto", "on", "off"))
    p.add_argument("--model-label", default=None, help="the records' model (default: preset)")
    p.add_argument("--out", default="benchmarks/results", help="results folder")
    p.add_argument("--tag", default=None, help="file name tag (default llama-cpp-DATE)")
    p.add_argument("--log-dir", default=".llama.cpp/logs", help="each run's whole output")
    add_prompt_source_args(p)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``llama-cpp`` and its actions to the ``specter`` parser."""
    p = subparsers.add_parser(
        "llama-cpp",
        help="convert, quantize and measure llama.cpp on the same weights",
        description="llama.cpp on the same seeded random weights as Specter: convert a "
        "checkpoint folder (specter write-checkpoint) to GGUF with llama.cpp's converter, "
        "quantize it, and measure batch-1 decode with llama-bench (all layers on the GPU, or "
        "routed experts on the CPU with --n-cpu-moe sized to a GPU memory budget) and "
        "speculative decoding with a quantized copy as draft, into Specter's records.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)

    convert = actions.add_parser("convert", help="checkpoint folder -> GGUF (converter)")
    _tree_args(convert)
    convert.add_argument("--checkpoint", required=True, help="a checkpoint folder")
    convert.add_argument("--outtype", default="f16", choices=("f16", "bf16", "q8_0"))
    convert.add_argument("--out", required=True, help="the GGUF file to write")
    convert.set_defaults(run=run_convert)

    quantize = actions.add_parser("quantize", help="F16 GGUF -> another type (llama-quantize)")
    _tree_args(quantize)
    quantize.add_argument("--gguf", required=True, help="the F16 GGUF")
    quantize.add_argument("--type", required=True, help="q8_0, q4_0, q4_k_m, ...")
    quantize.add_argument("--out", required=True, help="the GGUF file to write")
    quantize.add_argument("--threads", type=positive_int, default=None)
    quantize.set_defaults(run=run_quantize)

    plan = actions.add_parser("plan", help="print --n-cpu-moe auto's choice per budget")
    plan.add_argument("--gguf", required=True)
    plan.add_argument("--draft", default=None, help="a draft GGUF held on the GPU beside it")
    plan.add_argument("--gpu-memory-gb", type=_budgets, required=True)
    plan.add_argument("--prompt-tokens", type=positive_int, default=128)
    plan.add_argument("--new-tokens", type=positive_int, default=128)
    plan.set_defaults(run=run_plan)

    bench = actions.add_parser("bench", help="measure a GGUF with llama-bench (and a draft)")
    _tree_args(bench)
    bench.add_argument("--gguf", required=True, help="the target GGUF")
    bench.add_argument("--draft", default=None, help="a draft GGUF: also run speculative")
    bench.add_argument("--speculative-only", action="store_true", help="skip llama-bench")
    _measure_args(bench)
    bench.set_defaults(run=run_bench)

    chain = actions.add_parser(
        "all", help="write the checkpoint, convert, delete it, quantize, measure"
    )
    _tree_args(chain)
    chain.add_argument("--model", required=True, help="a preset (deepseek-v2-lite, qwen1.5-moe)")
    chain.add_argument("--weights-seed", type=int, default=0)
    chain.add_argument("--work", default=".llama.cpp/models", help="folder of the GGUF files")
    chain.add_argument(
        "--checkpoint-dir",
        default=None,
        help="where the checkpoint is written (default WORK/MODEL; /dev/shm/MODEL keeps it in "
        "host memory, off the disk)",
    )
    chain.add_argument("--types", default="f16,q8_0", help="weights measured (default f16,q8_0)")
    chain.add_argument("--draft-type", default=None, help="draft weights (e.g. q4_0, q8_0)")
    chain.add_argument("--keep-checkpoint", action="store_true")
    chain.add_argument(
        "--steps",
        default="checkpoint,convert,quantize,bench",
        help="steps to run (each skipped when its output exists)",
    )
    _measure_args(chain)
    chain.set_defaults(run=run_all)


def _tree(args: argparse.Namespace):
    from specter_bench.llama_cpp.invocations import LlamaCppTree

    return LlamaCppTree(source=Path(args.source), build=Path(args.build))


def _guard(action):
    """Run ``action``, reporting llama.cpp failures and existing outputs as command errors."""
    from specter_bench.llama_cpp.invocations import LlamaCppError

    try:
        return action()
    except (LlamaCppError, FileExistsError) as exc:
        raise CommandError(str(exc)) from None


def run_convert(args: argparse.Namespace) -> int:
    """``convert``: exit status 0 once the GGUF is written."""
    from specter_bench.llama_cpp.files import convert_checkpoint

    out = Path(args.out)
    _guard(
        lambda: convert_checkpoint(
            _tree(args), Path(args.checkpoint), args.outtype, out, log_dir=out.parent / "logs"
        )
    )
    return 0


def run_quantize(args: argparse.Namespace) -> int:
    """``quantize``: exit status 0 once the GGUF is written."""
    from specter_bench.llama_cpp.files import quantize_gguf

    out = Path(args.out)
    _guard(
        lambda: quantize_gguf(
            _tree(args),
            Path(args.gguf),
            args.type.lower(),
            out,
            log_dir=out.parent / "logs",
            threads=args.threads,
        )
    )
    return 0


def run_plan(args: argparse.Namespace) -> int:
    """``plan``: one line per budget."""
    from specter_bench.llama_cpp.cpu_moe import gpu_footprint, plan_cpu_moe
    from specter_bench.llama_cpp.gguf_file import read_gguf
    from specter_bench.llama_cpp.invocations import BenchSettings

    n_ctx = BenchSettings(prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens).n_ctx
    target = gpu_footprint(read_gguf(args.gguf), n_ctx=n_ctx)
    draft = gpu_footprint(read_gguf(args.draft), n_ctx=n_ctx) if args.draft else None
    for budget in args.gpu_memory_gb:
        print(plan_cpu_moe(target, budget, draft=draft).describe())
    return 0


def _measure_config(args: argparse.Namespace, gguf: Path, draft: Path | None):
    from specter_bench.commands.args import prompt_source_config
    from specter_bench.llama_cpp.measure import MeasureConfig

    return MeasureConfig(
        gguf=gguf,
        budgets=tuple(args.gpu_memory_gb),
        n_cpu_moe=args.n_cpu_moe,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        repetitions=args.repetitions,
        draft=draft,
        draft_max=args.draft_max,
        prompts=prompt_source_config(args, default_limit=3),
        max_prompt_tokens=args.max_prompt_tokens,
        threads=args.threads,
        flash_attn=args.flash_attn,
        model_label=args.model_label,
        out_dir=Path(args.out),
        tag=args.tag,
        command=getattr(args, "invocation", ""),
        skip_plain=getattr(args, "speculative_only", False),
        log_dir=Path(args.log_dir),
    )


def run_bench(args: argparse.Namespace) -> int:
    """``bench``: exit status 0 once every budget is measured."""
    from specter_bench.llama_cpp.measure import measure

    if args.speculative_only and not args.draft:
        raise CommandError("--speculative-only needs --draft FILE (the draft GGUF)")
    config = _measure_config(args, Path(args.gguf), Path(args.draft) if args.draft else None)
    _guard(lambda: measure(_tree(args), config))
    return 0


def run_all(args: argparse.Namespace) -> int:
    """``all``: the chain's steps; exit status 0."""
    from specter_bench.llama_cpp.chain import CHAIN_STEPS, ChainConfig, run_chain
    from specter_bench.llama_cpp.invocations import QUANT_TYPES
    from specter_models.presets import FULL_SIZE_PRESETS

    if args.model.lower() not in FULL_SIZE_PRESETS:
        raise CommandError(
            f"--model {args.model!r}: all writes a full-size preset, one of "
            f"{', '.join(FULL_SIZE_PRESETS)} (convert a checkpoint folder with `convert`)"
        )
    types = tuple(t.strip().lower() for t in args.types.split(",") if t.strip())
    bad = [t for t in (*types, args.draft_type or "f16") if t != "f16" and t not in QUANT_TYPES]
    if bad or "f16" not in types:
        raise CommandError(
            f"--types must include f16 and take types of {', '.join(('f16', *QUANT_TYPES))}; "
            f"got --types {args.types!r} --draft-type {args.draft_type!r}"
        )
    steps = tuple(s.strip() for s in args.steps.split(",") if s.strip())
    if not steps or any(s not in CHAIN_STEPS for s in steps):
        raise CommandError(f"--steps takes {', '.join(CHAIN_STEPS)}, got {args.steps!r}")
    config = ChainConfig(
        model=args.model.lower(),
        seed=args.weights_seed,
        work=Path(args.work),
        checkpoint=Path(args.checkpoint_dir) if args.checkpoint_dir else None,
        types=types,
        draft_type=args.draft_type.lower() if args.draft_type else None,
        keep_checkpoint=args.keep_checkpoint,
        steps=steps,
        measure=_measure_config(args, Path(), None),
        threads=args.threads,
    )
    _guard(lambda: run_chain(_tree(args), config))
    return 0
