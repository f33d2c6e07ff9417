"""The examples in the package's docstrings run and print what they show."""

import doctest
import importlib

import pytest
import torch

import specter_cache

MODULES = [
    "expert_layout",
    "expert_store",
    "expert_cache",
    "routing_counter",
    "prefetch_planner",
    "belady",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(f"specter_cache.{name}")
    globs = {**vars(specter_cache), "torch": torch}
    result = doctest.testmod(module, extraglobs=globs, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
