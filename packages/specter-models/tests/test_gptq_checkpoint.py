"""The draft from a GPTQ checkpoint of the same model, written here with an independent
(numpy) packing of the GPTQ format."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file

from specter_kernels import dequantize_int4
from specter_models.architecture import architecture_for, find_moe_layers
from specter_models.loader import load_model

GROUP = 32


def _pack_rows(values: np.ndarray) -> np.ndarray:
    """Pack 4-bit ``values [R, C]`` along rows: word ``r`` holds rows ``8r..8r+7``."""
    rows, cols = values.shape
    words = np.zeros((rows // 8, cols), dtype=np.uint32)
    for j in range(8):
        words |= values[j::8].astype(np.uint32) << np.uint32(4 * j)
    return words.view(np.int32)


def _unpack_rows(words: np.ndarray) -> np.ndarray:
    """Inverse of ``_pack_rows``."""
    words = words.view(np.uint32)
    out = np.zeros((words.shape[0] * 8, words.shape[1]), dtype=np.uint8)
    for j in range(8):
        out[j::8] = (words >> np.uint32(4 * j)) & 0xF
    return out


def _gptq_linear(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray, v1: bool) -> dict:
    """GPTQ tensors of one linear from ints ``q [K, N]``, zero points and scales ``[K/G, N]``."""
    stored = zeros - 1 if v1 else zeros
    return {
        "qweight": _pack_rows(q),
        "qzeros": np.ascontiguousarray(_pack_rows(stored.T.astype(np.uint8)).T),
        "scales": scales.astype(np.float16),
        "g_idx": (np.arange(q.shape[0]) // GROUP).astype(np.int32),
    }


def _dequantized(q: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> torch.Tensor:
    """``[N, K]`` weights ``(q - zero) * scale`` rounded to fp16 (transformers' orientation)."""
    z = np.repeat(zeros, GROUP, axis=0).astype(np.float16)
    s = np.repeat(scales, GROUP, axis=0).astype(np.float16)
    return torch.from_numpy(((q.astype(np.float16) - z) * s).T.copy())


def _write_gptq(
    folder: Path, model_dir: Path, rng: np.random.Generator, *, sym: bool, v1: bool, ints=None
) -> dict:
    """A GPTQ checkpoint of every routed expert of the model in ``model_dir``.

    Returns ``(moe layer, expert, "gate" | "up" | "down") -> dequantized [N, K]``.
    """
    lm = load_model(model_dir, device="cpu", dtype=torch.float32, draft=None)
    arch = architecture_for(lm.config)
    tensors, reference = {}, {}
    for layer in find_moe_layers(lm.model):
        H, I = layer.hidden_size, layer.intermediate_size
        for e in range(layer.num_experts):
            keys = arch.expert_keys(layer.decoder_layer, e)
            for part, (N, K) in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
                if ints is not None:
                    q, scales = ints[(layer.index, e, part)]
                else:
                    q = rng.integers(0, 16, size=(K, N))
                    scales = rng.uniform(0.01, 0.05, size=(K // GROUP, N))
                zeros = (
                    np.full((K // GROUP, N), 8)
                    if sym
                    else rng.integers(1, 16, size=(K // GROUP, N))
                )
                base = keys[part].removesuffix(".weight")
                for name, value in _gptq_linear(q, zeros, scales, v1).items():
                    tensors[f"{base}.{name}"] = value
                reference[(layer.index, e, part)] = _dequantized(q, zeros, scales)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"))
    settings = {"bits": 4, "group_size": GROUP, "sym": sym, "desc_act": False}
    settings["checkpoint_format"] = "gptq" if v1 else "gptq_v2"
    (folder / "quantize_config.json").write_text(json.dumps(settings))
    (folder / "config.json").write_text(json.dumps({"model_type": lm.config.model_type}))
    return reference


def _assert_draft_equals(lm, reference: dict) -> None:
    for module in lm.experts:
        gate_up = dequantize_int4(module.draft_gate_up, torch.float32)
        down = dequantize_int4(module.draft_down, torch.float32)
        cold = [e for e in range(module.num_experts) if e not in module.hot_experts]
        assert gate_up.shape[0] == len(cold)  # INT4 entries of the experts that are not hot
        for i, e in enumerate(cold):
            expected_gate_up = torch.cat(
                [reference[(module.layer, e, "gate")], reference[(module.layer, e, "up")]]
            )
            torch.testing.assert_close(gate_up[i], expected_gate_up.float(), rtol=0, atol=0)
            torch.testing.assert_close(
                down[i], reference[(module.layer, e, "down")].float(), rtol=0, atol=0
            )


@pytest.mark.parametrize(("sym", "v1"), [(True, True), (False, True), (False, False)])
def test_gptq_draft_equals_the_dequantized_reference(tmp_path, checkpoints, arch_name, sym, v1):
    rng = np.random.default_rng(7)
    reference = _write_gptq(tmp_path / "gptq", checkpoints[arch_name], rng, sym=sym, v1=v1)
    lm = load_model(
        checkpoints[arch_name], device="cpu", dtype=torch.float32, draft=tmp_path / "gptq"
    )
    _assert_draft_equals(lm, reference)
    assert all((m.draft_gate_up.zeros is None) == sym for m in lm.experts)
    lm.target.forward(torch.tensor([[1, 2, 3]]), 0)
    assert torch.isfinite(lm.draft.forward(torch.tensor([[4, 5]]), 3)).all()


def test_gptq_draft_with_a_hot_set_keeps_the_other_experts(tmp_path, checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    reference = _write_gptq(tmp_path / "gptq", folder, np.random.default_rng(3), sym=True, v1=True)
    layers = len(find_moe_layers(load_model(folder, device="cpu", draft=None).model))
    lm = load_model(
        folder, device="cpu", dtype=torch.float32, draft=tmp_path / "gptq", slots_per_layer=4,
        hot_experts=[[2, 5]] * layers,
    )  # fmt: skip
    assert all(m.hot_experts == (2, 5) for m in lm.experts)
    _assert_draft_equals(lm, reference)
    assert torch.isfinite(lm.draft.forward(torch.tensor([[4, 5]]), 0)).all()


def test_gptq_of_rtn_ints_reproduces_the_rtn_draft(tmp_path, checkpoints):
    # Pack the RTN draft's own ints and scales as GPTQ (symmetric, v1): same INT4 weights.
    folder = checkpoints["tiny-deepseek-v2"]
    rtn = load_model(folder, device="cpu", dtype=torch.float32, draft_group_size=GROUP)
    ints = {}
    for module in rtn.experts:
        I = module.intermediate_dim
        for e in range(module.num_experts):
            q13 = _unpack_rows(module.draft_gate_up.qweight[e].numpy())
            s13 = module.draft_gate_up.scales[e].numpy()
            ints[(module.layer, e, "gate")] = (q13[:, :I], s13[:, :I])
            ints[(module.layer, e, "up")] = (q13[:, I:], s13[:, I:])
            ints[(module.layer, e, "down")] = (
                _unpack_rows(module.draft_down.qweight[e].numpy()),
                module.draft_down.scales[e].numpy(),
            )
    _write_gptq(tmp_path / "gptq", folder, np.random.default_rng(0), sym=True, v1=True, ints=ints)
    gptq = load_model(folder, device="cpu", dtype=torch.float32, draft=tmp_path / "gptq")
    for a, b in zip(rtn.experts, gptq.experts, strict=True):
        for wa, wb in ((a.draft_gate_up, b.draft_gate_up), (a.draft_down, b.draft_down)):
            assert torch.equal(wa.qweight, wb.qweight)
            assert torch.equal(wa.scales, wb.scales)
            assert wb.zeros is None
            assert wa.group_size == wb.group_size == GROUP
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(
        rtn.draft.forward(ids, 0), gptq.draft.forward(ids, 0), rtol=0, atol=0
    )


def _edit(folder: Path, settings=None, drop=None, config=None) -> None:
    if settings:
        path = folder / "quantize_config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **settings}))
    if config:
        (folder / "config.json").write_text(json.dumps(config))
    if drop:
        from safetensors.numpy import load_file

        tensors = load_file(str(folder / "model.safetensors"))
        del tensors[drop]
        save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"settings": {"group_size": 64}}, "group size 32"),
        ({"settings": {"desc_act": True}}, "act-order"),
        ({"settings": {"bits": 8}}, "bits=8"),
        ({"config": {"model_type": "qwen2_moe"}}, "is a 'qwen2_moe' model"),
        ({"drop": "model.layers.2.mlp.experts.3.up_proj.qzeros"}, "experts.3.up_proj.qzeros"),
    ],
)
def test_mismatched_gptq_checkpoints_are_refused(tmp_path, checkpoints, change, message):
    folder = checkpoints["tiny-deepseek-v2"]
    _write_gptq(tmp_path / "gptq", folder, np.random.default_rng(1), sym=True, v1=True)
    _edit(tmp_path / "gptq", **change)
    with pytest.raises(ValueError, match=message):
        load_model(folder, device="cpu", dtype=torch.float32, draft=tmp_path / "gptq")


def test_draft_folder_must_exist_and_be_gptq(tmp_path, checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    with pytest.raises(FileNotFoundError, match="neither 'rtn' nor a GPTQ checkpoint"):
        load_model(folder, device="cpu", draft=tmp_path / "missing")
    (tmp_path / "plain").mkdir()
    with pytest.raises(ValueError, match="not a GPTQ checkpoint"):
        load_model(folder, device="cpu", draft=tmp_path / "plain")
