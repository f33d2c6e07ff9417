"""The shared experts on a side stream, beside the router and the routed experts.

DeepSeek-V2's and Qwen2-MoE's MoE blocks add a shared-expert MLP to their routed experts::

    out = routed(x) + shared(x)  # Qwen2-MoE: shared(x) = sigmoid(g x) * mlp(x)

The two branches read the same input ``x [B, S, H]`` and nothing of each other. At batch
size one each is a chain of small memory-bound kernels (on DeepSeek-V2-Lite the shared
branch is a 23 MB gate/up GEMV, ``silu_and_mul`` and an 11.5 MB down GEMV, about 22 us per
layer on an H200; the routed branch is the router's two kernels and the grouped expert
kernels), and run one after the other a decode step leaves the GPU's memory bandwidth idle
through each one's ramp and tail. :func:`install_shared_expert_overlap` runs the shared
branch on a side stream of the device, forked when the block starts and joined before the
add, so the two branches' kernels overlap; inside a CUDA graph capture the fork and the
join become the graph's branches. The patched block's forward also takes the decoder
layer's ``residual`` (``fused_residuals``) and then returns ``residual + (routed + shared)``
from one kernel.

The result is the same bits: the same kernels on the same inputs, and the same final add
in the same order (``routed + shared``). The shared branch's split-K GEMMs take arrival
counters of their own (``specter_kernels``' ``counters_in``), so the two branches' GEMMs never
draw tickets from one counter.

The fork applies only while a CUDA graph of a whole forward is captured: the stream is
capturing and no routed-expert split is installed (``ExpertsRuntime.expert_split``; a
piecewise capture ends a graph at each routed-expert call, and the fork and the join would
land in different graphs). Graphed decode steps (every draft step, the target's with every
expert resident or on the streamed miss path) replay it. Eager forwards (the prefill, steps
with graphs off) are bound by the host's launches, where a fork only adds host work (on an
H200 it made DeepSeek-V2-Lite's eager 349-token prefill 5-10% slower): there, and on the
CPU, both branches run in order on the current stream, as transformers' forward does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from specter_kernels import (
    residual_add,
    residual_add_rms_norm,
    residual_add_routed_pairs,
    residual_add_routed_pairs_rms_norm,
)
from specter_models import fused_norms
from specter_models.experts_runtime import ExpertsRuntime
from specter_models.fused_residuals import TAKES_RESIDUAL
from specter_models.module_patches import patch_forwards
from specter_models.specter_experts import SpecterExperts

__all__ = [
    "RoutedPairs",
    "SharedExpertOverlap",
    "install_shared_expert_overlap",
    "shared_branches",
]


class RoutedPairs(NamedTuple):
    """A routed branch's output left as its pairs: fp32 ``[T, k, H]`` (``T`` the block
    input's rows flattened), summed by the join."""

    pairs: torch.Tensor


Branch = Callable[[torch.Tensor], torch.Tensor]
RoutedBranch = Callable[..., "torch.Tensor | RoutedPairs"]


def shared_branches(block: nn.Module) -> tuple[RoutedBranch, Branch] | None:
    """``(routed, shared)`` of an MoE block with shared experts, each ``[B, S, H] -> [B, S, H]``
    computing exactly what transformers' forward computes for that branch; None for a block
    without shared experts (PhiMoE's) or one not recognised.

    ``routed(x, keep_pairs=True)`` asks Specter's routed experts for their per-pair
    accumulator: it returns :class:`RoutedPairs` when they keep one, else ``[B, S, H]``.

    DeepSeek-V2 (``DeepseekV2Moe``): ``gate``, ``experts`` and ``shared_experts``.
    Qwen2-MoE (``Qwen2MoeSparseMoeBlock``): ``gate``, ``experts``, ``shared_expert`` and
    ``shared_expert_gate`` (a sigmoid gate of one column).
    """
    gate, experts = getattr(block, "gate", None), getattr(block, "experts", None)
    if not isinstance(gate, nn.Module) or not isinstance(experts, nn.Module):
        return None
    if isinstance(getattr(block, "shared_experts", None), nn.Module):

        def routed(x: torch.Tensor, keep_pairs: bool = False) -> torch.Tensor | RoutedPairs:
            shape = x.shape
            _, weights, ids = block.gate(x)
            flat = x.view(-1, shape[-1])
            return _routed_out(block.experts, flat, ids, weights, keep_pairs, shape)

        def shared(x: torch.Tensor) -> torch.Tensor:
            return block.shared_experts(x)

        return routed, shared
    if isinstance(getattr(block, "shared_expert", None), nn.Module) and isinstance(
        getattr(block, "shared_expert_gate", None), nn.Module
    ):

        def routed(x: torch.Tensor, keep_pairs: bool = False) -> torch.Tensor | RoutedPairs:
            flat = x.view(-1, x.shape[-1])
            _, weights, ids = block.gate(flat)
            return _routed_out(block.experts, flat, ids, weights, keep_pairs, x.shape)

        def shared(x: torch.Tensor) -> torch.Tensor:
            flat = x.view(-1, x.shape[-1])
            mlp = block.shared_expert(flat)
            return (F.sigmoid(block.shared_expert_gate(flat)) * mlp).view(*x.shape)

        return routed, shared
    return None


