"""Triton jit kernels of the gemm family (launchers and tile choices live in :mod:`.gemm`).

All kernels walk output tiles in grouped order (``GROUP_M`` tile rows share columns of b while they
are hot in L2), accumulate in float32 and take any strides. ``UPCAST`` (set only under
``TRITON_INTERPRET=1``) casts dot operands to float32 first: the interpreter's bf16 dot is wrong.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + a @ b in float32 (operands upcast when interpreted; exact float32 products when IEEE)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _tile_coords(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` in grouped order."""
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    rows = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % rows
    pid_n = (pid % per_group) // rows
    return pid_m, pid_n


@triton.jit
def _mm_kernel(
    a_ptr,  # (M, K) fp16/bf16, any strides
    b_ptr,  # (K, N) same dtype, any strides
    c_ptr,  # (M, N) output, a's dtype, contiguous
    M, N, K,  # problem sizes
    stride_am, stride_ak,  # a strides (elements)
    stride_bk, stride_bn,  # b strides
    stride_cm,  # c row stride
    BLOCK_M: tl.constexpr,  # output tile rows
    BLOCK_N: tl.constexpr,  # output tile columns
    BLOCK_K: tl.constexpr,  # reduction step
    GROUP_M: tl.constexpr,  # tile rows per group (L2 reuse)
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
    IEEE: tl.constexpr,  # float32 operands: exact float32 products (no TF32)
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < K - k0) & (rn[None, :] < N), other=0.0)
        acc = _dot(a, b, acc, UPCAST, IEEE)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c = acc.to(c_ptr.dtype.element_ty)
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :], c, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _scale_epilogue(acc, sa_ptr, sb_ptr, rm, rn, m_ok, N, stride_sam, stride_sbn, MODE: tl.constexpr):
    """The fp8 accumulator (BLOCK_M, BLOCK_N) times its per-tensor (MODE 0) or row / column (MODE 1) scales;
    block scales (MODE 2) were applied per K step."""
    if MODE == 0:
        acc = acc * (tl.load(sa_ptr) * tl.load(sb_ptr))
    elif MODE == 1:
        s_a = tl.load(sa_ptr + rm * stride_sam, mask=m_ok, other=0.0)
        s_b = tl.load(sb_ptr + rn * stride_sbn, mask=rn < N, other=0.0)
        acc = acc * s_a[:, None] * s_b[None, :]
    return acc


@triton.jit
def _mm_fp8_kernel(
    a_ptr,  # (M, K) float8_e4m3fn, any strides
    b_ptr,  # (K, N) float8_e4m3fn, any strides
    c_ptr,  # (M, N) output in out_dtype, contiguous
    sa_ptr,  # scale of a: () tensor, (M, 1) row_col, (M, ceil(K/128)) block
    sb_ptr,  # scale of b: () tensor, (1, N) row_col, (ceil(K/128), ceil(N/128)) block
    M, N, K,  # problem sizes
    stride_am, stride_ak,  # a strides
    stride_bk, stride_bn,  # b strides
    stride_cm,  # c row stride
    stride_sam, stride_sak,  # scale_a strides (row, K-block)
    stride_sbk, stride_sbn,  # scale_b strides (K-block, column or N-block)
    MODE: tl.constexpr,  # 0 per-tensor, 1 row_col, 2 block (128x128)
    BLOCK_M: tl.constexpr,  # output tile rows
    BLOCK_N: tl.constexpr,  # output tile columns (block mode: divides 128)
    BLOCK_K: tl.constexpr,  # reduction step (block mode: 128, one scale block per step)
    GROUP_M: tl.constexpr,  # tile rows per group
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
):
    pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if MODE == 2:
        sa_row = sa_ptr + rm * stride_sam  # (BLOCK_M,) pointers to each row's K-block scales
        sb_col = sb_ptr + ((pid_n * BLOCK_N) // 128) * stride_sbn  # this tile's N-block of scale_b
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=m_ok[:, None] & (rk[None, :] < K - k0), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < K - k0) & (rn[None, :] < N), other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if MODE == 2:
            kb = k0 // 128
            s_a = tl.load(sa_row + kb * stride_sak, mask=m_ok, other=0.0)
            s_b = tl.load(sb_col + kb * stride_sbk)
            acc += tl.dot(a, b) * (s_a[:, None] * s_b)
        else:
            # sm_90 fp8 MMAs accumulate in reduced precision: fold into float32 once per BLOCK_K
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    acc = _scale_epilogue(acc, sa_ptr, sb_ptr, rm, rn, m_ok, N, stride_sam, stride_sbn, MODE)
    tl.store(c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=m_ok[:, None] & (rn[None, :] < N))


