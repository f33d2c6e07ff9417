"""Stop strings found across chunk boundaries."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from specter_bench.serve.stop_strings import StopMatcher


def _run(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(piece) for piece in pieces)
    return out + matcher.flush()


def test_a_stop_split_over_pieces_is_cut_before_it():
    m = StopMatcher(["END"])
    assert m.feed("abc E") == "abc "
    assert m.feed("N") == ""
    assert m.feed("Dxyz") == ""
    assert m.stopped
    assert m.matched == "END"
    assert m.feed("more") == ""
    assert m.flush() == ""


def test_a_false_start_is_released():
    m = StopMatcher(["END"])
    assert m.feed("EN") == ""
    assert m.feed("x") == "ENx"
    assert not m.stopped


def test_the_earliest_stop_wins_and_final_stops_need_no_cancel():
    m = StopMatcher(["cd", "b"], final=["<eos>"])
    assert m.feed("abcd") == "a"
    assert m.matched == "b"
    assert m.needs_cancel
    eos = StopMatcher([], final=["<eos>"])
    assert eos.feed("xy<eo") == "xy"
    assert eos.feed("s>") == ""
    assert eos.stopped
    assert not eos.needs_cancel


def test_without_stops_text_passes_through():
    m = StopMatcher([])
    assert m.feed("abc") == "abc"
    assert m.flush() == ""


@given(
    text=st.text(alphabet="ab\n", max_size=40),
    stop=st.text(alphabet="ab\n", min_size=1, max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_any_split_gives_the_text_before_the_first_stop(text, stop, cuts):
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    at = text.find(stop)
    expected = text if at < 0 else text[:at]
    assert _run(StopMatcher([stop]), pieces) == expected
