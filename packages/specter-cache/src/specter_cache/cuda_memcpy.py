"""``cudaMemcpyAsync`` called directly, for the copy engine's many small issues.

A prefetch batch issues a few copies per expert (its tensors, its map entry, an
invalidation). Through ``Tensor.copy_`` each one pays torch's dispatch, checks and stream
lookup before the CUDA call: tens of microseconds on a slow host, while the GPU, which
waits for the batch before the verification is launched, idles. The copies are plain
byte copies between tensors the cache owns for good (pinned host store, device slots,
device maps), so the runtime's own ``cudaMemcpyAsync`` on the copy stream does the same
work for a few microseconds.

The runtime is the one torch already loaded (found in ``/proc/self/maps``): no second
CUDA runtime, no new dependency. Where it cannot be found (another OS, a static build),
:func:`raw_memcpy` is None and the engine keeps ``copy_``.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

import torch

_CUDA_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the pointers (UVA)

RawMemcpy = Callable[[torch.Tensor, torch.Tensor, int], None]
"""``(dst, src, stream handle)``: enqueue a copy of ``src``'s bytes into ``dst``."""


def _loaded_cudart() -> ctypes.CDLL | None:
    """The CUDA runtime library this process loaded (torch's), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            return ctypes.CDLL(path)  # already loaded: the same handle, not a second runtime
        except OSError:
            continue
    return None


@functools.cache
def raw_memcpy() -> RawMemcpy | None:
    """A direct ``cudaMemcpyAsync`` for contiguous tensors of equal size, or None where the
    CUDA runtime is not available to call (no CUDA device, a runtime not found).

    The returned function raises ``ValueError`` for tensors it cannot copy as bytes (not
    contiguous, different sizes) and ``RuntimeError`` with the runtime's message when the
    call fails.
    """
    if not torch.cuda.is_available():
        return None
    torch.cuda.init()
    lib = _loaded_cudart()
    if lib is None:
        return None
    try:
        memcpy = lib.cudaMemcpyAsync
        error_string = lib.cudaGetErrorString
    except AttributeError:
        return None
    memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    memcpy.argtypes += [ctypes.c_void_p]
    memcpy.restype = ctypes.c_int
    error_string.argtypes = [ctypes.c_int]
    error_string.restype = ctypes.c_char_p

    def copy(dst: torch.Tensor, src: torch.Tensor, stream: int) -> None:
        nbytes = dst.numel() * dst.element_size()
        if (
            not dst.is_contiguous()
            or not src.is_contiguous()
            or src.numel() * src.element_size() != nbytes
        ):
            raise ValueError(
                f"a raw copy needs contiguous tensors of one size in bytes, got dst "
                f"{tuple(dst.shape)} {dst.dtype} and src {tuple(src.shape)} {src.dtype}"
            )
        code = memcpy(dst.data_ptr(), src.data_ptr(), nbytes, _CUDA_MEMCPY_DEFAULT, stream)
        if code != 0:
            raise RuntimeError(
                f"cudaMemcpyAsync of {nbytes} bytes failed: "
                f"{error_string(code).decode(errors='replace')} (error {code})"
            )

    return copy
