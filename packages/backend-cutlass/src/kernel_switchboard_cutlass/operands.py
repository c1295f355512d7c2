"""Turn torch operands into what a CUTLASS TMA kernel accepts, copying only when it must.

TMA (Hopper's tensor memory accelerator) needs 16-byte aligned base addresses and leading
dimensions, and CUTLASS also wants the contiguous extent of every operand to be a multiple of
16 bytes. An operand that already is row- or column-major and aligned is passed as it is; any other
is copied into a zero-padded row-major buffer. Zero padding along K does not change the product.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

ALIGN_BYTES = 16


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


class Operand(NamedTuple):
    """A matrix as the kernel sees it: data, "row"/"col" layout word, leading dimension (elements)."""

    tensor: torch.Tensor
    layout: str
    ld: int


def elems(dtype: torch.dtype) -> int:
    """How many elements make 16 bytes."""
    return ALIGN_BYTES // dtype.itemsize


def _aligned_ptr(t: torch.Tensor) -> bool:
    return t.data_ptr() % ALIGN_BYTES == 0


def as_operand(t: torch.Tensor, rows: int, cols: int, allow_col: bool = True) -> Operand:
    """``t`` (r, c) as a TMA-ready matrix of logical size (rows, cols) >= (r, c), zero-padded by a copy if needed.

    ``rows``/``cols`` are the padded extents the caller needs (multiples of the 16-byte element count
    along the dimension that ends up contiguous). ``allow_col=False`` forces row-major (fp8 A / K-major).
    """
    r, c = t.shape
    e = elems(t.dtype)
    if (r, c) == (rows, cols) and _aligned_ptr(t):
        rs, cs = t.stride()
        if (cs == 1 or c == 1) and rs % e == 0 and c % e == 0 and rs >= c:
            return Operand(t, "row", rs)
        if allow_col and (rs == 1 or r == 1) and cs % e == 0 and r % e == 0 and cs >= r:
            return Operand(t, "col", cs)
    buf = torch.zeros(rows, round_up(cols, e), dtype=t.dtype, device=t.device)
    buf[:r, :c] = t
    return Operand(buf, "row", buf.shape[1])


def as_k_major_b(b: torch.Tensor, k_pad: int, n_pad: int) -> Operand:
    """b (K, N) stored K-contiguous ("col") as fp8 tensor cores on Hopper need, padded to (k_pad, n_pad);
    a transposing copy when it is not already so."""
    k, n = b.shape
    e = elems(b.dtype)
    rs, cs = b.stride()
    if (k, n) == (k_pad, n_pad) and _aligned_ptr(b) and (rs == 1 or k == 1) and cs % e == 0 and cs >= k:
        return Operand(b, "col", cs)
    buf = torch.zeros(n_pad, k_pad, dtype=b.dtype, device=b.device)
    buf[:n, :k] = b.t()
    return Operand(buf.t(), "col", k_pad)


def padded_output(m: int, n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    """A row-major (m, n) output whose leading dimension is 16-byte aligned, and that leading dimension."""
    ld = round_up(n, elems(dtype))
    return torch.empty(m, ld, dtype=dtype, device=device), ld


def finish_output(d: torch.Tensor, n: int) -> torch.Tensor:
    """The contiguous (m, n) result out of a possibly padded output buffer."""
    return d if d.shape[1] == n else d[:, :n].contiguous()
