"""Matrix multiplication ops: ``gemm.mm``, ``gemm.mm_fp8``, ``gemm.grouped_mm``.

Kernel ``run`` signatures (operands are passed as given: any strides; the problem's ``layout`` and
``align_bytes`` say which):

- ``gemm.mm``: ``run(a, b) -> c``; a (M, K), b (K, N) fp16/bf16/fp32; c (M, N) contiguous, a's dtype,
  float32 accumulation. A ``bias`` given to :func:`mm` never reaches the kernel: the op adds it to c.
- ``gemm.mm_fp8``: ``run(a, b, scale_a, scale_b, scale_mode, out_dtype) -> c``; a (M, K), b (K, N)
  float8_e4m3fn; float32 scales by ``scale_mode``: "tensor": both 0-d; "row_col": scale_a (M, 1),
  scale_b (1, N); "block": scale_a (M, ceil(K/128)) (1x128 groups along K), scale_b
  (ceil(K/128), ceil(N/128)) (128x128 blocks). c = (a * scale_a) @ (b * scale_b), (M, N) contiguous in
  out_dtype (bf16 default; fp16, fp32).
- ``gemm.grouped_mm``: ``run(a, b, offsets) -> c``; a (T, K), b (G, K, N), offsets (G+1,) int32 on the
  device, offsets[0] = 0, non-decreasing, offsets[G] = T; rows offsets[g]:offsets[g+1] of c are
  a[rows] @ b[g]; c (T, N) contiguous, a's dtype.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features

FP8_DTYPES = frozenset({torch.float8_e4m3fn})
FP8_OUT_DTYPES = frozenset({torch.bfloat16, torch.float16, torch.float32})
#: K and N extent of one scale in "block" mode
BLOCK = 128


class GemmProblem(NamedTuple):
    """Signature of a gemm call (all three ops)."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype  # a's (and b's) dtype
    out_dtype: torch.dtype
    m: int  # bucketed (T for grouped_mm)
    n: int  # bucketed
    k: int  # bucketed
    #: memory order of a then b (b's last two dims): "R" row-major, "C" column-major, "S" other; e.g. "RC"
    layout: str
    #: largest power of two <= 16 dividing the base addresses and the non-unit strides (bytes) of a and b
    align_bytes: int
    scale_mode: str | None  # mm_fp8: "tensor" | "row_col" | "block"
    groups: int | None  # grouped_mm: G, bucketed
    features: frozenset[str]


def _order(t: torch.Tensor) -> str:
    rows, cols = t.shape[-2], t.shape[-1]
    rs, cs = t.stride(-2), t.stride(-1)
    if (cs == 1 or cols <= 1) and (rs >= cols or rows <= 1):
        return "R"
    if (rs == 1 or rows <= 1) and (cs >= rows or cols <= 1):
        return "C"
    return "S"


def _align(*tensors: torch.Tensor) -> int:
    g = 0
    for t in tensors:
        g = math.gcd(g, t.data_ptr())
        for s in t.stride():
            if s != 1:
                g = math.gcd(g, s * t.element_size())
    return 16 if g == 0 else min(16, g & -g)


def _problem(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype, scale_mode: str | None = None,
             groups: int | None = None) -> GemmProblem:
    dev, cc = device_key(a)
    return GemmProblem(dev, cc, a.dtype, out_dtype, bucket(a.shape[0]), bucket(b.shape[-1]), bucket(a.shape[1]),
                       _order(a) + _order(b), _align(a, b), scale_mode, None if groups is None else bucket(groups),
                       graph_features(dev))


def _check_operands(a: torch.Tensor, b: torch.Tensor, dtypes: frozenset[torch.dtype], b_dims: int = 2) -> None:
    check_tensor(a, "a", dims=2, dtypes=dtypes)
    check_tensor(b, "b", dims=b_dims)
    if b.dtype != a.dtype:
        raise fail("b.dtype", b.dtype, f"a's dtype ({a.dtype})")
    check_same_device("b", b, "a", a)
    if b.shape[-2] != a.shape[1]:
        want = f"({a.shape[1]}, N)" if b_dims == 2 else f"(G, {a.shape[1]}, N)"
        raise fail("b.shape", tuple(b.shape), f"{want}: b's K must equal a's columns ({a.shape[1]})")


