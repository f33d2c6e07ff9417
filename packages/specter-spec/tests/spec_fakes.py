"""Test doubles shared by specter-spec's tests: synthetic models, observers, clocks.

Importable from test modules because pytest puts ``tests/`` on ``sys.path``
(``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch


class VirtualClock:
    """A clock that only moves when a fake model says its work took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class TableLM:
    """A synthetic SpecModel whose KV is the list of tokens it was fed.

    The logits predicting position ``pos + 1`` are ``table[token_at_pos, pos % period]``,
    so the next-token distribution depends on the context (last token and
    position) but can be enumerated exactly. It records every call and checks
    the protocol itself: ``start_pos`` must equal ``kv_length``.

    Args:
        table: ``[V, period, V]`` logits.
        cost: seconds one forward takes on ``clock``: ``cost(T, start_pos)``.
        clock: a :class:`VirtualClock` advanced by ``cost``.
    """

    def __init__(
        self,
        table: torch.Tensor,
        cost: Callable[[int, int], float] | None = None,
        clock: VirtualClock | None = None,
    ) -> None:
        self.table = table
        self.kv: list[int] = []
        self.calls: list[tuple[int, list[int]]] = []
        self.cost = cost
        self.clock = clock

    @property
    def vocab_size(self) -> int:
        return self.table.shape[-1]

    @property
    def kv_length(self) -> int:
        return len(self.kv)

    def logits_at(self, token: int, position: int) -> torch.Tensor:
        return self.table[token, position % self.table.shape[1]]

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        if start_pos != len(self.kv):
            raise AssertionError(f"forward at start_pos={start_pos} but kv holds {len(self.kv)}")
        tokens = input_ids[0].tolist()
        rows = [self.logits_at(tok, start_pos + i) for i, tok in enumerate(tokens)]
        self.kv.extend(tokens)
        self.calls.append((start_pos, tokens))
        if self.clock is not None and self.cost is not None:
            self.clock.advance(self.cost(len(tokens), start_pos))
        return torch.stack(rows).unsqueeze(0)

    def truncate(self, length: int) -> None:
        if length < 0:
            raise ValueError(length)
        del self.kv[length:]

    def next_probs(self, context: list[int]) -> torch.Tensor:
        """``[V]`` softmax of the logits after ``context`` (unfiltered)."""
        return torch.softmax(self.logits_at(context[-1], len(context) - 1), dim=-1)


class ShiftedDraft(TableLM):
    """A draft equal to ``target`` except at chosen positions, where its argmax is wrong.

    ``wrong(index)`` says whether the prediction of the token at absolute index
    ``index`` is rolled by one along the vocabulary (so its argmax differs from
    the target's).
    """

    def __init__(self, target: TableLM, wrong: Callable[[int], bool], **kwargs) -> None:
        super().__init__(target.table, **kwargs)
        self.wrong = wrong

    def logits_at(self, token: int, position: int) -> torch.Tensor:
        row = super().logits_at(token, position)
        return torch.roll(row, 1) if self.wrong(position + 1) else row


class SharedKVDraft:
    """A draft that reads the target's committed KV and keeps only a scratch of its own.

    Mimics specter-models' adapter: ``kv_length`` is the target's length while
    there is no scratch, else the scratch's end; ``truncate(length)`` drops the
    scratch once the target's KV covers ``length`` (it never shortens the
    target's KV). Proposals are the target's argmax
    except at ``wrong`` indices.
    """

    def __init__(self, target: TableLM, wrong: Callable[[int], bool]) -> None:
        self.target = target
        self.wrong = wrong
        self.scratch_start = 0
        self.scratch: list[int] = []
        self.truncations: list[int] = []

    @property
    def kv_length(self) -> int:
        if self.scratch:
            return self.scratch_start + len(self.scratch)
        return self.target.kv_length

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        if start_pos != self.kv_length:
            raise AssertionError(f"forward at start_pos={start_pos}, kv_length={self.kv_length}")
        tokens = input_ids[0].tolist()
        if not self.scratch:
            self.scratch_start = start_pos
        self.scratch.extend(tokens)
        rows = []
        for i, tok in enumerate(tokens):
            row = self.target.logits_at(tok, start_pos + i)
            rows.append(torch.roll(row, 1) if self.wrong(start_pos + i + 1) else row)
        return torch.stack(rows).unsqueeze(0)

    def truncate(self, length: int) -> None:
        # Positions the target's committed KV already covers need no scratch.
        self.truncations.append(length)
        if length <= self.target.kv_length:
            self.scratch = []
        else:
            del self.scratch[length - self.scratch_start :]


