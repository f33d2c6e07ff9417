"""``specter train``: train the built-in demo model or a topology proxy, offline, from a seed.

    specter train --smoke --out /tmp/specter-smoke             # CPU check, about a minute
    specter train --out "$OUT/specter-code-tiny"               # the demo model, on a GPU
    specter train --arch dsv2-proxy --tokenizer DIR --max-minutes 1.8 --out /tmp/dsv2-proxy

Flags marked "preset" default to the ``--arch`` preset's value (docs/training.md).
"""

from __future__ import annotations

import argparse
import shlex
import sys

__all__ = ["ARCHS", "config_from_args", "register", "run"]

# The presets of specter_bench.training.architectures (checked by a test; named here so that
# building the parser does not import transformers).
ARCHS = ("dsv2-tiny", "dsv2-proxy", "qwen-proxy", "phi-proxy")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``train`` to the ``specter`` parser."""
    p = subparsers.add_parser(
        "train",
        help="train the demo model or a topology proxy on the Python standard library",
        description="Train a small MoE language model on the running interpreter's standard "
        "library (offline, seeded) into a Hugging Face checkpoint folder with a model card "
        "and a JSON-lines training log. Flags marked 'preset' default to the --arch preset's "
        "value.",
    )
    add = p.add_argument
    add("--out", required=True, help="output folder: the checkpoint and its log")
    add("--arch", default="dsv2-tiny", choices=ARCHS, help="default: dsv2-tiny")
    add("--seed", type=int, default=0, help="initialisation and batch sampling (default: 0)")
    add("--steps", type=int, default=None, help="optimizer steps (default: from --epochs)")
    add("--epochs", type=float, default=None, help="passes over the training tokens (preset)")
    add("--max-minutes", type=float, default=8.0, help="whole-run wall-clock budget (8)")
    add("--batch-size", type=int, default=None, help="sequences per step (preset)")
    add("--seq-len", type=int, default=None, help="tokens per sequence (preset)")
    add("--lr", type=float, default=None, help="peak learning rate (preset)")
    add("--min-lr-ratio", type=float, default=0.1, help="final lr / peak lr (0.1)")
    add("--warmup-steps", type=int, default=None, help="linear warm-up steps (preset)")
    add("--weight-decay", type=float, default=0.1, help="AdamW decay of matrices (0.1)")
    add("--grad-clip", type=float, default=1.0, help="gradient-norm clip (1.0)")
    add("--balance-coef", type=float, default=None, help="load-balance weight, 0 = off (preset)")
    add("--vocab-size", type=int, default=4096, help="BPE vocabulary size (4096)")
    add("--heldout-fraction", type=float, default=None, help="share of files held out (0.02)")
    add("--max-files", type=int, default=None, help="use a hash-chosen subset of the files")
    add("--tokenizer", default=None, help="reuse this tokenizer folder instead of training one")
    add("--evals", type=int, default=16, help="held-out evaluations during training (16)")
    add("--eval-windows", type=int, default=256, help="most held-out windows per eval (256)")
    add("--log-every", type=int, default=10, help="steps between training-log records (10)")
    add("--device", default=None, help="cuda or cpu (default: cuda when available)")
    add(
        "--experts-impl",
        default="auto",
        choices=("auto", "eager", "specter_train_grouped_mm"),
        help="auto (grouped GEMM when it matches eager on a probe batch), eager, or "
        "specter_train_grouped_mm (default: auto)",
    )
    add("--max-new-tokens", type=int, default=64, help="tokens per generation check (64)")
    add("--no-keep-best", action="store_true", help="save the last step, not the best held-out")
    add("--overwrite", action="store_true", help="replace the files of a non-empty --out")
    add("--smoke", action="store_true", help="quick CPU run with self-checks (about a minute)")
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace):
    """The `TrainConfig` the parsed flags ask for."""
    from specter_bench.training import TrainConfig

    return TrainConfig(
        arch=args.arch,
        seed=args.seed,
        steps=args.steps,
        epochs=args.epochs,
        max_minutes=args.max_minutes,
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        learning_rate=args.lr,
        min_lr_ratio=args.min_lr_ratio,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        grad_clip=args.grad_clip,
        balance_coef=args.balance_coef,
        vocab_size=args.vocab_size,
        heldout_fraction=args.heldout_fraction,
        max_files=args.max_files,
        tokenizer_dir=args.tokenizer,
        evals=args.evals,
        eval_windows=args.eval_windows,
        log_every=args.log_every,
        device=args.device,
        experts_impl=args.experts_impl,
        max_new_tokens=args.max_new_tokens,
        keep_best=not args.no_keep_best,
        smoke=args.smoke,
    )


def run(args: argparse.Namespace) -> int:
    """Trains as the flags ask; bad settings raise ValueError before any training."""
    from specter_bench.training import train

    # The subcommand's own arguments, for the logged reproduce command.
    invocation = getattr(args, "invocation", None)
    argv = shlex.split(invocation)[2:] if invocation else sys.argv[2:]
    return train(config_from_args(args), args.out, overwrite=args.overwrite, argv=argv)