@triton.jit
def _grouped_mm_kernel(
    a_ptr,  # (T, K) rows grouped by offsets
    b_ptr,  # (G, K, N) one matrix per group, any strides
    c_ptr,  # (T, N) output, contiguous
    off_ptr,  # (G+1,) int32 row offsets, offsets[0] = 0, offsets[G] = T
    G, N, K,  # groups, columns, reduction size
    stride_am, stride_ak,  # a strides
    stride_bg, stride_bk, stride_bn,  # b strides
    stride_cm,  # c row stride
    BLOCK_M: tl.constexpr,  # output tile rows (a tile never spans two groups)
    BLOCK_N: tl.constexpr,  # output tile columns
    BLOCK_K: tl.constexpr,  # reduction step
    GROUPS_P2: tl.constexpr,  # next power of two >= G
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
    IEEE: tl.constexpr,  # float32 operands: exact float32 products (no TF32)
):
    # program (tile t, column block): find the group whose row tiles contain t (tiles counted per group)
    t = tl.program_id(0)
    gi = tl.arange(0, GROUPS_P2)
    lo_all = tl.load(off_ptr + gi, mask=gi < G, other=0)
    hi_all = tl.load(off_ptr + gi + 1, mask=gi < G, other=0)
    tiles = tl.cdiv(hi_all - lo_all, BLOCK_M)
    ends = tl.cumsum(tiles, axis=0)
    g = tl.sum((ends <= t).to(tl.int32), axis=0)
    if g < G:
        lo = tl.sum(tl.where(gi == g, lo_all, 0), axis=0)
        hi = tl.sum(tl.where(gi == g, hi_all, 0), axis=0)
        first = tl.sum(tl.where(gi == g, ends - tiles, 0), axis=0)
        rm = lo + (t - first) * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        m_ok = rm < hi
        a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = b_ptr + g.to(tl.int64) * stride_bg + rk[:, None] * stride_bk + rn.to(tl.int64)[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = tl.load(a_ptrs, mask=m_ok[:, None] & (rk[None, :] < K - k0), other=0.0)
            b = tl.load(b_ptrs, mask=(rk[:, None] < K - k0) & (rn[None, :] < N), other=0.0)
            acc = _dot(a, b, acc, UPCAST, IEEE)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        tl.store(c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :], acc.to(c_ptr.dtype.element_ty),
                 mask=m_ok[:, None] & (rn[None, :] < N))


@triton.jit
def _load_b_tma(b_desc, k0, n0, B_KMAJOR: tl.constexpr):
    """(BLOCK_K, BLOCK_N) tile of b at (k0, n0); a K-major b is described by its (N, K) transpose."""
    if B_KMAJOR:
        b = b_desc.load([n0, k0]).T
    else:
        b = b_desc.load([k0, n0])
    return b


@triton.jit
def _mm_tma_kernel(
    a_desc,  # TMA descriptor of a (M, K) fp16/bf16, row-major, block (BLOCK_M, BLOCK_K)
    b_desc,  # TMA descriptor of b (K, N), block (BLOCK_K, BLOCK_N); of b.T (N, K) when B_KMAJOR
    c_desc,  # TMA descriptor of c (M, N) in a's dtype, block (BLOCK_M, BLOCK_N)
    M, N, K,  # problem sizes
    BLOCK_M: tl.constexpr,  # output tile rows
    BLOCK_N: tl.constexpr,  # output tile columns
    BLOCK_K: tl.constexpr,  # reduction step
    GROUP_M: tl.constexpr,  # tile rows per group (L2 reuse)
    B_KMAJOR: tl.constexpr,  # b is a transposed (N, K) row-major matrix (an nn.Linear weight)
    NUM_PROGRAMS: tl.constexpr,  # persistent programs (one per SM); each walks tiles with this stride
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
):
    """Persistent matmul with TMA loads and stores: edges are zero-filled on load and clipped on store."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([pid_m * BLOCK_M, k0])
            b = _load_b_tma(b_desc, k0, pid_n * BLOCK_N, B_KMAJOR)
            acc = _dot(a, b, acc, UPCAST, False)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


@triton.jit
def _mm_fp8_tma_kernel(
    a_desc,  # TMA descriptor of a (M, K) float8_e4m3fn, row-major, block (BLOCK_M, BLOCK_K)
    b_desc,  # TMA descriptor of b.T (N, K) float8_e4m3fn (b is K-major), block (BLOCK_N, BLOCK_K)
    c_desc,  # TMA descriptor of c (M, N) in out_dtype, block (BLOCK_M, BLOCK_N)
    sa_ptr, sb_ptr,  # scales as in _mm_fp8_kernel
    M, N, K,  # problem sizes
    stride_sam, stride_sak,  # scale_a strides (row, K-block)
    stride_sbk, stride_sbn,  # scale_b strides (K-block, column or N-block)
    MODE: tl.constexpr,  # 0 per-tensor, 1 row_col, 2 block (128x128)
    BLOCK_M: tl.constexpr,  # output tile rows
    BLOCK_N: tl.constexpr,  # output tile columns (block mode: divides 128)
    BLOCK_K: tl.constexpr,  # reduction step (block mode: 128)
    GROUP_M: tl.constexpr,  # tile rows per group
    NUM_PROGRAMS: tl.constexpr,  # persistent programs
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
):
    """Persistent fp8 matmul with TMA; scales applied as in :func:`_mm_fp8_kernel`."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS, flatten=True):
        pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = rm < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([pid_m * BLOCK_M, k0])
            b = _load_b_tma(b_desc, k0, pid_n * BLOCK_N, True)
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            if MODE == 2:
                kb = k0 // 128
                s_a = tl.load(sa_ptr + rm * stride_sam + kb * stride_sak, mask=m_ok, other=0.0)
                s_b = tl.load(sb_ptr + kb * stride_sbk + ((pid_n * BLOCK_N) // 128) * stride_sbn)
                acc += tl.dot(a, b) * (s_a[:, None] * s_b)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        acc = _scale_epilogue(acc, sa_ptr, sb_ptr, rm, rn, m_ok, N, stride_sam, stride_sbn, MODE)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))
