"""Records of the Triton GEMM kernels (launchers in :mod:`..gemm`): bf16/fp16/fp32 ``mm``, fp8 ``mm_fp8``
(per-tensor, row/column and 128x128 block scales) and ``grouped_mm`` over row segments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.availability import triton_interpreting

from .._common import BACKEND, DEVICES, PRIORITY, gluon_findable
from .._gemm_tiles import fp8_gpu_tiles
from .._perf import compute_bound, on_gpu
from . import launcher

DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32})
FP8 = frozenset({torch.float8_e4m3fn})
FP8_OUT = frozenset({torch.bfloat16, torch.float16, torch.float32})
#: rounded sustained rates of these kernels on the H200 at 8192^3 (grouped: DeepSeek-V3's experts); fp8 by scale
#: mode below
RATE = {"mm": 720e12, "grouped_mm": 240e12}
#: fp8 by scale mode, as RATE. Block scales: the sm_90 Gluon kernel's rate depends on scale_b's layout (a checkpoint's
#: transposed (N/128, K/128) view runs faster than a row-major (K/128, N/128) one) and on the size: with the faster
#: layout it nears 1000e12 only at 8192^3, and from 256 to 2048 rows it sustained 650-920e12 (docs/benchmarks.md),
#: where CUTLASS's kernels ran faster; the rate is set for that range, as for the other kernels' block scales
FP8_RATE = {"tensor": 1050e12, "row_col": 1050e12, "block": 830e12}
_FEATURES = frozenset({"cuda_graph", "deterministic"})
#: mm and mm_fp8: a row's result does not depend on the other rows (fixed tiles in the batch-invariant scope)
_ROWS_FEATURES = _FEATURES | {"batch_invariant"}


def _gluon_block_fp8(problem: Any) -> bool:
    """Whether a block-scaled fp8 call on this problem's GPU would take the sm_90 Gluon kernel (as
    ``gemm.mm_fp8`` decides with :func:`.._common.gluon_hopper`, here without importing Triton)."""
    cc = getattr(problem, "cc", None)
    return (problem.scale_mode == "block" and on_gpu(problem) and cc is not None and cc[0] == 9
            and not triton_interpreting() and gluon_findable())


def _rate(name: str, problem: Any) -> float | None:
    """The rate kernel ``name`` reaches on ``problem`` (None: the shared table's, by dtype)."""
    if problem.dtype == torch.float32:
        return None
    if name != "mm_fp8":
        return RATE[name]
    return FP8_RATE[problem.scale_mode]


#: SMs of the H100 SXM and the H200, where the rates were measured
SMS = 132
#: rows from which fp8 calls with TMA-ready operands take the persistent TMA kernels (``gemm.TMA_MIN_M`` on a GPU;
#: block scales: the Gluon kernel); below it every fp8 call takes the pointer kernel with 64x128 tiles
TMA_MIN_M = 65
#: the Gluon block-fp8 kernel's output tile (``_gemm_gluon.BLOCK_M`` x ``BLOCK_N``)
GLUON_TILE = (128, 128)


def _tma_operands(problem: Any) -> bool:
    """Whether a call of this problem can take the TMA kernels: a row-major, b K-major, 16-byte aligned, sm_90+."""
    cc = getattr(problem, "cc", None)
    return problem.layout == "RC" and problem.align_bytes >= 16 and cc is not None and cc[0] >= 9


def _grid_fill(name: str, problem: Any) -> float:
    """The share of the SMs that an fp8 kernel's output tiles keep busy (at most 1). Each program runs a tile's whole
    K, so with fewer tiles than SMs the idle SMs neither compute nor stream B. Every fp8 kernel here falls short on
    decode-sized and skinny problems: the pointer kernel below ``TMA_MIN_M`` rows (one program per 64x128 tile: 64 of
    them at 64x8192), the Gluon block-fp8 kernel's persistent grid (one program per 128x128 tile up to one per SM: 64
    at 128x8192) and the TMA kernel's per-tensor tiles (128x128, or 256x128 above 128 rows: 64 at 256x8192). Without
    this share the roofline ranked them above CUTLASS's persistent kernels there, which ran faster
    (docs/benchmarks.md, "fp8 block GEMM" and "fp8 per-tensor GEMM tiles")."""
    if name != "mm_fp8" or not on_gpu(problem):
        return 1.0
    if problem.m >= TMA_MIN_M and _gluon_block_fp8(problem):
        block_m, block_n = GLUON_TILE
    else:
        tiles = fp8_gpu_tiles(problem.m, problem.n, problem.k, problem.scale_mode,
                              tma=problem.m >= TMA_MIN_M and _tma_operands(problem))
        block_m, block_n = tiles.block_m, tiles.block_n
    count = -(-problem.m // block_m) * -(-problem.n // block_n)
    return min(1.0, count / SMS)


def _cost(name: str) -> Callable[[Any], float]:
    """The cost estimate of kernel ``name``: a roofline at its measured rate (``_rate``), over the share of the SMs
    its tiles fill (``_grid_fill``)."""
    def cost(problem: Any) -> float:
        m, n, k = problem.m, problem.n, problem.k
        size_in = problem.dtype.itemsize
        nbytes = (m * k + k * n * (problem.groups or 1)) * size_in + m * n * problem.out_dtype.itemsize
        fill = _grid_fill(name, problem)
        return compute_bound(problem, 2.0 * m * n * k / fill, nbytes / fill, problem.dtype, rate=_rate(name, problem))

    return cost


def kernels() -> list[Kernel]:
    return [
        Kernel("gemm.mm", "mm", BACKEND, Capability(devices=DEVICES, dtypes=DTYPES, features=_ROWS_FEATURES),
               launcher("gemm:mm"), priority=PRIORITY, cost=_cost("mm"),
               doc="grouped-order tiled matmul, fixed tiles by shape, fp32 accumulation"),
        Kernel("gemm.mm_fp8", "mm_fp8", BACKEND,
               Capability(devices=DEVICES, min_cc=(8, 9), dtypes=FP8, out_dtypes=FP8_OUT, features=_ROWS_FEATURES,
                          allowed={"scale_mode": frozenset({"tensor", "row_col", "block"})}),
               launcher("gemm:mm_fp8"), priority=PRIORITY, cost=_cost("mm_fp8"),
               doc="e4m3 matmul; block scales applied per 128-wide K step in the accumulation loop (sm_90: the "
                   "warp-specialised Gluon kernel)"),
        Kernel("gemm.grouped_mm", "grouped_mm", BACKEND,
               Capability(devices=DEVICES, dtypes=DTYPES, features=_FEATURES), launcher("gemm:grouped_mm"),
               priority=PRIORITY, cost=_cost("grouped_mm"),
               doc="row-segment grouped matmul; group of each tile found in-kernel (no host sync)"),
    ]
