"""The decode's observer and depth policy, shared by the engine and the benchmark."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specter_spec import AdaptiveDepth, AdaptiveDepthConfig

__all__ = ["DecodeWindow", "make_depth_policy"]


def make_depth_policy(depth: int | str, max_depth: int = 16) -> Any:
    """A fixed depth K, or ``"auto"``: specter-spec's online ``AdaptiveDepth`` up to ``max_depth``.

    Raises:
        ValueError: a negative depth or an unknown word.
    """
    if depth == "auto":
        return AdaptiveDepth(AdaptiveDepthConfig(max_depth=max_depth))
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0 or 'auto', got {depth!r}.")
    return depth


class DecodeWindow:
    """A speculation observer that zeroes cache statistics when decoding starts.

    The controller prefills, then starts the first iteration with ``on_draft_start``; at that
    first call this observer resets the cache's (and prefetcher's) counters, so what they
    hold afterwards covers the decode alone. Every call is forwarded to ``inner`` (the
    prefetcher) when there is one.

    Args:
        cache: the expert cache.
        inner: the prefetcher to forward phases to, or None (no draft-guided prefetch).
        on_decode_start: called once when decoding starts (after the counters are zeroed).
    """

    def __init__(
        self,
        cache: Any,
        inner: Any | None,
        on_decode_start: Callable[[], None] | None = None,
        *,
        streamed_plain: bool = False,
    ) -> None:
        self.cache = cache
        self.inner = inner
        self.streamed_plain = streamed_plain
        self.on_decode_start = on_decode_start
        self.started = False

    def on_draft_start(self, depth: int) -> None:
        if not self.started:
            self.started = True
            self.cache.reset_stats()
            if self.inner is not None:
                self.inner.reset_stats()
            if self.on_decode_start is not None:
                self.on_decode_start()
        if self.inner is not None:
            self.inner.on_draft_start(depth)

    def on_draft_token(self, index: int) -> None:
        if self.inner is not None:
            self.inner.on_draft_token(index)

    def plain_steps_may_overlap(self) -> bool:
        """True when plain steps have no cache work to keep in order, so the controller
        queues them one ahead: every expert is resident (an unlimited budget), or the
        system decodes plainly on the streamed path without prefetches (``streamed_plain``:
        its steps load nothing; what they stream and fill is counted in order)."""
        return self.streamed_plain or self.cache.every_layer_resident()

    def on_verify_start(self, num_tokens: int) -> None:
        if self.inner is not None:
            self.inner.on_verify_start(num_tokens)

    def on_verify_end(self, num_accepted: int) -> None:
        if self.inner is not None:
            self.inner.on_verify_end(num_accepted)
