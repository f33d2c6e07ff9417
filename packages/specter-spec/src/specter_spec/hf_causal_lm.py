"""Adapter that lets any transformers causal LM serve as draft or target."""

from __future__ import annotations

import inspect

import torch

__all__ = ["HFCausalLM"]


class HFCausalLM:
    """A transformers causal LM with its own ``DynamicCache``, following :class:`SpecModel`.

    The model builds its ``DynamicCache`` on the first forward; rollback uses
    ``DynamicCache.crop`` with a negative count (remove that many tokens). Positions are
    passed explicitly as ``position_ids``, so the model never guesses them from the
    cache. The cache goes in through the keyword the model's forward names (``cache``,
    or ``past_key_values`` in transformers releases before the rename) and comes back as
    the output's ``cache`` (else ``past_key_values``). This module never imports
    transformers.

    Only caches whose every layer keeps all positions can be rolled back: a model whose
    config declares sliding-window, chunked or linear-attention layers is refused.

    Args:
        model: a transformers ``PreTrainedModel`` for causal LM (anything whose
            ``__call__(input_ids=..., position_ids=..., cache=..., use_cache=True)``,
            or ``past_key_values=...`` in place of ``cache=...``, returns ``.logits``
            and ``.cache`` or ``.past_key_values``).

    Raises:
        TypeError: ``model`` is not callable.
        ValueError: the model's config has a ``sliding_window`` or layers other than
            full attention.

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
        _check_full_attention(model)
        self.model = model
        self._cache = None
        self._takes_logits_to_keep = _accepts(model, "logits_to_keep")
        self._cache_keyword = "cache" if _accepts(model, "cache") else "past_key_values"

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
                use_cache=True,
                **{self._cache_keyword: self._cache},
                **extra,
            )
        self._cache = _returned_cache(output)
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


def _returned_cache(output: object) -> object:
    """The cache a forward returned: ``output.cache``, else ``output.past_key_values``
    (its name in transformers releases before the rename)."""
    cache = getattr(output, "cache", None)
    return output.past_key_values if cache is None else cache


_FULL_ATTENTION = "full_attention"


def _check_full_attention(model: object) -> None:
    """Refuse a model whose config declares layers that drop positions (a sliding window,
    chunked or linear attention): their cache cannot be rolled back past what it dropped."""
    config = getattr(model, "config", None)
    if config is None:
        return
    window = getattr(config, "sliding_window", None)
    layer_types = list(getattr(config, "layer_types", None) or [])
    partial = sorted({kind for kind in layer_types if kind != _FULL_ATTENTION})
    if partial or (window is not None and not layer_types):
        name = type(model).__name__
        kinds = f" and layer types {partial}" if partial else ""
        raise ValueError(
            f"{name} has sliding_window={window!r}{kinds}: HFCausalLM rolls its cache back "
            "after every rejected proposal, and a layer that drops positions (a sliding "
            "window once full, chunked or linear attention) cannot restore them. Use a model "
            "whose layers all use full attention, or load this one with full attention on "
            "every layer (config.sliding_window=None and every config.layer_types entry "
            f"{_FULL_ATTENTION!r}), which gives the same logits while a sequence stays "
            "within the window."
        )
