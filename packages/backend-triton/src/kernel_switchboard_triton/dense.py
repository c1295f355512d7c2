"""``attention.dense`` on the ragged prefill kernel: the bias or mask is a variant hook that reads it.

Dense (B, H, L, D) tensors are the ragged prefill's packed (B * L, H, D) tokens with equal lengths (a view when
each batch row's tokens are evenly spaced, as for (B, L, H, D) memory transposed to (B, H, L, D); a copy
otherwise). A float bias is added to the scores by a ``score_mod`` and a bool mask removes scores by a
``mask_mod``; both load the bias at (batch, head, query, key) through its own strides, so broadcast biases
(stride 0) are read in place. The output is a (B, H, Lq, Dv) view of the packed result.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
import triton
import triton.language as tl

from kernel_switchboard import Variant
from kernel_switchboard.device import is_capturing
from kernel_switchboard.variants import BoundVariant

from ._prefill import launch_prefill, prefill_config


@triton.jit
def _bias_at(q_pos, kv_pos, head, batch, args, other, WIDE: tl.constexpr):
    """The bias at (batch, head, query, key); args = (bias, stride b, h, q, k, q_len, kv_len). Offsets in int32
    unless WIDE (a bias spanning :data:`WIDE_SPAN` elements or more): int64 (M, N) offset tiles cost registers
    (sm_90 ptxas, 128x64 tiles: 976 B of stack against 640 B)."""
    q_idx = q_pos - (args[6] - args[5])  # bottom-right: query i sits at KV position kv_len - q_len + i
    ok = (q_idx >= 0) & (q_idx < args[5]) & (kv_pos < args[6])
    if WIDE:
        offset = batch.to(tl.int64) * args[1] + head.to(tl.int64) * args[2] + q_idx.to(tl.int64) * args[3] \
            + kv_pos.to(tl.int64) * args[4]
    else:
        offset = batch * args[1] + head * args[2] + q_idx * args[3] + kv_pos * args[4]
    return tl.load(args[0] + offset, mask=ok, other=other)


@triton.jit
def _float_bias_score(s, q_pos, kv_pos, head, batch, args):
    return s + _bias_at(q_pos, kv_pos, head, batch, args, 0.0, False).to(tl.float32)


@triton.jit
def _float_bias_score_wide(s, q_pos, kv_pos, head, batch, args):
    return s + _bias_at(q_pos, kv_pos, head, batch, args, 0.0, True).to(tl.float32)


@triton.jit
def _bool_mask(q_pos, kv_pos, head, batch, args):
    return _bias_at(q_pos, kv_pos, head, batch, args, 0, False) != 0


@triton.jit
def _bool_mask_wide(q_pos, kv_pos, head, batch, args):
    return _bias_at(q_pos, kv_pos, head, batch, args, 0, True) != 0


def _unused(*_: Any) -> Any:  # the reference evaluates attention.dense directly, never through these variants
    raise NotImplementedError("dense-attention bias variants run only inside the Triton dense kernel")


_PARAMS = ("bias", "stride_b", "stride_h", "stride_q", "stride_k", "q_len", "kv_len")
#: biases whose elements span this many or more take int64 offsets
WIDE_SPAN = 2**31
#: (bool mask?, wide offsets?) -> the variant that reads the bias
_BIAS_VARIANTS = {
    (False, False): Variant("dense_float_bias", score_mod=_float_bias_score, torch_score_mod=_unused, params=_PARAMS),
    (False, True): Variant("dense_float_bias_wide", score_mod=_float_bias_score_wide, torch_score_mod=_unused,
                           params=_PARAMS),
    (True, False): Variant("dense_bool_mask", mask_mod=_bool_mask, torch_mask_mod=_unused, params=_PARAMS),
    (True, True): Variant("dense_bool_mask_wide", mask_mod=_bool_mask_wide, torch_mask_mod=_unused, params=_PARAMS),
}

_INDPTR: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def _indptr(batch: int, length: int, device: torch.device) -> torch.Tensor:
    """(B + 1,) int32 offsets of B equal requests, cached (no allocation on repeated shapes). Inside a CUDA-graph
    capture a fresh one is made by the graph and never cached (its memory belongs to the graph's pool)."""
    key = (batch, length, device)
    cached = _INDPTR.get(key)
    if cached is not None:
        return cached
    offsets = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)[: batch + 1]
    if not is_capturing():
        if len(_INDPTR) > 256:
            _INDPTR.clear()
        _INDPTR[key] = offsets
    return offsets


def _packed(t: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) -> (B * L, H, D): a view when the tokens are evenly spaced, else a copy."""
    return t.transpose(1, 2).reshape(t.shape[0] * t.shape[2], t.shape[1], t.shape[3])


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None, p: Any) -> torch.Tensor:
    """The ``attention.dense`` kernel: q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, Hq, Lq, Dv)."""
    b, hq, lq, _ = q.shape
    lk, dv = k.shape[2], v.shape[3]
    cfg = prefill_config(q.device, q.shape[3], dv, triton.next_power_of_2(lq * (hq // k.shape[1])))
    variant = None
    if attn_bias is not None:
        full = attn_bias.expand(b, hq, lq, lk)  # strides 0 on broadcast dims: read in place
        span = sum((n - 1) * st for n, st in zip(full.shape, full.stride()))
        kind = _BIAS_VARIANTS[(full.dtype == torch.bool, span >= WIDE_SPAN)]
        variant = BoundVariant(kind, (full.view(torch.uint8) if full.dtype == torch.bool else full, *full.stride(), lq, lk))
        # the bias tile is one more (M, N) operand: 64-wide KV tiles spill a third as much (sm_90 ptxas, 128-row
        # tiles: 640 B of stack against 2.1 KB at 128 wide)
        cfg = cfg._replace(block_n=min(cfg.block_n, 64))
    params = SimpleNamespace(sm_scale=p.sm_scale, logits_soft_cap=None, window_left=-1, causal=p.causal,
                             return_lse=False, max_q_len=lq, max_kv_len=lk, variant=variant)
    out = torch.empty(b, lq, hq, dv, dtype=q.dtype, device=q.device)
    launch_prefill(_packed(q), _packed(k), _packed(v), _indptr(b, lq, q.device), _indptr(b, lk, q.device), None, None,
                   None, 1, out.view(b * lq, hq, dv), None, params, cfg)
    return out.transpose(1, 2)
