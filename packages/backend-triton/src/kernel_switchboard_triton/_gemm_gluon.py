"""fp8 matmul with DeepSeek 128x128 block scales in Gluon (Triton's explicit-layout dialect), Hopper only.

Why a second kernel: Triton waits on each K step's wgmma before it scales the product into the float32
accumulator (``wgmma.wait_group 0``), so the tensor cores idle while the product is scaled. Here the K step's
MMA is issued before the previous step's product is waited for (``warpgroup_mma_wait(1)``) and scaled, so the
scaling overlaps the next MMA. Two warpgroups split each 128-row tile; a ring of ``STAGES`` TMA buffers is
refilled as soon as the MMA that read a stage is known to be done, with the program's next tile once this one's
steps are all loaded (persistent programs, one per SM).

Experimental, opt-in (benchmark rows and tests only; ``mm_fp8`` does not route to it): compiled on the host for
sm_90 (Triton 3.6: 248 registers, no spills, no MMA serialisation by ptxas, 160 KB of shared memory with 4
stages); not yet run on a GPU.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

#: TMA copies: Triton 3.6 (the H200 image) names them async_copy_*; 3.7+ async_load / async_store
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
_tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
#: a barrier over the program's warps: thread_barrier in Triton 3.6, barrier in 3.9
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier


@gluon.jit
def _tile_coords(pid, M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr):
    """(pid_m, pid_n) of program ``pid`` in grouped order (GROUP_M tile rows share columns of b in L2); the twin of
    ``_gemm_kernels._tile_coords`` (a Gluon kernel cannot call a ``triton.jit`` helper)."""
    num_m = gl.cdiv(M, BLOCK_M)
    num_n = gl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows = gl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % rows, (pid % per_group) // rows


@gluon.jit
def _load_step(a_desc, b_desc, a_smem, b_smem, ready, g, steps, M, N, STAGES: gl.constexpr, GROUP_M: gl.constexpr):
    """TMA loads of this program's K step ``g``, counted over all its tiles (tile g // steps, K block g % steps),
    into ring slot g % STAGES; ``ready`` of that slot completes when both land."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    tile = gl.program_id(0) + (g // steps) * gl.num_programs(0)
    pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    k = (g % steps) * BLOCK_K
    slot = g % STAGES
    bar = ready.index(slot)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes)
    _tma_load(a_desc, [pid_m * BLOCK_M, k], bar, a_smem.index(slot))
    _tma_load(b_desc, [pid_n * BLOCK_N, k], bar, b_smem.index(slot))


@gluon.jit
def _refill(a_desc, b_desc, a_smem, b_smem, ready, done, total, steps, M, N, STAGES: gl.constexpr,
            GROUP_M: gl.constexpr):
    """The slot step ``done`` read is free once its MMA is done (both warpgroups: the loads are issued behind a CTA
    barrier): load step done + STAGES into it, which may belong to this program's next tile."""
    _cta_barrier()
    if done + STAGES < total:
        _load_step(a_desc, b_desc, a_smem, b_smem, ready, done + STAGES, steps, M, N, STAGES, GROUP_M)


