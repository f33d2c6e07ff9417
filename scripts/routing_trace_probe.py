"""Dump the target's (and the INT4 draft's) expert routing of whole HumanEval sequences.

For offline cache-policy studies on the CPU (``scripts/policy_replay.py``): loads a preset
with every expert resident and the INT4 draft, greedy-decodes each of the first
``--num-prompts`` HumanEval prompts for ``--max-new-tokens`` tokens, then records the
target's and the draft's routing of the whole sequence (prompt and continuation) by teacher
forcing (specter-bench's ``teacher_forced_pass``). Greedy decoding is exact, so the target's
routing is the one any budget's run of these prompts sees.

Writes ``--out`` (a ``torch.save`` dict): ``model``, ``prompt_ids``, ``prompt_lens``, and
per prompt ``target`` / ``draft`` ``[T, L, k]`` expert ids, uint8 (int16 past 256 experts);
position ``prompt_len - 1`` onwards is the decode (the input of each decode step).

    source scripts/gpu-env.sh && python3 scripts/routing_trace_probe.py --out "$OUT/routing.pt"
"""

from __future__ import annotations

import argparse
import time

import torch


def _compact(routing: torch.Tensor) -> torch.Tensor:
    """Expert ids in uint8 when they fit (every preset's do), else int16."""
    return routing.to(torch.uint8 if int(routing.max()) < 256 else torch.int16)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--no-draft", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import specter_models
    from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
    from specter_bench.prompt_encoding import ByteTokenizer, encode_prompt
    from specter_bench.prompt_sources import load_humaneval
    from specter_bench.routing_recorder import RoutingRecorder, teacher_forced_pass

    t0 = time.perf_counter()
    lm = specter_models.load(
        args.model,
        device=args.device,
        max_seq_len=4096,
        gpu_memory_gb=None,
        draft=None if args.no_draft else "rtn",
    )
    print(f"loaded in {time.perf_counter() - t0:.1f} s", flush=True)
    vocab = lm.model.config.vocab_size
    tokenizer = ByteTokenizer(vocab_size=vocab)
    recorder = RoutingRecorder(lm.model)
    out: dict[str, object] = {"model": args.model, "prompt_ids": [], "prompt_lens": []}
    targets, drafts = [], []
    try:
        for prompt in load_humaneval(args.num_prompts):
            ids = encode_prompt(prompt.text, tokenizer, vocab_size=vocab)
            runner = EngineSystemRunner(lm, ENGINE_SYSTEMS["lru"], 0)
            tokens = runner.generate(ids, args.max_new_tokens).tokens
            sequence = ids + tokens[:-1]
            target = teacher_forced_pass(recorder, lm.target, sequence, 0, lm.reset)
            targets.append(_compact(target.routing))
            if lm.draft is not None:
                draft = teacher_forced_pass(recorder, lm.draft, sequence, 0, lm.reset)
                drafts.append(_compact(draft.routing))
                del draft
            del target
            out["prompt_ids"].append(prompt.id)  # type: ignore[union-attr]
            out["prompt_lens"].append(len(ids))  # type: ignore[union-attr]
            print(prompt.id, len(ids), len(tokens), f"{time.perf_counter() - t0:.1f} s", flush=True)
    finally:
        recorder.remove()
    out["target"] = targets
    out["draft"] = drafts
    torch.save(out, args.out)
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
