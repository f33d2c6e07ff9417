"""Builders shared by the tests: tiny transformers models and their checkpoints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specter_kernels import dequantize_int4
from specter_models import architecture_for, get_preset
from specter_models.architecture import find_moe_layers
from specter_models.loader import load_model

TINY_ARCHS = ("tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe")


def tiny_transformers_model(
    name: str, seed: int, *, dtype: torch.dtype = torch.float32, **config_changes
) -> PreTrainedModel:
    """transformers' own model of a tiny preset with every tensor random.

    Norm scales and biases are random too (transformers initialises them to one and zero),
    so a loader that drops or swaps them cannot pass the logits tests.
    """
    config = get_preset(name).make_config()
    for key, value in config_changes.items():
        setattr(config, key, value)
    model = _model_class(name)(config).to(dtype).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, param in model.named_parameters():
            if param.dim() == 1:
                # Norm scales near one, biases near zero: random but in their usual range.
                base = 1.0 if pname.endswith("weight") else 0.0
                param.copy_(base + 0.2 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.15 * torch.randn(param.shape, generator=generator))
    return model


def _model_class(name: str) -> type:
    return architecture_for(get_preset(name).make_config()).model_class


def save_tiny_checkpoint(name: str, folder: Path, *, seed: int, **save_kwargs) -> Path:
    """Save a random tiny model with ``save_pretrained`` (fp32 safetensors)."""
    model = tiny_transformers_model(name, seed)
    model.save_pretrained(folder, **save_kwargs)
    return folder


def reference_from_checkpoint(folder: Path, dtype: torch.dtype = torch.float64) -> PreTrainedModel:
    """transformers' own loading of a checkpoint (eager experts: float64 has no grouped_mm)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        folder, dtype=dtype, experts_implementation="eager"
    ).eval()


def random_prompt(length: int, vocab: int, seed: int) -> torch.Tensor:
    """``[1, length]`` random token ids."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, length), generator=generator)


def speculate_beside_transformers(lm, folder: Path, prompt: torch.Tensor, depth: int, tokens: int):
    """Greedy speculation of ``lm`` at ``depth`` and transformers' greedy ``generate`` of the
    checkpoint, ``tokens`` new tokens each, no stop token on either side (min_new_tokens
    would mask EOS instead): ``(SpecController result, transformers' new token ids)``."""
    from specter_spec import SpecController

    reference = reference_from_checkpoint(folder)
    reference.generation_config.eos_token_id = None
    reference.generation_config.pad_token_id = 0
    expected = reference.generate(prompt, max_new_tokens=tokens, do_sample=False)
    controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
    result = controller.generate(prompt[0].tolist(), max_new_tokens=tokens)
    return result, expected[0, prompt.shape[1] :].tolist()


def in_scalar_aten(module: str, function: str, *args: object) -> None:
    """Run ``module.function(*args)`` (a test module of this folder) in a child process with
    scalar ATen kernels.

    torch's vectorised CPU kernels round a tensor's SIMD body and its tail differently (SiLU,
    reductions), which breaks bit-for-bit row comparisons that hold on the GPU; with
    ``ATEN_CPU_CAPABILITY=default`` every element takes the same path.

    Raises:
        AssertionError: the child failed (its output tails in the message).
    """
    env = dict(os.environ, ATEN_CPU_CAPABILITY="default")
    here = Path(__file__).parent
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(here), env.get("PYTHONPATH")]))
    call = f"import {module} as t; t.{function}(*{args!r})"
    done = subprocess.run(
        [sys.executable, "-c", call], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def rows_together(lm, prompt: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Logits ``[T, V]`` of ``rows [1, T]`` verified in one target forward after ``prompt``."""
    lm.reset()
    lm.target.forward(prompt, 0)
    return lm.target.forward(rows, prompt.shape[1])[0]


def rows_alone(lm, start: int, rows: torch.Tensor) -> torch.Tensor:
    """Logits ``[T, V]`` of ``rows [1, T]`` decoded one target forward each from ``start``."""
    lm.target.truncate(start)
    return torch.stack(
        [lm.target.forward(rows[:, i : i + 1], start + i)[0, 0] for i in range(rows.shape[1])]
    )


def record_invariant_gemms(weight_ptrs: set[int]) -> list[torch.Size]:
    """From now on in this process, the weight shape of every invariant linear the models run
    over a weight whose ``data_ptr()`` is in ``weight_ptrs`` (for the subprocess checks)."""
    import specter_models.invariant_scopes as invariant_scopes

    recorded: list[torch.Size] = []
    invariant_linear = invariant_scopes.invariant_linear

    def counted(x, weight, bias=None, **kwargs):
        if weight.data_ptr() in weight_ptrs:
            recorded.append(weight.shape)
        return invariant_linear(x, weight, bias, **kwargs)

    invariant_scopes.invariant_linear = counted
    return recorded


def draft_experts_in_float64(lm, x, ids, weights):
    """``[T, H]`` float64: layer 0's draft experts as they should compute ``x`` routed to
    ``ids`` with ``weights``: hot experts from their FP16 slots, the others' dequantized INT4
    copies, pruned ones skipped (the reference for the fp16 kernels of a hot or pruned
    draft)."""
    module = lm.experts[0]
    skipped = set(module.hot_experts) | set(module.pruned_experts)
    cold = [e for e in range(module.num_experts) if e not in skipped]
    slots = lm.cache.slot_tensors(0)
    expected = torch.zeros(x.shape[0], module.hidden_dim, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e in module.pruned_experts:
                continue
            if e in module.hot_experts:
                slot = lm.cache.slot_of(0, e)
                gate_up, down = slots["gate_up"][slot].double(), slots["down"][slot].double()
            else:
                entry = cold.index(e)
                gate_up = dequantize_int4(module.draft_gate_up.experts(entry))[0].double()
                down = dequantize_int4(module.draft_down.experts(entry))[0].double()
            gate, up = (x[t].double() @ gate_up.T).chunk(2)
            expected[t] += weights[t, j] * (down @ (torch.nn.functional.silu(gate) * up))
    return expected


def moe_layer_count(folder: Path) -> int:
    """MoE layers of the checkpoint in ``folder`` (a draftless CPU load)."""
    return len(
        find_moe_layers(load_model(folder, device="cpu", draft=None, slots_per_layer=8).model)
    )


def reference_with_draft_experts(lm, folder: Path) -> PreTrainedModel:
    """transformers' float64 model of ``folder`` computing what ``lm``'s draft computes: in
    each MoE layer the experts neither pinned nor pruned are their dequantized INT4 copies,
    the pruned ones' down projections are zero (they add nothing), and the pinned hot ones
    stay the checkpoint's own (the draft reads them from their FP16 slots)."""
    reference = reference_from_checkpoint(folder)
    layers = find_moe_layers(lm.model)
    with torch.no_grad():
        for module in lm.experts:
            skipped = set(module.hot_experts) | set(module.pruned_experts)
            cold = [e for e in range(module.num_experts) if e not in skipped]
            experts = reference.model.layers[layers[module.layer].decoder_layer].mlp.experts
            experts.gate_up_proj[cold] = dequantize_int4(module.draft_gate_up, torch.float64)
            experts.down_proj[cold] = dequantize_int4(module.draft_down, torch.float64)
            experts.down_proj[list(module.pruned_experts)] = 0.0
    return reference