def _routed_out(
    experts: nn.Module,
    flat: torch.Tensor,
    ids: torch.Tensor,
    weights: torch.Tensor,
    keep_pairs: bool,
    shape: torch.Size,
) -> torch.Tensor | RoutedPairs:
    """The routed experts on ``flat [T, H]``: ``[*shape]``, or :class:`RoutedPairs` when
    ``keep_pairs`` and Specter's experts return their fp32 pairs ``[T, k, H]``."""
    if keep_pairs and isinstance(experts, SpecterExperts):
        out = experts(flat, ids, weights, keep_pairs=True)
        if out.dim() == 3:
            return RoutedPairs(out)
        return out.view(*shape)
    return experts(flat, ids, weights).view(*shape)


class SharedExpertOverlap:
    """The switch and the side streams of :func:`install_shared_expert_overlap`.

    Args:
        runtime: the model's experts runtime (its ``expert_split`` vetoes the fork).
        enabled: fork at all (False: every block runs its branches in order). Graphs
            already captured keep what they were captured with.

    Attributes:
        patched: blocks whose forward :func:`install_shared_expert_overlap` replaced.
        forks: block forwards captured with the shared branch on a side stream.
        capturing: whether the current stream is capturing a CUDA graph (torch's query;
            a test can stand in for it).
    """

    def __init__(self, runtime: ExpertsRuntime, enabled: bool = True) -> None:
        self.runtime = runtime
        self.enabled = enabled
        self.patched = 0  # blocks whose forward install_shared_expert_overlap replaced
        self.forks = 0  # blocks captured with the shared branch on a side stream
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._counters: dict[torch.device, torch.Tensor] = {}
        self.capturing: Callable[[], bool] = torch.cuda.is_current_stream_capturing

    def prepare(self, device: torch.device | str) -> None:
        """Make ``device``'s side stream and the shared branch's split-K counters now, outside
        any CUDA graph capture (a capture cannot make the counters; no-op off CUDA)."""
        device = torch.device(device)
        if device.type != "cuda":
            return
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if device in self._streams:
            return
        from specter_kernels.invariant.matmul_triton import split_counters  # Triton: CUDA only

        self._counters[device] = split_counters(device)
        self._streams[device] = torch.cuda.Stream(device)

    def side_stream(self, x: torch.Tensor) -> torch.cuda.Stream | None:
        """The stream the shared branch of a block with input ``x`` runs on, or None to run
        it in order (off, not CUDA, no graph being captured, a routed-expert split installed,
        or no side stream made for the device: see :meth:`prepare`)."""
        if not (self.enabled and x.is_cuda) or self.runtime.expert_split is not None:
            return None
        stream = self._streams.get(x.device)
        return stream if stream is not None and self.capturing() else None

    def run(
        self,
        x: torch.Tensor,
        routed: RoutedBranch,
        shared: Branch,
        residual: torch.Tensor | None = None,
        next_norm: nn.Module | None = None,
    ) -> torch.Tensor:
        """``routed(x) + shared(x)``, the shared branch on the side stream when it applies;
        given a ``residual`` (``x``'s shape and dtype), ``residual + (routed(x) + shared(x))``
        in one launch (specter-kernels ``residual_add``: the bits of the two adds; with the
        routed pairs kept, ``residual_add_routed_pairs``: the pair sum's bits too). Given
        ``next_norm`` too (the fused RMSNorm the layer's output goes to next), the same
        launch normalises the output for it (``*_rms_norm``, its bits) and hands the result
        over (``fused_norms.hand_normed``), so that norm launches nothing."""
        keep = residual is not None
        side = self.side_stream(x)
        if side is None:
            return _join(routed(x, keep), shared(x), residual, next_norm)
        from specter_kernels.invariant.matmul_triton import counters_in  # Triton: CUDA only

        main = torch.cuda.current_stream(x.device)
        side.wait_stream(main)  # x is ready
        with torch.cuda.stream(side), counters_in(self._counters[x.device]):
            shared_out = shared(x)
        routed_out = routed(x, keep)
        main.wait_stream(side)  # the capture's join: the graph's two branches meet here
        self.forks += 1
        return _join(routed_out, shared_out, residual, next_norm)


