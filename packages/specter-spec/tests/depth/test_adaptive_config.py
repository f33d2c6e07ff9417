"""AdaptiveDepthConfig: every setting is checked, with a message naming it."""

import pytest

from specter_spec import AdaptiveDepthConfig


def test_config_is_validated():
    with pytest.raises(ValueError, match="initial_depth=9 exceeds max_depth=8"):
        AdaptiveDepthConfig(max_depth=8, initial_depth=9)
    with pytest.raises(ValueError, match="must be >= 0"):
        AdaptiveDepthConfig(max_depth=-1)
    with pytest.raises(ValueError, match="acceptance_decay must be in"):
        AdaptiveDepthConfig(acceptance_decay=1.0)
    with pytest.raises(ValueError, match="probe_interval"):
        AdaptiveDepthConfig(probe_interval=1)
    with pytest.raises(ValueError, match=r"max_probe_interval must be an int >= probe_interval=8"):
        AdaptiveDepthConfig(probe_interval=8, max_probe_interval=4)
    with pytest.raises(ValueError, match="prior_acceptance"):
        AdaptiveDepthConfig(prior_acceptance=1.5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cost_horizon": 64}, r"cost_horizon must be an int > 2 \* max_probe_interval=64"),
        ({"plain_probe_steps": 0}, "plain_probe_steps must be an int >= 1"),
        ({"skip_losing_probes": 1}, "skip_losing_probes must be a bool"),
        ({"prior_trials": 0}, "prior_trials must be > 0"),
    ],
)
def test_probe_and_prior_settings_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AdaptiveDepthConfig(**kwargs)
