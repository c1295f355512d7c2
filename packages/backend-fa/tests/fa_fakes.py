"""CPU stand-ins for the FlashAttention entry points, written from their documented semantics
(docstrings of flash_attn/cute/interface.py, hopper/flash_attn_interface.py and
flash_attn/flash_attn_interface.py): argument names, tensor layouts in and out, bottom-right
causal/window masks, soft cap, LSE layouts. Tests put them where the real modules would be to
check the backend's glue (conversions, argument names, output layouts) against the reference.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import torch

calls: list[dict[str, Any]] = []


def attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool, left: int | None,
               right: int | None, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence: q (Sq, H, D), k (Sk, Hkv, D), v (Sk, Hkv, Dv) -> out (Sq, H, Dv), lse (Sq, H) float64.

    Query i sits on key column ``i + Sk - Sq`` (bottom-right); keys in [col - left, col + right] are
    kept (None = unbounded); causal sets right = 0. Rows with no key: out 0, lse -inf.
    """
    sq, h, _ = q.shape
    sk = k.shape[0]
    g = h // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    if cap > 0:
        s = cap * torch.tanh(s / cap)
    diag = torch.arange(sq)[:, None] + (sk - sq)
    col = torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if causal:
        right = 0
    if right is not None:
        keep &= col <= diag + right
    if left is not None:
        keep &= col >= diag - left
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.where(torch.isfinite(lse)[..., None], torch.exp(s - lse[..., None]), torch.zeros_like(s))
    return torch.einsum("hqk,khd->qhd", p, vv), lse.t()


