"""transformers baselines: greedy tokens and timing fields."""

import pytest
import torch

from specter_bench.hf_baseline import HFRunner
from specter_models import build_reference_model


@pytest.fixture(scope="module")
def reference():
    return build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float64)


def _greedy_by_hand(model, prompt, steps):
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(ids).logits[0, -1].argmax())
            out.append(token)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out


@pytest.mark.parametrize("system", ["hf", "hf-default"])
def test_generate_is_greedy_and_exactly_n_tokens(reference, system):
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(3, reference.config.vocab_size, (7,), generator=g).tolist()
    run = HFRunner(reference, system).generate(prompt, 10)
    assert run.tokens == _greedy_by_hand(reference, prompt, 10)
    assert run.prefill_s > 0
    assert run.decode_s >= 0
    assert run.tpot_s == pytest.approx(run.decode_s / 9)
    assert run.peak_gpu_bytes is None  # CPU
    assert run.settings["cache_implementation"] == ("static" if system == "hf" else "dynamic")
    assert run.settings["experts_implementation"] == "eager"  # float64 has no grouped kernels
    one = HFRunner(reference, system).generate(prompt, 1)
    assert len(one.tokens) == 1
    assert one.tpot_s is None


def test_bad_arguments(reference):
    with pytest.raises(ValueError, match="unknown transformers system 'vllm'"):
        HFRunner(reference, "vllm")
    runner = HFRunner(reference, "hf-default")
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        runner.generate([], 3)
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        runner.generate([1, 2], 0)


def test_static_cache_has_one_size_for_every_prompt(reference):
    # One compiled decode step serves every prompt: the cache is sized once, not per call.
    runner = HFRunner(reference, "hf", max_cache_len=96)
    short = runner.generate([5, 6, 7], 4)
    long = runner.generate(list(range(3, 40)), 4)
    assert reference._previous_max_cache_length == 96
    assert short.tokens == _greedy_by_hand(reference, [5, 6, 7], 4)
    assert long.tokens == _greedy_by_hand(reference, list(range(3, 40)), 4)


def test_hf_decodes_with_batched_mm_and_prefills_with_grouped_mm(monkeypatch):
    # batched_mm copies the expert weights once per routed pair: fine for one token, 68 GiB
    # for a HumanEval prompt on Phi-3.5-MoE. hf's experts take batched_mm for one-token
    # forwards only, and the tokens stay greedy.
    from transformers.integrations import moe

    from specter_bench.hf_baseline import DECODE_BATCHED_MM

    model = build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float32)
    expected = _greedy_by_hand(model, [4, 9, 2, 7, 11], 4)
    calls = []
    for name in ("batched_mm_experts_forward", "grouped_mm_experts_forward"):
        real = getattr(moe, name)

        def spy(module, hidden, ids, weights, _real=real, _name=name):
            calls.append((_name.split("_mm")[0], hidden.shape[0]))
            return _real(module, hidden, ids, weights)

        monkeypatch.setattr(moe, name, spy)
    runner = HFRunner(model, "hf", compile=False, decode_experts="batched_mm")
    run = runner.generate([4, 9, 2, 7, 11], 4)
    assert run.settings["experts_implementation"] == DECODE_BATCHED_MM
    assert run.tokens == expected
    layers = model.config.num_hidden_layers
    assert calls[:layers] == [("grouped", 5)] * layers  # the prompt
    assert calls[layers:] == [("batched", 1)] * (3 * layers)  # three decode steps


def test_compiled_hf_allows_one_compile_per_decoder_layer(reference, monkeypatch):
    # PhiMoE breaks the graph inside each decoder layer, so dynamo compiles one frame per
    # layer; at the default limit of 8 the rest of Phi-3.5-MoE's 32 layers ran eagerly.
    # (dynamo's config is changed through its own patch(): monkeypatch would delete the
    # attribute on undo, which hides it from every later test.)
    import torch._dynamo.config as dynamo_config

    before = dynamo_config.recompile_limit
    monkeypatch.setattr(reference.config, "num_hidden_layers", 32)
    with dynamo_config.patch(recompile_limit=8):
        runner = HFRunner(reference, "hf")
        assert dynamo_config.recompile_limit >= 32
        assert runner.settings["recompile_limit"] == dynamo_config.recompile_limit
    with dynamo_config.patch(recompile_limit=8):
        HFRunner(reference, "hf", compile=False)  # nothing compiled, nothing raised
        assert dynamo_config.recompile_limit == 8
    assert dynamo_config.recompile_limit == before  # patch() restored it


