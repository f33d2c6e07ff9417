"""The MLA prologue of one attention layer in one launch: the latent's RMSNorm, the rotary
embedding of the query's and key's rope parts, and the cache writes.

DeepSeek-V2's attention (absorbed, :mod:`specter_kernels.attention.mla_attention`) projects
each token to a query ``[H, nope + rope]`` and a compressed key/value ``[R + rope]``. Before
attending it normalises the latent ``[R]`` (``kv_a_layernorm``), rotates the query's
``rope`` part and the key's shared ``rope`` part (``apply_rotary_emb``) and appends the
latent and the rotated key to the cache: five launches at least (a norm, two rotary, two
cache writes), each a few microseconds of a decode step whose work is a few kilobytes.
:func:`mla_prologue` does all of it in one launch, one program per token, in the same
arithmetic as :func:`rms_norm` and :func:`rotary_complex` (fp32 statistics and products, one
rounding each).

The cache rows go where the caller says: ``rows`` is the first position of ``T`` consecutive
rows (an int), or a ``[T]`` int64 device tensor of positions (a CUDA graph's window mode,
where no position may be a host constant).

:func:`mla_prologue_absorb` also absorbs the queries in the same launch, ``q_lat = q_nope
@ W_UK`` per head (the absorbed attention's query side, a ``bmm`` after the prologue
otherwise): the two are independent, and as one launch they run side by side instead of
one after the other. Each ``(token, head, 64 columns)`` is a program of its own with
fixed-order fp32 sums, so a token's ``q_lat`` does not depend on the tokens beside it.
"""

from __future__ import annotations

import torch

from specter_kernels.attention.rotary import rotary_complex_reference
from specter_kernels.backend import FLOAT_DTYPES, select_backend
from specter_kernels.norms.rms_norm import rms_norm_reference

__all__ = [
    "MAX_LATENT",
    "mla_prologue",
    "mla_prologue_absorb",
    "mla_prologue_absorb_reference",
    "mla_prologue_reference",
]

MAX_LATENT = 4096
"""Widest latent (``R``) one program normalises in one block: ``rms_norm``'s widest block
(``rms_norm_triton.MAX_BLOCK``), so both sum the squares over the same lanes."""


def mla_prologue_reference(
    q_pe: torch.Tensor,
    kv_nope: torch.Tensor,
    k_pe: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    rows: int | torch.Tensor,
) -> torch.Tensor:
    """transformers' expressions, then the two cache writes (see :func:`mla_prologue`)."""
    T = kv_nope.shape[0]
    freqs = freqs_cis.reshape(1, T, -1)
    latent = rms_norm_reference(kv_nope, norm_weight, eps).to(latent_cache.dtype)
    key = rotary_complex_reference(k_pe[None, None], freqs)[0, 0]
    index = (
        torch.arange(rows, rows + T, device=latent_cache.device) if isinstance(rows, int) else rows
    )
    latent_cache.index_copy_(0, index, latent)
    rope_cache.index_copy_(0, index, key.to(rope_cache.dtype))
    return rotary_complex_reference(q_pe.transpose(0, 1)[None], freqs)[0].contiguous()


def mla_prologue(
    q_pe: torch.Tensor,
    kv_nope: torch.Tensor,
    k_pe: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    rows: int | torch.Tensor,
) -> torch.Tensor:
    """Norm the latents, rotate the rope parts and write both to the cache, in one launch
    (Triton on CUDA, the reference elsewhere).

    Args:
        q_pe: ``[T, H, rope]`` the queries' rope parts, any strides (a view of the query
            projection).
        kv_nope: ``[T, R]`` the latents before their norm, unit stride along ``R``.
        k_pe: ``[T, rope]`` the keys' rope part (one head), unit stride along ``rope``.
        norm_weight: ``[R]`` the latent RMSNorm's weight.
        eps: the norm's epsilon, >= 0.
        freqs_cis: ``[T, rope / 2]`` or ``[1, T, rope / 2]`` complex64 rotations.
        latent_cache: ``[S, R]`` cache rows of normed latents (unit stride along ``R``),
            the inputs' dtype.
        rope_cache: ``[S, rope]`` cache rows of rotated keys (unit stride along ``rope``).
        rows: the first of ``T`` consecutive cache rows to write, or a ``[T]`` int64 tensor
            of rows on the cache's device.

    Returns:
        ``[H, T, rope]`` contiguous, the rotated queries (the inputs' dtype).

    Raises:
        TypeError: an unsupported dtype.
        ValueError: shapes, devices or rows that do not fit.
    """
    args = (q_pe, kv_nope, k_pe, norm_weight, eps, freqs_cis, latent_cache, rope_cache, rows)
    _check(*args)
    return _run(args)


