"""``attn_implementation="ksb"``: transformers' attention call served by the switchboard's attention ops.

transformers calls ``attention_forward(module, query, key, value, attention_mask, scaling=..., dropout=...,
softcap=..., sliding_window=..., **kwargs)`` from every attention layer, with query ``(B, Hq, Lq, D)``, key and value
``(B, Hkv, Lk, D)`` (the whole cache when there is one) and the mask that :func:`ksb_mask` built; it expects
``(out (B, Lq, Hq, Dv), None)``.

How a call is served:

- The mask says who attends whom. When it is the bottom-right causal (or full) pattern over per-request runs of
  rows and columns (:mod:`._layout`: left padding, a static cache's unwritten slots, a sliding window), the
  call runs on the switchboard's length-based kernels: with no left padding the keys are read in place as a paged
  cache of one-token pages (:func:`_in_place_cache`; ``attention.decode`` for one query token, ``attention.prefill``
  otherwise); with left padding the kept rows are gathered into ``attention.prefill_ragged``.
- Any other mask (right padding, bidirectional image blocks, a custom 4-d mask) runs on ``attention.dense`` with
  the mask itself, which is exact for every mask; with a soft-cap, which ``attention.dense`` does not apply, such a
  mask is refused.
- GQA reads the key/value heads directly (no repeat); ``scaling`` is the kernels' ``sm_scale``, ``softcap`` their
  ``logits_soft_cap``.

Refused by name, never approximated: dropout, ``output_attentions=True`` (the kernels do not form the attention
matrix), a position bias (T5), attention sinks, a continuous-batching paged cache passed to the non-paged entry,
and a missing mask where the causal alignment is ambiguous.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import fail

from ._layout import Layout, layout_of, uniform_layout

_Tensor = torch.Tensor
NAME = "ksb"


def window_left_of(sliding_window: Any) -> int | None:
    """transformers' ``sliding_window`` (a query sees itself and the ``sliding_window - 1`` keys before it) as the
    kernels' ``window_left``; None or a non-positive value: no window."""
    if sliding_window is None or isinstance(sliding_window, bool):
        return None
    if not isinstance(sliding_window, int):
        raise fail("sliding_window", sliding_window, "an int or None")
    return sliding_window - 1 if sliding_window > 0 else None


def _refuse_unsupported(module: Any, dropout: float, kwargs: dict[str, Any]) -> None:
    if dropout:
        raise fail("dropout", dropout, f"0.0 (attn_implementation={NAME!r} is for inference; call model.eval())")
    if kwargs.get("output_attentions"):
        raise fail("output_attentions", True, f"False: attn_implementation={NAME!r} never forms the attention "
                                              "weights (use 'eager' to inspect them)")
    if kwargs.get("position_bias") is not None:
        raise fail("position_bias", "a tensor", f"None: attn_implementation={NAME!r} adds no relative-position bias")
    if kwargs.get("s_aux") is not None or getattr(module, "sinks", None) is not None:
        raise fail("sinks", "attention sinks", f"a model without them: attn_implementation={NAME!r} has no sink term")
    if kwargs.get("cache") is not None:
        raise fail("cache", type(kwargs["cache"]).__name__,
                   f"None: continuous batching reaches the switchboard as 'paged|{NAME}' (transformers 5.16-5.17 only)")


def _bool_mask(mask: _Tensor) -> _Tensor | None:
    """A float mask that only holds 0 (attend) and -inf or the dtype's minimum (mask) as a bool mask, else None."""
    if mask.dtype == torch.bool:
        return mask
    floor = torch.finfo(mask.dtype).min
    keep = mask == 0
    return keep if bool((keep | (mask <= floor)).all()) else None


def _find_layout(mask: _Tensor, batch: int, causal: bool, window_left: int | None) -> tuple[Layout | None, int | None]:
    """The layout of a bool mask: with the module's window first, then (a mask built without it) with none."""
    if mask.shape[1] != 1:  # one mask per head
        return None, None
    for window in (window_left, None) if window_left is not None else (None,):
        layout = layout_of(mask, batch, causal, window)
        if layout is not None:
            return layout, window
    return None, None


def attention_forward(module: torch.nn.Module, query: _Tensor, key: _Tensor, value: _Tensor,
                      attention_mask: _Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                      softcap: float | None = None, sliding_window: int | None = None, is_causal: bool | None = None,
                      **kwargs: Any) -> tuple[_Tensor, None]:
    """The ``"ksb"`` entry of transformers' ``AttentionInterface`` (see the module docstring)."""
    _refuse_unsupported(module, dropout, kwargs)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not (isinstance(t, torch.Tensor) and t.dim() == 4):
            raise fail(name, getattr(t, "shape", type(t).__name__), "a 4-d (batch, heads, length, head_dim) tensor")
    batch, _, q_len, _ = query.shape
    kv_len = key.shape[2]
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    window_left = window_left_of(sliding_window)
    if attention_mask is None:
        if causal and q_len not in (1, kv_len):
            raise fail("attention_mask", None, f"a mask when {q_len} query tokens meet {kv_len} keys (the causal "
                                               "alignment is ambiguous without one)")
        layout: Layout | None = uniform_layout(batch, q_len, kv_len, query.device)
    elif isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
        mask = _bool_mask(attention_mask)
        layout, window_left = (None, None) if mask is None else _find_layout(mask, batch, causal, window_left)
        if layout is None:
            return _dense(query, key, value, attention_mask if mask is None else mask, scaling, softcap), None
    else:
        raise fail("attention_mask", getattr(attention_mask, "shape", type(attention_mask).__name__),
                   f"None or a 4-d tensor (the mask that attn_implementation={NAME!r} registers)")
    assert layout is not None
    return run_layout(query, key, value, layout, causal=causal, scaling=scaling, softcap=softcap,
                      window_left=window_left), None


