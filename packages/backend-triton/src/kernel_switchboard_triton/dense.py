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

from ._prefill import launch_prefill


@triton.jit
def _bias_at(q_pos, kv_pos, head, batch, args, other):
    """The bias at (batch, head, query, key); args = (bias, stride b, h, q, k, q_len, kv_len)."""
    q_idx = q_pos - (args[6] - args[5])  # bottom-right: query i sits at KV position kv_len - q_len + i
    ok = (q_idx >= 0) & (q_idx < args[5]) & (kv_pos < args[6])
    offset = batch.to(tl.int64) * args[1] + head.to(tl.int64) * args[2] + q_idx.to(tl.int64) * args[3] \
        + kv_pos.to(tl.int64) * args[4]
    return tl.load(args[0] + offset, mask=ok, other=other)


@triton.jit
def _float_bias_score(s, q_pos, kv_pos, head, batch, args):
    return s + _bias_at(q_pos, kv_pos, head, batch, args, 0.0).to(tl.float32)


@triton.jit
def _bool_mask(q_pos, kv_pos, head, batch, args):
    return _bias_at(q_pos, kv_pos, head, batch, args, 0) != 0


def _unused(*_: Any) -> Any:  # the reference evaluates attention.dense directly, never through these variants
    raise NotImplementedError("dense-attention bias variants run only inside the Triton dense kernel")


_FLOAT_BIAS = Variant("dense_float_bias", score_mod=_float_bias_score, torch_score_mod=_unused,
                      params=("bias", "stride_b", "stride_h", "stride_q", "stride_k", "q_len", "kv_len"))
_BOOL_MASK = Variant("dense_bool_mask", mask_mod=_bool_mask, torch_mask_mod=_unused,
                     params=("mask", "stride_b", "stride_h", "stride_q", "stride_k", "q_len", "kv_len"))

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
    variant = None
    if attn_bias is not None:
        full = attn_bias.expand(b, hq, lq, lk)  # strides 0 on broadcast dims: read in place
        bias = full.view(torch.uint8) if full.dtype == torch.bool else full
        kind = _BOOL_MASK if full.dtype == torch.bool else _FLOAT_BIAS
        variant = BoundVariant(kind, (bias, *full.stride(), lq, lk))
    params = SimpleNamespace(sm_scale=p.sm_scale, logits_soft_cap=None, window_left=-1, causal=p.causal,
                             return_lse=False, max_q_len=lq, max_kv_len=lk, variant=variant)
    out = torch.empty(b, lq, hq, dv, dtype=q.dtype, device=q.device)
    launch_prefill(_packed(q), _packed(k), _packed(v), _indptr(b, lq, q.device), _indptr(b, lk, q.device), None, None,
                   None, 1, out.view(b * lq, hq, dv), None, params)
    return out.transpose(1, 2)
