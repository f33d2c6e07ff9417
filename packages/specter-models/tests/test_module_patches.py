"""patch_forwards: the modules that apply get the new forward, built from the one they had,
once each."""

from __future__ import annotations

import torch
from torch import nn

from specter_models.module_patches import patch_forwards


def test_patches_the_modules_that_apply_once_each():
    model = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 3)))
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    seen = []

    def make_forward(module, plain):
        seen.append(module)

        def forward(x):
            return plain(x) + 1.0  # the replaced forward is still reachable

        return forward

    x = torch.randn(2, 3)
    before = [m(x) for m in linears]
    applies = lambda m: isinstance(m, nn.Linear)
    assert patch_forwards(model, applies, "_patched", make_forward) == 2
    assert seen == linears
    assert all(getattr(m, "_patched", False) for m in linears)
    assert not getattr(model[1], "_patched", False)
    for module, expected in zip(linears, before, strict=True):
        torch.testing.assert_close(module(x), expected + 1.0)
    assert patch_forwards(model, applies, "_patched", make_forward) == 0  # nothing twice
    torch.testing.assert_close(linears[0](x), before[0] + 1.0)
