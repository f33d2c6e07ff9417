"""The README's Python examples run as written and do what they say."""

import re
from pathlib import Path

import torch
import torch.nn.functional as F

README = Path(__file__).parents[1] / "README.md"


def test_readme_examples_run_and_use_the_cache(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 3
    usage: dict = {}
    exec(compile(blocks[0], "README-usage", "exec"), usage)
    assert sorted(usage["out"]) == [2, 5, 6]
    for e, y in usage["out"].items():  # each wave's slot held its expert's weights
        expect = usage["x"].cpu() @ usage["store"].get(0, e)["w"].T
        torch.testing.assert_close(y.cpu(), expect)
    usage_total = usage["cache"].stats()["total"]
    assert (usage_total["hits"], usage_total["misses"]) == (1, 2)  # expert 2 was prefetched
    assert "[2, 5, 6] 0.333" in capsys.readouterr().out
    namespace: dict = {}
    exec(compile(blocks[1], "README-example-1", "exec"), namespace)
    cache = namespace["cache"]
    total = cache.stats()["total"]
    assert namespace["y"].shape == (5, 64)
    assert total["acquires"] == 2
    assert total["hits"] + total["misses"] >= 2
    # The cached layer computes what a dense top-2 MoE over the store's experts computes.
    model, store, device = namespace["model"], namespace["store"], namespace["device"]
    x = torch.randn(7, 64, generator=torch.Generator().manual_seed(0))
    ref = x  # computed on the CPU, from the store's host tensors
    for layer, block in enumerate(model):
        weights, ids = F.linear(ref, block.router.weight.cpu()).softmax(-1).topk(2)
        out = torch.zeros_like(ref)
        for t in range(ref.shape[0]):
            for k in range(2):
                w = store.get(layer, int(ids[t, k]))
                gate, up = (w["gate_up"] @ ref[t]).chunk(2)
                out[t] += weights[t, k] * (w["down"] @ (F.silu(gate) * up))
        ref = out
    torch.testing.assert_close(model(x.to(device)).cpu(), ref, rtol=1e-4, atol=1e-4)
    exec(compile(blocks[2], "README-example-2", "exec"), namespace)
    assert namespace["prefetcher"].stats()["boundaries"] >= 1
    assert "torch.Size([5, 64])" in capsys.readouterr().out
