"""The Triton kernel of :func:`kernel_switchboard.empty_rows.zero_empty_requests` (imported only when used)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def zero_empty_kernel(
    seq_lens_ptr,  # (B,) cached tokens per request
    out_ptr,  # (B, ...) rows of row_elems contiguous elements, stride_out apart
    lse_ptr,  # (B, heads) float32, stride_lse apart (HAS_LSE only)
    row_elems,  # elements in one row of out
    stride_out,  # out stride over requests
    heads,  # lse entries per request
    stride_lse,  # lse stride over requests
    HAS_LSE: tl.constexpr,  # write lse
    BLOCK: tl.constexpr,  # elements per store
):
    """One program per request: a request with no token gets out 0 and lse -inf; the others return at once."""
    b = tl.program_id(0)
    if tl.load(seq_lens_ptr + b) == 0:
        base = out_ptr + b.to(tl.int64) * stride_out
        for start in range(0, row_elems, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(base + offs, tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty), mask=offs < row_elems)
        if HAS_LSE:
            for start in range(0, heads, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                tl.store(lse_ptr + b.to(tl.int64) * stride_lse + offs, tl.full([BLOCK], float("-inf"), dtype=tl.float32),
                         mask=offs < heads)
