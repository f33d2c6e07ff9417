"""BatchInvariantMode routes each covered call to its invariant function and nothing else."""

import pytest
import torch
import torch.nn.functional as F

import specter_kernels as sk
from specter_kernels.invariant import mode as batch_invariant_mode

ROUTED = [
    "invariant_attention",
    "invariant_bmm",
    "invariant_layer_norm",
    "invariant_linear",
    "invariant_log_softmax",
    "invariant_mean",
    "invariant_rms_norm",
    "invariant_row_sum",
    "invariant_softmax",
]


@pytest.fixture
def calls(monkeypatch):
    """Counts of the invariant functions the mode calls, by name."""
    counts = dict.fromkeys(ROUTED, 0)
    for name in ROUTED:
        original = getattr(batch_invariant_mode, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            counts[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(batch_invariant_mode, name, counted)
    return counts


def _cases():
    x = torch.randn(3, 5, 24).half()
    x2 = x[0]
    w, b = torch.randn(16, 24).half(), torch.randn(16).half()
    a3, b3 = torch.randn(4, 5, 24).half(), torch.randn(4, 24, 7).half()
    n = torch.randn(24).half()
    q, k, v = torch.randn(1, 4, 5, 16).half(), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    k, v = k.half(), v.half()
    mask = torch.ones(5, 8, dtype=torch.bool).tril(diagonal=3)
    sdpa_args = {"attn_mask": mask, "enable_gqa": True}

    # A matmul by a 2-d operand is one bmm over every leading row. (Not invariant_linear:
    # that takes the GEMV where a tile is configured, whose low bits may differ.)
    def rows_by_w():
        return sk.invariant_bmm(x.reshape(1, 15, 24), w.T.unsqueeze(0))[0].view(3, 5, 16)

    # (call under the mode, the invariant function it must equal, the routed function)
    return {
        "F.linear": (lambda: F.linear(x, w, b), lambda: sk.invariant_linear(x, w, b), "linear"),
        "torch.matmul": (lambda: torch.matmul(x, w.T), rows_by_w, "bmm"),
        "@": (lambda: x @ w.T, rows_by_w, "bmm"),
        "Tensor.matmul batched": (lambda: a3.matmul(b3), lambda: sk.invariant_bmm(a3, b3), "bmm"),
        "matmul broadcast": (
            lambda: a3 @ b3[:1],
            lambda: sk.invariant_bmm(a3, b3[:1].expand(4, 24, 7)),
            "bmm",
        ),
        "matmul vector": (lambda: x2 @ n, lambda: sk.invariant_mm(x2, n[:, None])[:, 0], "bmm"),
        "torch.mm": (lambda: torch.mm(x2, w.T), lambda: sk.invariant_mm(x2, w.T), "bmm"),
        "torch.bmm": (lambda: torch.bmm(a3, b3), lambda: sk.invariant_bmm(a3, b3), "bmm"),
        "torch.addmm": (
            lambda: torch.addmm(b, x2, w.T),
            lambda: (b.float() + sk.invariant_mm(x2, w.T, torch.float32)).half(),
            "bmm",
        ),
        "Tensor.mean": (lambda: x.mean(-1), lambda: sk.invariant_mean(x), "mean"),
        "torch.mean keepdim": (
            lambda: torch.mean(x, dim=2, keepdim=True),
            lambda: sk.invariant_mean(x, keepdim=True),
            "mean",
        ),
        "Tensor.sum dtype": (
            lambda: x.sum(-1, dtype=torch.float32),
            lambda: sk.invariant_row_sum(x),
            "row_sum",
        ),
        "torch.sum": (
            lambda: torch.sum(x, (-1,)),
            lambda: sk.invariant_row_sum(x).half(),
            "row_sum",
        ),
        "F.softmax": (lambda: F.softmax(x, dim=-1), lambda: sk.invariant_softmax(x), "softmax"),
        "torch.softmax dtype": (
            lambda: torch.softmax(x, -1, dtype=torch.float32),
            lambda: sk.invariant_softmax(x, dtype=torch.float32),
            "softmax",
        ),
        "Tensor.softmax": (lambda: x.softmax(2), lambda: sk.invariant_softmax(x), "softmax"),
        "F.log_softmax": (
            lambda: F.log_softmax(x, -1),
            lambda: sk.invariant_log_softmax(x),
            "log_softmax",
        ),
        "torch.log_softmax": (
            lambda: torch.log_softmax(x, -1),
            lambda: sk.invariant_log_softmax(x),
            "log_softmax",
        ),
        "Tensor.log_softmax": (
            lambda: x.log_softmax(-1),
            lambda: sk.invariant_log_softmax(x),
            "log_softmax",
        ),
        "F.layer_norm": (
            lambda: F.layer_norm(x, (24,), n, n),
            lambda: sk.invariant_layer_norm(x, (24,), n, n),
            "layer_norm",
        ),
        "F.rms_norm": (
            lambda: F.rms_norm(x, [24], n, 1e-6),
            lambda: sk.invariant_rms_norm(x, (24,), n, 1e-6),
            "rms_norm",
        ),
        "F.sdpa": (
            lambda: F.scaled_dot_product_attention(q, k, v, **sdpa_args),
            lambda: sk.invariant_attention(q, k, v, **sdpa_args),
            "attention",
        ),
    }


CASES = list(_cases())


@pytest.mark.parametrize("case", CASES)
def test_each_covered_call_is_routed_to_its_invariant_function(seed, backend, calls, case):
    under_mode, invariant, routed = _cases()[case]
    with sk.BatchInvariantMode():
        out = under_mode()
    assert calls[f"invariant_{routed}"] >= 1, f"{case} was not routed to invariant_{routed}"
    assert torch.equal(out, invariant())


def test_uncovered_calls_pass_through_unchanged(seed, calls):
    x = torch.randn(4, 6)
    outside = {
        "sum over dim 0": lambda: x.sum(0),
        "full mean": lambda: x.mean(),
        "softmax over dim 0": lambda: torch.softmax(x, 0),
        "exp": lambda: torch.exp(x),
        "int matmul": lambda: torch.randint(0, 5, (3, 4)) @ torch.ones(4, 2, dtype=torch.long),
        "float64 linear": lambda: F.linear(x.double(), torch.ones(3, 6, dtype=torch.float64)),
    }
    for name, call in outside.items():
        torch.manual_seed(0)
        expected = call()
        torch.manual_seed(0)
        with sk.batch_invariant():
            out = call()
        assert torch.equal(out, expected), name
    assert sum(calls.values()) == 0, calls


def test_the_mode_is_scoped_and_refuses_gradients(seed, calls):
    w = torch.randn(3, 6, requires_grad=True)
    with sk.batch_invariant(), pytest.raises(RuntimeError, match="no_grad"):
        F.linear(torch.randn(2, 6), w)
    with sk.batch_invariant(), torch.no_grad():
        F.linear(torch.randn(2, 6), w)
    assert calls["invariant_linear"] == 1
    F.linear(torch.randn(2, 6), w)  # outside the block: torch's own kernel
    assert calls["invariant_linear"] == 1