def _dense(query: _Tensor, key: _Tensor, value: _Tensor, mask: _Tensor, scaling: float | None,
           softcap: float | None) -> _Tensor:
    """Any mask, exactly, through ``attention.dense`` (no soft-cap there: refused with one)."""
    if softcap is not None:
        raise fail("attention_mask", f"a {tuple(mask.shape)} mask of another pattern",
                   "with softcap, a causal or full mask over per-request runs of tokens (padding, sliding window): "
                   "attention.dense, which serves any other mask, applies no soft-cap")
    if mask.dtype != torch.bool:
        mask = mask.to(query.dtype)
    out = ksb.attention.dense(query, key, value, mask, sm_scale=scaling)
    return out.transpose(1, 2)


def run_layout(query: _Tensor, key: _Tensor, value: _Tensor, layout: Layout, *, causal: bool, scaling: float | None,
               softcap: float | None, window_left: int | None) -> _Tensor:
    """Attention of dense ``(B, H, L, D)`` inputs over the rows and columns ``layout`` keeps -> (B, Lq, Hq, Dv);
    rows it drops (padding queries) get 0."""
    batch, q_heads, q_len, _ = query.shape
    dim_v = value.shape[-1]
    args: dict[str, Any] = {"sm_scale": scaling, "logits_soft_cap": softcap, "window_left": window_left}
    if layout.kv_prefix and layout.all_q and q_len == 1:
        cache, table = _in_place_cache(key, value, layout)
        out = ksb.attention.decode(query[:, :, 0], cache, table, **args)
        assert isinstance(out, torch.Tensor)
        return out.view(batch, 1, q_heads, dim_v)
    rows = _rows(query, layout.q_index)
    if layout.kv_prefix:
        cache, table = _in_place_cache(key, value, layout)
        out = ksb.attention.prefill(rows, layout.qo_indptr, cache, table, causal=causal, **args)
    else:
        k_rows, v_rows = _rows(key, layout.kv_index), _rows(value, layout.kv_index)
        out = ksb.attention.prefill_ragged(rows, k_rows, v_rows, layout.qo_indptr, layout.kv_indptr, causal=causal,
                                           **args)
    assert isinstance(out, torch.Tensor)
    if layout.q_index is not None:
        full = out.new_zeros(batch * q_len, q_heads, dim_v)
        full.index_copy_(0, layout.q_index, out)
        out = full
    return out.view(batch, q_len, q_heads, dim_v)


def _rows(t: _Tensor, index: _Tensor | None) -> _Tensor:
    """(B, H, L, D) -> packed rows (B*L or len(index), H, D)."""
    batch, heads, length, dim = t.shape
    rows = t.transpose(1, 2).reshape(batch * length, heads, dim)
    return rows if index is None else rows.index_select(0, index)


def _in_place_cache(key: _Tensor, value: _Tensor, layout: Layout) -> tuple[ksb.PagedKVCache, ksb.PageTable]:
    """Key/value ``(B, Hkv, Lk, D)`` as an HND paged cache read in place (no copy when the head dim has unit stride,
    as in transformers' caches). Each token is a page of one slot (:func:`_token_pages`), so the page size stays 1
    while ``Lk`` grows by one every decode step: kernels that compile per page size compile once, not per step.
    Where the strides do not allow that view, request b is page b of ``Lk`` slots."""
    if key.stride(-1) != 1:
        key = key.contiguous()
    if value.stride(-1) != 1:
        value = value.contiguous()
    max_len = max(layout.kv_lens, default=0)
    paged = _token_pages(key), _token_pages(value)
    if paged[0] is not None and paged[1] is not None and paged[0][1] == paged[1][1]:
        (k_pages, per_request), (v_pages, _) = paged[0], paged[1]
        width = max(256, -(-key.shape[2] // 256) * 256)  # the table's width changes every 256 tokens, not every step
        table = ksb.PageTable(_token_table(key.shape[0], per_request, key.shape[2], width, key.device),
                              layout.seq_lens, max_seq_len=max_len)
        return ksb.PagedKVCache(k_pages, v_pages, layout="HND"), table
    cache = ksb.PagedKVCache(key, value, layout="HND")
    return cache, ksb.PageTable(layout.pages, layout.seq_lens, max_seq_len=max_len)


def _token_pages(t: _Tensor) -> tuple[_Tensor, int] | None:
    """``t`` (B, H, L, D) viewed as HND pages of one slot, (P, H, 1, D) with token (b, i) on page ``b * M + i``, and
    M; None when the batch stride is not a whole number of token strides or a page index would pass int32."""
    batch, heads, length, dim = t.shape
    sb, sh, sl, sd = t.stride()
    if batch == 0 or length == 0 or sl <= 0 or sb % sl or (batch - 1) * (sb // sl) + length >= 2**31:
        return None
    per_request = sb // sl if batch > 1 else length
    pages = (batch - 1) * per_request + length
    return t.as_strided((pages, heads, 1, dim), (sl, sh, sl, sd)), per_request


@functools.lru_cache(maxsize=32)
def _token_table(batch: int, per_request: int, length: int, width: int, device: torch.device) -> _Tensor:
    """(B, width) int32 block table of :func:`_token_pages`: request b's token i on page ``b * per_request + i``,
    page 0 past ``length`` (never read: past every sequence length)."""
    i = torch.arange(width, dtype=torch.int32, device=device)
    table = torch.arange(batch, dtype=torch.int32, device=device)[:, None] * per_request + i
    return torch.where(i < length, table, 0)
