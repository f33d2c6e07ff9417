"""How fragile are random-weight models to fp16 rounding? CPU experiments on narrow proxies.

The GPU check (scripts/gpu_check_models.py) found, on the full-size random-weight presets,
that Phi-3.5-MoE's fp16 logits decorrelate completely between Specter and transformers, and
that greedy speculative and plain decoding of the same engine part ways after a few dozen
tokens on DeepSeek-V2-Lite. This script reproduces both on the CPU with narrow proxies:
each preset with its hidden and expert widths divided by ``--div`` and ``initializer_range``
multiplied by ``sqrt(div)``, so that every linear keeps the full model's gain
(``std * sqrt(fan_in)``), and the full depth and expert counts kept. It measures:

* ``precision``: transformers' own logits in float32 and float16 against float64, and the
  engine's (1 slot per layer) in float32 and float16 against the same float64 reference;
* ``spec_vs_plain``: greedy speculative (depth 4) against plain decoding of the same engine,
  in float64 and float16; at the first mismatch, the plain run's top-2 logit margin and how
  much the same row's logits change when it is computed inside a 5-row verification batch.

    .venv/bin/python scripts/bench_models_precision.py \
        --out benchmarks/results/models-precision-cpu.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import time

import torch

import specter_models
from specter_models import presets
from specter_spec import SpecController

PROXY = "precision-proxy"


def proxy_config(name: str, div: int):
    """The preset ``name`` with widths / ``div`` and the same per-linear gain."""
    c = presets.get_preset(name).make_config()
    c.initializer_range *= math.sqrt(div)
    c.hidden_size //= div
    c.num_attention_heads //= div
    c.vocab_size = 4096
    if c.model_type == "phimoe":
        c.num_key_value_heads = max(1, c.num_key_value_heads // div)
        c.intermediate_size //= div
    else:
        c.num_key_value_heads = c.num_attention_heads
        c.moe_intermediate_size //= div
        c.intermediate_size //= div
        if c.model_type == "deepseek_v2":
            c.kv_lora_rank //= div
        else:
            c.shared_expert_intermediate_size //= div
    return c


def register(name: str, div: int) -> None:
    presets.PRESETS[PROXY] = presets.Preset(
        PROXY, f"{name} / {div}", lambda: proxy_config(name, div)
    )


def row_errors(got: torch.Tensor, ref: torch.Tensor) -> dict:
    err = (got.double() - ref).abs().amax(dim=-1)
    return {
        "max_abs_err": err.max().item(),
        "first_rows_abs_err": [round(e, 6) for e in err[:4].tolist()],
        "argmax_agreement": (got.argmax(-1) == ref.argmax(-1)).double().mean().item(),
    }


def precision(name: str, div: int, rows: int) -> dict:
    register(name, div)
    ids = torch.randint(0, 4096, (1, rows), generator=torch.Generator().manual_seed(0))
    logits = {}
    for dtype in (torch.float64, torch.float32, torch.float16):
        ref = specter_models.build_reference_model(
            PROXY, device="cpu", dtype=dtype, experts_implementation="eager"
        )
        with torch.no_grad():
            logits[dtype] = ref(ids).logits[0].double()
        del ref
    truth = logits[torch.float64]
    out = {"logit_scale": truth.abs().max().item()}
    for dtype in (torch.float32, torch.float16):
        out[f"transformers_{dtype}"] = row_errors(logits[dtype], truth)
        lm = specter_models.load(
            PROXY, device="cpu", dtype=dtype, slots_per_layer=1, max_seq_len=64
        )
        out[f"engine_{dtype}"] = row_errors(lm.target.forward(ids, 0)[0], truth)
    return out


def spec_vs_plain(name: str, div: int, tokens: int) -> dict:
    register(name, div)
    prompt = torch.randint(0, 4096, (16,), generator=torch.Generator().manual_seed(1234)).tolist()
    out = {}
    for dtype in (torch.float64, torch.float16):
        lm = specter_models.load(
            PROXY, device="cpu", dtype=dtype, slots_per_layer=8, max_seq_len=128
        )
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4).generate(
            prompt, tokens
        )
        lm.reset()
        plain = SpecController(None, lm.target, depth=0).generate(prompt, tokens)
        first = next(
            (i for i, (a, b) in enumerate(zip(spec.tokens, plain.tokens, strict=True)) if a != b),
            None,
        )
        record = {
            "equal": spec.tokens == plain.tokens,
            "first_mismatch": first,
            "acceptance": spec.stats.acceptance_rate,
        }
        if first is not None:
            # The mismatching row, as plain decoding computed it (one row) and inside a
            # verification batch of 5 rows (what speculation computed).
            lm.reset()
            seq = torch.tensor([prompt + plain.tokens[:first]])
            lm.target.forward(seq[:, :-1], 0)
            alone = lm.target.forward(seq[:, -1:], seq.shape[1] - 1)[0, -1].double()
            lm.reset()
            lm.target.forward(seq[:, :-1], 0)
            batch = torch.cat([seq[:, -1:], torch.tensor([spec.tokens[first : first + 4]])], dim=1)
            batched = lm.target.forward(batch, seq.shape[1] - 1)[0, 0].double()
            top2 = alone.topk(2).values
            record.update(
                plain_top2_margin=(top2[0] - top2[1]).item(),
                row_alone_vs_in_batch_max_abs_diff=(alone - batched).abs().max().item(),
                argmax_alone=alone.argmax().item(),
                argmax_in_batch=batched.argmax().item(),
            )
        out[str(dtype).removeprefix("torch.")] = record
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON-lines file to append to")
    p.add_argument("--rows", type=int, default=24)
    p.add_argument("--tokens", type=int, default=40)
    args = p.parse_args()
    torch.set_num_threads(2)
    runs = [
        ("precision", "phi-3.5-moe", 8),
        ("precision", "deepseek-v2-lite", 4),
        ("precision", "qwen1.5-moe", 4),
        ("spec_vs_plain", "deepseek-v2-lite", 4),
    ]
    for kind, name, div in runs:
        started = time.perf_counter()
        result = (
            precision(name, div, args.rows)
            if kind == "precision"
            else spec_vs_plain(name, div, args.tokens)
        )
        record = {
            "experiment": kind,
            "model": name,
            "proxy_width_divisor": div,
            "weights": "random seed=0 (gain-matched narrow proxy)",
            "device": "cpu",
            "torch": torch.__version__,
            "seconds": time.perf_counter() - started,
            **result,
        }
        print(json.dumps(record), flush=True)
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")


if __name__ == "__main__":
    main()
