"""A weight brought into the GPU's L2 cache ahead of the kernel that reads it.

At batch size one a decoder layer's attention is a chain of small dependent kernels that
leaves most of the memory bandwidth idle (on an H200, DeepSeek-V2-Lite's attention block
reads 30 MB in about 30 us, a fifth of the copy ceiling), while its MoE block is bound by
the bandwidth (139 MB: the routed experts and the shared experts, whose branch runs on a
side stream beside the routed one). A weight that does not depend on the layer's input (the
shared experts') can be read into the L2 during the attention, on a side stream, so that
its GEMVs read the L2 and leave the memory to the routed experts.

:func:`l2_prefetch` launches that read: one program per stretch of 128-byte lines, each
asking for its lines with the ``evict_last`` policy (``mode="prefetch"``: PTX
``prefetch.global.L2::evict_last``, nothing comes back; ``mode="load"``: loads of each
line's first word, XORed into a per-program checksum). It changes no value anywhere; off
CUDA there is no cache to fill and it launches nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specter_kernels.backend import select_backend

PREFETCH_MODES = ("prefetch", "load")
"""``l2_prefetch``'s modes: PTX prefetch hints, or loads with a checksum."""


def l2_prefetch_checksum_reference(tensor: torch.Tensor) -> int:
    """The XOR of the first int32 word of each 128-byte line of ``tensor``'s bytes: what
    the programs' checksums of ``l2_prefetch(..., mode="load")`` XOR to."""
    words = tensor.detach().reshape(-1).view(torch.uint8).view(torch.int32)
    starts = words[::32].to(torch.int64)
    out = 0
    for value in starts.tolist():
        out ^= value & 0xFFFFFFFF
    return out


def l2_prefetch(
    tensors: Sequence[torch.Tensor], mode: str = "prefetch", programs: int = 32
) -> list[torch.Tensor]:
    """Ask the L2 for every byte of each tensor of ``tensors`` (launches on the current
    stream; one launch a tensor).

    Args:
        tensors: contiguous tensors whose byte counts are multiples of 4, all on one device.
        mode: ``"prefetch"`` (hints) or ``"load"`` (loads, a checksum a launch).
        programs: the most programs a launch takes (the SMs the prefetch may occupy).

    Returns:
        ``mode="load"`` on CUDA: each launch's per-program checksums (int32 ``[programs']``,
        XOR them for :func:`l2_prefetch_checksum_reference`); otherwise an empty list.

    Raises:
        ValueError: an unknown mode, ``programs < 1``, a tensor not contiguous, or a byte
            count not a multiple of 4.
    """
    if mode not in PREFETCH_MODES:
        raise ValueError(f"mode={mode!r} is not one of {PREFETCH_MODES}")
    if programs < 1:
        raise ValueError(f"programs={programs} must be at least 1")
    checksums: list[torch.Tensor] = []
    for t in tensors:
        if not t.is_contiguous():
            raise ValueError(
                f"l2_prefetch takes contiguous tensors; got shape {tuple(t.shape)} with "
                f"strides {t.stride()} (prefetch its base tensor instead)"
            )
        nbytes = t.numel() * t.element_size()
        if nbytes % 4:
            raise ValueError(f"l2_prefetch takes whole int32 words; a tensor has {nbytes} bytes")
        if nbytes == 0 or select_backend(t.device) == "torch" or not t.is_cuda:
            continue
        from specter_kernels.l2_prefetch_triton import launch_l2_prefetch

        flat = t.detach().reshape(-1).view(torch.uint8)
        out = launch_l2_prefetch(flat, programs, PREFETCH_MODES.index(mode))
        if out is not None:
            checksums.append(out)
    return checksums
