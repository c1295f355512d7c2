"""``flashinfer.gemm`` over the switchboard's ``gemm`` ops: :func:`bmm_fp8` (``gemm.mm_fp8`` per batch entry, e4m3,
per-tensor scales) and :class:`SegmentGEMMWrapper` (``gemm.grouped_mm``). ``backend`` names are accepted; the
switchboard ranks its own kernels."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import fail
from ..ops import gemm
from ._common import check_workspace, write_out

_FP8_BACKENDS = ("cudnn", "cublas", "cutlass", "cute-dsl", "auto")
_OUT_DTYPES = (torch.bfloat16, torch.float16)


def bmm_fp8(A: torch.Tensor, B: torch.Tensor, A_scale: torch.Tensor, B_scale: torch.Tensor, dtype: torch.dtype,
            out: torch.Tensor | None = None, backend: str = "cublas") -> torch.Tensor:
    """Batched scaled fp8 matmul: ``(A[i] * A_scale) @ (B[i] * B_scale)`` for A (b, m, k), B (b, k, n)
    float8_e4m3fn, per-tensor float32 scales -> (b, m, n) in ``dtype`` (bf16 or fp16). One ``gemm.mm_fp8`` per batch
    entry."""
    if backend not in _FP8_BACKENDS:
        raise fail("backend", backend, f"one of {_FP8_BACKENDS}")
    for name, t in (("A", A), ("B", B)):
        if not (isinstance(t, torch.Tensor) and t.dim() == 3):
            raise fail(name, type(t).__name__ if not isinstance(t, torch.Tensor) else tuple(t.shape), "a 3-d tensor")
        if t.dtype != torch.float8_e4m3fn:
            raise fail(f"{name}.dtype", t.dtype, "torch.float8_e4m3fn (e5m2 operands are not served)")
    if B.shape[0] != A.shape[0] or B.shape[1] != A.shape[2]:
        raise fail("B", tuple(B.shape), f"({A.shape[0]}, {A.shape[2]}, n) to match A {tuple(A.shape)}")
    if dtype not in _OUT_DTYPES:
        raise fail("dtype", dtype, "torch.bfloat16 or torch.float16")
    for name, s in (("A_scale", A_scale), ("B_scale", B_scale)):
        if not (isinstance(s, torch.Tensor) and s.numel() == 1):
            raise fail(name, type(s).__name__ if not isinstance(s, torch.Tensor) else tuple(s.shape),
                       "a one-element float32 tensor (per-tensor scale)")
    if out is None:
        out = torch.empty(A.shape[0], A.shape[1], B.shape[2], dtype=dtype, device=A.device)
    elif out.shape != (A.shape[0], A.shape[1], B.shape[2]) or out.dtype != dtype:
        raise fail("out", f"{tuple(out.shape)} {out.dtype}", f"({A.shape[0]}, {A.shape[1]}, {B.shape[2]}) {dtype}")
    scale_a, scale_b = A_scale.float().reshape(()), B_scale.float().reshape(())
    for i in range(A.shape[0]):
        out[i].copy_(gemm.mm_fp8(A[i], B[i], scale_a, scale_b, out_dtype=dtype))
    return out


class SegmentGEMMWrapper:
    """FlashInfer's segment GEMM: segment i of x (its rows ``seg_indptr[i]:seg_indptr[i+1]``) times weight i (or
    ``weights[weight_indices[i]]``), through ``gemm.grouped_mm``."""

    def __init__(self, float_workspace_buffer: torch.Tensor, backend: str = "auto") -> None:
        self._float_workspace_buffer = check_workspace(float_workspace_buffer)
        if backend not in ("auto", "sm80", "sm90"):
            raise fail("backend", backend, "one of ('auto', 'sm80', 'sm90')")
        self.backend = backend

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor) -> None:
        self._float_workspace_buffer = check_workspace(float_workspace_buffer)

    def run(self, x: torch.Tensor, weights: torch.Tensor, batch_size: int, weight_column_major: bool,
            out: torch.Tensor | None = None, seg_lens: torch.Tensor | None = None,
            seg_indptr: torch.Tensor | None = None, weight_indices: torch.Tensor | None = None) -> torch.Tensor:
        """y (rows, d_out) = each segment of x (rows, d_in) times its weight; weights (num_weights, d_in, d_out), or
        (num_weights, d_out, d_in) when ``weight_column_major``. Segments by ``seg_indptr`` (batch+1,) or
        ``seg_lens`` (batch,)."""
        if not (isinstance(weights, torch.Tensor) and weights.dim() == 3):
            raise fail("weights", type(weights).__name__ if not isinstance(weights, torch.Tensor) else tuple(weights.shape),
                       "a (num_weights, d_in, d_out) tensor")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise fail("batch_size", batch_size, "a positive int (the number of segments)")
        w = weights.transpose(1, 2) if weight_column_major else weights
        if weight_indices is not None:
            w = w.index_select(0, weight_indices.to(w.device).long())
        elif w.shape[0] < batch_size:
            raise fail("weights", tuple(weights.shape), f"at least batch_size = {batch_size} weights")
        w = w[:batch_size]
        offsets = _offsets(seg_lens, seg_indptr, batch_size, x.device)
        y = gemm.grouped_mm(x, w, offsets)
        return write_out(out, y)

    forward = run


def _offsets(seg_lens: Any, seg_indptr: Any, batch: int, device: torch.device) -> torch.Tensor:
    if seg_indptr is not None:
        offsets = seg_indptr
    elif seg_lens is not None:
        lens = seg_lens.to(device)
        offsets = torch.cat((lens.new_zeros(1), torch.cumsum(lens, 0)))
    else:
        raise fail("seg_lens/seg_indptr", None, "one of them: the segments' lengths or their indptr")
    if not (isinstance(offsets, torch.Tensor) and offsets.shape == (batch + 1,)):
        raise fail("seg_indptr", type(offsets).__name__ if not isinstance(offsets, torch.Tensor) else tuple(offsets.shape),
                   f"a ({batch + 1},) tensor")
    return offsets.to(device, torch.int32).contiguous()
