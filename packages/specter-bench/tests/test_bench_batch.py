"""The batch experiment end to end on tiny models (CPU): transformers' batched generate for
real, the engine systems through a scripted batch engine; records, skips and checks."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specter_bench.bench_runner import BenchRunner
from specter_bench.experiments import BenchConfig, plan_stages
from specter_bench.prompt_sources import PromptSourceConfig

TEXTS = [
    "def add(a, b):\n    return",
    "import os\nfor name in os.listdir('.'):\n",
    "class Stack:\n    def push(self, item):\n",
    "while True:\n    line = input()\n",
    "x = [i * i for i in range(10)]\n",
]


def _prompts(tmp: Path, limit: int) -> PromptSourceConfig:
    path = tmp / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    return PromptSourceConfig("jsonl", str(path), field="text", limit=limit)


def _config(tmp: Path, **changes) -> BenchConfig:
    settings = {
        "model": "tiny-qwen2-moe",
        "experiment": "batch",
        "prompts": _prompts(tmp, 3),
        "max_new_tokens": 5,
        "max_prompt_tokens": 16,
        "device": "cpu",
        "dtype": torch.float64,
        "seed": 1,
        "out_dir": tmp / "results",
        "tag": "batch",
        "warmup": 0,
        "batch_sizes": (1, 2, 3),
        "calibration_prompts": 1,
        **changes,
    }
    return BenchConfig(**settings)


def _run(config: BenchConfig) -> list[dict]:
    runner = BenchRunner(config, progress=False, log=lambda line: None)
    return runner.run().records


def test_the_batch_experiment_plans_specter_offload_then_transformers(tmp_path):
    config = _config(tmp_path)
    stages = plan_stages(config, (0.5, 0.3))
    assert [(s.kind, s.budget_gb, s.systems) for s in stages] == [
        ("batch", 0.5, ("specter",)), ("batch", 0.5, ("offload",)),
        ("batch", 0.3, ("specter",)), ("batch", 0.3, ("offload",)),
        ("hf-batch", None, ("hf",)),
    ]  # fmt: skip
    assert not stages[1].with_draft


def test_transformers_batches_decode_what_each_prompt_decodes_at_b_1(tmp_path):
    records = _run(_config(tmp_path, systems=("hf",)))
    batch = [r["data"] for r in records if r["kind"] == "batch"]
    assert [d["batch_size"] for d in batch] == [1, 2, 3]
    assert all(d["system"] == "hf" for d in batch)
    assert [d["prompt_ids"] for d in batch] == [["0"], ["0", "1"], ["0", "1", "2"]]
    assert all(n == [5] * d["batch_size"] for d in batch for n in [d["new_tokens"]])
    # Each prompt's first decode is its reference: rows decoded again in larger batches
    # (left-padded beside longer prompts) give the same greedy tokens.
    assert [d["sequences_checked"] for d in batch] == [0, 1, 2]
    assert [d["sequences_matching_reference"] for d in batch] == [0, 1, 2]
    assert all(d["throughput_tok_s"] is None or d["throughput_tok_s"] > 0 for d in batch)
    assert all(d["distinct_experts_target"] is None for d in batch)
    assert batch[0]["settings"]["cache_implementation"] == "static"
    assert records[0]["budget_gb"] is None  # every weight on the device


def test_every_system_batches_on_the_real_engine_with_the_greedy_tokens_it_decodes_alone(tmp_path):
    # Speculating and plain batches, at a budget that leaves experts without a slot, must
    # give each prompt the greedy tokens it gives alone (float64: no near-tie flips), and
    # transformers' batches agree with them.
    config = _config(tmp_path, model="tiny-deepseek-v2", depth=2, max_new_tokens=8)
    records = _run(config)
    batch = [r["data"] for r in records if r["kind"] == "batch"]
    assert [(d["system"], d["batch_size"]) for d in batch] == [
        (system, size) for system in ("specter", "offload", "hf") for size in (1, 2, 3)
    ]
    assert all(d["new_tokens"] == [8] * d["batch_size"] for d in batch)
    assert sum(d["sequences_checked"] for d in batch) == 3 * 6 - 3  # all but the first decodes
    assert all(d["sequences_matching_reference"] == d["sequences_checked"] for d in batch)
    engine = [d for d in batch if d["system"] != "hf"]
    assert all(
        d["sequences_matching_engine_reference"] == d["sequences_checked_engine"] for d in engine
    )
    for d in engine:
        assert 1 <= d["distinct_experts_target"] <= 8  # tiny-deepseek-v2: 8 routed experts
        assert d["slots_per_layer"] < 8  # under the budget some expert has no slot
    specter = [d for d in engine if d["system"] == "specter"]
    assert all(d["distinct_experts_draft"] is not None for d in specter)
    assert all(0 <= d["acceptance_rate"] <= 1 for d in specter)
    assert all(d["speculation"].startswith("on") for d in specter)
    assert all(d["distinct_experts_draft"] is None for d in engine if d["system"] == "offload")


class _ScriptedBatch:
    """``Engine.generate_batch``'s result for the scripted engine: each sequence's token i
    is (sum of its prompt + i) % 50, two tokens a step when speculating."""

    def __init__(self, engine, prompts, max_new_tokens):
        self.engine, self.prompts, self.n = engine, prompts, max_new_tokens
        self.results = []
        self.stats = {}

    def __iter__(self):
        per_step = 2 if self.engine.depth else 1
        made = [0] * len(self.prompts)
        while min(made) < self.n:
            for i, prompt in enumerate(self.prompts):
                k = min(per_step, self.n - made[i])
                ids = [(sum(prompt) + made[i] + j) % 50 for j in range(k)]
                made[i] += k
                done = made[i] == self.n
                reason = "max_new_tokens" if done else None
                yield SimpleNamespace(
                    index=i, token_ids=ids, text="", finished=done, finish_reason=reason
                )
        B = len(self.prompts)
        self.results = [SimpleNamespace(stats={"acceptance_rate": 0.5 if per_step > 1 else None})
                        for _ in self.prompts]  # fmt: skip
        self.stats = {
            "steps": -(-self.n // per_step),
            "mean_active_batch": float(B),
            "mean_depth": 2.0 if per_step > 1 else 0.0,
            "working_set": {
                "target": {"mean": 3.0 * B},
                "draft": 2.5 * B if per_step > 1 else None,
            },
            "speculation": f"on (depth 2, batch {B})" if per_step > 1 else None,
        }


class _ScriptedEngine:
    def __init__(self, depth: int, max_batch: int) -> None:
        self.depth = depth
        self.max_batch = max_batch
        self.device = "cpu"
        self.setup_stats = {"speculation": "on (depth 2)" if depth else "off (depth 0)"}
        self.model = SimpleNamespace(
            memory=SimpleNamespace(plan=SimpleNamespace(slots_per_layer=3))
        )
        self.calls = []

    def generate_batch(self, prompts, *, max_new_tokens, stop_token_ids=None):
        assert len(prompts) <= self.max_batch
        assert stop_token_ids == []
        self.calls.append((len(prompts), max_new_tokens))
        return _ScriptedBatch(self, prompts, max_new_tokens)


def test_engine_systems_record_their_batches_and_skip_what_does_not_fit(tmp_path, monkeypatch):
    from specter_models import MemoryBudgetError

    built = []

    def build(self, stage, max_batch):
        if max_batch > 2:
            raise MemoryBudgetError(f"no room for {max_batch} sequences")
        engine = _ScriptedEngine(2 if stage.systems[0] == "specter" else 0, max_batch)
        built.append((stage.systems[0], max_batch, engine))
        return engine

    monkeypatch.setattr(BenchRunner, "_build_batch_engine", build)
    config = _config(tmp_path, systems=("specter", "offload"), budgets=(0.5,), warmup=1, runs=2,
                     warmup_tokens=2)  # fmt: skip
    records = _run(config)
    assert [(s, m) for s, m, _ in built] == [("specter", 2), ("offload", 2)]
    engine = built[0][2]
    assert engine.calls == [(1, 2), (1, 5), (1, 5), (2, 2), (2, 5), (2, 5)]
    skipped = [r["data"]["what"] for r in records if r["kind"] == "skipped"]
    assert skipped == ["specter at B = 3, 0.5 GB", "offload at B = 3, 0.5 GB"]
    batch = [r["data"] for r in records if r["kind"] == "batch"]
    assert [(d["system"], d["batch_size"], d["run_index"]) for d in batch] == [
        ("specter", 1, 0), ("specter", 1, 1), ("specter", 2, 0), ("specter", 2, 1),
        ("offload", 1, 0), ("offload", 1, 1), ("offload", 2, 0), ("offload", 2, 1),
    ]  # fmt: skip
    specter_two = batch[2]
    assert specter_two["distinct_experts_target"] == 6.0
    assert specter_two["distinct_experts_draft"] == 5.0
    assert specter_two["acceptance_rate"] == 0.5
    assert specter_two["speculation"] == "on (depth 2, batch 2)"
    assert specter_two["slots_per_layer"] == 3
    assert specter_two["new_tokens"] == [5, 5]
    offload_one = batch[4]
    assert offload_one["speculation"] == "off (depth 0)"  # the engine's own, at setup
    assert offload_one["distinct_experts_draft"] is None
    # Both systems decode the same tokens: every engine sequence matches the first decode.
    assert all(d["sequences_matching_engine_reference"] == d["sequences_checked_engine"]
               for d in batch)  # fmt: skip
    assert batch[-1]["sequences_checked_engine"] == 2
    assert all(r["budget_gb"] == 0.5 for r in records if r["kind"] == "batch")


def test_no_batch_size_fitting_skips_the_stage_with_why(tmp_path, monkeypatch):
    from specter_models import MemoryBudgetError

    def build(self, stage, max_batch):
        raise MemoryBudgetError(f"no room for {max_batch} sequences")

    monkeypatch.setattr(BenchRunner, "_build_batch_engine", build)
    records = _run(_config(tmp_path, systems=("offload",), budgets=(0.5,)))
    reasons = [r["data"]["reason"] for r in records if r["kind"] == "skipped"]
    assert len(reasons) == 3
    assert "no room for 1 sequences" in reasons[-1]
    assert not [r for r in records if r["kind"] == "batch"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_sizes": (1, 0)}, "batch_sizes must be ints >= 1"),
        ({"systems": ("lru",)}, "the batch experiment measures specter, offload, hf, not lru"),
        ({"cpu_experts": ("auto",)}, "--cpu-experts auto"),
    ],
)
def test_bad_batch_configs_say_what_to_change(tmp_path, changes, message):
    with pytest.raises(ValueError, match=message):
        _config(tmp_path, **changes)


def test_fewer_prompts_than_the_largest_batch_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="gave 3, fewer than the largest batch size 4"):
        BenchRunner(_config(tmp_path, batch_sizes=(1, 4)), progress=False)