def test_hf_can_decode_with_grouped_mm(reference):
    model = build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float32)
    runner = HFRunner(model, "hf", compile=False, decode_experts="grouped_mm")
    assert runner.settings["experts_implementation"] == "grouped_mm"
    assert runner.generate([4, 9, 2], 3).tokens == _greedy_by_hand(model, [4, 9, 2], 3)
    with pytest.raises(ValueError, match="decode_experts='bmm' is not one of"):
        HFRunner(reference, "hf", decode_experts="bmm")
    both = HFRunner(model, "hf", compile=False, decode_experts="batched_mm_prompt_too")
    assert both.settings["experts_implementation"] == "batched_mm"  # transformers' own
    assert both.generate([4, 9, 2], 3).tokens == _greedy_by_hand(model, [4, 9, 2], 3)


def test_bench_cli_passes_hf_decode_experts():
    from specter_bench.cli import build_parser
    from specter_bench.commands.bench import bench_config_from_args

    parser = build_parser()
    for argv, expected in (
        (["bench", "--model", "tiny-qwen2-moe"], "auto"),
        (["bench", "--model", "tiny-qwen2-moe", "--hf-decode-experts", "grouped_mm"], "grouped_mm"),
    ):
        config = bench_config_from_args(parser.parse_args(argv), "cpu")
        assert config.hf_decode_experts == expected
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--hf-decode-experts", "eager"])


def test_auto_decode_experts_follow_expert_size(reference, monkeypatch):
    from specter_bench import hf_baseline

    assert hf_baseline.choose_decode_experts(reference) == "batched_mm_prompt_too"  # tiny
    fp32 = build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float32)
    # transformers' own batched_mm, the prompt included (the split was 2.2x slower).
    assert HFRunner(fp32, "hf", compile=False).settings["experts_implementation"] == "batched_mm"
    experts = next(m for m in reference.modules() if hasattr(m, "gate_up_proj"))
    per_expert = (experts.gate_up_proj.numel() + experts.down_proj.numel()) // (
        experts.gate_up_proj.shape[0]
    )
    monkeypatch.setattr(hf_baseline, "BATCHED_MM_MAX_EXPERT_PARAMS", per_expert)
    assert hf_baseline.choose_decode_experts(reference) == "batched_mm_prompt_too"  # at it
    monkeypatch.setattr(hf_baseline, "BATCHED_MM_MAX_EXPERT_PARAMS", per_expert - 1)
    assert hf_baseline.choose_decode_experts(reference) == "grouped_mm"
    runner = HFRunner(fp32, "hf", compile=False)
    assert runner.settings["experts_implementation"] == "grouped_mm"


def test_batched_mm_prompts_are_fed_in_chunks_that_cap_the_expert_copies(monkeypatch):
    # transformers' batched_mm gathers k expert copies per prompt token: a whole 512-token
    # DeepSeek-V2-Lite prompt ran out of memory. The prompt goes in chunks; tokens stay greedy.
    from transformers.integrations import moe

    from specter_bench import hf_baseline

    model = build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float32)
    experts = model.model.layers[0].mlp.experts
    weights = experts.gate_up_proj.numel() + experts.down_proj.numel()
    # float32 bytes of one token's k expert copies
    per_token = model.config.num_experts_per_tok * weights // model.config.num_experts * 4
    monkeypatch.setattr(hf_baseline, "BATCHED_MM_MAX_GATHER_BYTES", 3 * per_token)
    assert hf_baseline.batched_mm_prefill_chunk(model) == 3
    prompt = [4, 9, 2, 7, 11, 3, 8]
    expected = _greedy_by_hand(model, prompt, 3)
    rows = []
    real = moe.batched_mm_experts_forward

    def spy(module, hidden, ids, weights):
        rows.append(hidden.shape[0])
        return real(module, hidden, ids, weights)

    monkeypatch.setitem(moe.ExpertsInterface._global_mapping, "batched_mm", spy)
    runner = HFRunner(model, "hf", compile=False, decode_experts="batched_mm_prompt_too")
    assert runner.settings["prefill_chunk_size"] == 3
    assert runner.generate(prompt, 3).tokens == expected
    layers = model.config.num_hidden_layers
    assert rows == [3] * layers + [3] * layers + [1] * layers + [1] * (2 * layers)
    grouped = HFRunner(model, "hf", compile=False, decode_experts="grouped_mm")
    assert grouped.settings["prefill_chunk_size"] is None  # grouped_mm copies nothing
