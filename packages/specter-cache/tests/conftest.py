"""Shared fixtures of specter-cache's tests: small random expert stores."""

import sys
from pathlib import Path

import pytest
import torch

# Helper modules beside the tests are importable under --import-mode=importlib.
sys.path.insert(0, str(Path(__file__).parent))

from cache_helpers import build_store

# Tiny tensors: intra-op threads only add synchronisation on a small shared machine.
torch.set_num_threads(1)


@pytest.fixture
def make_store():
    """Factory: ``make_store(L, E, layout=None, seed=0, **kwargs) -> (store, reference)``."""
    return build_store
