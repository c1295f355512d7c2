"""Output rows of requests with no cached token: ``out`` 0 and ``lse`` -inf, the ops' convention.

Vendor decode kernels (cuDNN, TensorRT-LLM's XQA) leave those rows undefined (NaN on the H200), and
engines pad CUDA-graph batches with such requests, so their backends call :func:`zero_empty_requests`
after the kernel. With Triton installed it is one launch (~1 us in a CUDA graph on the H200: XQA B=16 L=2048
page 64 48.7 us without it, 49.8 with it), else two torch ops. Device work only: capturable once
compiled; plans call :func:`prepare` so that their first run may be inside a capture.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .availability import triton_interpreting
from .device import is_capturing


def zero_empty_requests(seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None = None) -> None:
    """seq_lens (B,) int32; out (B, ...) any float dtype; lse (B, H) float32 or None: in place.

    Inside a CUDA-graph capture the one launch is used only when its kernel was compiled for these
    arguments before (by :func:`prepare` or an earlier call): Triton must not compile while capturing."""
    kernel = _triton_kernel()
    if kernel is not None and _one_launch_fits(seq_lens, out, lse):
        key = _signature(seq_lens, out, lse)
        if key in _compiled or not is_capturing():
            _launch(kernel, seq_lens, out, lse)
            _compiled.add(key)
            return
    empty = (seq_lens == 0).view(-1, *([1] * (out.dim() - 1)))
    out.masked_fill_(empty, 0.0)
    if lse is not None:
        lse.masked_fill_(empty.view(-1, *([1] * (lse.dim() - 1))), float("-inf"))


def prepare(device: torch.device, dtype: torch.dtype, row_shape: tuple[int, ...], lse_heads: int | None) -> None:
    """Compile the one-launch kernel now for contiguous (B, *row_shape) outputs in ``dtype`` (and (B, lse_heads)
    LSE), so that a plan's first run may be inside a CUDA-graph capture. A no-op without Triton or off CUDA."""
    request = (device, dtype, row_shape, lse_heads)
    if device.type != "cuda" or _triton_kernel() is None or request in _prepared:
        return
    out = torch.zeros((1, *row_shape), dtype=dtype, device=device)
    lse = torch.zeros((1, lse_heads), dtype=torch.float32, device=device) if lse_heads is not None else None
    zero_empty_requests(torch.ones(1, dtype=torch.int32, device=device), out, lse)
    _prepared.add(request)


def _signature(seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None) -> tuple[Any, ...]:
    """What Triton specialises the kernel on: dtypes, sizes and strides, 16-byte alignment of the pointers."""
    lse_part = (lse.shape[1], lse.stride(0), lse.data_ptr() % 16 == 0) if lse is not None else None
    return (out.device, out.dtype, seq_lens.dtype, tuple(out.shape[1:]), out.stride(0), out.data_ptr() % 16 == 0,
            seq_lens.data_ptr() % 16 == 0, lse_part)


#: signatures the kernel was launched with (so compiled), outside any capture; and what prepare() was asked
_compiled: set[tuple[Any, ...]] = set()
_prepared: set[tuple[Any, ...]] = set()


def _one_launch_fits(seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None) -> bool:
    """Triton can run on these tensors and each row of out (and of lse) is one contiguous run of elements."""
    if not (out.is_cuda or triton_interpreting()) or out.dim() < 2 or out.shape[0] != seq_lens.shape[0]:
        return False
    rows_contiguous = out.shape[0] == 0 or out[0].is_contiguous()
    return rows_contiguous and seq_lens.is_contiguous() and (lse is None or (lse.dim() == 2 and lse.stride(1) == 1))


def _launch(kernel: Any, seq_lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor | None) -> None:
    batch = out.shape[0]
    if batch == 0:
        return
    row = out[0].numel()
    heads = lse.shape[1] if lse is not None else 1
    kernel[(batch,)](seq_lens, out, lse if lse is not None else out, row, out.stride(0), heads,
                     lse.stride(0) if lse is not None else 0, HAS_LSE=lse is not None, BLOCK=1024)


@functools.cache
def _triton_kernel() -> Any:
    """The one-launch kernel (:mod:`._empty_rows_kernel`, imported on first use), or None without Triton."""
    try:
        from ._empty_rows_kernel import zero_empty_kernel
    except ImportError:
        return None
    return zero_empty_kernel
