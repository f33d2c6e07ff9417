"""Where a draft proposal's time goes inside the controller, against the graphed step alone.

The ninth session timed DeepSeek-V2-Lite's one-row draft step, replayed as a CUDA graph and
synchronised, at about 2.9 ms; inside ``SpecController`` a proposal takes 4.0-4.6 ms (bench
records: draft time per token times committed per iteration over the depth). This script
loads one preset (every expert resident unless ``--budget-gb``), prefills a HumanEval
prompt and prints, in ms:

* ``synced``: one draft step, synchronised before and after (the ninth session's figure);
* ``back_to_back``: K steps queued without a synchronisation, then one (the GPU-bound cost
  of a proposal when the host keeps ahead);
* ``host``: the host time of one ``draft.forward`` call alone (no synchronisation);
* ``controller``: ``SpecController.generate`` at fixed K, the draft phase per proposal,
  with the model's prefetcher as the observer and without one;
* the same phase split by a host-side wrapper: time inside ``draft.forward``, inside the
  observer's ``on_draft_token`` and ``on_draft_start``, and the rest.

    source scripts/gpu-env.sh && python3 scripts/draft_loop_probe.py --depth 4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch

import specter_models
from specter_spec import SpecController


def _timed(stats: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            stats[name] += time.perf_counter() - t

    return wrapper


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--budget-gb", type=float, default=None)
    p.add_argument("--humaneval", type=int, default=0)
    p.add_argument("--out", default=None, help="append one JSON line here")
    p.add_argument("--device", default="cuda")
    args = p.parse_args()

    from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
    from specter_bench.prompt_sources import load_humaneval

    lm = specter_models.load(
        args.model, device=args.device, max_seq_len=1024, gpu_memory_gb=args.budget_gb
    )
    print(f"built {lm!r}", flush=True)
    if args.device.startswith("cuda"):
        print(f"captured {lm.capture_step_graphs(1024)}", flush=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    vocab = lm.model.config.vocab_size
    prompt = load_humaneval(args.humaneval + 1)[args.humaneval]
    ids = encode_prompt(prompt.text, ByteTokenizer(vocab_size=vocab), vocab_size=vocab)
    record: dict = {"model": args.model, "budget_gb": args.budget_gb, "depth": args.depth}

    # -- the step alone -----------------------------------------------------------------
    lm.reset()
    prompt_ids = torch.tensor([ids], device=args.device)
    lm.target.forward(prompt_ids[:, :-1], 0)
    lm.draft.forward(prompt_ids[:, -1:], len(ids) - 1)  # warm
    start = len(ids)
    token = torch.ones(1, 1, dtype=torch.long, device=args.device)
    synced, hosts, b2b = [], [], []
    for _ in range(20):
        lm.draft.truncate(start)
        sync()
        t = time.perf_counter()
        lm.draft.forward(token, start)
        hosts.append(time.perf_counter() - t)
        sync()
        synced.append(time.perf_counter() - t)
    for _ in range(10):
        lm.draft.truncate(start)
        sync()
        t = time.perf_counter()
        feed = token
        for k in range(args.depth):
            logits = lm.draft.forward(feed, start + k)
            feed = logits[0, -1].argmax().view(1, 1)
        sync()
        b2b.append((time.perf_counter() - t) / args.depth)
    record["synced_ms"] = 1e3 * statistics.median(synced)
    record["host_ms"] = 1e3 * statistics.median(hosts)
    record["back_to_back_ms"] = 1e3 * statistics.median(b2b)
    print(json.dumps(record), flush=True)

    # -- inside the controller ------------------------------------------------------------
    for observer_name in ("prefetcher", "none"):
        observer = lm.prefetcher if observer_name == "prefetcher" else None
        stats: dict = defaultdict(float)
        forward = lm.draft.forward
        lm.draft.forward = _timed(stats, "draft_forward", forward)
        hooks = {}
        if observer is not None:
            for name in ("on_draft_token", "on_draft_start"):
                hooks[name] = getattr(observer, name)
                setattr(observer, name, _timed(stats, name, hooks[name]))
        try:
            for _ in range(2):  # the first one warms what the second measures
                stats.clear()
                lm.reset()
                controller = SpecController(lm.draft, lm.target, cache=observer, depth=args.depth)
                result = controller.generate(ids, args.tokens)
        finally:
            lm.draft.forward = forward
            for name, hook in hooks.items():
                setattr(observer, name, hook)
        s = result.stats
        proposals = max(s.proposed, 1)
        record[f"controller_{observer_name}"] = {
            "tpot_ms": 1e3 * s.tpot_s,
            "draft_ms_per_proposal": 1e3 * s.draft_time_s / proposals,
            "verify_ms_per_iteration": 1e3 * s.verify_time_s / max(s.num_iterations, 1),
            "host_in_draft_forward_ms_per_proposal": 1e3 * stats["draft_forward"] / proposals,
            "host_in_on_draft_token_ms_per_proposal": 1e3 * stats["on_draft_token"] / proposals,
            "host_in_on_draft_start_ms_per_iteration": 1e3
            * stats["on_draft_start"]
            / max(s.num_iterations, 1),
            "acceptance": s.acceptance_rate,
            "iterations": s.num_iterations,
        }
        print(json.dumps(record[f"controller_{observer_name}"]), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
