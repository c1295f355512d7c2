"""Triton jit kernels of the fused mixture-of-experts (launcher and token sort live in :mod:`.moe`).

Tokens are sorted by expert into blocks of ``BLOCK_M`` assignments (an assignment = one (token, slot)
pair, index ``t * top_k + j``); each block belongs to one expert and is padded with the sentinel
``T * top_k``. ``_moe_gate_up_kernel`` gathers the block's token rows, multiplies them by the expert's
gate and up rows together and writes ``silu(gate) * up`` per assignment; ``_moe_down_kernel`` multiplies
those rows by the expert's down projection and the routing weight. With fp8 weights both GEMMs run
on fp8 MMAs (DeepSeek-V3's recipe): ``_quant_groups_kernel`` quantizes their inputs per row and 128
columns, and each 128-deep K step's partial product is scaled by its row's and its weight block's
scales into a float32 accumulator.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._gemm_kernels import _dot

#: the largest finite float8_e4m3fn
FP8_MAX = tl.constexpr(448.0)


@triton.jit
def _round_e4m3(v):
    """float32 v in [-448, 448] rounded to the nearest float8_e4m3fn value (normals to even), still float32.
    Converting the result to fp8 is then exact, on the GPU and in the interpreter (whose own float32 to
    fp8 conversion sends values such as 126.7 to 64)."""
    bits = v.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # 3 mantissa bits
    subnormal = tl.floor(v * 512.0 + 0.5) / 512.0  # below 2^-6: steps of 2^-9
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def _quant_groups_kernel(
    x_ptr,  # (R, C) float16 / bfloat16 / float32, unit column stride
    q_ptr,  # (R, C) float8_e4m3fn out, contiguous
    s_ptr,  # (R, ceil(C/128)) float32 out: each group's scale, amax / 448
    R, C,  # rows, columns
    stride_x,  # row stride of x
    BLOCK_R: tl.constexpr,  # rows per program
    GROUP: tl.constexpr,  # columns per scale (128)
):
    """Quantize each row's groups of GROUP columns to float8_e4m3fn: q = round(x / s), s = amax / 448."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    ok = (rows < R)[:, None] & (cols < C)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :], mask=ok, other=0.0).to(tl.float32)
    s = tl.maximum(tl.max(tl.abs(x), 1), 1e-12) / FP8_MAX
    q = _round_e4m3(tl.minimum(tl.maximum(x / s[:, None], -FP8_MAX), FP8_MAX))
    tl.store(q_ptr + rows.to(tl.int64)[:, None] * C + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(s_ptr + rows.to(tl.int64) * tl.num_programs(1) + tl.program_id(1), s, mask=rows < R)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,  # (T, H) activations, contiguous (fp8: quantized by _quant_groups_kernel)
    xs_ptr,  # (T, ceil(H/128)) float32 scales of the quantized activations (fp8 only)
    w_ptr,  # (E, 2I, H) gate rows then up rows per expert (x's dtype or float8_e4m3fn)
    s_ptr,  # (E, ceil(2I/128), ceil(H/128)) float32 block scales (fp8 only)
    h_ptr,  # (T*k, INTER) output: silu(x G^T) * (x U^T) per assignment, the activations' dtype
    sorted_ptr,  # (num_blocks * BLOCK_M,) int32 assignment ids sorted by expert, T*k = padding
    block_expert_ptr,  # (num_blocks,) int32 expert of each block, >= E for unused blocks
    E, INTER, H,  # experts, intermediate size, hidden size
    TOPK,  # experts per token
    NUM_ASSIGN,  # T * k
    stride_we, stride_wn,  # w strides (expert, row); the H stride is 1
    stride_se, stride_sn, stride_sk,  # scale strides (fp8 only)
    FP8: tl.constexpr,  # fp8 weights with block scales, activations quantized per row and 128 columns
    BLOCK_M: tl.constexpr,  # assignments per block
    BLOCK_N: tl.constexpr,  # intermediate columns per program
    BLOCK_K: tl.constexpr,  # hidden step (divides 128 for fp8)
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
    IEEE: tl.constexpr,  # float32 activations: exact float32 products
):
    blk = tl.program_id(0)
    e = tl.load(block_expert_ptr + blk)
    if e < E:
        rm = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        assign = tl.load(sorted_ptr + rm)
        row_ok = assign < NUM_ASSIGN
        token = tl.where(row_ok, assign // TOPK, 0)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < INTER
        rk = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + token.to(tl.int64)[:, None] * H + rk[None, :]
        w_base = w_ptr + e.to(tl.int64) * stride_we
        g_ptrs = w_base + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]  # (BLOCK_K, BLOCK_N) = G^T tile
        u_ptrs = g_ptrs + INTER * stride_wn
        acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FP8:
            s_base = s_ptr + e.to(tl.int64) * stride_se
            sg_rows = s_base + (rn // 128) * stride_sn
            su_rows = s_base + ((rn + INTER) // 128) * stride_sn
            xs_rows = xs_ptr + token.to(tl.int64) * tl.cdiv(H, 128)
        for k0 in range(0, H, BLOCK_K):
            k_ok = rk < H - k0
            a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if FP8:  # fp8 products of this K step, scaled by the row's and the weight block's scales
                kb = k0 // 128
                sa = tl.load(xs_rows + kb, mask=row_ok, other=0.0)[:, None]
                sg = tl.load(sg_rows + kb * stride_sk, mask=n_ok, other=0.0)[None, :]
                su = tl.load(su_rows + kb * stride_sk, mask=n_ok, other=0.0)[None, :]
                acc_g += _dot(a, g, tl.zeros_like(acc_g), UPCAST, False) * (sa * sg)
                acc_u += _dot(a, u, tl.zeros_like(acc_u), UPCAST, False) * (sa * su)
            else:
                acc_g = _dot(a, g, acc_g, UPCAST, IEEE)
                acc_u = _dot(a, u, acc_u, UPCAST, IEEE)
            x_ptrs += BLOCK_K
            g_ptrs += BLOCK_K
            u_ptrs += BLOCK_K
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        out = h_ptr + assign.to(tl.int64)[:, None] * INTER + rn[None, :]
        tl.store(out, h.to(h_ptr.dtype.element_ty), mask=row_ok[:, None] & n_ok[None, :])


@triton.jit
def _moe_down_kernel(
    h_ptr,  # (T*k, INTER) silu-and-mul rows per assignment (fp8: quantized by _quant_groups_kernel)
    hs_ptr,  # (T*k, ceil(INTER/128)) float32 scales of the quantized rows (fp8 only)
    w_ptr,  # (E, H, INTER) down projection per expert (the activations' dtype or float8_e4m3fn)
    s_ptr,  # (E, ceil(H/128), ceil(INTER/128)) float32 block scales (fp8 only)
    y_ptr,  # (T*k, H) output: routing weight * (h D^T) per assignment
    topw_ptr,  # (T*k,) float32 routing weights
    sorted_ptr,  # (num_blocks * BLOCK_M,) int32 assignment ids sorted by expert
    block_expert_ptr,  # (num_blocks,) int32 expert of each block
    E, INTER, H,  # experts, intermediate size, hidden size
    NUM_ASSIGN,  # T * k
    stride_we, stride_wn,  # w strides (expert, row); the INTER stride is 1
    stride_se, stride_sn, stride_sk,  # scale strides (fp8 only)
    FP8: tl.constexpr,  # fp8 weights with block scales, h quantized per row and 128 columns
    BLOCK_M: tl.constexpr,  # assignments per block
    BLOCK_N: tl.constexpr,  # hidden columns per program
    BLOCK_K: tl.constexpr,  # intermediate step (divides 128 for fp8)
    UPCAST: tl.constexpr,  # cast dot operands to float32 (interpreter only)
    IEEE: tl.constexpr,  # float32 activations: exact float32 products
):
    blk = tl.program_id(0)
    e = tl.load(block_expert_ptr + blk)
    if e < E:
        rm = blk * BLOCK_M + tl.arange(0, BLOCK_M)
        assign = tl.load(sorted_ptr + rm)
        row_ok = assign < NUM_ASSIGN
        arow = tl.where(row_ok, assign, 0).to(tl.int64)
        rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = rn < H
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = h_ptr + arow[:, None] * INTER + rk[None, :]
        b_ptrs = w_ptr + e.to(tl.int64) * stride_we + rn.to(tl.int64)[None, :] * stride_wn + rk[:, None]
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if FP8:
            s_rows = s_ptr + e.to(tl.int64) * stride_se + (rn // 128) * stride_sn
            hs_rows = hs_ptr + arow * tl.cdiv(INTER, 128)
        for k0 in range(0, INTER, BLOCK_K):
            k_ok = rk < INTER - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if FP8:  # as in the gate/up kernel
                kb = k0 // 128
                sa = tl.load(hs_rows + kb, mask=row_ok, other=0.0)[:, None]
                sb = tl.load(s_rows + kb * stride_sk, mask=n_ok, other=0.0)[None, :]
                acc += _dot(a, b, tl.zeros_like(acc), UPCAST, False) * (sa * sb)
            else:
                acc = _dot(a, b, acc, UPCAST, IEEE)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        wt = tl.load(topw_ptr + arow, mask=row_ok, other=0.0)
        acc = acc * wt[:, None]
        tl.store(y_ptr + arow[:, None] * H + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])
