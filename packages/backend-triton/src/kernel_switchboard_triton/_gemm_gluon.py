"""fp8 matmul with DeepSeek 128x128 block scales in Gluon (Triton's explicit-layout dialect), Hopper only.

Why a second kernel: Triton's block-scaled kernel keeps its two warpgroups in step (one program, shared loop),
so while one scales a K step's product into its float32 accumulator the tensor cores idle. Here the work is split
into warp-specialised partitions that meet only at mbarriers (DeepGEMM's structure): one warp issues the TMA
loads of a ring of ``STAGES`` (A, B) tiles, two consumer warpgroups each own 64 rows of the 128 x 128 output tile
(wgmma, wait, free the stage, scale the product into the accumulator), and one warp stores finished tiles with
TMA. The consumers drift apart, so one's MMAs run while the other scales, and the next tile's loads run under
this tile's epilogue. Programs are persistent (one per SM, tiles in grouped order).

``gemm.mm_fp8`` routes 128x128 block-scaled problems with TMA-ready operands on sm_90 here (``gemm.GLUON_FP8``).
On the H200 at 8192^3 it runs faster than Triton's block-scaled kernel and below torch._scaled_mm per-tensor; other
stage counts and tile-row groups than the default 4 stages time within the run-to-run spread, and 128x256 tiles (two
128-column accumulators) spill and run at under half the rate. A one-partition kernel (a ``wgmma.wait_group 1``
overlap instead of warp specialisation) ran about a third slower.

A K step's scale loads are issued after its MMAs (in the SASS, the ``FMUL`` of the three scales follows the four
``QGMMA``, Triton 3.6 and 3.9): issued before them, each step's MMAs waited for its scales to arrive, and a
row-major scale_b (K/128, N/128) is a new 128-byte line every step (an L1 miss), where the transposed view a
checkpoint's (N/128, K/128) scales give stays in one line for 32 steps. Host ptxas sm_90 (Triton 3.6): 168
registers at launch, no spills, 164 KB of shared memory with 4 stages.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._attn_common import sm_count

#: TMA copies: Triton 3.6 (the H200 image) names them async_copy_*; 3.7+ async_load / async_store
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global

BLOCK_M = gl.constexpr(128)  # output rows per tile: two consumer warpgroups of 64
BLOCK_N = gl.constexpr(128)  # output columns per tile: one scale_b block
BLOCK_K = gl.constexpr(128)  # K per step: one scale block


@gluon.jit
def _tile_coords(tile, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of tile ``tile`` in grouped order (GROUP_M tile rows share columns of b in L2); the twin of
    ``_gemm_kernels._tile_coords`` (a Gluon kernel cannot call a ``triton.jit`` helper)."""
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (tile // per_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@gluon.jit
def _my_tiles(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """Tiles of this persistent program: program_id, program_id + programs, ..."""
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    return gl.cdiv(num_tiles - gl.program_id(0), gl.num_programs(0))


@gluon.jit
def _loader(p):
    """Worker (1 warp): TMA loads of every K step of every tile into the ring, a stage once both consumers freed
    it. (Every partition takes the kernel's argument tuple ``p`` and unpacks all of it.)"""
    a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, strides, a_smem, b_smem, c_smem, bars, GROUP_M = p  # noqa: RUF059
    ready, empty, c_ready, c_empty = bars  # noqa: RUF059
    STAGES: gl.constexpr = a_smem.shape[0]
    steps = gl.cdiv(K, BLOCK_K)
    g = 0
    for local in range(_my_tiles(M, N, BLOCK_M, BLOCK_N)):
        pid_m, pid_n = _tile_coords(gl.program_id(0) + local * gl.num_programs(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for ks in range(steps):
            slot = g % STAGES
            mbarrier.wait(empty.index(slot), ((g // STAGES) & 1) ^ 1)  # a fresh barrier passes phase 1
            bar = ready.index(slot)
            mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(a_desc, [pid_m * BLOCK_M, ks * BLOCK_K], bar, a_smem.index(slot))
            _tma_load(b_desc, [pid_n * BLOCK_N, ks * BLOCK_K], bar, b_smem.index(slot))
            g += 1


@gluon.jit
def _storer(p):
    """Worker (1 warp): TMA stores of each consumer's finished 64-row half tile."""
    a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, strides, a_smem, b_smem, c_smem, bars, GROUP_M = p  # noqa: RUF059
    ready, empty, c_ready, c_empty = bars  # noqa: RUF059
    HALF: gl.constexpr = c_desc.block_type.shape[0]
    for local in range(_my_tiles(M, N, BLOCK_M, BLOCK_N)):
        pid_m, pid_n = _tile_coords(gl.program_id(0) + local * gl.num_programs(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        for wg in gl.static_range(2):
            mbarrier.wait(c_ready.index(wg), local & 1)
            _tma_store(c_desc, [pid_m * BLOCK_M + wg * HALF, pid_n * BLOCK_N], c_smem.index(wg))
        tma.store_wait(pendings=0)
        for wg in gl.static_range(2):
            mbarrier.arrive(c_empty.index(wg), count=1)


@gluon.jit
def _consume(p, WG: gl.constexpr):
    """Consumer warpgroup ``WG`` (4 warps): rows [WG * 64, WG * 64 + 64) of each tile. Per K step: wait for the
    stage, wgmma into a fresh product, wait for it, free the stage, add product * scale_a[row] * scale_b to the
    float32 accumulator. Then the half tile goes through shared memory to the storer."""
    a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, strides, a_smem, b_smem, c_smem, bars, GROUP_M = p  # noqa: RUF059
    ready, empty, c_ready, c_empty = bars  # noqa: RUF059
    stride_sam, stride_sak, stride_sbk, stride_sbn = strides
    STAGES: gl.constexpr = a_smem.shape[0]
    HALF: gl.constexpr = c_desc.block_type.shape[0]
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                     instr_shape=[16, BLOCK_N, 32])
    steps = gl.cdiv(K, BLOCK_K)
    g = 0
    product = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=layout)
    for local in range(_my_tiles(M, N, BLOCK_M, BLOCK_N)):
        pid_m, pid_n = _tile_coords(gl.program_id(0) + local * gl.num_programs(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows = pid_m * BLOCK_M + WG * HALF + gl.arange(0, HALF, layout=gl.SliceLayout(1, layout))
        sa_rows = sa_ptr + rows * stride_sam
        sb_col = sb_ptr + pid_n * stride_sbn  # one 128-column scale block per tile
        acc = gl.zeros((HALF, BLOCK_N), dtype=gl.float32, layout=layout)
        for ks in range(steps):
            slot = g % STAGES
            mbarrier.wait(ready.index(slot), (g // STAGES) & 1)
            product = warpgroup_mma(a_smem.index(slot).slice(WG * HALF, HALF), b_smem.index(slot).permute((1, 0)),
                                    product, use_acc=False, is_async=True)
            # the scales are loaded once the MMAs are issued: loaded before, their product was computed before the
            # first wgmma (SASS), so every K step's MMAs waited for a global load
            scale = gl.load(sa_rows + ks * stride_sak, mask=rows < M, other=0.0) * gl.load(sb_col + ks * stride_sbk)
            product = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
            mbarrier.arrive(empty.index(slot), count=1)
            acc += product * scale[:, None]
            g += 1
        mbarrier.wait(c_empty.index(WG), (local & 1) ^ 1)  # the storer is done with the previous tile's half
        c_smem.index(WG).store(acc.to(c_desc.dtype))
        fence_async_shared()
        mbarrier.arrive(c_ready.index(WG), count=1)



@gluon.jit
def mm_fp8_block_kernel(
    a_desc,  # TMA descriptor of a (M, K) float8_e4m3fn, block (128, 128)
    b_desc,  # TMA descriptor of b.T (N, K) float8_e4m3fn, block (128, 128)
    c_desc,  # TMA descriptor of c (M, N) bf16 / fp16 / fp32, block (64, 128): one consumer's half tile
    sa_ptr,  # scale_a (M, ceil(K/128)) float32
    sb_ptr,  # scale_b (ceil(K/128), ceil(N/128)) float32
    M, N, K,  # problem sizes
    stride_sam, stride_sak, stride_sbk, stride_sbn,  # scale strides
    GROUP_M: gl.constexpr,  # tile rows per group
    STAGES: gl.constexpr,  # TMA ring slots
    num_warps: gl.constexpr,  # 4: the default partition is consumer warpgroup 0
):
    """Persistent program: the partitions walk the same tiles (program_id, + programs, ...) and K steps."""
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # noqa: RUF005
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)  # noqa: RUF005
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [2] + c_desc.block_type.shape, c_desc.layout)  # noqa: RUF005
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    c_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    c_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)  # the loader's expect + the TMA bytes
        mbarrier.init(empty.index(i), count=2)  # one arrival per consumer warpgroup
    for i in gl.static_range(2):
        mbarrier.init(c_ready.index(i), count=1)
        mbarrier.init(c_empty.index(i), count=1)
    p = (a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, (stride_sam, stride_sak, stride_sbk, stride_sbn),
         a_smem, b_smem, c_smem, (ready, empty, c_ready, c_empty), GROUP_M)
    gl.warp_specialize([(_consume, (p, 0)), (_consume, (p, 1)), (_loader, (p,)), (_storer, (p,))],
                       [4, 1, 1], [232, 40, 40])


_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16,
              torch.float32: gl.float32}


@functools.cache
def _smem_layout(rows: int, cols: int, dtype: torch.dtype) -> Any:
    """The shared-memory layout of a TMA block (computed in Python, 5-7 us a call: made once per block and dtype)."""
    return gl.NVMMASharedLayout.get_default_for([rows, cols], _GL_DTYPES[dtype])


def _descriptors(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple:
    """TMA descriptors of a (M, K) and b.t() (N, K) e4m3 and c (M, N): whole tiles in, one consumer's half out."""
    block_m, block_n, block_k = BLOCK_M.value, BLOCK_N.value, BLOCK_K.value  # host code takes plain ints
    half = block_m // 2
    fp8 = torch.float8_e4m3fn
    return (TensorDescriptor.from_tensor(a, [block_m, block_k], _smem_layout(block_m, block_k, fp8)),
            TensorDescriptor.from_tensor(b.t(), [block_n, block_k], _smem_layout(block_n, block_k, fp8)),
            TensorDescriptor.from_tensor(c, [half, block_n], _smem_layout(half, block_n, c.dtype)))


def mm_fp8_block(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, c: torch.Tensor,
                 stages: int = 4, group_m: int = 8, programs: int | None = None) -> torch.Tensor:
    """c (M, N) bf16 / fp16 / fp32 = a @ b with block scales, written in place and returned: a (M, K) e4m3 and
    b.t() (N, K) e4m3 and c row-major and TMA-ready; scale_a (M, ceil(K/128)), scale_b (ceil(K/128), ceil(N/128))
    float32, any strides. Hopper. ``programs``: persistent programs (default one per SM, at most one per tile)."""
    m, k = a.shape
    n = b.shape[1]
    a_desc, b_desc, c_desc = _descriptors(a, b, c)
    tiles = triton.cdiv(m, BLOCK_M.value) * triton.cdiv(n, BLOCK_N.value)
    if programs is None:
        programs = sm_count(a.device)
    mm_fp8_block_kernel[(min(tiles, programs),)](
        a_desc, b_desc, c_desc, scale_a, scale_b, m, n, k, scale_a.stride(0), scale_a.stride(1), scale_b.stride(0),
        scale_b.stride(1), GROUP_M=group_m, STAGES=stages, num_warps=4, maxnreg=168)
    return c
