"""Triton fused mixture-of-experts: token sort by expert, gate/up grouped GEMM with a fused SiLU-and-mul
epilogue, down GEMM with the routing weight, then the sum over each token's experts.

Signature: :mod:`kernel_switchboard.ops.moe` (``moe.fused_moe``; routing stays with ``moe.route``'s
kernels). The sort is a handful of torch ops on the device (count, stable argsort, scatter), so the
whole call is free of host syncs and CUDA-graph capturable. Weights: x's dtype, or float8_e4m3fn
with 128x128 block scales; then both GEMMs run on fp8 MMAs, their inputs (x, and the intermediate)
quantized per row and 128 columns (DeepSeek-V3's recipe, :func:`quantize_groups`). The intermediate
and the per-assignment outputs are rounded to x's dtype; the final sum over the top-k slots is taken
in float32 by torch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.invariance import active as invariant_scope

from . import _moe_kernels as K

UPCAST = triton_interpreting()


class MoeTiles(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int
    #: the down GEMM's output columns per program (None: block_n)
    down_block_n: int | None = None


def moe_tiles(assignments: int, experts: int, fp32: bool, fp8: bool = False) -> MoeTiles:
    """Tiles by the mean number of assignments per expert (decode-sized batches take short blocks);
    ``fp8``: fp8 block-scaled weights (fp8 MMAs, 128-deep K steps: one scale block each).

    On the H200 at 4096 tokens, Mixtral bf16 runs fastest on 128x128x64 tiles (128x256 needs 245 KB of shared
    memory); DeepSeek-V3 fp8 on 64x64x128 tiles, 4 warps, 3 stages (more stages, 8 warps, a 64-column down GEMM and
    128-row blocks were slower; 128 gate/up columns spill: the two scaled partial products beside their accumulators
    take ptxas sm_90 to 255 registers and 520 B of stack). 64-row blocks pad each expert's rows less (~128
    assignments per expert).
    """
    if triton_interpreting():
        return MoeTiles(16, 32, 32, 4, 1)
    per_expert = assignments / max(experts, 1)
    block_m = 16 if per_expert <= 16 else 32 if per_expert <= 32 else 64 if per_expert <= 96 else 128
    if fp32:
        return MoeTiles(min(block_m, 64), 64, 32, 4, 3)
    if fp8:
        if block_m <= 32:
            return MoeTiles(block_m, 64, 128, 4, 4, 64)
        return MoeTiles(64, 64, 128, 4, 3, 128)
    if block_m <= 32:
        return MoeTiles(block_m, 64, 128, 4, 4)
    return MoeTiles(block_m, 128, 64, 8 if block_m == 128 else 4, 3)


def sort_by_expert(topk_ids: torch.Tensor, experts: int, block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sorted assignment ids padded per expert to ``block_m`` with T*k, expert of each block), no host sync.

    Launches ``ceil(T*k / block_m) + E`` blocks: enough for any split of the assignments among experts;
    blocks past the used ones get expert E and exit.
    """
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    dev = flat.device
    counts = torch.zeros(experts, dtype=torch.int64, device=dev).scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(flat, stable=True)
    e_sorted = flat[order]
    rank = torch.arange(n, device=dev) - (torch.cumsum(counts, 0) - counts)[e_sorted]
    pos = (padded_end - padded)[e_sorted] + rank
    num_blocks = triton.cdiv(n, block_m) + experts
    sorted_ids = torch.full((num_blocks * block_m,), n, dtype=torch.int32, device=dev)
    sorted_ids[pos] = order.to(torch.int32)
    starts = torch.arange(num_blocks, device=dev) * block_m
    block_expert = torch.searchsorted(padded_end, starts, right=True).to(torch.int32)
    return sorted_ids, block_expert


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (R, C) with unit column stride -> (float8_e4m3fn (R, C), float32 scales (R, ceil(C/128))): each row's
    groups of 128 columns scaled by amax / 448 and rounded to nearest."""
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty((rows, triton.cdiv(cols, 128)), dtype=torch.float32, device=x.device)
    block_r = 16 if triton_interpreting() else 32
    K._quant_groups_kernel[(triton.cdiv(rows, block_r), s.shape[1])](
        x, q, s, rows, cols, x.stride(0), BLOCK_R=block_r, GROUP=128, num_warps=4)
    return q, s


def fused_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None) -> torch.Tensor:
    tokens, hidden = x.shape
    experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    n = tokens * top_k
    if n == 0:
        return torch.zeros_like(x)
    fp8 = w13_scale is not None
    fp32 = x.dtype == torch.float32
    invariant = invariant_scope()  # tiles of 64-assignment blocks whatever the batch, slots summed in order
    t = moe_tiles(64 * experts if invariant else n, experts, fp32, fp8)
    sorted_ids, block_expert = sort_by_expert(topk_ids, experts, t.block_m)
    num_blocks = block_expert.numel()
    w13c, w2c = w13.contiguous(), w2.contiguous()
    if w13_scale is not None and w2_scale is not None:  # fp8 weights (the core checks the scales come together)
        s13, s2 = w13_scale, w2_scale
        s13_strides, s2_strides = (s13.stride(0), s13.stride(1), s13.stride(2)), (s2.stride(0), s2.stride(1), s2.stride(2))
    else:  # unused pointers
        s13, s2 = w13c, w2c
        s13_strides = s2_strides = (0, 0, 0)
    xa, xs = quantize_groups(x) if fp8 else (x, x)  # x: an unused scale pointer
    h = torch.empty((n, inter), dtype=x.dtype, device=x.device)
    K._moe_gate_up_kernel[(num_blocks, triton.cdiv(inter, t.block_n))](
        xa, xs, w13c, s13, h, sorted_ids, block_expert, experts, inter, hidden, top_k, n,
        w13c.stride(0), w13c.stride(1), *s13_strides,
        FP8=fp8, BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k, UPCAST=UPCAST, IEEE=fp32,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    ha, hs = quantize_groups(h) if fp8 else (h, h)
    y = torch.empty((n, hidden), dtype=x.dtype, device=x.device)
    down_n = t.down_block_n or t.block_n
    K._moe_down_kernel[(num_blocks, triton.cdiv(hidden, down_n))](
        ha, hs, w2c, s2, y, topk_weights.reshape(-1), sorted_ids, block_expert, experts, inter, hidden, n,
        w2c.stride(0), w2c.stride(1), *s2_strides,
        FP8=fp8, BLOCK_M=t.block_m, BLOCK_N=down_n, BLOCK_K=t.block_k, UPCAST=UPCAST, IEEE=fp32,
        num_warps=t.num_warps, num_stages=t.num_stages,
    )
    if top_k == 1:
        return y
    slots = y.view(tokens, top_k, hidden)
    if invariant:  # torch's reduction may split a small batch's sum across threads: add the slots one by one
        total = slots[:, 0].float()
        for j in range(1, top_k):
            total = total + slots[:, j]
        return total.to(x.dtype)
    return slots.sum(dim=1, dtype=torch.float32).to(x.dtype)
