"""Prompts from several sources: the count split across them, calibration after each
source's measured prompts."""

import pytest

from specter_bench.prompt_mix import load_prompt_mix, source_names, split_count
from specter_bench.prompt_sources import (
    PromptSourceConfig,
    load_humaneval,
    load_prompts,
    load_prose,
)


def test_the_count_splits_with_the_first_sources_taking_the_remainder():
    assert split_count(10, 2) == [5, 5]
    assert split_count(7, 3) == [3, 2, 2]
    assert split_count(1, 2) == [1, 0]
    assert sum(split_count(23, 4)) == 23


def test_humaneval_and_prose_mix_measured_then_calibration_per_source():
    measured, calibration = load_prompt_mix(PromptSourceConfig("humaneval,prose", limit=5), 4)
    humaneval, prose = load_humaneval(limit=5), load_prose(limit=5)
    assert measured == [*humaneval[:3], *prose[:2]]
    assert calibration == [*humaneval[3:5], *prose[2:4]]
    assert [p.source for p in measured] == ["humaneval"] * 3 + ["prose"] * 2
    assert not {p.id for p in measured} & {p.id for p in calibration}
    # load_prompts gives the measured mix; one source is as before.
    assert load_prompts(PromptSourceConfig("humaneval,prose", limit=5)) == measured
    single, extra = load_prompt_mix(PromptSourceConfig("prose", limit=2), 1)
    assert (single, extra) == (prose[:2], prose[2:3])
    every, none = load_prompt_mix(PromptSourceConfig("prose,humaneval"), 3)
    assert len(every) == 24 + 164
    assert none == []


def test_bad_source_lists_say_what_is_expected():
    assert source_names(" humaneval , prose ") == ("humaneval", "prose")
    with pytest.raises(ValueError, match="unknown prompt source 'wiki' in 'humaneval,wiki'"):
        source_names("humaneval,wiki")
    with pytest.raises(ValueError, match="name a source twice"):
        source_names("prose,prose")
    with pytest.raises(ValueError, match="mix at most one of them"):
        source_names("jsonl,c4")
    with pytest.raises(ValueError, match="no prompt source"):
        source_names(" , ")
