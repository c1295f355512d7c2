"""FlashAttention-2 (``flash_attn``) and FlashAttention-3 (``flash_attn_interface``), when installed.

- decode: ``flash_attn_with_kvcache`` on one-token queries (B, 1, Hq, D) over the paged NHD pool
  (``block_table`` in FA2, ``page_table`` in FA3), ``cache_seqlens``, split-KV by its heuristic.
- prefill over pages: FA3 ``flash_attn_with_kvcache`` with ``cu_seqlens_q``; FA2
  ``flash_attn_varlen_func`` with ``block_table`` and ``cu_seqlens_k`` made from the lengths.
- prefill_ragged: ``flash_attn_varlen_func``.
- Page sizes: FA2's paged kernels need multiples of 256; FA3 takes any size.
- Head dims: FA2 up to 256 (Q/K and V equal); FA3 up to 256, plus 192/128.
- Both: causal (bottom-right), sliding window, soft cap, LSE, GQA; sm_80-90 (FA2), sm_90 (FA3).
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.paged import PagedKVCache, PageTable

from .convert import cu_seqlens, decode_queries, lse_batched, lse_varlen, softcap, window_fa
from .cost import decode_cost, prefill_cost
from .providers import FA2, FA3, Provider, load

HALF = frozenset({torch.float16, torch.bfloat16})
DIMS = frozenset(range(8, 257, 8))
_COMMON = frozenset({"return_lse", "soft_cap", "sliding_window", "cuda_graph"})


def _module(key: str) -> Any:
    return load(FA3 if key == "fa3" else FA2)


def _fa2_pages(pr: Any) -> list[str]:
    if pr.page_size % 256:
        return [f"page_size={pr.page_size} not supported (FA2's paged kernels need a multiple of 256)"]
    return []


def _fa3_dims(pr: Any) -> list[str]:
    if pr.head_dim != pr.head_dim_v and (pr.head_dim, pr.head_dim_v) != (192, 128):
        return [f"(head_dim, head_dim_v)=({pr.head_dim}, {pr.head_dim_v}) not supported (equal dims or (192, 128))"]
    return []


def capabilities(provider: Provider) -> dict[str, Capability]:
    fa3 = provider.key == "fa3"
    dims_differ = frozenset({"qk_v_dims_differ"}) if fa3 else frozenset()
    common = dict(devices=frozenset({"cuda"}), min_cc=provider.min_cc, max_cc=provider.max_cc, dtypes=HALF,
                  kv_dtypes=HALF, head_dims=DIMS, head_dims_v=DIMS)
    paged_check = _fa3_dims if fa3 else _fa2_pages
    nhd = frozenset({"NHD"})
    return {
        "attention.decode": Capability(**common, layouts=nhd, features=_COMMON | dims_differ | {"paged"},  # type: ignore[arg-type]
                                       check=paged_check),
        "attention.prefill": Capability(**common, layouts=nhd,  # type: ignore[arg-type]
                                        features=_COMMON | dims_differ | {"paged", "causal", "mixed_batch"},
                                        check=paged_check),
        "attention.prefill_ragged": Capability(**common,  # type: ignore[arg-type]
                                               features=_COMMON | dims_differ | {"ragged", "causal", "mixed_batch"},
                                               check=_fa3_dims if fa3 else None),
    }


def _empty_result(q: torch.Tensor, dv: int, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    out = q.new_zeros((q.shape[0], q.shape[1], dv))
    return out, (q.new_full(q.shape[:2], float("-inf"), dtype=torch.float32) if p.return_lse else None)


def _split(res: Any, return_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FA returns ``out`` alone, or a tuple whose first two entries are (out, lse)."""
    if return_lse:
        return res[0], res[1]
    return (res[0] if isinstance(res, tuple) else res), None


