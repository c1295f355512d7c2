"""Reference MoE kernels (see :mod:`kernel_switchboard.ops.moe` for signatures and semantics).

Routing in float32 with ``torch.topk``; experts as one float32 GEMM pair per expert that has tokens
(fp8 weights dequantized block by block, one expert at a time), in true float32 on every device: TF32 is
never used, whatever ``torch.backends.cuda.matmul.allow_tf32`` says, so the GPU and CPU results differ only by
float32 summation order. The expert loop reads the token counts on the host, so the experts kernel is not
CUDA-graph capturable.
"""

from __future__ import annotations

import torch

from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, INVARIANT_REFERENCE, PRIORITY
from ._rows import rowwise
from .gemm import _mm32

BLOCK = 128


def route(router_logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool, num_expert_group: int | None,
          topk_group: int | None, correction_bias: torch.Tensor | None,
          routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    logits = router_logits.float()
    scores = torch.softmax(logits, dim=-1) if scoring == "softmax" else torch.sigmoid(logits)
    select = scores if correction_bias is None else scores + correction_bias.float()
    if num_expert_group:
        t, e = select.shape
        grouped = select.view(t, num_expert_group, e // num_expert_group)
        if correction_bias is not None:
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
        else:
            group_score = grouped.amax(-1)
        best = group_score.topk(int(topk_group or num_expert_group), dim=-1).indices
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(1, best, True)
        select = select.masked_fill(~keep.repeat_interleave(e // num_expert_group, dim=1), float("-inf"))
    ids = select.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-20)
    return weights * routed_scaling_factor, ids.to(torch.int32)


def dequantize_block(w: torch.Tensor, scale: torch.Tensor | None, block: int = BLOCK) -> torch.Tensor:
    """float32 weights from (..., N, K) ``w`` and its (..., ceil(N/block), ceil(K/block)) block scales."""
    if scale is None:
        return w.float()
    n, k = w.shape[-2:]
    s = scale.float().repeat_interleave(block, dim=-2)[..., :n, :].repeat_interleave(block, dim=-1)[..., :k]
    return w.float() * s


def fused_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None) -> torch.Tensor:
    t, k = topk_ids.shape
    e, inter = w13.shape[0], w2.shape[2]
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    tokens = torch.arange(t, device=x.device).repeat_interleave(k)[order]
    weights = topk_weights.reshape(-1).float()[order]
    counts = torch.bincount(flat, minlength=e).tolist()  # host sync
    x32 = x.float()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = tokens[start:start + count]
        gate_up = _mm32(x32[rows], dequantize_block(w13[expert], None if w13_scale is None else w13_scale[expert]).T)
        act = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        out = _mm32(act, dequantize_block(w2[expert], None if w2_scale is None else w2_scale[expert]).T)
        y.index_add_(0, rows, out * weights[start:start + count, None])
        start += count
    return y.to(x.dtype)


KERNELS = [
    Kernel("moe.route", "route", "reference", INVARIANT_CAPTURABLE, rowwise(route, rows=(0,)), priority=PRIORITY,
           doc="softmax / sigmoid top-k, DeepSeek grouped top-k (float32)"),
    Kernel("moe.fused_moe", "fused_moe", "reference", INVARIANT_REFERENCE, rowwise(fused_moe, rows=(0, 1, 2)),
           priority=PRIORITY,
           doc="one float32 GEMM pair per expert; fp8 block weights dequantized"),
]