def _run(args: tuple, absorb: tuple[torch.Tensor, torch.Tensor] | None = None):
    """The checked prologue (with ``absorb = (q_nope, w_uk)``, and the absorption): the
    Triton kernel on CUDA, the reference elsewhere."""
    q_pe, kv_nope, k_pe, norm_weight, eps, freqs_cis, latent_cache, rope_cache, rows = args
    if kv_nope.shape[0] == 0 or select_backend(kv_nope.device) == "torch":
        if absorb is None:
            return mla_prologue_reference(*args)
        return mla_prologue_absorb_reference(*args, *absorb)
    from specter_kernels.attention.mla_prologue_triton import launch_mla_prologue

    freqs = torch.view_as_real(freqs_cis.reshape(kv_nope.shape[0], -1))  # [T, rope/2, 2]
    if freqs.stride(-1) != 1 or freqs.stride(-2) != 2:
        freqs = freqs.contiguous()
    return launch_mla_prologue(
        q_pe, kv_nope, k_pe, norm_weight.contiguous(), float(eps), freqs, latent_cache,
        rope_cache, rows, absorb=absorb,
    )  # fmt: skip


def _check(q_pe, kv_nope, k_pe, norm_weight, eps, freqs_cis, latent_cache, rope_cache, rows):
    for name, t in (("q_pe", q_pe), ("kv_nope", kv_nope), ("k_pe", k_pe),
                    ("norm_weight", norm_weight), ("latent_cache", latent_cache),
                    ("rope_cache", rope_cache)):  # fmt: skip
        if not isinstance(t, torch.Tensor) or t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"mla_prologue: {name} must be a tensor of {FLOAT_DTYPES}, got "
                f"{getattr(t, 'dtype', type(t).__name__)}"
            )
    if not isinstance(freqs_cis, torch.Tensor) or freqs_cis.dtype != torch.complex64:
        got = getattr(freqs_cis, "dtype", type(freqs_cis).__name__)
        raise TypeError(f"mla_prologue: freqs_cis must be complex64, got {got}")
    if kv_nope.dim() != 2 or q_pe.dim() != 3 or k_pe.dim() != 2:
        raise ValueError(
            f"mla_prologue takes q_pe [T, H, rope], kv_nope [T, R] and k_pe [T, rope]; got "
            f"{tuple(q_pe.shape)}, {tuple(kv_nope.shape)} and {tuple(k_pe.shape)}"
        )
    T, R = kv_nope.shape
    rope = k_pe.shape[1]
    if q_pe.shape[0] != T or k_pe.shape[0] != T or q_pe.shape[2] != rope or rope % 2:
        raise ValueError(
            f"mla_prologue: q_pe {tuple(q_pe.shape)}, kv_nope {tuple(kv_nope.shape)} and k_pe "
            f"{tuple(k_pe.shape)} must agree on T and an even rope width"
        )
    if freqs_cis.numel() != T * (rope // 2) or freqs_cis.shape[-1] != rope // 2:
        raise ValueError(
            f"mla_prologue: freqs_cis must be [T, rope/2] = [{T}, {rope // 2}] (or with a "
            f"leading 1), got {tuple(freqs_cis.shape)}"
        )
    if R > MAX_LATENT:
        raise ValueError(
            f"mla_prologue normalises a latent of at most {MAX_LATENT} values in one block, got "
            f"R={R}; use rms_norm and rotary_complex apart for wider latents"
        )
    if norm_weight.shape != (R,):
        raise ValueError(
            f"mla_prologue: norm_weight must be [R] = [{R}], got {tuple(norm_weight.shape)}"
        )
    if not eps >= 0:
        raise ValueError(f"mla_prologue: eps must be >= 0, got {eps!r}")
    if (
        latent_cache.dim() != 2 or latent_cache.shape[1] != R
        or rope_cache.dim() != 2 or rope_cache.shape[1] != rope
        or rope_cache.shape[0] != latent_cache.shape[0]
    ):  # fmt: skip
        raise ValueError(
            f"mla_prologue: the caches must be [S, R] = [S, {R}] and [S, rope] = [S, {rope}], "
            f"got {tuple(latent_cache.shape)} and {tuple(rope_cache.shape)}"
        )
    if (
        kv_nope.stride(1) != 1
        or k_pe.stride(1) != 1
        or latent_cache.stride(1) != 1
        or rope_cache.stride(1) != 1
    ):
        raise ValueError(
            "mla_prologue: kv_nope, k_pe and the caches need unit stride in their last dim"
        )
    devices = {
        t.device for t in (q_pe, kv_nope, k_pe, norm_weight, freqs_cis, latent_cache, rope_cache)
    }
    if len(devices) != 1:
        raise ValueError(
            f"mla_prologue: every tensor must be on one device, got {sorted(map(str, devices))}"
        )
    S = latent_cache.shape[0]
    if isinstance(rows, bool) or not isinstance(rows, (int, torch.Tensor)):
        raise TypeError(
            f"mla_prologue: rows must be an int or an int64 tensor, got {type(rows).__name__}"
        )
    if isinstance(rows, int):
        if rows < 0 or rows + T > S:
            raise ValueError(
                f"mla_prologue: rows {rows}..{rows + T - 1} do not fit a cache of {S} rows"
            )
    elif rows.dtype != torch.int64 or rows.shape != (T,) or rows.device != latent_cache.device:
        raise ValueError(
            f"mla_prologue: rows must be a [T] = [{T}] int64 tensor on {latent_cache.device}, got "
            f"{rows.dtype} {tuple(rows.shape)} on {rows.device}"
        )


def mla_prologue_absorb_reference(
    q_pe: torch.Tensor,
    kv_nope: torch.Tensor,
    k_pe: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    rows: int | torch.Tensor,
    q_nope: torch.Tensor,
    w_uk: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mla_prologue_reference`, then ``q_lat[h] = q_nope[:, h] @ W_UK[h]`` in fp32
    (float64 for float64 inputs), rounded once to the inputs' dtype."""
    out = mla_prologue_reference(
        q_pe, kv_nope, k_pe, norm_weight, eps, freqs_cis, latent_cache, rope_cache, rows
    )
    work = torch.float64 if q_nope.dtype == torch.float64 else torch.float32
    q_lat = torch.bmm(q_nope.transpose(0, 1).to(work), w_uk.to(work)).to(q_nope.dtype)
    return out, q_lat


def mla_prologue_absorb(
    q_pe: torch.Tensor,
    kv_nope: torch.Tensor,
    k_pe: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    freqs_cis: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    rows: int | torch.Tensor,
    q_nope: torch.Tensor,
    w_uk: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mla_prologue` and the query absorption ``q_lat = q_nope @ W_UK`` in one launch
    (Triton on CUDA, the reference elsewhere).

    Args:
        q_pe, kv_nope, k_pe, norm_weight, eps, freqs_cis, latent_cache, rope_cache, rows:
            as :func:`mla_prologue`.
        q_nope: ``[T, H, nope]`` the queries' no-position parts, any strides (a view of the
            query projection), ``q_pe``'s dtype.
        w_uk: ``W_UK [H, nope, R]`` (a view of ``kv_b_proj``'s weight), unit stride along
            ``R``, ``q_pe``'s dtype.

    Returns:
        ``(q_pe_rotated [H, T, rope], q_lat [H, T, R])``, both contiguous.

    Raises:
        TypeError: an unsupported dtype, or dtypes that differ.
        ValueError: shapes, devices or rows that do not fit.
    """
    args = (q_pe, kv_nope, k_pe, norm_weight, eps, freqs_cis, latent_cache, rope_cache, rows)
    _check(*args)
    _check_absorb(q_pe, kv_nope, q_nope, w_uk)
    return _run(args, (q_nope, w_uk))


def _check_absorb(q_pe, kv_nope, q_nope, w_uk) -> None:
    for name, t in (("q_nope", q_nope), ("w_uk", w_uk)):
        if not isinstance(t, torch.Tensor) or t.dtype != q_pe.dtype:
            raise TypeError(
                f"mla_prologue_absorb: {name} must be a tensor of q_pe's dtype {q_pe.dtype}, got "
                f"{getattr(t, 'dtype', type(t).__name__)}"
            )
    T, H, _ = q_pe.shape
    R = kv_nope.shape[1]
    if q_nope.dim() != 3 or tuple(q_nope.shape[:2]) != (T, H) or q_nope.shape[2] == 0:
        raise ValueError(
            f"mla_prologue_absorb: q_nope must be [T, H, nope] = [{T}, {H}, nope], got "
            f"{tuple(q_nope.shape)}"
        )
    nope = q_nope.shape[2]
    if w_uk.dim() != 3 or tuple(w_uk.shape) != (H, nope, R):
        raise ValueError(
            f"mla_prologue_absorb: w_uk must be W_UK [H, nope, R] = [{H}, {nope}, {R}], got "
            f"{tuple(w_uk.shape)}"
        )
    if w_uk.stride(2) != 1:
        raise ValueError("mla_prologue_absorb: w_uk needs unit stride along R (its last dim)")
    if q_nope.device != q_pe.device or w_uk.device != q_pe.device:
        raise ValueError(
            f"mla_prologue_absorb: q_nope and w_uk must be on {q_pe.device}, got "
            f"{q_nope.device} and {w_uk.device}"
        )