# -- mm ------------------------------------------------------------------------------------------------
def mm(a: torch.Tensor, b: torch.Tensor, *, bias: torch.Tensor | None = None, backend: BackendArg = None) -> torch.Tensor:
    """torch.mm: a (M, K) @ b (K, N) -> (M, N); fp16/bf16/fp32, same dtype and device, any strides.

    Accumulates in float32 (no TF32 for fp32 inputs in the reference); returns a's dtype.

    ``bias`` (N,) in a's dtype (a linear layer's bias, e.g. Qwen2's q/k/v): the op adds it to the kernel's
    product, ``c + bias`` in a's dtype, in place on the fresh product (one elementwise pass; under
    ``torch.compile`` an add that the compiler fuses with its neighbours). Kernels never see it, so every
    ``gemm.mm`` kernel serves biased calls; in fp16/bf16 the product is rounded before the add.
    """
    if bias is not None:
        _check_operands(a, b, FLOAT_DTYPES)
        _check_bias(bias, a, b)
    if torch.compiler.is_compiling():
        out: torch.Tensor = MM.compiled(a, b, backend)
        return out if bias is None else out + bias
    out = _mm_eager(a, b, backend)
    return out if bias is None else out.add_(bias)


def _check_bias(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    check_tensor(bias, "bias", dims=1)
    if bias.shape[0] != b.shape[1]:
        raise fail("bias.shape", tuple(bias.shape), f"({b.shape[1]},): one value per output column (b's N)")
    if bias.dtype != a.dtype:
        raise fail("bias.dtype", bias.dtype, f"a's dtype ({a.dtype})")
    check_same_device("bias", bias, "a", a)


def mm_call(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> tuple[GemmProblem]:
    """Validate an :func:`mm` call; its problem (the kernel's: a bias is added by the op, never by a kernel)."""
    _check_operands(a, b, FLOAT_DTYPES)
    if bias is not None:
        _check_bias(bias, a, b)
    return _problem(a, b, a.dtype),


def _mm_eager(a: torch.Tensor, b: torch.Tensor, backend: BackendArg) -> torch.Tensor:
    problem, = mm_call(a, b)
    out: torch.Tensor = select("gemm.mm", problem, backend).kernel.run(a, b)
    return out


# -- mm_fp8 --------------------------------------------------------------------------------------------
def scale_mode_of(scale_a: torch.Tensor, scale_b: torch.Tensor, m: int, n: int, k: int) -> str:
    """The mode the scale shapes select for an (M, K) @ (K, N) product; raises naming the scale that fits none."""
    if scale_a.numel() == 1 and scale_b.numel() == 1 and scale_a.dim() <= 2 and scale_b.dim() <= 2:
        return "tensor"
    sa, sb = tuple(scale_a.shape), tuple(scale_b.shape)
    kb, nb = -(-k // BLOCK), -(-n // BLOCK)
    if sa == (m, 1) and sb == (1, n):
        return "row_col"
    if sa == (m, kb) and sb == (kb, nb):
        return "block"
    of = f", for a (M, K) = {(m, k)} and b (K, N) = {(k, n)}"  # the shapes the scales must fit
    if sa == (m, 1) and kb != 1:
        raise fail("scale_b.shape", sb, f"(1, {n}) for per-column scales, as scale_a {sa} is per-row" + of)
    if sa == (m, 1):
        raise fail("scale_b.shape", sb, f"(1, {n}) (row_col) or (1, {nb}) (block)" + of)
    if sa == (m, kb):
        raise fail("scale_b.shape", sb, f"({kb}, {nb}): 128x128 block scales, as scale_a {sa} has 1x128 groups" + of)
    if scale_a.numel() == 1:
        raise fail("scale_b.shape", sb, "a 1-element tensor (per-tensor), as scale_a is one" + of)
    raise fail("scale_a.shape", sa, f"() or (1,) (tensor), ({m}, 1) (row_col) or ({m}, {kb}) (block)" + of)


def mm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, *,
           out_dtype: torch.dtype = torch.bfloat16, backend: BackendArg = None) -> torch.Tensor:
    """Scaled fp8 matmul: (a * scale_a) @ (b * scale_b) -> (M, N) in ``out_dtype``.

    a (M, K), b (K, N) float8_e4m3fn; float32 scales whose shapes choose the mode: both 1-element
    ("tensor"), scale_a (M, 1) with scale_b (1, N) ("row_col"), or scale_a (M, ceil(K/128)) with scale_b
    (ceil(K/128), ceil(N/128)) ("block", DeepSeek-V3 style). out_dtype: bfloat16, float16 or float32.
    """
    if torch.compiler.is_compiling():
        return MM_FP8.compiled(a, b, scale_a, scale_b, out_dtype, backend)  # type: ignore[no-any-return]
    return _mm_fp8_eager(a, b, scale_a, scale_b, out_dtype, backend)


def mm_fp8_call(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                out_dtype: torch.dtype = torch.bfloat16) -> tuple[GemmProblem, str, torch.Tensor, torch.Tensor]:
    """Validate an :func:`mm_fp8` call: its problem, the scale mode and the scales as the kernels take them."""
    _check_operands(a, b, FP8_DTYPES)
    check_tensor(scale_a, "scale_a", dtypes=frozenset({torch.float32}))
    check_tensor(scale_b, "scale_b", dtypes=frozenset({torch.float32}))
    check_same_device("scale_a", scale_a, "a", a)
    check_same_device("scale_b", scale_b, "a", a)
    if out_dtype not in FP8_OUT_DTYPES:
        raise fail("out_dtype", out_dtype, f"one of {sorted(str(d) for d in FP8_OUT_DTYPES)}")
    mode = scale_mode_of(scale_a, scale_b, a.shape[0], b.shape[1], a.shape[1])
    if mode == "tensor":
        scale_a, scale_b = scale_a.reshape(()), scale_b.reshape(())
    return _problem(a, b, out_dtype, mode), mode, scale_a, scale_b


def _mm_fp8_eager(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  out_dtype: torch.dtype, backend: BackendArg) -> torch.Tensor:
    problem, mode, scale_a, scale_b = mm_fp8_call(a, b, scale_a, scale_b, out_dtype)
    out: torch.Tensor = select("gemm.mm_fp8", problem, backend).kernel.run(a, b, scale_a, scale_b, mode, out_dtype)
    return out


# -- grouped_mm ----------------------------------------------------------------------------------------
def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, *, backend: BackendArg = None) -> torch.Tensor:
    """Row-grouped matmul: rows offsets[g]:offsets[g+1] of a (T, K) times b[g] (K, N) -> c (T, N).

    b (G, K, N) in a's dtype (fp16/bf16/fp32); offsets (G+1,) int32 on a's device. offsets[0] = 0,
    non-decreasing, offsets[G] = T is checked with one device-to-host copy of offsets (a sync on a
    GPU), skipped while a CUDA graph is being captured.
    """
    if torch.compiler.is_compiling():
        return GROUPED_MM.compiled(a, b, offsets, backend)  # type: ignore[no-any-return]
    return _grouped_eager(a, b, offsets, backend)


def _check_offsets(offsets: torch.Tensor, rows: int) -> None:
    """offsets[0] = 0, non-decreasing, offsets[-1] = rows; one device-to-host copy."""
    values = offsets.tolist()
    if values[0] != 0 or values[-1] != rows or any(x > y for x, y in itertools.pairwise(values)):
        shown = values if len(values) <= 9 else [*values[:4], "...", *values[-4:]]
        raise fail("offsets", shown, f"non-decreasing row offsets from 0 to {rows} (a's rows)")


def grouped_mm_call(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> tuple[GemmProblem]:
    """Validate a :func:`grouped_mm` call (offsets: one host read, none in a capture); its problem."""
    _check_operands(a, b, FLOAT_DTYPES, b_dims=3)
    groups = b.shape[0]
    check_tensor(offsets, "offsets", dims=1, dtypes=frozenset({torch.int32}))
    if offsets.shape[0] != groups + 1:
        raise fail("offsets.shape", tuple(offsets.shape), f"({groups + 1},): G+1 with G = b.shape[0]")
    check_same_device("offsets", offsets, "a", a)
    problem = _problem(a, b, a.dtype, groups=groups)
    if "cuda_graph" not in problem.features:
        _check_offsets(offsets, a.shape[0])
    return problem,


def _grouped_eager(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor, backend: BackendArg) -> torch.Tensor:
    problem, = grouped_mm_call(a, b, offsets)
    out: torch.Tensor = select("gemm.grouped_mm", problem, backend).kernel.run(a, b, offsets)
    return out


# -- specs ---------------------------------------------------------------------------------------------
_BACKEND = Arg("backend", "backend")
MM = define(OpSpec(
    "gemm.mm", mm, GemmProblem, mm_call, reference="mm", cases="gemm", op="mm", args=(Arg("a"), Arg("b"), _BACKEND),
    fake=lambda a, b, backend: a.new_empty((a.shape[0], b.shape[1])),
))
MM_FP8 = define(OpSpec(
    "gemm.mm_fp8", mm_fp8, GemmProblem, mm_fp8_call, reference="mm_fp8", cases="gemm", op="mm_fp8",
    args=(Arg("a"), Arg("b"), Arg("scale_a"), Arg("scale_b"), Arg("out_dtype", "dtype"), _BACKEND),
    fake=lambda a, b, sa, sb, out_dtype, backend: a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype),
))
GROUPED_MM = define(OpSpec(
    "gemm.grouped_mm", grouped_mm, GemmProblem, grouped_mm_call, reference="grouped_mm", cases="gemm",
    op="grouped_mm", args=(Arg("a"), Arg("b"), Arg("offsets"), _BACKEND),
    fake=lambda a, b, offsets, backend: a.new_empty((a.shape[0], b.shape[2])),
))