def _paged(pool: torch.Tensor, row: torch.Tensor, n: int) -> torch.Tensor:
    ps = pool.shape[1]
    pos = torch.arange(n)
    return pool[row.long()[pos // ps], pos % ps]


def _run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, cu_q: torch.Tensor | None, cu_k: torch.Tensor | None,
         used_k: torch.Tensor | None, table: torch.Tensor | None, scale: float | None, causal: bool, left: int | None,
         right: int | None, cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns FA-layout out and lse: batched (B, Sq, H, Dv) / (B, H, Sq), varlen (T, H, Dv) / (H, T)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    batched = cu_q is None
    nb = q.shape[0] if batched else cu_q.shape[0] - 1  # type: ignore[union-attr]
    outs, lses = [], []
    for b in range(nb):
        qb = q[b] if batched else q[int(cu_q[b]):int(cu_q[b + 1])]  # type: ignore[index]
        if table is not None:
            n = int(used_k[b])  # type: ignore[index]
            kb, vb = _paged(k, table[b], n), _paged(v, table[b], n)
        elif cu_k is not None:
            kb, vb = k[int(cu_k[b]):int(cu_k[b + 1])], v[int(cu_k[b]):int(cu_k[b + 1])]
        else:
            kb, vb = k[b], v[b]
        o, s = attend_one(qb, kb, vb, scale, causal, left, right, cap)
        outs.append(o.to(q.dtype))
        lses.append(s.float())
    if batched:
        return torch.stack(outs), torch.stack(lses).transpose(1, 2).contiguous()
    return torch.cat(outs), torch.cat(lses).t().contiguous()


def _fa23_window(window_size: tuple[int, int]) -> tuple[int | None, int | None]:
    left, right = window_size
    return (None if left < 0 else left), (None if right < 0 else right)


# -- FA4: flash_attn.cute.flash_attn_varlen_func ------------------------------------------------------------
def fa4_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qv: Any = None, cu_seqlens_q: Any = None,
               cu_seqlens_k: Any = None, max_seqlen_q: Any = None, max_seqlen_k: Any = None, min_seqlen_k: Any = None,
               seqused_q: Any = None, seqused_k: Any = None, gather_kv_indices: Any = None, page_table: Any = None,
               softmax_scale: float | None = None, causal: bool = False,
               window_size: tuple[int | None, int | None] = (None, None), learnable_sink: Any = None,
               softcap: float = 0.0, num_splits: int = 1, pack_gqa: Any = None, deterministic: bool = False,
               return_lse: bool = False, **rest: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    assert page_table is None or cu_seqlens_k is None, "page_table is not supported with cu_seqlens_k"
    for t in (cu_seqlens_q, cu_seqlens_k, seqused_k, page_table):
        assert t is None or t.dtype == torch.int32
    calls.append({"fn": "fa4", "num_splits": num_splits, "batch": q.shape[0] if cu_seqlens_q is None else None})
    out, lse = _run(q, k, v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, used_k=seqused_k, table=page_table,
                    scale=softmax_scale, causal=causal, left=window_size[0], right=window_size[1], cap=softcap)
    return out, (lse if return_lse else None)


def fa4_dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qv: Any = None, gather_kv_indices: Any = None,
              softmax_scale: float | None = None, causal: bool = False,
              window_size: tuple[int | None, int | None] = (None, None), learnable_sink: Any = None,
              softcap: float = 0.0, num_splits: int = 1, pack_gqa: Any = None, deterministic: bool = False,
              return_lse: bool = False, **rest: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``flash_attn.cute.flash_attn_func``: q (B, Sq, H, D), k / v (B, Sk, Hkv, D) -> out (B, Sq, H, Dv), lse (B, H, Sq)."""
    assert q.dim() == k.dim() == v.dim() == 4 and q.shape[0] == k.shape[0] == v.shape[0]
    calls.append({"fn": "fa4_dense", "batch": q.shape[0], "pack_gqa": pack_gqa})
    out, lse = _run(q, k, v, cu_q=None, cu_k=None, used_k=None, table=None, scale=softmax_scale, causal=causal,
                    left=window_size[0], right=window_size[1], cap=softcap)
    return out, (lse if return_lse else None)


# -- FA3 / FA2 ----------------------------------------------------------------------------------------------
def _kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_seqlens: torch.Tensor,
             table: torch.Tensor, cu_seqlens_q: Any, softmax_scale: float | None, causal: bool,
             window_size: tuple[int, int], softcap: float, return_softmax_lse: bool) -> Any:
    left, right = _fa23_window(window_size)
    out, lse = _run(q, k_cache, v_cache, cu_q=cu_seqlens_q, cu_k=None, used_k=cache_seqlens, table=table,
                    scale=softmax_scale, causal=causal, left=left, right=right, cap=softcap)
    return (out, lse) if return_softmax_lse else out


def fa3_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Any = None, v: Any = None,
                     qv: Any = None, rotary_cos: Any = None, rotary_sin: Any = None, cache_seqlens: Any = None,
                     cache_batch_idx: Any = None, cache_leftpad: Any = None, page_table: Any = None,
                     cu_seqlens_q: Any = None, cu_seqlens_k_new: Any = None, max_seqlen_q: Any = None,
                     rotary_seqlens: Any = None, q_descale: Any = None, k_descale: Any = None, v_descale: Any = None,
                     softmax_scale: float | None = None, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                     attention_chunk: int = 0, softcap: float = 0.0, rotary_interleaved: bool = True,
                     scheduler_metadata: Any = None, num_splits: int = 0, pack_gqa: Any = None, sm_margin: int = 0,
                     return_softmax_lse: bool = False) -> Any:
    assert cu_seqlens_q is None or max_seqlen_q is not None
    calls.append({"fn": "fa3_with_kvcache"})
    return _kvcache(q, k_cache, v_cache, cache_seqlens, page_table, cu_seqlens_q, softmax_scale, causal, window_size,
                    softcap, return_softmax_lse)


def fa3_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
               max_seqlen_q: int, max_seqlen_k: int, seqused_q: Any = None, seqused_k: Any = None,
               softmax_scale: float | None = None, causal: bool = False, qv: Any = None, q_descale: Any = None,
               k_descale: Any = None, v_descale: Any = None, window_size: tuple[int, int] = (-1, -1),
               attention_chunk: int = 0, softcap: float = 0.0, num_splits: int = 1, pack_gqa: Any = None,
               deterministic: bool = False, sm_margin: int = 0, return_attn_probs: bool = False) -> Any:
    calls.append({"fn": "fa3_varlen"})
    left, right = _fa23_window(window_size)
    out, lse = _run(q, k, v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, used_k=None, table=None, scale=softmax_scale,
                    causal=causal, left=left, right=right, cap=softcap)
    return (out, lse) if return_attn_probs else out


def fa2_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Any = None, v: Any = None,
                     rotary_cos: Any = None, rotary_sin: Any = None, cache_seqlens: Any = None,
                     cache_batch_idx: Any = None, cache_leftpad: Any = None, block_table: Any = None,
                     softmax_scale: float | None = None, causal: bool = False, window_size: tuple[int, int] = (-1, -1),
                     softcap: float = 0.0, rotary_interleaved: bool = True, alibi_slopes: Any = None,
                     num_splits: int = 0, return_softmax_lse: bool = False) -> Any:
    calls.append({"fn": "fa2_with_kvcache"})
    return _kvcache(q, k_cache, v_cache, cache_seqlens, block_table, None, softmax_scale, causal, window_size, softcap,
                    return_softmax_lse)


def fa2_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
               max_seqlen_q: int, max_seqlen_k: int, dropout_p: float = 0.0, softmax_scale: float | None = None,
               causal: bool = False, window_size: tuple[int, int] = (-1, -1), softcap: float = 0.0,
               alibi_slopes: Any = None, deterministic: bool = False, return_attn_probs: bool = False,
               block_table: Any = None) -> Any:
    """FA2 varlen; with ``block_table`` k/v are page pools and cu_seqlens_k counts each sequence's keys."""
    calls.append({"fn": "fa2_varlen", "paged": block_table is not None})
    left, right = _fa23_window(window_size)
    if block_table is not None:
        used = cu_seqlens_k[1:] - cu_seqlens_k[:-1]
        out, lse = _run(q, k, v, cu_q=cu_seqlens_q, cu_k=None, used_k=used, table=block_table, scale=softmax_scale,
                        causal=causal, left=left, right=right, cap=softcap)
    else:
        out, lse = _run(q, k, v, cu_q=cu_seqlens_q, cu_k=cu_seqlens_k, used_k=None, table=None, scale=softmax_scale,
                        causal=causal, left=left, right=right, cap=softcap)
    return (out, lse, torch.empty(0)) if return_attn_probs else out


FA3_MODULE = SimpleNamespace(flash_attn_with_kvcache=fa3_with_kvcache, flash_attn_varlen_func=fa3_varlen)
FA2_MODULE = SimpleNamespace(flash_attn_with_kvcache=fa2_with_kvcache, flash_attn_varlen_func=fa2_varlen)


# -- torch SDPA (flash backend semantics: top-left causal) ----------------------------------------------------
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> torch.Tensor:
    """(1, Hq, Sq, D) x (1, Hkv, Sk, D): torch's math SDPA, top-left causal like torch's flash backend."""
    return torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                            scale=scale, enable_gqa=True).to(q.dtype)


def flash_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """aten flash semantics: equal head counts, top-left causal; out (1, H, Sq, D), lse (1, H, Sq)."""
    assert q.shape[1] == k.shape[1], "the aten flash kernel gets equal head counts here"
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v.double())
    return out.to(q.dtype), lse.float()