def _join(
    routed: torch.Tensor | RoutedPairs,
    shared: torch.Tensor,
    residual: torch.Tensor | None,
    next_norm: nn.Module | None = None,
) -> torch.Tensor:
    """``routed + shared``, or ``residual + (routed + shared)`` in one launch (the routed
    pairs summed in it when ``routed`` is :class:`RoutedPairs`, which needs a residual), and
    with a fused ``next_norm`` that applies, its RMSNorm of the result handed to it."""
    if isinstance(routed, RoutedPairs):
        if residual is None:
            raise ValueError("routed pairs are joined into a residual; none was given")
        H = residual.shape[-1]
        rows = (residual.reshape(-1, H), routed.pairs, shared.reshape(-1, H))
        norm = _fusable_norm(next_norm, residual, shared)
        if norm is None:
            return residual_add_routed_pairs(*rows).view(residual.shape)
        out, normed = residual_add_routed_pairs_rms_norm(*rows, norm.weight, norm.variance_epsilon)
        return _handed(norm, out.view(residual.shape), normed)
    if residual is None:
        return routed + shared
    norm = _fusable_norm(next_norm, residual, shared, routed)
    if norm is None:
        return residual_add(residual, routed, shared)
    H = residual.shape[-1]
    out, normed = residual_add_rms_norm(
        residual.reshape(-1, H), routed.reshape(-1, H), shared.reshape(-1, H), norm.weight,
        norm.variance_epsilon,
    )  # fmt: skip
    return _handed(norm, out.view(residual.shape), normed)


def _fusable_norm(
    norm: nn.Module | None, residual: torch.Tensor, *parts: torch.Tensor
) -> nn.Module | None:
    """``norm`` when the join can normalise for it (a norm that ``fused_norms`` patched and
    whose fused kernel applies, every part of the residual's shape and dtype), else None."""
    if norm is None or not getattr(norm, "_specter_fused", False):
        return None
    if not fused_norms.fused_applies(residual, norm.weight):
        return None
    if any(p.shape != residual.shape or p.dtype != residual.dtype for p in parts):
        return None
    return norm


def _handed(norm: nn.Module, out: torch.Tensor, normed: torch.Tensor) -> torch.Tensor:
    fused_norms.hand_normed(norm, out, normed.view(out.shape))
    return out


def install_shared_expert_overlap(
    model: nn.Module, runtime: ExpertsRuntime, enabled: bool = True
) -> SharedExpertOverlap:
    """Give every MoE block of ``model`` with shared experts the forward of
    :meth:`SharedExpertOverlap.run` (once; see the module docstring).

    Install it after the fusions that replace the blocks' submodules' forwards (it calls the
    submodules, so it runs whatever they are), and call :meth:`SharedExpertOverlap.prepare`
    with the model's device before any CUDA graph capture.

    Returns:
        The overlap: its switch (``enabled``), how many blocks this call patched
        (``patched``) and how many block captures forked (``forks``).
    """
    overlap = SharedExpertOverlap(runtime, enabled)

    def make_forward(block: nn.Module, _plain: Any) -> Callable[[torch.Tensor], torch.Tensor]:
        routed, shared = shared_branches(block)  # type: ignore[misc]

        def forward(
            hidden_states: torch.Tensor,
            residual: torch.Tensor | None = None,
            next_norm: nn.Module | None = None,
        ) -> torch.Tensor:
            return overlap.run(hidden_states, routed, shared, residual, next_norm)

        setattr(block, TAKES_RESIDUAL, True)
        return forward

    overlap.patched = patch_forwards(
        model, lambda m: shared_branches(m) is not None, "_specter_shared_overlap", make_forward
    )
    return overlap
