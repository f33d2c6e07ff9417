"""``specter write-checkpoint``: a preset's seeded random weights, and a tokenizer of its
vocabulary, written to disk as a Hugging Face checkpoint folder.

    specter write-checkpoint --model deepseek-v2-lite --weights-seed 0 --dtype float16 \\
        --out /dev/shm/deepseek-v2-lite
"""

from __future__ import annotations

import argparse

from specter_bench.commands.args import CommandError, non_negative_float

__all__ = ["register", "run"]

_DTYPES = ("float16", "bfloat16", "float32", "float64")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``write-checkpoint`` to the ``specter`` parser."""
    p = subparsers.add_parser(
        "write-checkpoint",
        help="write a preset's seeded random weights and a tokenizer as a checkpoint folder",
        description="Write a preset's seeded random weights to disk as a Hugging Face "
        "checkpoint folder (config.json, generation_config.json, safetensors shards and their "
        "index, per-expert names as save_pretrained writes them), bit for bit what the engine "
        "builds in memory for the same preset and seed on the same device, streamed tensor by "
        "tensor; then a byte-level BPE tokenizer of exactly the model's vocabulary, trained on "
        "the Python standard library's sources. Specter (--model FOLDER), transformers and "
        "llama.cpp's converter read the folder.",
    )
    p.add_argument("--model", required=True, help="a preset (deepseek-v2-lite, qwen1.5-moe, ...)")
    p.add_argument("--weights-seed", type=int, default=0, help="random-weight seed (default 0)")
    p.add_argument("--dtype", default="float16", choices=_DTYPES, help="default float16")
    p.add_argument(
        "--device",
        default="auto",
        help="where the values are generated: auto (CUDA when available, as the engine "
        "builds them), cpu or cuda; CUDA and CPU generators give different values",
    )
    p.add_argument("--out", required=True, help="a new folder (or an empty one)")
    p.add_argument(
        "--max-shard-gb",
        type=non_negative_float,
        default=5.0,
        help="most tensor GB per safetensors file (default 5, save_pretrained's)",
    )
    p.add_argument("--no-tokenizer", action="store_true", help="write the weights and config only")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Writes the folder; exit status 0."""
    import torch

    from specter_bench.checkpoint_folder import write_checkpoint_folder
    from specter_bench.commands.args import resolve_device
    from specter_models.presets import PRESETS

    if args.model.lower() not in PRESETS:
        raise CommandError(
            f"--model {args.model!r} is not a preset; write-checkpoint writes one of "
            f"{', '.join(sorted(PRESETS))}"
        )
    if args.max_shard_gb <= 0:
        raise CommandError(f"--max-shard-gb must be > 0, got {args.max_shard_gb}")
    device = resolve_device(args.device)
    try:
        write_checkpoint_folder(
            args.model.lower(),
            args.out,
            seed=args.weights_seed,
            dtype=getattr(torch, args.dtype),
            device=device,
            max_shard_bytes=int(args.max_shard_gb * 1e9),
            tokenizer=not args.no_tokenizer,
        )
    except FileExistsError as exc:
        raise CommandError(str(exc)) from None
    print(f"wrote {args.out}")
    return 0
