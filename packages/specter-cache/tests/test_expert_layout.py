"""ExpertLayout: record offsets, sizes and validation of expert tensors."""

import itertools
import random

import pytest
import torch

from specter_cache import ExpertLayout
from specter_cache.expert_layout import RECORD_ALIGNMENT, TensorSpec

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.int32, torch.uint8]


@pytest.mark.parametrize("seed", range(5))
def test_offsets_are_aligned_disjoint_and_hold_every_tensor(seed):
    rng = random.Random(seed)
    specs = {
        f"t{i}": (tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3))), rng.choice(DTYPES))
        for i in range(rng.randint(1, 5))
    }
    layout = ExpertLayout(specs)
    spans = []
    for name, (shape, dtype) in specs.items():
        nbytes = torch.empty(shape, dtype=dtype).nbytes
        assert layout.spec(name).nbytes == nbytes
        off = layout.offset(name)
        assert off % RECORD_ALIGNMENT == 0
        spans.append((off, off + nbytes))
    spans.sort()
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start
    assert spans[-1][1] <= layout.record_bytes
    assert layout.record_bytes % RECORD_ALIGNMENT == 0
    assert layout.payload_bytes == sum(e - s for s, e in spans)
    assert layout.names == tuple(specs)


def test_from_tensors_and_check_accepts_matching_tensors():
    tensors = {"a": torch.zeros(3, 2, dtype=torch.float16), "b": torch.zeros(5, dtype=torch.int32)}
    layout = ExpertLayout.from_tensors(tensors)
    layout.check(tensors, "here")
    assert layout == ExpertLayout({"a": ((3, 2), torch.float16), "b": ((5,), torch.int32)})


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        ({"a": torch.zeros(3, 2, dtype=torch.float16)}, "missing"),
        (
            {"a": torch.zeros(3, 2, dtype=torch.float16), "b": torch.zeros(5), "c": torch.zeros(1)},
            "unexpected",
        ),
        (
            {"a": torch.zeros(2, 3, dtype=torch.float16), "b": torch.zeros(5, dtype=torch.int32)},
            r"\(2, 3\)",
        ),
        (
            {"a": torch.zeros(3, 2, dtype=torch.float32), "b": torch.zeros(5, dtype=torch.int32)},
            "float32",
        ),
    ],
)
def test_check_names_the_mismatch(tensors, match):
    layout = ExpertLayout({"a": ((3, 2), torch.float16), "b": ((5,), torch.int32)})
    with pytest.raises(ValueError, match=match):
        layout.check(tensors, "put")


def test_bad_specs_are_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        ExpertLayout({})
    with pytest.raises(TypeError, match="TensorSpec"):
        ExpertLayout({"a": "fp16"})
    with pytest.raises(ValueError, match="non-negative"):
        TensorSpec((-1, 2), torch.float16)
    with pytest.raises(TypeError, match=r"torch\.dtype"):
        TensorSpec((1, 2), "float16")
    with pytest.raises(KeyError, match="known names"):
        ExpertLayout({"a": ((1,), torch.float16)}).spec("b")
