"""FixedDepth and the int-or-policy argument of SpecController."""

import pytest

from specter_spec import AdaptiveDepth, FixedDepth
from specter_spec.depth.policy import DepthPolicy, as_depth_policy


def test_an_int_becomes_a_fixed_depth_and_a_policy_passes_through():
    policy = as_depth_policy(5)
    assert isinstance(policy, FixedDepth)
    assert [policy.choose_depth() for _ in range(3)] == [5, 5, 5]
    adaptive = AdaptiveDepth()
    assert as_depth_policy(adaptive) is adaptive
    assert isinstance(adaptive, DepthPolicy)


@pytest.mark.parametrize(
    ("depth", "error"), [(-3, ValueError), (2.0, TypeError), (None, TypeError), (False, TypeError)]
)
def test_bad_depths_are_refused(depth, error):
    with pytest.raises(error, match="depth"):
        as_depth_policy(depth)
    with pytest.raises(error, match="depth"):
        FixedDepth(depth)
