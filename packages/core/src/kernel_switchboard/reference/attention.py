"""Reference attention kernels (see :mod:`kernel_switchboard.ops.attention` for signatures).

Pure torch, CPU and GPU; accumulation in float32 (float64 for float32 inputs, so the oracle of a
float32 kernel is never the less accurate of the two, whatever the TF32 settings). Every kernel is
padded, batched torch ops whose sizes come only from host ints (shapes and ``AttnParams.max_q_len
/ max_kv_len``), so no kernel reads a value back from the device: all are CUDA-graph capturable.

Scheme: gather each request's K/V into ``(B, L, Hkv, D)`` (L = max_kv_len), scatter its queries
into ``(B, M, Hq, D)`` (M = max_q_len), compute masked logits ``(B, Hkv, G, M, L)`` in batch
chunks that bound memory, then scatter the rows back to the caller's layout.

Masked positions (past a request's length, outside the causal mask or the sliding window, masked by a
variant, a boolean mask or a ``-inf`` bias) contribute exactly nothing, whatever K and V hold there, NaN and
inf included: a product ``0 * NaN`` never reaches the output. A non-finite V value at a position a query
attends reaches that query's output as IEEE arithmetic would carry it (NaN, or inf of its sign; NaN when
both signs meet), so the oracle never hides bad data that a query reads.

Batch invariance (``AttnParams.batch_invariant``, set inside ``ksb.batch_invariant()``): the padding to the batch's
longest lengths would change the shapes (and so the reduction order) of a request's computation with its batch, so
each request is attended alone on copies of its rows, with L and M its own lengths (read on the host once per call).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..ops.attention_runner import into
from ..paged import FP8_DTYPES, PagedKVCache, PageTable
from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PER_REQUEST, PRIORITY
from ._rows import rowwise

#: logits elements per chunk: bounds the reference's temporary memory to ~0.5-1 GB
_CHUNK_ELEMS = 1 << 27


# -- the math -----------------------------------------------------------------------------------
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, kv_len: torch.Tensor,
           p: Any, batch0: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention of padded batches, in the dtype of q (float32 or float64).

    q (B, M, Hq, D), k (B, L, Hkv, D), v (B, L, Hkv, Dv); q_pos (B, M) int64: each query's KV
    position; kv_len (B,) int64. Returns out (B, M, Hq, Dv) and lse (B, M, Hq) float32
    (natural log; rows with nothing to attend get out 0 and lse -inf). ``batch0``: the request
    index of row 0 (batch chunks), seen by a custom variant's hooks.
    """
    if getattr(p, "variant", None) is not None:
        return _attend_variant(q, k, v, q_pos, kv_len, p, batch0)
    b, m, hq, d = q.shape
    hkv = k.shape[2]
    qg = q.view(b, m, hkv, hq // hkv, d)
    s = torch.einsum("bmhgd,blhd->bhgml", qg, k) * p.sm_scale
    if p.logits_soft_cap is not None:
        s = torch.tanh(s / p.logits_soft_cap) * p.logits_soft_cap
    pos = torch.arange(k.shape[1], device=k.device)
    keep = pos[None, None, :] < kv_len[:, None, None]  # (B, 1, L)
    if p.causal:
        keep = keep & (pos[None, None, :] <= q_pos[:, :, None])
    if p.window_left >= 0:
        keep = keep & (pos[None, None, :] >= q_pos[:, :, None] - p.window_left)
    s = s.masked_fill(~keep[:, None, None], float("-inf"))
    mx = s.amax(dim=-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    e = torch.exp(s - mx)
    total = e.sum(dim=-1, keepdim=True)
    w = e / torch.where(total > 0, total, torch.ones_like(total))
    if keep.shape[1] == 1:  # one mask for every query: zero the masked V rows, exact for the kept ones
        out = torch.einsum("bhgml,blhd->bmhgd", w, v.masked_fill(~keep[:, 0, :, None, None], 0.0))
    else:
        out = torch.einsum("bhgml,blhd->bmhgd", w, _finite(v))
        hits = torch.einsum("bml,blhd->bmhd", keep.to(v.dtype), _nonfinite_flags(v))  # (B, M, Hkv, 3 Dv)
        out = _with_nonfinite(out, hits[:, :, :, None])
    lse = (torch.log(total) + mx).squeeze(-1)  # (B, Hkv, G, M); log(0) = -inf
    return out.reshape(b, m, hq, v.shape[-1]), lse.permute(0, 3, 1, 2).reshape(b, m, hq).float()


def _finite(v: torch.Tensor) -> torch.Tensor:
    """``v`` with its non-finite entries zeroed (their effect is restored by :func:`_with_nonfinite`)."""
    return torch.where(torch.isfinite(v), v, torch.zeros_like(v))


def _nonfinite_flags(v: torch.Tensor) -> torch.Tensor:
    """(..., 3 D) in v's dtype: where ``v`` (..., D) is NaN, +inf, -inf."""
    return torch.cat((v.isnan(), v == float("inf"), v == float("-inf")), dim=-1).to(v.dtype)


def _with_nonfinite(out: torch.Tensor, hits: torch.Tensor) -> torch.Tensor:
    """``out`` (the weighted sum of the finite V values) with the non-finite values the query attends put back:
    ``hits`` (..., 3 D), broadcastable to out, counts the attended NaN / +inf / -inf entries of each column."""
    nan, pos, neg = (hits > 0).chunk(3, dim=-1)
    nan = nan | (pos & neg)
    special = torch.where(nan, float("nan"), torch.where(pos, float("inf"), float("-inf"))).to(out.dtype)
    return torch.where(nan | pos | neg, special, out)


def _attend_variant(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, kv_len: torch.Tensor,
                    p: Any, batch0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`attend` with the torch definitions of ``p.variant`` (see kernel_switchboard.variants)."""
    var, args = p.variant.variant, p.variant.args
    b, _, hq, _ = q.shape
    hkv, length = k.shape[2], k.shape[1]
    g = hq // hkv
    kh = k.repeat_interleave(g, dim=2) if g > 1 else k  # (B, L, Hq, D): q head h reads kv head h // G
    vh = v.repeat_interleave(g, dim=2) if g > 1 else v
    s = torch.einsum("bmhd,blhd->bhml", q, kh) * p.sm_scale
    if p.logits_soft_cap is not None:
        s = torch.tanh(s / p.logits_soft_cap) * p.logits_soft_cap
    dev = q.device
    qp = q_pos[:, None, :, None]  # (B, 1, M, 1)
    kp = torch.arange(length, device=dev)[None, None, None, :]  # (1, 1, 1, L)
    head = torch.arange(hq, device=dev)[None, :, None, None]  # (1, H, 1, 1)
    batch = torch.arange(batch0, batch0 + b, device=dev)[:, None, None, None]  # (B, 1, 1, 1)
    args = tuple(a.to(s.dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    if var.torch_score_mod is not None:
        s = var.torch_score_mod(s, qp, kp, head, batch, args).to(s.dtype)
    keep = kp < kv_len[:, None, None, None]
    if p.causal:
        keep = keep & (kp <= qp)
    if p.window_left >= 0:
        keep = keep & (kp >= qp - p.window_left)
    if var.torch_mask_mod is not None:
        keep = keep & var.torch_mask_mod(qp, kp, head, batch, args)
    mask = keep  # before broadcasting: its size-1 dims say which masks every head / query shares
    keep = keep.expand(s.shape)
    if var.softmax:
        s = s.masked_fill(~keep, float("-inf"))
        mx = s.amax(dim=-1, keepdim=True)
        mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
        w = torch.exp(s - mx)
    else:
        w = torch.where(keep, s, torch.zeros_like(s))
        mx = torch.zeros_like(s[..., :1])
    total = w.sum(dim=-1, keepdim=True)  # (B, H, M, 1)
    if mask.shape[1] == 1 and mask.shape[2] == 1:  # one mask for every head and query
        acc = torch.einsum("bhml,blhd->bhmd", w, vh.masked_fill(~mask[:, 0, 0, :, None, None], 0.0))
    else:
        acc = torch.einsum("bhml,blhd->bhmd", w, _finite(vh))
        acc = _with_nonfinite(acc, torch.einsum("bhml,blhd->bhmd", keep.to(vh.dtype), _nonfinite_flags(vh)))
    if var.torch_output_mod is not None:
        out = var.torch_output_mod(acc, total, mx, head, batch, args).to(acc.dtype)
    elif var.softmax:
        out = acc / torch.where(total > 0, total, torch.ones_like(total))
    else:
        out = acc
    out = torch.where(total != 0, out, torch.zeros_like(out))  # nothing attended: out 0
    lse = torch.log(total) + mx  # log(0) = -inf
    return out.permute(0, 2, 1, 3), lse[..., 0].permute(0, 2, 1).float()


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The reference's accumulation dtype for inputs of ``dtype``."""
    return torch.float64 if dtype == torch.float32 else torch.float32


def _empty(like: torch.Tensor, rows: tuple[int, ...], dv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of attention over nothing: out 0 (rows..., Dv), lse -inf (rows...), float32."""
    return like.new_zeros((*rows, dv), dtype=torch.float32), like.new_full(rows, float("-inf"), dtype=torch.float32)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _chunk(batch: int, per_request: int) -> int:
    return max(1, min(batch, _CHUNK_ELEMS // max(per_request, 1)))


# -- paged K/V gathering ------------------------------------------------------------------------------
def paged_slots(block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, length: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(page ids (B, L), in-page slots (L,)) int64 of KV positions 0..L-1; unused positions read page 0."""
    pos = torch.arange(length, device=block_table.device)
    col = torch.clamp(pos // page_size, max=max(block_table.shape[1] - 1, 0))
    if block_table.shape[1] == 0:
        pages = torch.zeros(block_table.shape[0], length, dtype=torch.int64, device=block_table.device)
    else:
        pages = block_table[:, col].long()
    pages = torch.where(pos[None, :] < seq_lens[:, None], pages, torch.zeros_like(pages))
    return pages, pos % page_size


def gather_pages(cache: PagedKVCache, pages: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype = torch.float32
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """K (B, L, Hkv, D) and V (B, L, Hkv, Dv) in ``dtype``, dequantised, of the given page ids / slots."""
    k_nhd, v_nhd = cache.nhd()
    k, v = k_nhd[pages, slots[None, :]].to(dtype), v_nhd[pages, slots[None, :]].to(dtype)
    if cache.k_scale is not None and cache.v_scale is not None:  # fp8 pages
        k, v = k * head_scale(cache.k_scale, dtype), v * head_scale(cache.v_scale, dtype)
    return k, v


def head_scale(scale: float | torch.Tensor, dtype: torch.dtype) -> float | torch.Tensor:
    """A cache scale as a factor of (..., Hkv, D) values: a float, or a tensor () / (Hkv,) as (1, 1) / (Hkv, 1)."""
    return scale.to(dtype).reshape(-1, 1) if isinstance(scale, torch.Tensor) else scale


def _paged_attend(q_pad: torch.Tensor, q_pos: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any,
                  batch0: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded queries (B, M, Hq, D) against the paged cache, in batch chunks; ``batch0``: the request index of row 0
    (seen by a custom variant's hooks)."""
    b, m, hq, _ = q_pad.shape
    length = p.max_kv_len
    if b == 0 or length == 0 or cache.num_pages == 0:
        return _empty(q_pad, (b, m, hq), cache.head_dim_v)
    seq_lens = table.seq_lens.long()
    outs, lses = [], []
    step = _chunk(b, max(hq * m, cache.num_kv_heads * (cache.head_dim + cache.head_dim_v)) * length)
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        pages, slots = paged_slots(table.block_table[lo:hi], table.seq_lens[lo:hi], cache.page_size, length)
        k, v = gather_pages(cache, pages, slots, q_pad.dtype)
        o, s = attend(q_pad[lo:hi], k, v, q_pos[lo:hi], seq_lens[lo:hi], p, batch0 + lo)
        outs.append(o)
        lses.append(s)
    return _cat(outs), _cat(lses)


# -- batch invariance: each request alone -----------------------------------------------------------------
def _alone(p: Any, max_q: int, max_kv: int) -> Any:
    """``p`` for one request of ``max_q`` queries and ``max_kv`` keys."""
    return dataclasses.replace(p, max_q_len=max_q, max_kv_len=max_kv, batch_invariant=False)


def _table_row(table: PageTable, b: int, length: int) -> PageTable:
    """Request b's row of ``table`` as a table of its own (copies; ``length`` its sequence length)."""
    return PageTable(table.block_table[b:b + 1].clone(), table.seq_lens[b:b + 1].clone(), max_seq_len=length)


def _single(length: int, device: torch.device) -> torch.Tensor:
    """qo_indptr / kv_indptr of one request of ``length`` rows."""
    return torch.tensor([0, length], dtype=torch.int32, device=device)


_Parts = list[tuple[torch.Tensor, torch.Tensor | None]]


def _joined(parts: _Parts, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The requests' (out, lse) as the batch's (lse only when the call asked for it)."""
    if not p.return_lse:
        return torch.cat([o for o, _ in parts]), None
    return torch.cat([o for o, _ in parts]), torch.cat([s for _, s in parts if s is not None])


def _decode_each(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    parts: _Parts = []
    for b, n in enumerate(table.seq_lens.tolist()):
        q_pos = torch.full((1, 1), n - 1, dtype=torch.int64, device=q.device)
        out, lse = _paged_attend(q[b:b + 1].to(compute_dtype(q.dtype))[:, None], q_pos, cache, _table_row(table, b, n),
                                 _alone(p, 1, n), b)
        parts.append((out[:, 0].to(q.dtype), lse[:, 0]))
    return _joined(parts, p)


def _prefill_each(q: torch.Tensor, qo_indptr: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    bounds, lens = qo_indptr.tolist(), table.seq_lens.tolist()
    parts: _Parts = []
    for b, n in enumerate(lens):
        lo, hi = bounds[b], bounds[b + 1]
        one = _single(hi - lo, q.device)
        q_pad = pad_queries(q[lo:hi].clone(), *token_rows(one, hi - lo), 1, hi - lo)
        q_pos = query_positions(one, table.seq_lens[b:b + 1], hi - lo)
        out, lse = _paged_attend(q_pad, q_pos, cache, _table_row(table, b, n), _alone(p, hi - lo, n), b)
        parts.append((out[0, :hi - lo].to(q.dtype), lse[0, :hi - lo]))
    return _joined(parts, p)


def _ragged_each(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                 p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    q_bounds, kv_bounds = qo_indptr.tolist(), kv_indptr.tolist()
    parts: _Parts = []
    for b in range(len(q_bounds) - 1):
        qlo, qhi, klo, khi = q_bounds[b], q_bounds[b + 1], kv_bounds[b], kv_bounds[b + 1]
        parts.append(_ragged_padded(q[qlo:qhi].clone(), k[klo:khi].clone(), v[klo:khi].clone(),
                                    _single(qhi - qlo, q.device), _single(khi - klo, q.device),
                                    _alone(p, qhi - qlo, khi - klo), b))
    return _joined(parts, p)


def _latent_each(q_nope: torch.Tensor, q_pe: torch.Tensor, qo_bounds: list[int], ckv_pages: torch.Tensor,
                 kpe_pages: torch.Tensor, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """MLA (decode: ``qo_bounds`` = 0..B) one request at a time; its queries at the last positions of its sequence."""
    parts: _Parts = []
    for b, n in enumerate(table.seq_lens.tolist()):
        lo, hi = qo_bounds[b], qo_bounds[b + 1]
        one = _single(hi - lo, q_nope.device)
        q = torch.cat((q_nope[lo:hi], q_pe[lo:hi]), dim=-1)
        q_pad = pad_queries(q, *token_rows(one, hi - lo), 1, hi - lo)
        q_pos = query_positions(one, table.seq_lens[b:b + 1], hi - lo)
        out, lse = _latent_attend(q_pad, q_pos, ckv_pages, kpe_pages, _table_row(table, b, n), _alone(p, hi - lo, n))
        parts.append((out[0, :hi - lo].to(q_nope.dtype), lse[0, :hi - lo]))
    return _joined(parts, p)


# -- query packing (prefill) ----------------------------------------------------------------------
def token_rows(qo_indptr: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request index, index within the request) int64 of each of ``total`` packed tokens."""
    t = torch.arange(total, device=qo_indptr.device, dtype=torch.int64)
    ind = qo_indptr.long()
    row = torch.searchsorted(ind[1:], t, right=True)
    return row, t - ind[row]


def pad_queries(q: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, batch: int, max_q: int) -> torch.Tensor:
    """Packed (T, H, D) -> zero-padded (B, max_q, H, D) in the compute dtype."""
    cdt = compute_dtype(q.dtype)
    q_pad = q.new_zeros((batch, max(max_q, 1), *q.shape[1:]), dtype=cdt)
    q_pad[rows, cols] = q.to(cdt)
    return q_pad


def query_positions(qo_indptr: torch.Tensor, kv_len: torch.Tensor, max_q: int) -> torch.Tensor:
    """(B, max_q) int64: the KV position ``kv_len - qo_len + i`` of query i of each request."""
    ind = qo_indptr.long()
    qo_len = ind[1:] - ind[:-1]
    i = torch.arange(max(max_q, 1), device=qo_indptr.device)
    return (kv_len.long() - qo_len)[:, None] + i[None, :]


# -- kernels ---------------------------------------------------------------------------------------
def decode(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (B, Hq, D) -> out (B, Hq, Dv) q.dtype, lse (B, Hq) float32 or None."""
    if getattr(p, "batch_invariant", False):
        return _decode_each(q, cache, table, p)
    q_pos = (table.seq_lens.long() - 1)[:, None]
    out, lse = _paged_attend(q.to(compute_dtype(q.dtype))[:, None], q_pos, cache, table, p)
    return out[:, 0].to(q.dtype), (lse[:, 0] if p.return_lse else None)


def prefill(q: torch.Tensor, qo_indptr: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (Tq, Hq, D) packed by qo_indptr (B+1,) -> out (Tq, Hq, Dv), lse (Tq, Hq) float32 or None. float8_e4m3fn
    queries are ``stored * p.q_scale`` and give a bfloat16 out."""
    if q.dtype in FP8_DTYPES:
        out, lse = prefill(q.float() * p.q_scale, qo_indptr, cache, table, p)
        return out.to(torch.bfloat16), lse
    if getattr(p, "batch_invariant", False):
        return _prefill_each(q, qo_indptr, cache, table, p)
    rows, cols = token_rows(qo_indptr, q.shape[0])
    return _prefill_rows(q, qo_indptr, rows, cols, cache, table, p)


def _prefill_rows(q: torch.Tensor, qo_indptr: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                  cache: PagedKVCache, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = table.batch_size
    q_pad = pad_queries(q, rows, cols, b, p.max_q_len)
    q_pos = query_positions(qo_indptr, table.seq_lens, p.max_q_len)
    out, lse = _paged_attend(q_pad, q_pos, cache, table, p)
    return out[rows, cols].to(q.dtype), (lse[rows, cols] if p.return_lse else None)


def pod(q_prefill: torch.Tensor, qo_indptr: torch.Tensor, q_decode: torch.Tensor, cache: PagedKVCache,
        prefill_table: PageTable, decode_table: PageTable, p: Any
        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``attention.pod``: :func:`prefill` of the prefill part and :func:`decode` of the decode part, over one cache ->
    (out_prefill, out_decode, lse_prefill, lse_decode)."""
    out_p, lse_p = prefill(q_prefill, qo_indptr, cache, prefill_table, p)
    out_d, lse_d = decode(q_decode, cache, decode_table, p)
    return out_p, out_d, lse_p, lse_d


def prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv) packed by the indptrs -> out (Tq, Hq, Dv), lse (Tq, Hq)."""
    if getattr(p, "batch_invariant", False):
        return _ragged_each(q, k, v, qo_indptr, kv_indptr, p)
    return _ragged_padded(q, k, v, qo_indptr, kv_indptr, p)


def _ragged_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor,
                   p: Any, batch0: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
    b = qo_indptr.shape[0] - 1
    rows, cols = token_rows(qo_indptr, q.shape[0])
    q_pad = pad_queries(q, rows, cols, b, p.max_q_len)
    kv_ind = kv_indptr.long()
    kv_len = kv_ind[1:] - kv_ind[:-1]
    q_pos = query_positions(qo_indptr, kv_len, p.max_q_len)
    length = p.max_kv_len
    pos = torch.arange(length, device=q.device)
    m, hq = q_pad.shape[1], q.shape[1]
    if b == 0 or length == 0 or k.shape[0] == 0:
        out, lse = _empty(q, (q.shape[0], hq), v.shape[-1])
        return out.to(q.dtype), (lse if p.return_lse else None)
    outs, lses = [], []
    step = _chunk(b, max(hq * m, k.shape[1] * (k.shape[2] + v.shape[2])) * length)
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        valid = pos[None, :] < kv_len[lo:hi, None]
        tok = torch.where(valid, kv_ind[lo:hi, None] + pos[None, :], torch.zeros_like(valid, dtype=torch.int64))
        o, s = attend(q_pad[lo:hi], k[tok].to(q_pad.dtype), v[tok].to(q_pad.dtype), q_pos[lo:hi], kv_len[lo:hi], p,
                      batch0 + lo)
        outs.append(o)
        lses.append(s)
    out, lse = _cat(outs), _cat(lses)
    return out[rows, cols].to(q.dtype), (lse[rows, cols] if p.return_lse else None)


def _latent_attend(q_pad: torch.Tensor, q_pos: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
                   table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded queries (B, M, H, Dc + Dr) in the compute dtype against the latent pages (one latent KV head: K =
    [ckv, kpe], V = ckv), in batch chunks: out (B, M, H, Dc), lse (B, M, H)."""
    b, m, h, _ = q_pad.shape
    page_size, dc = ckv_pages.shape[1], ckv_pages.shape[2]
    length = p.max_kv_len
    if b == 0 or length == 0 or ckv_pages.shape[0] == 0:
        return _empty(q_pad, (b, m, h), dc)
    seq_lens = table.seq_lens.long()
    outs, lses = [], []
    step = _chunk(b, max(h * m, 2 * dc + q_pad.shape[-1]) * length)
    for lo in range(0, b, step):
        hi = min(b, lo + step)
        pages, slots = paged_slots(table.block_table[lo:hi], table.seq_lens[lo:hi], page_size, length)
        ckv = ckv_pages[pages, slots[None, :]].to(q_pad.dtype)[:, :, None]  # (b, L, 1, Dc)
        kpe = kpe_pages[pages, slots[None, :]].to(q_pad.dtype)[:, :, None]
        o, s = attend(q_pad[lo:hi], torch.cat((ckv, kpe), dim=-1), ckv, q_pos[lo:hi], seq_lens[lo:hi], p)
        outs.append(o)
        lses.append(s)
    return _cat(outs), _cat(lses)


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
               table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Absorbed MLA decode: q_nope (B, H, Dc), q_pe (B, H, Dr), ckv_pages (P, S, Dc), kpe_pages (P, S, Dr).

    logits = (q_nope·ckv + q_pe·kpe) * sm_scale; out = softmax · ckv (B, H, Dc); lse (B, H).
    """
    if getattr(p, "batch_invariant", False):
        return _latent_each(q_nope, q_pe, list(range(q_nope.shape[0] + 1)), ckv_pages, kpe_pages, table, p)
    q = torch.cat((q_nope, q_pe), dim=-1).to(compute_dtype(q_nope.dtype))[:, None]  # (B, 1, H, Dc+Dr)
    q_pos = (table.seq_lens.long() - 1)[:, None]
    out, lse = _latent_attend(q, q_pos, ckv_pages, kpe_pages, table, p)
    return out[:, 0].to(q_nope.dtype), (lse[:, 0] if p.return_lse else None)


def mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, qo_indptr: torch.Tensor, ckv_pages: torch.Tensor,
                kpe_pages: torch.Tensor, table: PageTable, p: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Absorbed MLA over several new tokens per request: q_nope (Tq, H, Dc), q_pe (Tq, H, Dr) packed by qo_indptr
    (B+1,) -> out (Tq, H, Dc) q's dtype, lse (Tq, H) float32 or None; query i of request b at KV position
    ``seq_len_b - qo_len_b + i``."""
    if getattr(p, "batch_invariant", False):
        return _latent_each(q_nope, q_pe, qo_indptr.tolist(), ckv_pages, kpe_pages, table, p)
    rows, cols = token_rows(qo_indptr, q_nope.shape[0])
    q_pad = pad_queries(torch.cat((q_nope, q_pe), dim=-1), rows, cols, table.batch_size, p.max_q_len)
    q_pos = query_positions(qo_indptr, table.seq_lens, p.max_q_len)
    out, lse = _latent_attend(q_pad, q_pos, ckv_pages, kpe_pages, table, p)
    return out[rows, cols].to(q_nope.dtype), (lse[rows, cols] if p.return_lse else None)


def merge_states(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions over disjoint KV sets: out (T, H, D) out_a.dtype, lse (T, H) float32."""
    mx = torch.maximum(lse_a, lse_b)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    wa, wb = torch.exp(lse_a - mx), torch.exp(lse_b - mx)
    total = wa + wb
    safe = torch.where(total > 0, total, torch.ones_like(total))
    cdt = compute_dtype(out_a.dtype)
    wa, wb = (wa / safe).to(cdt), (wb / safe).to(cdt)
    out = (out_a.to(cdt) * wa[..., None] + out_b.to(cdt) * wb[..., None]).to(out_a.dtype)
    return out, torch.log(total) + mx


# -- plans ---------------------------------------------------------------------------------------------
class DecodePlanRunner:
    """Reference decode plan: the KV slot offsets are fixed at plan time; run is batched torch ops
    that read the table's tensors on the device (so in-place updates between replays are seen)."""

    def __init__(self, problem: Any, table: PageTable, p: Any, **_: Any) -> None:
        self.table, self.p = table, p

    def run(self, q: torch.Tensor, cache: PagedKVCache, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        return into(decode(q, cache, self.table, self.p), out, lse)


def dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None, p: Any) -> torch.Tensor:
    """``attention.dense``: q (B, Hq, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, Hq, Lq, Dv)."""
    acc = torch.float64 if q.dtype == torch.float32 else torch.float32
    group = q.shape[1] // k.shape[1]
    kh, vh = k.to(acc).repeat_interleave(group, dim=1), v.to(acc).repeat_interleave(group, dim=1)
    s = torch.einsum("bhmd,bhld->bhml", q.to(acc), kh) * p.sm_scale
    lq, lk = q.shape[2], k.shape[2]
    keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
    if p.causal:  # query i sits at KV position lk - lq + i
        keep = keep.tril(lk - lq)
    if attn_bias is not None and attn_bias.dtype == torch.bool:
        keep = keep & attn_bias
    elif attn_bias is not None:
        s = s + attn_bias.to(acc)
        keep = keep & (attn_bias != float("-inf"))  # a -inf bias masks its position like False in a mask
    s = s.masked_fill(~keep, float("-inf"))
    mx = s.amax(dim=-1, keepdim=True)
    e = torch.exp(s - torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx)))
    total = e.sum(dim=-1, keepdim=True)
    w = e / torch.where(total > 0, total, torch.ones_like(total))
    if not p.causal and attn_bias is None:  # nothing masked
        return torch.einsum("bhml,bhld->bhmd", w, vh).to(q.dtype)
    out = torch.einsum("bhml,bhld->bhmd", w, _finite(vh))
    hits = torch.einsum("bhml,bhld->bhmd", keep.expand(s.shape).to(acc), _nonfinite_flags(vh))
    return _with_nonfinite(out, hits).to(q.dtype)


class PrefillPlanRunner:
    """Reference prefill plan: the packed-token -> (request, row) maps are built at plan time (at the first run when
    the indptr's host values are not known, as in a captured eager call)."""

    def __init__(self, problem: Any, table: PageTable, p: Any, *, qo_indptr: torch.Tensor,
                 host_qo_indptr: list[int] | None = None, **_: Any) -> None:
        self.table, self.p, self.qo_indptr = table, p, qo_indptr
        self.rows = None if host_qo_indptr is None else token_rows(qo_indptr, host_qo_indptr[-1])

    def run(self, q: torch.Tensor, cache: PagedKVCache, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if getattr(self.p, "batch_invariant", False) or q.dtype in FP8_DTYPES:
            return into(prefill(q, self.qo_indptr, cache, self.table, self.p), out, lse)
        if self.rows is None:
            self.rows = token_rows(self.qo_indptr, q.shape[0])
        rows, cols = self.rows
        return into(_prefill_rows(q, self.qo_indptr, rows, cols, cache, self.table, self.p), out, lse)


def _dense_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_bias: torch.Tensor | None, p: Any
                ) -> torch.Tensor:
    """:func:`dense`, one batch entry at a time in the batch-invariant scope (a bias of 4 dims whose first is the batch
    is sliced with it; any other bias broadcasts over the batch)."""
    if attn_bias is not None and attn_bias.dim() == 4 and attn_bias.shape[0] == q.shape[0]:
        return _dense_per_batch(q, k, v, attn_bias, p)  # type: ignore[no-any-return]
    return _dense_shared_bias(q, k, v, p, attn_bias)  # type: ignore[no-any-return]


_dense_per_batch = rowwise(dense, rows=(0, 1, 2, 3))
_dense_shared_bias = rowwise(lambda q, k, v, p, bias: dense(q, k, v, bias, p), rows=(0, 1, 2))

KERNELS = [
    Kernel("attention.decode", "decode", "reference", PER_REQUEST, decode, priority=PRIORITY,
           plan=DecodePlanRunner, doc="padded batched torch, float32 (float64 for float32 q)"),
    Kernel("attention.prefill", "prefill", "reference", PER_REQUEST, prefill, priority=PRIORITY,
           plan=PrefillPlanRunner, doc="padded batched torch, float32 (float64 for float32 q)"),
    Kernel("attention.prefill_ragged", "prefill_ragged", "reference", PER_REQUEST, prefill_ragged,
           priority=PRIORITY),
    Kernel("attention.mla_decode", "mla_decode", "reference", PER_REQUEST, mla_decode, priority=PRIORITY),
    Kernel("attention.mla_prefill", "mla_prefill", "reference", PER_REQUEST, mla_prefill, priority=PRIORITY,
           doc="padded batched torch over the gathered latents, float32 (float64 for float32 q)"),
    Kernel("attention.pod", "pod", "reference", PER_REQUEST, pod, priority=PRIORITY,
           doc="the reference prefill of the prefill part, then its decode of the decode part"),
    Kernel("attention.merge_states", "merge_states", "reference", INVARIANT_CAPTURABLE,
           rowwise(merge_states, rows=(0, 1, 2, 3)), priority=PRIORITY),
    Kernel("attention.dense", "dense", "reference", INVARIANT_CAPTURABLE, _dense_rows, priority=PRIORITY,
           doc="torch einsum, float32 (float64 for float32 q)"),
]
