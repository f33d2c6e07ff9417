"""Stop strings found across token boundaries in streamed text.

Text arrives in pieces that need not align with a stop string: ``"\\n\\n"`` may end one
chunk and start the next, or a stop string may arrive one character per token. The
matcher holds back the longest tail of the text that could still grow into a stop string,
releases the rest, and at the first complete match releases exactly the text before it.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["StopMatcher"]


class StopMatcher:
    """Incremental search for the earliest of several stop strings.

    Args:
        stops: the stop strings (empty ones are ignored).
        final: further stop strings that end the generation by themselves (the EOS
            token's text): they are cut like the others, but ``needs_cancel`` stays False.

    Attributes:
        stopped: a stop string has completed.
        matched: the stop string that completed first (None before).

    Example:
        >>> m = StopMatcher(["END"])
        >>> m.feed("abc E"), m.feed("N"), m.feed("Dx"), m.stopped
        ('abc ', '', '', True)
    """

    def __init__(self, stops: Sequence[str], final: Sequence[str] = ()) -> None:
        self.final = [s for s in final if s]
        self.stops = [s for s in stops if s] + self.final
        self._held = ""
        self.stopped = False
        self.matched: str | None = None

    @property
    def needs_cancel(self) -> bool:
        """A stop string (not a ``final`` one) has completed: the generation must stop."""
        return self.stopped and self.matched not in self.final

    def feed(self, text: str) -> str:
        """Take the next piece of text; return what can be released now.

        After a stop string completes, ``stopped`` is True, the text before it is
        released, and further pieces release nothing.
        """
        if self.stopped:
            return ""
        if not self.stops:
            return text
        buffer = self._held + text
        found = [(i, stop) for stop in self.stops if (i := buffer.find(stop)) >= 0]
        if found:
            at, self.matched = min(found, key=lambda pair: pair[0])
            self.stopped = True
            self._held = ""
            return buffer[:at]
        keep = self._partial_tail(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The held-back text at the end of the generation (it matched no stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest tail of ``buffer`` that is a proper prefix of a stop."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:n]):
                    best = n
                    break
        return best
