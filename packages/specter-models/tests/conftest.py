"""Shared fixtures: tiny checkpoints of each architecture written by ``save_pretrained``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from model_helpers import TINY_ARCHS, save_tiny_checkpoint

# One thread: this shared 2-core machine runs tiny models faster without contention.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """preset name -> folder of a tiny checkpoint (random weights, random norms and biases)."""
    root = tmp_path_factory.mktemp("checkpoints")
    return {name: save_tiny_checkpoint(name, root / name, seed=11) for name in TINY_ARCHS}


@pytest.fixture(params=TINY_ARCHS)
def arch_name(request: pytest.FixtureRequest) -> str:
    """Each tiny architecture in turn."""
    return request.param
