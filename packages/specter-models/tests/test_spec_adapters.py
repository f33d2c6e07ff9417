"""Shared-prefix KV: the draft appends scratch after the target's committed KV (MLA latents
for DeepSeek), scratch is invisible to the target and dropped at commit, and nothing of a
rejected suffix survives."""

from __future__ import annotations

import pytest
import torch

from model_helpers import random_prompt
from specter_models.loader import load_model


def _rows(lm, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of every layer's first ``length`` cached rows (keys, values)."""
    return [
        (layer.keys[:, :, :length].clone(), layer.values[:, :, :length].clone())
        for layer in lm.kv.cache.layers
    ]


def _assert_rows_equal(a, b, **tolerance) -> None:
    for (ka, va), (kb, vb) in zip(a, b, strict=True):
        torch.testing.assert_close(ka, kb, **tolerance)
        torch.testing.assert_close(va, vb, **tolerance)


@pytest.mark.parametrize(
    "accepted", [4, 1, 0], ids=["all-accepted", "partly-rejected", "all-rejected"]
)
def test_kv_contract_over_one_iteration(checkpoints, arch_name, accepted):
    depth = 4
    lm = load_model(checkpoints[arch_name], device="cpu", dtype=torch.float64, slots_per_layer=3)
    target, draft = lm.target, lm.draft
    tokens = random_prompt(6, lm.config.vocab_size, seed=accepted)[0]
    n = tokens.numel()
    target.forward(tokens[None, : n - 1], 0)
    committed = _rows(lm, n - 1)
    assert target.kv_length == draft.kv_length == n - 1

    # Draft K tokens on top of the committed KV.
    proposals, feed, position = [], tokens[None, n - 1 :], n - 1
    for _ in range(depth):
        logits = draft.forward(feed, position)
        position += feed.shape[1]
        feed = logits[:, -1].argmax(-1, keepdim=True)
        proposals.append(feed)
        assert target.kv_length == n - 1, "draft scratch must stay invisible to the target"
        assert draft.kv_length == position
    _assert_rows_equal(_rows(lm, n - 1), committed, rtol=0, atol=0)  # drafting never writes them
    if arch_name == "tiny-deepseek-v2":  # MLA: one head of compressed latents per position
        cfg, layer = lm.config, lm.kv.cache.layers[0]
        assert layer.keys.shape[1::2] == (1, cfg.kv_lora_rank)
        assert layer.values.shape[1::2] == (1, cfg.qk_rope_head_dim)

    # Verify: the scratch is dropped first, then K + 1 rows are appended.
    verify = torch.cat([tokens[None, n - 1 :], *proposals], dim=1)
    target.forward(verify, n - 1)
    assert target.kv_length == lm.kv.cache.length == n + depth

    # Commit `accepted` proposals plus one correction/bonus token.
    new_n = n + accepted + 1
    target.truncate(new_n - 1)
    draft.truncate(new_n - 1)
    assert target.kv_length == draft.kv_length == lm.kv.cache.length == new_n - 1

    # The committed KV equals a fresh target-only prefill of the same tokens...
    history = torch.cat([tokens[None], *proposals[:accepted]], dim=1)[:, : new_n - 1]
    fresh = load_model(lm.source, device="cpu", dtype=torch.float64, slots_per_layer=8)
    fresh.target.forward(history, 0)
    # (DeepSeek's float32 router can round rows computed in other batch shapes apart.)
    _assert_rows_equal(_rows(lm, new_n - 1), _rows(fresh, new_n - 1), rtol=1e-5, atol=1e-7)
    # ...and the next step sees no trace of the rejected rows.
    nxt = torch.tensor([[7]])
    torch.testing.assert_close(
        target.forward(nxt, new_n - 1), fresh.target.forward(nxt, new_n - 1), rtol=1e-5, atol=1e-7
    )


def test_draft_can_rewrite_its_own_scratch(checkpoints):
    lm = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float64)
    lm.target.forward(torch.tensor([[3, 4, 5]]), 0)
    first = lm.draft.forward(torch.tensor([[6, 7]]), 3)
    lm.draft.forward(torch.tensor([[9]]), 5)
    again = lm.draft.forward(torch.tensor([[6, 7]]), 3)  # back to position 3: scratch dropped
    torch.testing.assert_close(first, again, rtol=0, atol=0)
    assert lm.draft.kv_length == 5
    assert lm.target.kv_length == 3


