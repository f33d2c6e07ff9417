"""``specter tune``: measure the kernels' tiles on this GPU and write the tuned files.

``specter tune gemv|matmul|int4 --model M`` tries every candidate tile of the invariant
GEMV, the invariant matmul or the W4A16 gemv path at each of the model's shapes: a candidate
whose output is wrong (against the torch reference, or not batch-invariant) is refused
before it is timed; the others are timed with CUDA events inside CUDA graphs. With
``--write-config`` the best tiles go to the tuned file the config modules read on this GPU
model (keeping the file's entries of other shapes). Tune the matmul before the GEMV: the
GEMV is compared with the matmul's tuned tile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specter_bench.commands.args import CommandError

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter tune``."""
    p = subparsers.add_parser(
        "tune",
        help="measure the kernels' tiles on this GPU and write the tuned tile files",
        description="Gate (against the torch reference) and time every candidate tile of a "
        "kernel at a model's shapes on this CUDA GPU; print the best and optionally write "
        "them to the tuned file the kernels read on this GPU model.",
    )
    p.add_argument(
        "kernel",
        choices=("gemv", "matmul", "int4"),
        help="gemv: the batch-invariant GEMV; matmul: the batch-invariant tensor-core "
        "matmul; int4: the W4A16 routed-expert gemv path",
    )
    p.add_argument(
        "--model", default="deepseek-v2-lite", help="preset or checkpoint whose shapes to tune"
    )
    p.add_argument("--device", default="cuda", help="the CUDA device (cuda or cuda:N)")
    p.add_argument(
        "--shapes",
        type=parse_shapes,
        default=None,
        metavar="NxK,...",
        help="only these linear shapes, e.g. 3648x2048,2048x2048 (gemv, matmul; default all)",
    )
    p.add_argument(
        "--write-config",
        nargs="?",
        const="",
        default=None,
        metavar="PATH",
        help="write the best tiles to the tuned file (default: the one specter-kernels "
        "reads on this GPU model); its entries of other shapes are kept",
    )
    p.add_argument("--out", default=None, help="JSON lines file: one line per candidate")
    p.set_defaults(run=run)


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"3648x2048,2048x2048"`` -> ``[(3648, 2048), (2048, 2048)]`` (output by input
    features)."""
    shapes = []
    for item in text.split(","):
        n, _, k = item.strip().lower().partition("x")
        if not (n.isdigit() and k.isdigit() and int(n) > 0 and int(k) > 0):
            raise argparse.ArgumentTypeError(
                f"{item!r} is not a linear shape; expected NxK (output by input features, "
                "e.g. 3648x2048), comma-separated"
            )
        shapes.append((int(n), int(k)))
    return shapes


def _cuda_device(text: str):
    import torch

    if not (text == "cuda" or text.startswith("cuda:")):
        raise CommandError(f"--device must be cuda or cuda:N, got {text!r}")
    if not torch.cuda.is_available():
        raise CommandError(
            "tuning times the kernels on a CUDA GPU and none is available here "
            "(torch.cuda.is_available() is False); run specter tune on the GPU model "
            "whose tiles you want"
        )
    device = torch.device(text)
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise CommandError(
            f"--device {text}: this machine has {torch.cuda.device_count()} CUDA device(s)"
        )
    return device


def run(args: argparse.Namespace) -> int:
    """Tune, print one line per shape as it ends and, with ``--write-config``, add it to the
    tuned file at once (an interrupted tuning keeps the shapes it finished); exit status 0."""
    device = _cuda_device(args.device)
    import torch

    from specter_bench.tuning.model_tuning import tune_model, tuned_path, write_tuned
    from specter_bench.tuning.trials import cuda_graph_timer
    from specter_models.engine.model_source import model_config

    config = model_config(args.model)
    gpu_name = torch.cuda.get_device_name(device)
    torch.cuda.set_device(device)
    path = None
    if args.write_config is not None:
        shipped = args.write_config == ""
        path = tuned_path(args.kernel, gpu_name) if shipped else Path(args.write_config)
    out = open(args.out, "w") if args.out else None  # noqa: SIM115 (closed below)
    shape_name = ""
    written = 0
    print(f"{args.kernel} tiles of {args.model} on {gpu_name}:", flush=True)

    def on_shape(name: str) -> None:
        nonlocal shape_name
        shape_name = name
        print(f"tuning {args.kernel} at {name} ...", file=sys.stderr, flush=True)

    def on_result(result) -> None:
        nonlocal written
        refused = sum(not t.passed for t in result.trials)
        entry = result.entry or "no candidate passed the gate"
        print(f"  {shape_name}: {len(result.trials)} tried, {refused} refused -> {entry}")
        if path is not None and result.entry is not None:
            written += write_tuned(args.kernel, [result], path, gpu_name, args.invocation)[0]
        sys.stdout.flush()

    def progress(trial) -> None:
        if out is not None:
            record = {
                "kernel": args.kernel,
                "shape": shape_name,
                "candidate": repr(trial.candidate),
                "failure": trial.failure,
                "times_us": dict(trial.times_us),
            }
            out.write(json.dumps(record) + "\n")
            out.flush()

    try:
        tune_model(
            args.kernel,
            config,
            device,
            cuda_graph_timer(),
            model=args.model,
            gpu_name=gpu_name,
            only=args.shapes,
            on_shape=on_shape,
            on_result=on_result,
            progress=progress,
        )
    finally:
        if out is not None:
            out.close()
    if path is not None:
        print(f"wrote {written} tuned entries to {path} (its entries of other shapes kept)")
    return 0
