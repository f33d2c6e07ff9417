"""observe_and_publish: the Triton kernel (under the interpreter here) counts like the
reference's index_add_ and writes the stamped row where the host address points."""

import pytest
import torch

import specter_kernels as sk
from specter_kernels.streaming.routing_publish_triton import launch_observe_and_publish


def _row_and_host(experts):
    counts = torch.randint(0, 5, (experts,), dtype=torch.int32)
    host = torch.full((experts,), -1, dtype=torch.int32)
    return counts, host, torch.tensor(host.data_ptr(), dtype=torch.int64)


@pytest.mark.parametrize(
    ("experts", "rows", "dtype"),
    [(64, 1, torch.int64), (60, 3, torch.int32), (16, 40, torch.int64)],
)
def test_the_kernel_counts_and_publishes_as_the_reference(experts, rows, dtype):
    # 40 rows x 2 ids: past one 64-id block, so the kernel loops.
    ids = torch.randint(0, experts, (rows, 6 if experts > 16 else 2)).to(dtype)
    stamp = torch.tensor(7 << 20, dtype=torch.int32)
    counts, host, address = _row_and_host(experts)
    expected_counts, expected_host = counts.clone(), host.clone()
    sk.observe_and_publish_reference(expected_counts, ids, stamp, address, expected_host)
    launch_observe_and_publish(counts, ids.reshape(-1), stamp, address)
    assert torch.equal(counts, expected_counts)
    assert torch.equal(host, expected_host)  # written through the address alone
    assert torch.equal(host, counts + stamp)


def test_the_public_function_takes_the_kernel_when_triton_is_forced(monkeypatch):
    monkeypatch.setenv(sk.BACKEND_ENV_VAR, "triton")
    counts, host, address = _row_and_host(8)
    before = counts.clone()
    sk.observe_and_publish(
        counts, torch.tensor([[7, 2], [2, 2]]), torch.tensor(3, dtype=torch.int32), address, host
    )
    assert (counts - before).tolist() == [0, 0, 3, 0, 0, 0, 0, 1]
    assert torch.equal(host, counts + 3)


def test_bad_arguments_are_named():
    counts, host, address = _row_and_host(4)
    stamp = torch.tensor(0, dtype=torch.int32)
    ids = torch.tensor([1])
    with pytest.raises(ValueError, match="counts_row"):
        sk.observe_and_publish(counts.long(), ids, stamp, address, host)
    with pytest.raises(ValueError, match="ids must be"):
        sk.observe_and_publish(counts, ids.float(), stamp, address, host)
    with pytest.raises(ValueError, match="host_row"):
        sk.observe_and_publish(counts, ids, stamp, address, host[:3])
    with pytest.raises(ValueError, match="stamp"):
        sk.observe_and_publish(counts, ids, stamp.long(), address, host)
