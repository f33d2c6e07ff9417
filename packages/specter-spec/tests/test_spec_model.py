"""The SpecModel protocol check."""

import pytest

from spec_fakes import TableLM, random_table
from specter_spec import SpecModel
from specter_spec.spec_model import check_spec_model


def test_fake_models_follow_the_protocol():
    model = TableLM(random_table(vocab=3, period=1, seed=0))
    assert isinstance(model, SpecModel)
    check_spec_model(model, "target")


def test_missing_members_are_named():
    class OnlyForward:
        def forward(self, input_ids, start_pos):
            return input_ids

    with pytest.raises(TypeError, match=r"draft model OnlyForward .* missing truncate, kv_length"):
        check_spec_model(OnlyForward(), "draft")
