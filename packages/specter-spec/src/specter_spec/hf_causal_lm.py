"""Adapter that lets any transformers causal LM serve as draft or target."""

from __future__ import annotations

import inspect

import torch

__all__ = ["HFCausalLM"]


class HFCausalLM:
    """A transformers causal LM with its own ``DynamicCache``, following :class:`SpecModel`.

    The model builds its ``DynamicCache`` on the first forward; rollback uses
    ``DynamicCache.crop`` with a negative count (remove that many tokens), which
    means the same on transformers 4.x and 5.x (5.17 deprecates positive counts).
    Positions are passed explicitly as ``position_ids``, so the model never
    guesses them from the cache. This module never imports transformers.

    Only caches whose every layer keeps all positions can be rolled back:
    sliding-window or linear-attention layers cannot restore what they dropped.

    Args:
        model: a transformers ``PreTrainedModel`` for causal LM (anything whose
            ``__call__(input_ids=..., position_ids=..., past_key_values=...,
            use_cache=True)`` returns ``.logits`` and ``.past_key_values``).

    Example:
        >>> import torch
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> config = LlamaConfig(
        ...     vocab_size=64,
        ...     hidden_size=32,
        ...     intermediate_size=64,
        ...     num_hidden_layers=2,
        ...     num_attention_heads=4,
        ...     num_key_value_heads=2,
        ... )
        >>> lm = HFCausalLM(LlamaForCausalLM(config).eval())
        >>> lm.forward(torch.tensor([[1, 2, 3]]), start_pos=0).shape
        torch.Size([1, 3, 64])
        >>> lm.truncate(1)
        >>> lm.kv_length
        1
    """

    def __init__(self, model: torch.nn.Module) -> None:
        if not callable(model):
            raise TypeError(
                f"HFCausalLM wraps a transformers causal LM module, got {type(model).__name__}."
            )
        self.model = model
        self._cache = None
        self._takes_logits_to_keep = _accepts(model, "logits_to_keep")

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters (where input ids must live)."""
        return next(self.model.parameters()).device

    @property
    def kv_length(self) -> int:
        """Token positions held in the cache (a Python int read from tensor shapes)."""
        return 0 if self._cache is None else int(self._cache.get_seq_length())

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Run ``input_ids`` at positions ``start_pos..`` and append their KV.

        Args:
            input_ids: ``[1, T]`` int64 token ids, ``T >= 1``.
            start_pos: must equal ``kv_length``.

        Returns:
            ``[1, T, V]`` logits in the model's dtype.

        Raises:
            ValueError: on a bad shape or a ``start_pos`` other than ``kv_length``
                (call ``truncate`` first to roll back).
        """
        return self._run(input_ids, start_pos, {})

    def prefill(self, input_ids: torch.Tensor, start_pos: int) -> None:
        """``forward`` for prompt tokens whose logits nobody reads (the controller's
        prefill): the same KV; where the model's forward takes transformers'
        ``logits_to_keep`` the LM head runs on the last row only, not on all ``T`` (a
        ``[T, V]`` tensor as large as the prompt).

        Raises:
            ValueError: as ``forward``.
        """
        keep = {"logits_to_keep": 1} if self._takes_logits_to_keep else {}
        self._run(input_ids, start_pos, keep)

    def _run(self, input_ids: torch.Tensor, start_pos: int, extra: dict) -> torch.Tensor:
        if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
            raise ValueError(
                f"input_ids must have shape [1, T] with T >= 1, got {tuple(input_ids.shape)}."
            )
        cached = self.kv_length
        if start_pos != cached:
            raise ValueError(
                f"start_pos={start_pos} but the cache holds {cached} positions; new tokens must "
                "continue the cache. Call truncate(start_pos) first to roll back."
            )
        positions = torch.arange(
            start_pos, start_pos + input_ids.shape[1], device=input_ids.device
        ).unsqueeze(0)
        with torch.no_grad():
            output = self.model(
                input_ids=input_ids,
                position_ids=positions,
                past_key_values=self._cache,
                use_cache=True,
                **extra,
            )
        self._cache = output.past_key_values
        return output.logits

    def truncate(self, length: int) -> None:
        """Drop cached positions ``>= length``; a no-op when ``length >= kv_length``.

        Raises:
            ValueError: if ``length`` is negative.
        """
        if length < 0:
            raise ValueError(f"truncate length must be >= 0, got {length}.")
        excess = self.kv_length - length
        if excess <= 0:
            return
        if length == 0:
            self._cache = None  # a fresh cache is cheaper than cropping every layer to empty
            return
        self._cache.crop(-excess)


def _accepts(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model``'s forward takes the keyword ``name`` (False where its signature
    cannot be read)."""
    try:
        parameters = inspect.signature(getattr(model, "forward", model)).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters
