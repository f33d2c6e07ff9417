"""Count a router's choices and publish the counts to the host, in one launch.

The draft's MoE layers count their routers' top-k choices on the device (specter-cache's
``RoutingCounter``). For the host to plan prefetches while the draft still runs, each
layer's counts row also goes, stamped with the forward's generation, into pinned host
memory the device writes in place (``RoutingCounter.publish``). :func:`observe_and_publish`
does both in the launch the count alone took (an ``index_add_``): the kernel adds the ids
to the row and stores ``row + stamp`` at the host row's address (pinned host memory is
mapped into the device's address space, so a kernel's stores reach it over PCIe; nothing
waits for them).
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend


def observe_and_publish_reference(
    counts_row: torch.Tensor,
    ids: torch.Tensor,
    stamp: torch.Tensor,
    host_address: torch.Tensor,
    host_row: torch.Tensor,
) -> None:
    """torch's version: ``counts_row[e] += #(ids == e)``, then ``host_row = counts_row +
    stamp`` (a copy; ``host_address`` is not used)."""
    flat = ids.reshape(-1).long()
    counts_row.index_add_(0, flat, torch.ones_like(flat, dtype=counts_row.dtype))
    host_row.copy_(counts_row + stamp, non_blocking=host_row.is_pinned())


def observe_and_publish(
    counts_row: torch.Tensor,
    ids: torch.Tensor,
    stamp: torch.Tensor,
    host_address: torch.Tensor,
    host_row: torch.Tensor,
) -> None:
    """Add ``ids`` to ``counts_row`` and write ``counts_row + stamp`` to the host row at
    ``host_address``, in one launch (Triton on CUDA, the reference elsewhere). It has
    specter-cache's ``PublishKernel`` signature: ``RoutingCounter.publish(observe_and_publish)``.

    Args:
        counts_row: ``[E]`` int32, contiguous, on the device.
        ids: expert ids, any shape (``[T, k]``), int32 or int64, on the device; each in
            ``[0, E)`` (others are not counted).
        stamp: ``[]`` int32 on the device, added to every published entry.
        host_address: ``[]`` int64 on the device: ``host_row.data_ptr()``.
        host_row: ``[E]`` int32 pinned host memory (a CPU tensor for the reference).

    Raises:
        ValueError: mismatched shapes or dtypes (the address is not checked: reading it
            would sync the host).

    Example:
        >>> import torch, specter_kernels as sk
        >>> counts, host = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
        >>> stamp, address = torch.tensor(100, dtype=torch.int32), torch.tensor(host.data_ptr())
        >>> sk.observe_and_publish(counts, torch.tensor([[1, 3], [3, 0]]), stamp, address, host)
        >>> counts.tolist(), host.tolist()
        ([1, 1, 0, 2], [101, 101, 100, 102])
    """
    if counts_row.dim() != 1 or counts_row.dtype != torch.int32 or not counts_row.is_contiguous():
        raise ValueError(
            f"counts_row must be a contiguous int32 [E] row, got {counts_row.dtype} "
            f"{tuple(counts_row.shape)}"
        )
    if ids.dtype not in (torch.int32, torch.int64) or ids.device != counts_row.device:
        raise ValueError(
            f"ids must be int32 or int64 expert ids on {counts_row.device}, got {ids.dtype} "
            f"on {ids.device}"
        )
    if tuple(host_row.shape) != tuple(counts_row.shape) or host_row.dtype != torch.int32:
        raise ValueError(
            f"host_row must be int32 {tuple(counts_row.shape)} like counts_row, got "
            f"{host_row.dtype} {tuple(host_row.shape)}"
        )
    if stamp.dim() != 0 or stamp.dtype != torch.int32 or host_address.dim() != 0:
        raise ValueError("stamp must be a 0-d int32 tensor and host_address a 0-d int64 one")
    if select_backend(counts_row.device) == "torch" or ids.numel() == 0:
        observe_and_publish_reference(counts_row, ids, stamp, host_address, host_row)
        return
    from specter_kernels.streaming.routing_publish_triton import launch_observe_and_publish

    launch_observe_and_publish(counts_row, ids.reshape(-1), stamp, host_address)