def make_decode(key: str) -> Any:
    def decode(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (B, Hq, D) -> out (B, Hq, Dv), lse (B, Hq) or None."""
        if q.shape[0] == 0 or not (table.max_pages and cache.num_pages):
            return _empty_result(q, cache.head_dim_v, p)
        pages = {"page_table" if key == "fa3" else "block_table": table.block_table}
        res = _module(key).flash_attn_with_kvcache(
            decode_queries(q), cache.k_pages, cache.v_pages, cache_seqlens=table.seq_lens, softmax_scale=p.sm_scale,
            causal=True, window_size=window_fa(p.window_left, True), softcap=softcap(p.logits_soft_cap),
            num_splits=0, return_softmax_lse=p.return_lse, **pages)
        out, lse = _split(res, p.return_lse)
        return out[:, 0], (lse_batched(lse) if lse is not None else None)

    return decode


def make_prefill(key: str) -> Any:
    def prefill(q: torch.Tensor, qo_indptr: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (Tq, Hq, D) packed by qo_indptr over the paged pool -> out (Tq, Hq, Dv), lse (Tq, Hq) or None."""
        if q.shape[0] == 0 or not (table.max_pages and cache.num_pages):
            return _empty_result(q, cache.head_dim_v, p)
        mod = _module(key)
        window, cap = window_fa(p.window_left, p.causal), softcap(p.logits_soft_cap)
        if key == "fa3":
            res = mod.flash_attn_with_kvcache(
                q, cache.k_pages, cache.v_pages, cache_seqlens=table.seq_lens, page_table=table.block_table,
                cu_seqlens_q=qo_indptr, max_seqlen_q=max(p.max_q_len, 1), softmax_scale=p.sm_scale, causal=p.causal,
                window_size=window, softcap=cap, return_softmax_lse=p.return_lse)
        else:
            res = mod.flash_attn_varlen_func(
                q, cache.k_pages, cache.v_pages, qo_indptr, cu_seqlens(table.seq_lens), max(p.max_q_len, 1),
                max(p.max_kv_len, 1), softmax_scale=p.sm_scale, causal=p.causal, window_size=window, softcap=cap,
                return_attn_probs=p.return_lse, block_table=table.block_table)
        out, lse = _split(res, p.return_lse)
        return out, (lse_varlen(lse) if lse is not None else None)

    return prefill


def make_ragged(key: str) -> Any:
    def prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor,
                       kv_indptr: torch.Tensor, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) packed by the indptrs -> out (Tq, Hq, Dv), lse or None."""
        if q.shape[0] == 0 or k.shape[0] == 0:
            return _empty_result(q, v.shape[-1], p)
        res = _module(key).flash_attn_varlen_func(
            q, k, v, qo_indptr, kv_indptr, max(p.max_q_len, 1), max(p.max_kv_len, 1), softmax_scale=p.sm_scale,
            causal=p.causal, window_size=window_fa(p.window_left, p.causal), softcap=softcap(p.logits_soft_cap),
            return_attn_probs=p.return_lse)
        out, lse = _split(res, p.return_lse)
        return out, (lse_varlen(lse) if lse is not None else None)

    return prefill_ragged


def kernels(provider: Provider, version: str | None, unavailable: str | None) -> list[Kernel]:
    """Kernel records of FA2 or FA3; ``unavailable`` (reason) marks them all when it cannot run here."""
    key = provider.key
    caps = capabilities(provider)
    tag = f"{key}@{version or 'none'}"
    extra = dict(backend="fa", version=version or "", unavailable=unavailable,
                 install=provider.install if unavailable else None)
    return [
        Kernel("attention.decode", f"{tag}:decode", capability=caps["attention.decode"], run=make_decode(key),
               cost=decode_cost(key), doc=f"{key.upper()} flash_attn_with_kvcache, paged", reads_stale_slots=True,
               **extra),  # type: ignore[arg-type]
        Kernel("attention.prefill", f"{tag}:prefill", capability=caps["attention.prefill"], run=make_prefill(key),
               cost=prefill_cost(key), doc=f"{key.upper()} varlen queries over the paged pool", reads_stale_slots=True,
               **extra),  # type: ignore[arg-type]
        Kernel("attention.prefill_ragged", f"{tag}:prefill_ragged", capability=caps["attention.prefill_ragged"],
               run=make_ragged(key), cost=prefill_cost(key), doc=f"{key.upper()} flash_attn_varlen_func",
               **extra),  # type: ignore[arg-type]
    ]


PROVIDERS = (FA3, FA2)
