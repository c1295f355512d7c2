"""Kernel configurations (what one compiled .so contains) and the shape heuristics that pick one.

A :class:`GemmConfig` fixes everything that is a template argument: the kind of GEMM, element
types, operand layouts, CTA tile, cluster shape and warp-specialised schedule. Its ``name`` is
readable and unique; the builder's cache key adds the toolchain versions.

Layout words describe the switchboard's operands: ``a`` is (M, K) and ``b`` is (K, N), each
``"row"`` (last dim contiguous) or ``"col"`` (first dim contiguous). The output is (M, N) row-major.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

KINDS = ("mm", "mm_fp8_block", "mm_fp8_tensor", "grouped_mm")
SCHEDULES = ("cooperative", "pingpong")
DTYPES = ("bf16", "fp16", "e4m3")
OUT_DTYPES = ("bf16", "fp16", "fp32")
LAYOUTS = ("row", "col")


@dataclass(frozen=True)
class GemmConfig:
    """Template arguments of one CUTLASS 3.x Hopper GEMM."""

    kind: str
    dtype: str  # operand element type
    out_dtype: str  # output element type
    layout_a: str
    layout_b: str
    tile: tuple[int, int, int]
    cluster: tuple[int, int, int]
    schedule: str
    #: fp8: fold K tile k - 1 into the output while tile k's MMAs run (``overlap_promotion.hpp``)
    overlap_promotion: bool = False
    #: split K over this many CTAs per output tile (CUTLASS's stream-K scheduler in split-K mode; the partial
    #: accumulators meet in the workspace): fills the GPU when the output has fewer tiles than it has SMs
    split_k: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"GemmConfig.kind={self.kind!r}: expected one of {KINDS}")
        if self.schedule not in SCHEDULES:
            raise ValueError(f"GemmConfig.schedule={self.schedule!r}: expected one of {SCHEDULES}")
        if self.dtype not in DTYPES or self.out_dtype not in OUT_DTYPES:
            raise ValueError(f"GemmConfig dtypes {self.dtype}/{self.out_dtype}: operands one of {DTYPES}, "
                             f"output one of {OUT_DTYPES}")
        if self.layout_a not in LAYOUTS or self.layout_b not in LAYOUTS:
            raise ValueError(f"GemmConfig layouts {self.layout_a}/{self.layout_b}: expected one of {LAYOUTS}")
        if self.schedule == "cooperative" and self.tile[0] < 128:
            raise ValueError(f"GemmConfig.tile={self.tile}: the cooperative schedule needs a tile M of at least 128")
        if self.dtype == "e4m3" and (self.layout_a, self.layout_b) != ("row", "col"):
            raise ValueError("fp8 GEMMs on Hopper need K-major operands: layout_a='row', layout_b='col'")
        if self.overlap_promotion and (self.kind not in ("mm_fp8_block", "mm_fp8_tensor")
                                       or (self.schedule, self.tile[2]) != ("cooperative", 128)):
            raise ValueError(f"GemmConfig.overlap_promotion: only for kinds 'mm_fp8_block' / 'mm_fp8_tensor' with the "
                             f"cooperative schedule and a tile K of 128 (one promotion), not {self.kind} "
                             f"{self.schedule} {self.tile}")
        if self.split_k < 1 or (self.split_k > 1 and (self.schedule != "cooperative" or self.overlap_promotion
                                                       or self.kind == "grouped_mm")):
            raise ValueError(f"GemmConfig.split_k={self.split_k}: at least 1; above 1 only with the cooperative "
                             f"schedule, CUTLASS's own mainloop and one problem (not {self.kind} {self.schedule}"
                             f"{' with overlap_promotion' if self.overlap_promotion else ''})")

    @property
    def name(self) -> str:
        t = "x".join(map(str, self.tile))
        c = "x".join(map(str, self.cluster[:2]))
        lay = self.layout_a[0] + self.layout_b[0]
        sched = "coop" if self.schedule == "cooperative" else "pp"
        ovl = "_ovl" if self.overlap_promotion else ""
        split = f"_sk{self.split_k}" if self.split_k > 1 else ""
        return f"{self.kind}_{self.dtype}_{self.out_dtype}_{lay}_{t}_c{c}_{sched}{ovl}{split}"


#: one validated instance per distinct set of template arguments: a call's configuration is looked up, not rebuilt
#: and re-validated (the heuristics run on every eager call)
_config = functools.lru_cache(maxsize=None)(GemmConfig)


def _mm(dtype: str, la: str, lb: str, tile: tuple[int, int, int], cluster: tuple[int, int, int], sched: str) -> GemmConfig:
    return _config("mm", dtype, dtype, la, lb, tile, cluster, sched)


#: bf16/fp16 mm tiles, by name of the role each plays in :func:`mm_config`
MM_TILES: dict[str, tuple[tuple[int, int, int], tuple[int, int, int], str]] = {
    "large": ((128, 256, 64), (2, 1, 1), "cooperative"),
    "medium": ((128, 128, 64), (1, 2, 1), "cooperative"),
    "small_m": ((64, 128, 64), (1, 1, 1), "pingpong"),
}


def mm_configs(dtype: str, layout_a: str, layout_b: str) -> list[GemmConfig]:
    """Every bf16/fp16 mm configuration offered for these operand layouts."""
    return [_mm(dtype, layout_a, layout_b, *MM_TILES[role]) for role in MM_TILES]


def mm_role(m: int, n: int, sm_count: int = 132) -> str:
    """Which mm tile fits an (m, n) output: small M -> 64-row pingpong tiles; enough 128x256 tiles to
    fill the GPU -> the large cooperative tile; otherwise the 128x128 tile (more CTAs)."""
    if m <= 64:
        return "small_m"
    tiles_large = -(-m // 128) * -(-n // 256)
    return "large" if tiles_large >= sm_count else "medium"


def mm_config(dtype: str, layout_a: str, layout_b: str, m: int, n: int, sm_count: int = 132) -> GemmConfig:
    """The configuration for one mm call. ``KSB_CUTLASS_MM_TILE`` (large | medium | small_m) forces a tile."""
    role = os.environ.get("KSB_CUTLASS_MM_TILE") or mm_role(m, n, sm_count)
    if role not in MM_TILES:
        raise ValueError(f"KSB_CUTLASS_MM_TILE={role!r}: expected one of {sorted(MM_TILES)}")
    return _mm(dtype, layout_a, layout_b, *MM_TILES[role])


#: fp8 block-scaled tiles by role (:func:`fp8_role` picks the default); ``coop``, ``coop_c2x1`` and
#: ``coop_sk2`` are candidates the benchmark measures (``KSB_CUTLASS_FP8_BLOCK_TILE`` forces one). At M = 128 the
#: 64-row tiles make two tile rows, so N = 8192 gives 128 programs for the 132 SMs where 128-row tiles give 64.
#: ``coop_c2x1_ovl`` is coop_c2x1 with the promotion overlapped (``overlap_promotion.hpp``): on the H200 at 8192^3
#: (swizzle 8, timed in turn against torch._scaled_mm per-tensor) it is the faster of the two and comes close to
#: torch's per-tensor kernel, but up to 1024 rows it ran far slower than 128-row tiles without a cluster
#: (docs/benchmarks.md). All pass GPU conformance with clusters cut by the problem's edge (M = 333, 1100).
#: ``coop_sk2`` splits K in two: at M = 128 and N = 8192 the 128x128 tiles are 64, half the H100's SMs; two K halves
#: make 128 work units, yet on an H100 it ran 50.8 us against ``coop``'s 46.0 there (43.5 against 20.7 at
#: 128x7168x2048; faster only at 128x2112x7168, 29.7 against 32.3), so no role picks it. Not offered: 64x128x128
#: pingpong with a 1x2 cluster (slower) and 128x256x128 cooperative (nvcc rejects it).
FP8_BLOCK_TILES: dict[str, tuple[tuple[int, int, int], tuple[int, int, int], str, bool, int]] = {
    "small_m": ((64, 128, 128), (1, 1, 1), "pingpong", False, 1),
    "coop": ((128, 128, 128), (1, 2, 1), "cooperative", False, 1),
    "coop_c2x1": ((128, 128, 128), (2, 1, 1), "cooperative", False, 1),
    "coop_c1x1": ((128, 128, 128), (1, 1, 1), "cooperative", False, 1),
    "coop_c2x1_ovl": ((128, 128, 128), (2, 1, 1), "cooperative", True, 1),
    "coop_sk2": ((128, 128, 128), (1, 2, 1), "cooperative", False, 2),
}


def _fp8_config(kind: str, tiles: dict[str, Any], variable: str, out_dtype: str, role: str | None,
                default: str) -> GemmConfig:
    """The fp8 ``kind`` configuration of tile ``role``, else of the one ``variable`` forces, else of ``default``."""
    role = role or os.environ.get(variable) or default
    if role not in tiles:
        raise ValueError(f"{variable}={role!r}: expected one of {sorted(tiles)}")
    return _config(kind, "e4m3", out_dtype, "row", "col", *tiles[role])


def fp8_role(m: int, n: int | None = None, sm_count: int = 132) -> str:
    """The default fp8 tile for an (m, n) output, block-scaled or per-tensor alike: 64-row tiles while 128-row ones
    would leave more than half the SMs idle (up to 128 rows, or an N so small that the 128x128 tiles number under
    half the SMs); 128-row tiles without a cluster up to 1024 rows; the overlapped 2x1-cluster tile beyond (``n``
    None: a wide output). Measured on an H100 for both scale modes (docs/benchmarks.md)."""
    if m <= 128 or (n is not None and -(-m // 128) * -(-n // 128) < sm_count // 2):
        return "small_m"
    return "coop_c1x1" if m <= 1024 else "coop_c2x1_ovl"


def fp8_block_config(out_dtype: str, m: int, role: str | None = None, n: int | None = None) -> GemmConfig:
    """DeepSeek-style fp8 GEMM with 1x128 (A) and 128x128 (B) float32 scales; ``role`` (else
    ``KSB_CUTLASS_FP8_BLOCK_TILE``, else :func:`fp8_role` of ``m`` and ``n``) names one of
    ``FP8_BLOCK_TILES``."""
    return _fp8_config("mm_fp8_block", FP8_BLOCK_TILES, "KSB_CUTLASS_FP8_BLOCK_TILE", out_dtype, role,
                       fp8_role(m, n))


#: fp8 per-tensor tiles by role, as ``FP8_BLOCK_TILES`` (``KSB_CUTLASS_FP8_TENSOR_TILE`` forces one). CUTLASS's fp8
#: mainloop keeps a second accumulator to promote into every 128 of K, so the large-M tile is 128x128, as for block
#: scales: at 128x256 the two 128-float accumulators spill 1,412 bytes a thread (ptxas), which makes that tile
#: slow. ``coop_c2x1_ovl``, the large-M default, overlaps the promotion (``overlap_promotion.hpp``): on the H200 at
#: 8192^3 it is faster than ``coop_c2x1`` and close to torch._scaled_mm, timed in turn.
FP8_TENSOR_TILES: dict[str, tuple[tuple[int, int, int], tuple[int, int, int], str, bool, int]] = {
    "small_m": ((64, 128, 128), (1, 1, 1), "pingpong", False, 1),
    "coop_c1x1": ((128, 128, 128), (1, 1, 1), "cooperative", False, 1),
    "coop_c2x1": ((128, 128, 128), (2, 1, 1), "cooperative", False, 1),
    "coop_c2x1_ovl": ((128, 128, 128), (2, 1, 1), "cooperative", True, 1),
}


def fp8_tensor_config(out_dtype: str, m: int, role: str | None = None, n: int | None = None) -> GemmConfig:
    """fp8 GEMM with one float32 scale per operand (folded into the epilogue's alpha); ``role`` (else
    ``KSB_CUTLASS_FP8_TENSOR_TILE``, else :func:`fp8_role` of ``m`` and ``n``) names one of ``FP8_TENSOR_TILES``."""
    return _fp8_config("mm_fp8_tensor", FP8_TENSOR_TILES, "KSB_CUTLASS_FP8_TENSOR_TILE", out_dtype, role,
                       fp8_role(m, n))


def grouped_config(dtype: str, layout_b: str) -> GemmConfig:
    """Ptr-array grouped GEMM (one problem per expert): a row-major, b (G, K, N) row or col."""
    return _config("grouped_mm", dtype, dtype, "row", layout_b, (128, 128, 64), (1, 2, 1), "cooperative")
