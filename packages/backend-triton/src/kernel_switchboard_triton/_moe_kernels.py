"""Triton jit kernels of the fused mixture-of-experts (launcher and token sort live in :mod:`.moe`).

Tokens are sorted by expert into blocks of ``BLOCK_M`` assignments (an assignment = one (token, slot)
pair, index ``t * top_k + j``); each block belongs to one expert and is padded with the sentinel
``T * top_k``. ``_moe_gate_up_kernel`` gathers the block's token rows, multiplies them by the expert's
gate and up rows together and writes ``silu(gate) * up`` per assignment; ``_moe_down_kernel`` multiplies
those rows by the expert's down projection and the routing weight. fp8 weights are converted to the
activation dtype tile by tile and their 128x128 block scale is applied to each K step's partial product.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._gemm_kernels import _dot


@triton.jit
def _moe_gate_up_kernel(
    x_ptr,  # (T, H) activations, contiguous
    w_ptr,  # (E, 2I, H) gate rows then up rows per expert (x's dtype or float8_e4m3fn)
    s_ptr,  # (E, ceil(2I/128), ceil(H/128)) float32 block scales (fp8 only)
    h_ptr,  # (T*k, INTER) output: silu(x G^T) * (x U^T) per assignment, x's dtype
    sorted_ptr,  # (num_blocks * BLOCK_M,) int32 assignment ids sorted by expert, T*k = padding
    block_expert_ptr,  # (num_blocks,) int32 expert of each block, >= E for unused blocks
    E, INTER, H,  # experts, intermediate size, hidden size
    TOPK,  # experts per token
    NUM_ASSIGN,  # T * k
    stride_we, stride_wn,  # w strides (expert, row); the H stride is 1
    stride_se, stride_sn, stride_sk,  # scale strides (fp8 only)
    FP8: tl.constexpr,  # weights are float8_e4m3fn with block scales
    BLOCK_M: tl.constexpr,  # assignments per block
    BLOCK_N: tl.constexpr,  # intermediate columns per program (divides 128 for fp8)
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
        for k0 in range(0, H, BLOCK_K):
            k_ok = rk < H - k0
            a = tl.load(x_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            g = tl.load(g_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            u = tl.load(u_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if FP8:
                # dequantise the weight tile (one scale per column in this K step) so the MMA accumulates in
                # place: a separate scaled partial product per step doubled the live accumulators and spilled
                kb = k0 // 128
                sg = tl.load(sg_rows + kb * stride_sk, mask=n_ok, other=0.0)
                su = tl.load(su_rows + kb * stride_sk, mask=n_ok, other=0.0)
                g = (g.to(tl.float32) * sg[None, :]).to(x_ptr.dtype.element_ty)
                u = (u.to(tl.float32) * su[None, :]).to(x_ptr.dtype.element_ty)
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
    h_ptr,  # (T*k, INTER) silu-and-mul rows per assignment
    w_ptr,  # (E, H, INTER) down projection per expert (x's dtype or float8_e4m3fn)
    s_ptr,  # (E, ceil(H/128), ceil(INTER/128)) float32 block scales (fp8 only)
    y_ptr,  # (T*k, H) output: routing weight * (h D^T) per assignment
    topw_ptr,  # (T*k,) float32 routing weights
    sorted_ptr,  # (num_blocks * BLOCK_M,) int32 assignment ids sorted by expert
    block_expert_ptr,  # (num_blocks,) int32 expert of each block
    E, INTER, H,  # experts, intermediate size, hidden size
    NUM_ASSIGN,  # T * k
    stride_we, stride_wn,  # w strides (expert, row); the INTER stride is 1
    stride_se, stride_sn, stride_sk,  # scale strides (fp8 only)
    FP8: tl.constexpr,  # weights are float8_e4m3fn with block scales
    BLOCK_M: tl.constexpr,  # assignments per block
    BLOCK_N: tl.constexpr,  # hidden columns per program (divides 128 for fp8)
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
        for k0 in range(0, INTER, BLOCK_K):
            k_ok = rk < INTER - k0
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if FP8:  # dequantise the weight tile: the MMA then accumulates in place (see the gate/up kernel)
                sb = tl.load(s_rows + (k0 // 128) * stride_sk, mask=n_ok, other=0.0)
                b = (b.to(tl.float32) * sb[None, :]).to(h_ptr.dtype.element_ty)
            acc = _dot(a, b, acc, UPCAST, IEEE)
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K
        wt = tl.load(topw_ptr + arow, mask=row_ok, other=0.0)
        acc = acc * wt[:, None]
        tl.store(y_ptr + arow[:, None] * H + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])
