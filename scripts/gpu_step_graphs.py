"""Time decode steps of a full-size preset eagerly and as CUDA graphs, side by side.

Loads the model with every expert resident (so the target's steps can be graphed too), then
measures the median wall time (synchronised) of: the draft's one-row step, and the
target's steps of 1 and K+1 rows, each eagerly (``cuda_graphs`` off) and replayed; then
decodes the same prompt plainly and speculatively with graphs and checks the tokens agree.
One JSON line per measurement goes to ``--out``.

    source scripts/gpu-env.sh && python3 scripts/gpu_step_graphs.py --model deepseek-v2-lite \\
        --out $OUT/step-graphs.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import specter_models
from specter_spec import SpecController


def step_ms(adapter, ids: torch.Tensor, start: int, repeats: int) -> float:
    """Median ms of ``adapter.forward(ids, start)`` (the cache is cropped to ``start``)."""
    times = []
    for _ in range(repeats):
        adapter.truncate(start)
        torch.cuda.synchronize()
        t = time.perf_counter()
        adapter.forward(ids, start)
        torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--out", default="step-graphs.jsonl")
    args = p.parse_args()
    t = time.perf_counter()
    lm = specter_models.load(args.model, device="cuda", max_seq_len=1024)
    print(f"built {lm!r} in {time.perf_counter() - t:.1f} s", flush=True)
    records = []

    def emit(**record) -> None:
        record["model"] = args.model
        records.append(record)
        print(json.dumps(record), flush=True)

    prompt = torch.arange(3, 203, device="cuda").unsqueeze(0)
    start = prompt.shape[1]
    for graphs in (False, True):
        lm.cuda_graphs = graphs
        lm.reset()
        lm.target.forward(prompt, 0)
        token = torch.ones(1, 1, dtype=torch.long, device="cuda")
        rows = torch.ones(1, args.depth + 1, dtype=torch.long, device="cuda")
        for role, adapter, ids in (
            ("draft", lm.draft, token),
            ("target", lm.target, token),
            ("target", lm.target, rows),
        ):
            step_ms(adapter, ids, start, 3)  # warm-up: compiled, captured
            ms = step_ms(adapter, ids, start, 20)
            emit(kind="step", role=role, rows=ids.shape[1], cuda_graphs=graphs, ms=ms)
        emit(kind="graph_stats", cuda_graphs=graphs, stats=lm.graph_stats())

    lm.cuda_graphs = True
    ids = prompt[0].tolist()
    outputs = {}
    for depth in (0, args.depth):
        for _ in range(2):  # the first decode captures what the second replays
            lm.reset()
            controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
            t = time.perf_counter()
            result = controller.generate(ids, args.tokens)
            seconds = time.perf_counter() - t
        outputs[depth] = result.tokens
        emit(
            kind="decode",
            depth=depth,
            tokens=len(result.tokens),
            ms_per_token=1e3 * seconds / len(result.tokens),
            acceptance=result.stats.acceptance_rate if depth else None,
            graph_stats=lm.graph_stats(),
        )
    emit(kind="decode_equal", equal=outputs[0] == outputs[args.depth])
    with open(args.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