def test_contract_violations_are_refused(checkpoints):
    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, max_seq_len=16
    )
    target, draft = lm.target, lm.draft
    target.forward(torch.tensor([[1, 2, 3, 4]]), 0)
    with pytest.raises(ValueError, match="committed KV holds 4"):
        target.forward(torch.tensor([[5]]), 3)
    with pytest.raises(ValueError, match="never rewrites"):
        draft.forward(torch.tensor([[5]]), 2)
    with pytest.raises(ValueError, match="never rewrites"):
        draft.forward(torch.tensor([[5]]), 6)
    with pytest.raises(ValueError, match="truncate the target first"):
        draft.truncate(2)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        target.forward(torch.ones(1, 13, dtype=torch.long), 4)
    with pytest.raises(ValueError, match=r"\[1, T\]"):
        target.forward(torch.tensor([5]), 4)
    with pytest.raises(TypeError, match="integer"):
        target.forward(torch.tensor([[5.0]]), 4)
    with pytest.raises(ValueError, match="non-negative"):
        target.truncate(-1)
    assert target.kv_length == 4  # refused calls changed nothing
    target.truncate(0)
    draft.truncate(0)
    assert target.kv_length == draft.kv_length == 0


@pytest.mark.parametrize("role", ["target", "draft"])
def test_prefill_writes_forwards_kv_with_the_lm_head_on_the_last_row_only(
    checkpoints, arch_name, role
):
    tokens = random_prompt(9, 64, seed=3)[0]
    runs = []
    for use_prefill in (False, True):
        lm = load_model(
            checkpoints[arch_name], device="cpu", dtype=torch.float64, slots_per_layer=3
        )
        model = getattr(lm, role)
        head_rows: list[int] = []
        hook = lm.model.lm_head.register_forward_hook(
            lambda module, args, out, rows=head_rows: rows.append(args[0].shape[1])
        )
        if use_prefill:
            assert model.prefill(tokens[None, :8], 0) is None
        else:
            model.forward(tokens[None, :8], 0)
        hook.remove()
        assert model.kv_length == 8
        runs.append((head_rows, _rows(lm, 8), model.forward(tokens[None, 8:], 8)))
    (full_rows, full_kv, full_next), (last_rows, kv, next_logits) = runs
    assert full_rows == [8]
    assert last_rows == [1]
    _assert_rows_equal(kv, full_kv, rtol=0, atol=0)
    torch.testing.assert_close(next_logits, full_next, rtol=0, atol=0)


def test_greedy_decoding_takes_the_kernels_argmax(checkpoints, monkeypatch):
    # Both adapters offer specter-spec's optional argmax through specter-kernels'
    # argmax_last_dim; a controller's greedy decoding calls it for every proposal and every
    # verified row, and its tokens are torch.argmax's.
    import specter_models.spec_adapters as adapters
    from specter_spec import SpecController

    calls: list[tuple[int, ...]] = []
    real = adapters.argmax_last_dim
    monkeypatch.setattr(
        adapters, "argmax_last_dim", lambda x: calls.append(tuple(x.shape)) or real(x)
    )
    name = next(iter(checkpoints))
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float64, slots_per_layer=3)
    logits = lm.target.forward(random_prompt(5, 64, seed=4)[0][None, :], 0)
    assert torch.equal(lm.target.argmax(logits), logits.argmax(dim=-1))
    assert torch.equal(lm.draft.argmax(logits[0, -1]), logits[0, -1].argmax())
    calls.clear()
    lm.reset()
    prompt = random_prompt(6, 64, seed=5)[0].tolist()
    result = SpecController(lm.draft, lm.target, depth=2).generate(prompt, 6)
    iterations = result.stats.iterations
    proposals = [s for s in calls if len(s) == 1]  # the draft's: one [V] row a proposal
    verifications = [s for s in calls if len(s) > 1]  # the target's: [1, rows, V]
    assert len(proposals) == sum(it.depth for it in iterations) > 0
    assert len(verifications) == len(iterations)
    lm.reset()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 6)
    assert plain.tokens == result.tokens