@gluon.jit
def _issue_mma(a_smem, b_smem, ready, g, buf, STAGES: gl.constexpr):
    """Start the MMA of step ``g`` into ``buf``'s registers (its old value is ignored) once its slot landed."""
    slot = g % STAGES
    mbarrier.wait(ready.index(slot), phase=(g // STAGES) & 1)
    return warpgroup_mma(a_smem.index(slot), b_smem.index(slot).permute((1, 0)), buf, use_acc=False, is_async=True)


@gluon.jit
def _scales(sa_ptr, sb_ptr, rows, m_ok, step, pid_n, stride_sam, stride_sak, stride_sbk, stride_sbn,
            BLOCK_N: gl.constexpr):
    """(BLOCK_M,) scale_a of K block ``step`` for this tile's rows, times scale_b of (step, this N block)."""
    s_a = gl.load(sa_ptr + rows * stride_sam + step * stride_sak, mask=m_ok, other=0.0)
    s_b = gl.load(sb_ptr + step * stride_sbk + ((pid_n * BLOCK_N) // 128) * stride_sbn)
    return s_a * s_b


@gluon.jit
def mm_fp8_block_kernel(
    a_desc,  # TMA descriptor of a (M, K) float8_e4m3fn, block (BLOCK_M, BLOCK_K)
    b_desc,  # TMA descriptor of b.T (N, K) float8_e4m3fn, block (BLOCK_N, BLOCK_K)
    c_desc,  # TMA descriptor of c (M, N) bf16 / fp16 / fp32, block (BLOCK_M, BLOCK_N)
    sa_ptr,  # scale_a (M, ceil(K/128)) float32
    sb_ptr,  # scale_b (ceil(K/128), ceil(N/128)) float32
    M, N, K,  # problem sizes
    stride_sam, stride_sak, stride_sbk, stride_sbn,  # scale strides
    GROUP_M: gl.constexpr,  # tile rows per group
    STAGES: gl.constexpr,  # TMA ring slots
    num_warps: gl.constexpr,  # 8: two warpgroups of 64 rows
):
    """Program p takes tiles p, p + programs, ...; its K steps are counted over all its tiles, so the ring
    prefetches the next tile's first steps during this tile's last ones and its epilogue."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    num_tiles = gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)
    my_tiles = gl.cdiv(num_tiles - gl.program_id(0), gl.num_programs(0))
    steps = gl.cdiv(K, BLOCK_K)
    total = my_tiles * steps

    mma_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, BLOCK_N, 32])
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)  # noqa: RUF005
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)  # noqa: RUF005
    c_smem = gl.allocate_shared_memory(c_desc.dtype, c_desc.block_type.shape, c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    for i in gl.static_range(STAGES):  # prologue: the first STAGES steps in flight, one per slot
        if i < total:
            _load_step(a_desc, b_desc, a_smem, b_smem, ready, i, steps, M, N, STAGES, GROUP_M)

    for local in range(my_tiles):
        pid_m, pid_n = _tile_coords(gl.program_id(0) + local * gl.num_programs(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, mma_layout))
        m_ok = rows < M
        g0 = local * steps
        # Two product buffers alternate (x: even K steps, y: odd), so the loop never copies registers an MMA is
        # still writing (ptxas would then serialise the MMAs). At the loop head: x's MMA (step - 1) is in flight.
        acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
        y = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout)
        x = _issue_mma(a_smem, b_smem, ready, g0, gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=mma_layout),
                       STAGES)
        sx = _scales(sa_ptr, sb_ptr, rows, m_ok, 0, pid_n, stride_sam, stride_sak, stride_sbk, stride_sbn, BLOCK_N)
        for step in range(1, steps - 1, 2):
            y_mma = _issue_mma(a_smem, b_smem, ready, g0 + step, y, STAGES)
            sy = _scales(sa_ptr, sb_ptr, rows, m_ok, step, pid_n, stride_sam, stride_sak, stride_sbk, stride_sbn,
                         BLOCK_N)
            x_done = warpgroup_mma_wait(num_outstanding=1, deps=(x,))  # step - 1 done; step may run on
            acc += x_done * sx[:, None]
            _refill(a_desc, b_desc, a_smem, b_smem, ready, g0 + step - 1, total, steps, M, N, STAGES, GROUP_M)
            x = _issue_mma(a_smem, b_smem, ready, g0 + step + 1, x_done, STAGES)
            sx = _scales(sa_ptr, sb_ptr, rows, m_ok, step + 1, pid_n, stride_sam, stride_sak, stride_sbk, stride_sbn,
                         BLOCK_N)
            y = warpgroup_mma_wait(num_outstanding=1, deps=(y_mma,))  # step done; step + 1 may run on
            acc += y * sy[:, None]
            _refill(a_desc, b_desc, a_smem, b_smem, ready, g0 + step, total, steps, M, N, STAGES, GROUP_M)
        if steps % 2 == 0:  # one step left (steps - 1, odd): into y
            y_mma = _issue_mma(a_smem, b_smem, ready, g0 + steps - 1, y, STAGES)
            sy = _scales(sa_ptr, sb_ptr, rows, m_ok, steps - 1, pid_n, stride_sam, stride_sak, stride_sbk,
                         stride_sbn, BLOCK_N)
            x_done = warpgroup_mma_wait(num_outstanding=1, deps=(x,))
            acc += x_done * sx[:, None]
            y = warpgroup_mma_wait(num_outstanding=0, deps=(y_mma,))
            acc += y * sy[:, None]
            # (refilling step steps - 2's slot between the two waits made ptxas serialise the MMAs)
            _refill(a_desc, b_desc, a_smem, b_smem, ready, g0 + steps - 2, total, steps, M, N, STAGES, GROUP_M)
        else:
            x_done = warpgroup_mma_wait(num_outstanding=0, deps=(x,))
            acc += x_done * sx[:, None]
        _refill(a_desc, b_desc, a_smem, b_smem, ready, g0 + steps - 1, total, steps, M, N, STAGES, GROUP_M)

        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        _cta_barrier()
        _tma_store(c_desc, [pid_m * BLOCK_M, pid_n * BLOCK_N], c_smem)
        tma.store_wait(pendings=0)
        _cta_barrier()  # c_smem is free for the next tile
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))


_GL_DTYPES = {torch.float8_e4m3fn: gl.float8e4nv, torch.bfloat16: gl.bfloat16, torch.float16: gl.float16,
              torch.float32: gl.float32}


def mm_fp8_block(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                 out_dtype: torch.dtype, block_m: int = 128, block_n: int = 128, stages: int = 4,
                 group_m: int = 8, persistent: bool = True) -> torch.Tensor:
    """a (M, K) row-major e4m3; b (K, N) K-major e4m3 (b.t() row-major); scale_a (M, K/128), scale_b (K/128, N/128)
    float32 -> (M, N) in out_dtype. Hopper; K a multiple of 16 (TMA rows). ``persistent``: one program per SM
    walking its tiles, else one program per tile."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=out_dtype, device=a.device)
    block_k = 128
    bt = b.t()
    a_desc = TensorDescriptor.from_tensor(a, [block_m, block_k],
                                          gl.NVMMASharedLayout.get_default_for([block_m, block_k], gl.float8e4nv))
    b_desc = TensorDescriptor.from_tensor(bt, [block_n, block_k],
                                          gl.NVMMASharedLayout.get_default_for([block_n, block_k], gl.float8e4nv))
    c_desc = TensorDescriptor.from_tensor(c, [block_m, block_n],
                                          gl.NVMMASharedLayout.get_default_for([block_m, block_n], _GL_DTYPES[out_dtype]))
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, block_n)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    grid = (min(tiles, sms) if persistent else tiles,)
    mm_fp8_block_kernel[grid](a_desc, b_desc, c_desc, scale_a, scale_b, m, n, k, scale_a.stride(0), scale_a.stride(1),
                              scale_b.stride(0), scale_b.stride(1), GROUP_M=group_m, STAGES=stages, num_warps=8)
    return c
