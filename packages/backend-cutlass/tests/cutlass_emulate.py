"""A torch model of what one CUTLASS entry point computes from the arguments it is given.

It reads the operands only through what the C call receives: data pointers (here: each tensor's
storage and offset), the layout word compiled into the kernel, leading dimensions, and the problem
size (m, n, k). It writes the output buffer the way the kernel's epilogue does. Running a
:class:`~kernel_switchboard_cutlass.gemm.Launch` through it on CPU tensors checks the translation
(padding, transposes, scale layouts, per-group pointers) against the reference kernels.
"""

from __future__ import annotations

import torch

from kernel_switchboard_cutlass.gemm import Launch
from kernel_switchboard_cutlass.operands import Operand

BLOCK = 128


def _matrix(op: Operand, rows: int, cols: int, offset: int = 0) -> torch.Tensor:
    """The (rows, cols) matrix a kernel reads through ``op``'s base pointer (+ offset elements) and ld."""
    t = op.tensor
    stride = (op.ld, 1) if op.layout == "row" else (1, op.ld)
    view = torch.as_strided(t, (rows, cols), stride, t.storage_offset() + offset)
    return view.float()


def _store(job: Launch, rows: slice, value: torch.Tensor) -> None:
    d = job.d
    assert d.stride(1) == 1, "the epilogue writes a row-major output"
    d[rows, : job.n] = value.to(d.dtype)


def run(job: Launch) -> None:
    """Compute what the C call would, writing ``job.d``."""
    if job.fn == "ksb_grouped":
        _grouped(job)
        return
    a = _matrix(job.a, job.m, job.k)
    b = _matrix(job.b, job.k, job.n)
    if job.fn == "ksb_gemm_block":
        sfa, sfb = job.extra
        assert sfa is not None and sfb is not None
        kb = -(-job.k // BLOCK)
        assert sfa.shape == (kb, job.m) and sfa.is_contiguous(), "SFA is M-major (K/128, M)"
        assert sfb.shape == (-(-job.n // BLOCK), kb) and sfb.is_contiguous(), "SFB is K-major (N/128, K/128)"
        acc = torch.zeros(job.m, job.n)
        for i in range(kb):
            blk = slice(i * BLOCK, min((i + 1) * BLOCK, job.k))
            col_scale = sfb[:, i].repeat_interleave(BLOCK)[: job.n]
            acc += (a[:, blk] @ b[blk, :]) * sfa[i][:, None] * col_scale[None, :]
        _store(job, slice(0, job.m), acc)
        return
    alpha = job.extra[0]
    acc = a @ b
    if alpha is not None:
        assert alpha.shape == (1,) and alpha.dtype == torch.float32
        acc = acc * alpha[0]
    _store(job, slice(0, job.m), acc)


def _grouped(job: Launch) -> None:
    offsets = job.extra[0]
    assert offsets is not None and offsets.dtype == torch.int32
    bounds = offsets.tolist()
    gstride = job.b.tensor.stride(0)
    for g in range(job.groups):
        lo, hi = bounds[g], bounds[g + 1]
        if hi == lo:
            continue
        a = _matrix(job.a, hi - lo, job.k, lo * job.a.ld)
        b = _matrix(job.b, job.k, job.n, g * gstride)
        _store(job, slice(lo, hi), a @ b)
