"""``attention.merge_states``: combine two attention results over disjoint KV sets by their LSE."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_states_kernel(
    oa_ptr,  # (T, H, D) out_a
    la_ptr,  # (T, H) float32 lse_a, natural log (-inf = empty)
    ob_ptr,  # (T, H, D) out_b
    lb_ptr,  # (T, H) float32 lse_b
    o_ptr,  # (T, H, D) merged out, out_a's dtype
    l_ptr,  # (T, H) float32 merged lse
    heads,  # H
    stride_oat,  # out_a stride over tokens
    stride_oah,  # out_a stride over heads
    stride_obt,  # out_b stride over tokens
    stride_obh,  # out_b stride over heads
    stride_ot,  # out stride over tokens
    stride_oh,  # out stride over heads
    stride_lat,  # lse_a stride over tokens (head stride 1)
    stride_lbt,  # lse_b stride over tokens (head stride 1)
    stride_lt,  # out lse stride over tokens (head stride 1)
    HEAD_DIM: tl.constexpr,  # D
    BLOCK_D: tl.constexpr,  # next power of two of D
    BLOCK_H: tl.constexpr,  # heads per program
):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask_h = offs_h < heads
    mask = mask_h[:, None] & (offs_d < HEAD_DIM)[None, :]
    la = tl.load(la_ptr + t * stride_lat + offs_h, mask=mask_h, other=float("-inf"))
    lb = tl.load(lb_ptr + t * stride_lbt + offs_h, mask=mask_h, other=float("-inf"))
    m = tl.maximum(la, lb)
    m = tl.where(m == float("-inf"), 0.0, m)
    wa = tl.exp2((la - m) * 1.4426950408889634)
    wb = tl.exp2((lb - m) * 1.4426950408889634)
    total = wa + wb
    safe = tl.where(total > 0.0, total, 1.0)
    oa = tl.load(oa_ptr + t * stride_oat + offs_h[:, None] * stride_oah + offs_d[None, :], mask=mask, other=0.0)
    ob = tl.load(ob_ptr + t * stride_obt + offs_h[:, None] * stride_obh + offs_d[None, :], mask=mask, other=0.0)
    out = oa.to(tl.float32) * (wa / safe)[:, None] + ob.to(tl.float32) * (wb / safe)[:, None]
    tl.store(o_ptr + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=mask)
    tl.store(l_ptr + t * stride_lt + offs_h, tl.where(total > 0.0, tl.log(safe) + m, float("-inf")), mask=mask_h)


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``attention.merge_states`` kernel: out (T, H, D) in out_a's dtype, lse (T, H) float32."""
    t, h, d = out_a.shape
    out = out_a.new_empty(t, h, d)
    lse = lse_a.new_empty(t, h)
    if t == 0 or h == 0:
        return out, lse
    block_d = triton.next_power_of_2(d)
    block_h = min(triton.next_power_of_2(h), max(1, 2048 // block_d))
    _merge_states_kernel[(t, triton.cdiv(h, block_h))](
        out_a, lse_a, out_b, lse_b, out, lse, h,
        out_a.stride(0), out_a.stride(1), out_b.stride(0), out_b.stride(1), out.stride(0), out.stride(1),
        lse_a.stride(0), lse_b.stride(0), lse.stride(0),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_H=block_h, num_warps=4,
    )
    return out, lse
