"""Batch-invariant arithmetic exactly where a target forward needs it.

A row's logits must not depend on how many rows the target verifies together (see
``ExpertsRuntime.batch_invariant``). Only a few kinds of torch calls pick their reduction
order by row count (GEMMs, last-dim reductions, attention; specter-kernels'
``BatchInvariantMode`` lists them). Running the whole forward under that torch-function
mode works, but then every one of the forward's thousands of torch calls pays a Python
dispatch. Instead, :func:`install_batch_invariance` wraps, once at load time:

* every plain ``nn.Linear`` (projections, shared experts, LM head): ``invariant_linear``
  directly, no mode at all;
* the modules whose own code makes such calls, each under ``BatchInvariantMode`` for its
  duration only: attention (score and value products, softmax or SDPA), RMSNorm and
  LayerNorm (last-dim means), and the routers (fp32 linear, softmax; their selection code
  is transformers' own, untouched).

What stays outside is elementwise (activations, residual adds, rotary application) or exact
whatever the row count (rotary frequencies are products with a reduction length of one).
The wrappers check ``ExpertsRuntime.invariant_active``, true only inside a target forward of
a batch-invariant model, so the draft (the same modules) runs torch's own kernels, except
its plain linears when ``ExpertsRuntime.invariant_draft_linears`` asks for the invariant GEMM
there too (a speed choice: at one row its tuned tiles beat cuBLAS on the H200).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specter_kernels import BatchInvariantMode, invariant_linear
from specter_models.experts_runtime import ExpertsRuntime

INVARIANT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""Dtypes the invariant kernels take (float64 models run torch's own arithmetic)."""
SCOPED_CLASS_SUFFIXES = ("Attention", "RMSNorm", "Router")
"""Class-name endings of the modules run under ``BatchInvariantMode`` (with LayerNorm)."""


def needs_scope(module: nn.Module) -> bool:
    """Whether ``module``'s own forward makes row-count-sensitive calls (see the module doc).

    Routers that subclass ``nn.Linear`` (PhiMoE's) are scoped, not treated as linears: their
    forward also selects experts.
    """
    name = type(module).__name__
    return isinstance(module, nn.LayerNorm) or name.endswith(SCOPED_CLASS_SUFFIXES)


def install_batch_invariance(model: nn.Module, runtime: ExpertsRuntime) -> dict[str, int]:
    """Wrap ``model``'s linears and scoped modules (once; see the module docstring).

    Args:
        model: transformers' model whose target forwards must be batch-invariant.
        runtime: the shared runtime whose ``invariant_active`` switches the wrappers on.

    Returns:
        How many modules were wrapped: ``{"linear": n, "scoped": m}``.
    """
    counts = {"linear": 0, "scoped": 0}
    for module in model.modules():
        if getattr(module, "_specter_invariant", False):
            continue
        if type(module) is nn.Linear:
            module.forward = _linear_forward(module, runtime)
            counts["linear"] += 1
        elif needs_scope(module):
            module.forward = _scoped_forward(module.forward, runtime)
            counts["scoped"] += 1
        else:
            continue
        module._specter_invariant = True
    return counts


def runtime_linear(
    runtime: ExpertsRuntime,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x @ weight^T (+ bias)`` as a plain linear of ``runtime``'s model runs it:
    ``invariant_linear`` while ``runtime.invariant_linears_active`` (for the dtypes it
    takes), ``F.linear`` otherwise. For weights that are not an ``nn.Linear`` of their own
    (the fused gate/up weight of ``fused_mlp``). The weight is the model's, which no kernel
    of a step writes, so the GEMV may load it before its PDL wait (``constant_weight``)."""
    if runtime.invariant_linears_active and x.dtype in INVARIANT_DTYPES:
        return invariant_linear(x, weight, bias, constant_weight=True)
    return F.linear(x, weight, bias)


def _linear_forward(module: nn.Linear, runtime: ExpertsRuntime) -> Callable[[Any], Any]:
    def forward(x):
        return runtime_linear(runtime, x, module.weight, module.bias)

    return forward


def _scoped_forward(plain: Callable[..., Any], runtime: ExpertsRuntime) -> Callable[..., Any]:
    def forward(*args, **kwargs):
        if runtime.invariant_active:
            with BatchInvariantMode():
                return plain(*args, **kwargs)
        return plain(*args, **kwargs)

    return forward
