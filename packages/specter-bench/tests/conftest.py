"""Session settings for specter-bench's tests."""

import matplotlib
import pytest
import torch

# Tiny models and tensors: intra-op threads only add synchronisation on a small shared machine.
torch.set_num_threads(1)
# Plots are built without pyplot; this keeps any indirect pyplot import headless too.
matplotlib.use("Agg")


@pytest.fixture(autouse=True)
def _private_specter_cache(tmp_path, monkeypatch):
    """Each test keeps what generate measures (its depth costs) in a folder of its own, so
    no test reads another's, or the user's, stored costs."""
    monkeypatch.setenv("SPECTER_CACHE_DIR", str(tmp_path / "specter-cache"))