class RecordingObserver:
    """Records every speculation phase call as a tuple."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def on_draft_start(self, depth: int) -> None:
        self.events.append(("draft_start", depth))

    def on_draft_token(self, index: int) -> None:
        self.events.append(("draft_token", index))

    def on_verify_start(self, num_tokens: int) -> None:
        self.events.append(("verify_start", num_tokens))

    def on_verify_end(self, num_accepted: int) -> None:
        self.events.append(("verify_end", num_accepted))


class RolledLogits:
    """Wraps a SpecModel and rolls its logits by one: its argmax is never the inner one's."""

    def __init__(self, inner) -> None:
        self.inner = inner

    @property
    def kv_length(self) -> int:
        return self.inner.kv_length

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        return torch.roll(self.inner.forward(input_ids, start_pos), 1, dims=-1)

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)


def random_table(vocab: int, period: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    """``[V, period, V]`` float64 logits from a seeded generator."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, period, vocab, generator=gen, dtype=torch.float64) * scale


def tiny_causal_lm(seed: int, arch: str = "llama", vocab: int = 64):
    """A float64 two-layer transformers causal LM with hidden size 32 and seeded weights."""
    import transformers

    common = {
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "eos_token_id": None,
        "bos_token_id": None,
        "pad_token_id": None,
    }
    if arch == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(config).to(torch.float64).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    return model


def fake_quantized(model, bits: int = 4):
    """A copy of ``model`` with every weight rounded to a symmetric per-tensor ``bits``-bit grid."""
    draft = copy.deepcopy(model)
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for param in draft.parameters():
            scale = param.abs().max().clamp(min=1e-12) / levels
            param.copy_(torch.round(param / scale) * scale)
    return draft


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Target-only greedy tokens from transformers' own ``generate``."""
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )
    return out[0, len(prompt) :].tolist()


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square p-value of ``counts`` against ``probs`` (same shape, any rank).

    Cells of probability zero must be empty (a hit there fails at once); every
    other cell must expect at least 5 hits, the usual validity condition.
    """
    from scipy.stats import chisquare

    counts = counts.reshape(-1).to(torch.float64)
    probs = probs.reshape(-1).to(torch.float64)
    impossible = probs <= 0
    assert counts[impossible].sum() == 0, "a token of probability zero was sampled"
    total = counts.sum()
    expected = probs[~impossible] / probs[~impossible].sum() * total
    assert expected.min() >= 5, f"too few samples: smallest expected count {expected.min():.2f}"
    return float(chisquare(counts[~impossible].numpy(), expected.numpy()).pvalue)


def biased_rejection_sampler(accept_argmax: bool = False, correct_from_p: bool = False):
    """A rejection sampler with one deliberate mistake, otherwise the real rule.

    Args:
        accept_argmax: also accept any proposal that is the target's argmax.
        correct_from_p: draw the correction token from ``p`` instead of the residual.
    """
    from specter_spec.acceptance import (
        AcceptanceResult,
        acceptance_probability,
        residual_distribution,
    )

    def sampler(drafts, q, p, generator=None):
        depth = drafts.shape[-1]
        accept = acceptance_probability(p[..., :depth, :], q, drafts)
        if accept_argmax:
            accept = torch.where(drafts == p[..., :depth, :].argmax(-1), 1.0, accept)
        uniform = torch.rand(accept.shape, generator=generator, dtype=accept.dtype)
        num_accepted = torch.cumprod((uniform < accept).long(), -1).sum(-1)
        padded_q = torch.cat([q, torch.zeros_like(p[..., :1, :])], -2)
        row = num_accepted[..., None, None].expand(*num_accepted.shape, 1, p.shape[-1])
        p_row, q_row = p.gather(-2, row).squeeze(-2), padded_q.gather(-2, row).squeeze(-2)
        dist = p_row if correct_from_p else residual_distribution(p_row, q_row)
        flat = dist.reshape(-1, dist.shape[-1])
        token = torch.multinomial(flat, 1, generator=generator).reshape(num_accepted.shape)
        return AcceptanceResult(num_accepted, token)

    return sampler
