"""Every expert's FP16 weights where the device reads them in place: the streamed miss path.

A verification under a memory budget meets experts that hold no cache slot. Copying them in
first needs the host to learn which experts are missing (a sync per layer) and to schedule
the copies. ``StreamedExperts`` lets the grouped FP16 kernel take those experts' weights
straight from host memory instead: pinned host memory is mapped into the device's address
space (CUDA unified addressing), so a kernel can load from it over PCIe, and the program
of a missing expert reads its weights once, from there, while resident experts read their
slots. Nothing waits on the host, so a verified layer needs no host decision at all.

The arithmetic is the same whichever memory a weight comes from, so a streamed expert's
result has the same bits as the same expert read from a slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StreamedExperts:
    """Per-expert addresses of one layer's FP16 expert weights, readable by the device.

    Build it with :meth:`from_tensors`. The tensors are kept here, so their memory lives as
    long as this object.

    Attributes:
        w13_addresses: int64 ``[E]`` on the kernel's device: the address of expert e's
            gate_up weights ``[2I, H]`` (gate rows first).
        w2_addresses: int64 ``[E]``: the address of expert e's down weights ``[H, I]``.
        w13: the ``E`` gate_up tensors (contiguous fp16 ``[2I, H]``).
        w2: the ``E`` down tensors (contiguous fp16 ``[H, I]``).
    """

    w13_addresses: torch.Tensor
    w2_addresses: torch.Tensor
    w13: tuple[torch.Tensor, ...]
    w2: tuple[torch.Tensor, ...]

    @property
    def num_experts(self) -> int:
        """``E``."""
        return len(self.w13)

    @classmethod
    def from_tensors(
        cls,
        w13: Sequence[torch.Tensor],
        w2: Sequence[torch.Tensor],
        device: torch.device | str,
    ) -> StreamedExperts:
        """Addresses of ``w13[e]`` ``[2I, H]`` and ``w2[e]`` ``[H, I]`` for a kernel on ``device``.

        On a CUDA device every tensor must be pinned host memory (``pin_memory()``, which is
        mapped into the device's address space) or memory of that device; on the CPU
        (the Triton interpreter, the torch reference) any CPU tensor.

        Raises:
            ValueError: no experts, unequal counts, wrong shapes, dtypes or layouts, or memory
                the device cannot read (pageable host memory for a CUDA kernel).
        """
        device = torch.device(device)
        w13, w2 = tuple(w13), tuple(w2)
        if not w13 or len(w13) != len(w2):
            raise ValueError(
                f"StreamedExperts needs one gate_up and one down tensor per expert, got "
                f"{len(w13)} and {len(w2)}"
            )
        two_i, h = tuple(w13[0].shape) if w13[0].dim() == 2 else (0, 0)
        if two_i % 2 or two_i == 0:
            raise ValueError(
                f"gate_up tensors must be fp16 [2I, H], got {tuple(w13[0].shape)} for expert 0"
            )
        shapes = (("gate_up", w13, (two_i, h)), ("down", w2, (h, two_i // 2)))
        for name, tensors, shape in shapes:
            for e, t in enumerate(tensors):
                if t.dtype != torch.float16 or tuple(t.shape) != shape or not t.is_contiguous():
                    raise ValueError(
                        f"{name} of expert {e} must be a contiguous float16 {list(shape)} "
                        f"tensor, got {t.dtype} {list(t.shape)}"
                        + ("" if t.is_contiguous() else " (not contiguous)")
                    )
                _check_readable(t, device, f"{name} of expert {e}")
        addresses = [
            torch.tensor([t.data_ptr() for t in tensors], dtype=torch.int64).to(device)
            for tensors in (w13, w2)
        ]
        return cls(addresses[0], addresses[1], w13, w2)


def _check_readable(t: torch.Tensor, device: torch.device, what: str) -> None:
    if device.type != "cuda":
        if t.device.type != "cpu":
            raise ValueError(f"{what} is on {t.device}; a kernel on {device} reads CPU memory")
        return
    if t.device.type == "cuda":
        if t.device.index not in (None, device.index if device.index is not None else 0):
            raise ValueError(f"{what} is on {t.device}, the kernel runs on {device}")
        return
    if not t.is_pinned():
        raise ValueError(
            f"{what} is pageable host memory, which a CUDA kernel cannot read; keep the "
            "experts in pinned memory (tensor.pin_memory(), or an ExpertStore with "
            "pin_memory=True)"
        )
