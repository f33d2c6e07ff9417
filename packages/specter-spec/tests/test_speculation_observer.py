"""The SpeculationObserver protocol check."""

import pytest

from spec_fakes import RecordingObserver
from specter_spec import SpeculationObserver
from specter_spec.speculation_observer import check_observer


def test_recording_observer_follows_the_protocol():
    assert isinstance(RecordingObserver(), SpeculationObserver)
    check_observer(RecordingObserver())


def test_missing_methods_are_named():
    class Half:
        def on_draft_start(self, depth):
            pass

        def on_verify_end(self, num_accepted):
            pass

    with pytest.raises(TypeError, match="missing on_draft_token, on_verify_start"):
        check_observer(Half())
