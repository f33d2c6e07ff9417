"""Record which experts a transformers MoE model routes each token to.

transformers 5.17's DeepSeek-V2, Qwen2-MoE and PhiMoE blocks all call
``self.experts(hidden [T, H], top_k_index [T, k], top_k_weights [T, k])`` on a module at
``model.layers.<i>.mlp.experts``; specter-models' swapped experts keep that call. A forward
pre-hook on each such module sees the router's decision without touching the router, for
the unmodified transformers model and Specter's target and draft alike (for Specter's
experts, the ids they compute: a routing replay's where one is attached).

Recording copies each layer's ``top_k_index`` to the host (a sync per layer), so it runs in
separate diagnostic passes (teacher forcing), never inside a timed decode.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from specter_models.routing_trace import TracedSequence, compact_ids

__all__ = [
    "RoutingRecorder",
    "TeacherForcedPass",
    "experts_modules",
    "record_sequence",
    "teacher_forced_pass",
    "teacher_forced_routing",
]

_EXPERTS_NAME = re.compile(r"(?:^|\.)layers\.(\d+)\.mlp\.experts$")


def experts_modules(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """``(decoder layer index, experts module)`` of every MoE layer, in layer order.

    Raises:
        ValueError: the model has no ``layers.<i>.mlp.experts`` module (not an MoE model
            of a supported type).
    """
    found = []
    for name, module in model.named_modules():
        match = _EXPERTS_NAME.search(name)
        if match is not None:
            found.append((int(match.group(1)), module))
    if not found:
        raise ValueError(
            f"{type(model).__name__} has no `layers.<i>.mlp.experts` modules; routing can be "
            "recorded for deepseek_v2, qwen2_moe and phimoe models."
        )
    return sorted(found, key=lambda item: item[0])


class RoutingRecorder:
    """Forward pre-hooks that keep each MoE layer's ``top_k_index`` while recording.

    Args:
        model: a transformers MoE model (or a model holding one).

    Example:
        >>> recorder = RoutingRecorder(model)  # doctest: +SKIP
        >>> with recorder.recording():  # doctest: +SKIP
        ...     model(input_ids)
        >>> recorder.routing().shape  # [T, L, k]  # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module) -> None:
        modules = experts_modules(model)
        self.layers = [index for index, _ in modules]
        self._rows: list[list[torch.Tensor]] = [[] for _ in modules]
        self._active = False
        self._handles = [
            module.register_forward_pre_hook(self._hook(i), with_kwargs=True)
            for i, (_, module) in enumerate(modules)
        ]

    def _hook(self, position: int):
        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._active:
                return
            ids = args[1] if len(args) > 1 else kwargs.get("top_k_index")
            if ids is None:
                raise RuntimeError(
                    f"the experts module of MoE layer {self.layers[position]} was called "
                    "without top_k_index; this transformers version's MoE call is not supported."
                )
            routed = getattr(module, "routed_ids", None)
            if callable(routed):  # Specter's experts: a routing replay's ids where one runs
                ids = routed(ids)
            # Host copy on purpose: diagnostic passes only (see the module docstring).
            self._rows[position].append(
                ids.detach().to("cpu", torch.long).reshape(-1, ids.shape[-1])
            )

        return hook

    @contextmanager
    def recording(self) -> Iterator[RoutingRecorder]:
        """Record inside the block (what was recorded before is dropped)."""
        self._rows = [[] for _ in self._rows]
        self._active = True
        try:
            yield self
        finally:
            self._active = False

    def routing(self) -> torch.Tensor:
        """``[T, L, k]`` int64: the recorded calls of each layer concatenated over tokens.

        Raises:
            RuntimeError: nothing recorded, or layers saw different token counts.
        """
        per_layer = [torch.cat(rows) if rows else None for rows in self._rows]
        if any(r is None for r in per_layer):
            raise RuntimeError("no routing recorded: run a forward inside recording().")
        counts = {r.shape[0] for r in per_layer}  # type: ignore[union-attr]
        if len(counts) != 1:
            raise RuntimeError(f"MoE layers recorded different token counts {sorted(counts)}.")
        return torch.stack(per_layer, dim=1)  # type: ignore[arg-type]

    def remove(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []


@dataclass(frozen=True)
class TeacherForcedPass:
    """What one teacher-forced forward gives for the kept positions.

    Attributes:
        routing: ``[T, L, k]`` int64 on the CPU: each kept position's experts per MoE layer.
        logits: ``[T, V]`` on the model's device, in its dtype: the next-token logits after
            each kept position (a copy: the prompt's logits are not held).
    """

    routing: torch.Tensor
    logits: torch.Tensor

    def greedy(self) -> torch.Tensor:
        """``[T]`` int64 on the CPU: the token the model would pick after each position."""
        return self.logits.argmax(-1).cpu()


def teacher_forced_pass(
    recorder: RoutingRecorder,
    spec_model: object,
    token_ids: list[int],
    start: int,
    reset: Callable[[], None],
) -> TeacherForcedPass:
    """Routing and logits for ``token_ids[start:]`` from one forward over the sequence.

    ``spec_model`` follows specter-spec's ``SpecModel`` protocol (``forward(ids, start_pos)``
    returning ``[1, T, V]`` logits); ``reset`` empties its KV before and after, so no state
    survives (for specter-models: ``SpecterModel.reset``).

    Args:
        recorder: hooks on the model ``spec_model`` runs.
        spec_model: a target or draft adapter.
        token_ids: the full sequence (prompt and generated tokens).
        start: first position to keep.
        reset: empties the KV cache(s).

    Returns:
        The kept positions' routing (on the CPU) and logits (left on the device, so that
        draft and target distributions can be compared there without a host copy of
        ``[T, V]``).

    Raises:
        ValueError: ``start`` outside the sequence.
    """
    if not 0 <= start < len(token_ids):
        raise ValueError(f"start={start} is outside the sequence of {len(token_ids)} tokens.")
    device = getattr(spec_model, "device", None)
    ids = torch.tensor([token_ids], dtype=torch.long, device=device)
    # The hooks copy to the host: a step captured as a CUDA graph would skip them (or fail
    # to capture), so specter-models' step graphs are off for the pass.
    paused = getattr(spec_model, "graphs_paused", contextlib.nullcontext)
    reset()
    try:
        with torch.no_grad(), recorder.recording(), paused():
            logits = spec_model.forward(ids, 0)  # type: ignore[attr-defined]
        return TeacherForcedPass(recorder.routing()[start:], logits[0, start:].clone())
    finally:
        reset()


def teacher_forced_routing(
    recorder: RoutingRecorder,
    spec_model: object,
    token_ids: list[int],
    start: int,
    reset: Callable[[], None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Routing and greedy choices for ``token_ids[start:]`` (:func:`teacher_forced_pass`).

    Returns:
        ``(routing [len - start, L, k], argmax [len - start])``: the experts of each kept
        position and the token the model would predict after it, both on the CPU.

    Raises:
        ValueError: ``start`` outside the sequence.
    """
    forced = teacher_forced_pass(recorder, spec_model, token_ids, start, reset)
    return forced.routing, forced.greedy()


def record_sequence(
    recorder: RoutingRecorder,
    lm: Any,
    prompt_ids: Sequence[int],
    new_tokens: int,
    *,
    prompt_id: str = "",
    source: str = "",
) -> TracedSequence:
    """One sequence of a routing trace (``routing_trace``): greedy-decode ``new_tokens``
    after the prompt with the target alone (no stop token), then teacher-force the whole
    sequence through the target and, where ``lm`` has one, the draft.

    Args:
        recorder: hooks on ``lm.model``.
        lm: a ``SpecterModel`` (load it with every expert resident: nothing is timed).
        prompt_ids: the prompt's ids (at least one).
        new_tokens: the continuation's length.
        prompt_id: the prompt's id in its source; source: the prompt source.

    Returns:
        Its tokens, prompt length, target and draft routing (uint8, int16 past 256 experts)
        and the draft's greedy agreement with the target at every position.
    """
    prompt = [int(t) for t in prompt_ids]
    generated = lm.generate(prompt, new_tokens, depth=0).tokens
    tokens = prompt + list(generated)
    target = teacher_forced_pass(recorder, lm.target, tokens, 0, lm.reset)
    draft_ids = agree = None
    if lm.draft is not None:
        draft = teacher_forced_pass(recorder, lm.draft, tokens, 0, lm.reset)
        agree = draft.greedy() == target.greedy()
        draft_ids = compact_ids(draft.routing)
        del draft
    return TracedSequence(
        prompt_id=prompt_id,
        source=source,
        tokens=torch.tensor(tokens, dtype=torch.long),
        prompt_len=len(prompt),
        target=compact_ids(target.routing),
        draft=draft_ids,
        agree=agree,
    )
