"""The canonical attention arguments in cuDNN's form: pure torch, no cuDNN import, CPU-testable.

cuDNN's SDPA sees every tensor as logical ``(B, H, S, D)`` with arbitrary element strides:

- queries/outputs packed ``(T, H, D)`` by an indptr are *ragged*: dims ``(B, H, S_max, D)``,
  strides ``(S_max*t, h, t, 1)`` (t = elements per token) plus a ragged offset tensor
  ``(B+1, 1, 1, 1)`` int32 = ``indptr * t`` (element units);
- paged K/V: a container ``(num_pages, Hkv, page_size, D)`` (HND; an NHD pool is the same logical
  tensor with permuted strides), page tables ``(B, 1, max_pages, 1)`` int32, lengths ``(B, 1, 1, 1)``;
- LSE ("stats", natural log by default, i.e. the op's convention): dense ``(B, Hq, S, 1)`` float32,
  for packed queries gathered back to ``(T, Hq)`` with :func:`lse_gather_index`.

Masks: causal = bottom-right diagonal alignment (aligned with each request's actual lengths) and
right bound 0; ``window_left = w`` = left bound ``w + 1`` (cuDNN masks columns at or before
``row - left_bound``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard.capability import bucket
from kernel_switchboard.paged import PagedKVCache, PageTable

#: element offsets travel as int32
INT32_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class TensorSpec:
    """One graph tensor: logical dims, element strides, torch dtype, and its ragged offset role (or None)."""

    dims: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    ragged: str | None = None


@dataclass(frozen=True)
class SdpaSpec:
    """Everything a cuDNN SDPA graph is built from (hashable: the graph cache key).

    Roles of the tensors bound at execution: q, k, v, o, stats (optional), seq_q, seq_kv,
    k_table / v_table (paged), q_off / o_off / k_off / v_off (ragged offsets).
    """

    q: TensorSpec
    k: TensorSpec
    v: TensorSpec
    o: TensorSpec
    stats: TensorSpec | None
    batch: int
    table: TensorSpec | None  # (B, 1, max_pages, 1) when paged
    max_seq_len_kv: int | None  # paged: max_pages * page_size
    scale: float
    causal: bool
    left_bound: int | None
    #: seq_q / seq_kv padding mask; off only for dense uniform batches (every length is the full S)
    padding: bool = True

    @property
    def paged(self) -> bool:
        return self.table is not None


def spec_of(t: torch.Tensor, ragged: str | None = None) -> TensorSpec:
    """The :class:`TensorSpec` of a concrete 4-d tensor view."""
    return TensorSpec(tuple(t.shape), tuple(t.stride()), t.dtype, ragged)


def _int_spec(dims: tuple[int, ...]) -> TensorSpec:
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    return TensorSpec(dims, tuple(strides), torch.int32)


def left_bound(window_left: int) -> int | None:
    """cuDNN's left diagonal bound for the op's ``window_left`` (-1 = none): ``w + 1``."""
    return None if window_left < 0 else window_left + 1


# -- tensors in cuDNN's form -----------------------------------------------------------------------------
def pages_hnd(cache: PagedKVCache) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V pools as logical HND ``(num_pages, Hkv, page_size, D)`` views (no copy)."""
    if cache.layout == "HND":
        return cache.k_pages, cache.v_pages
    return cache.k_pages.transpose(1, 2), cache.v_pages.transpose(1, 2)


def table_4d(block_table: torch.Tensor) -> torch.Tensor:
    """(B, max_pages) int32 -> (B, 1, max_pages, 1) view."""
    return block_table[:, None, :, None]


def lengths_4d(seq_lens: torch.Tensor) -> torch.Tensor:
    """(B,) int32 -> (B, 1, 1, 1) view."""
    return seq_lens.view(-1, 1, 1, 1)


def indptr_lengths(indptr: torch.Tensor) -> torch.Tensor:
    """(B+1,) int32 offsets -> (B, 1, 1, 1) int32 lengths (device op, no sync)."""
    return (indptr[1:] - indptr[:-1]).to(torch.int32).view(-1, 1, 1, 1)


def ragged_offsets(indptr: torch.Tensor, token_stride: int) -> torch.Tensor:
    """(B+1,) token offsets -> (B+1, 1, 1, 1) int32 element offsets ``indptr * token_stride``."""
    return (indptr.to(torch.int32) * token_stride).view(-1, 1, 1, 1)


def ragged_view(t: torch.Tensor, batch: int, s_max: int) -> torch.Tensor:
    """A packed (T, H, D) tensor as the logical ragged (B, H, s_max, D) cuDNN reads (strides only;
    for specs, never dereferenced past T)."""
    tok, head, dim = t.stride()
    return t.as_strided((batch, t.shape[1], s_max, t.shape[2]), (s_max * tok, head, tok, dim))


def _ragged_spec(t: torch.Tensor, batch: int, s_max: int, role: str) -> TensorSpec:
    tok, head, dim = t.stride()
    return TensorSpec((batch, t.shape[1], s_max, t.shape[2]), (s_max * tok, head, tok, dim), t.dtype, role)


def lse_gather_index(qo_indptr: torch.Tensor, total: int, s_max: int) -> torch.Tensor:
    """(T,) int64: row ``b * s_max + i`` of packed token t (request b, index i) in a dense
    (B * s_max, Hq) stats buffer (device ops, no sync)."""
    t = torch.arange(total, device=qo_indptr.device, dtype=torch.int64)
    ind = qo_indptr.long()
    row = torch.searchsorted(ind[1:], t, right=True)
    return row * s_max + (t - ind[row])


def q_bucket(max_q_len: int) -> int:
    """The query-length bound a graph is built for (power of two, so few graphs are built)."""
    return max(1, bucket(max_q_len))


def check_offsets(t: torch.Tensor, name: str) -> None:
    """Element offsets of ``t`` must fit int32 (cuDNN's ragged offsets here)."""
    if t.shape[0] * t.stride(0) > INT32_LIMIT:
        from kernel_switchboard.errors import fail

        raise fail(f"{name}.shape", tuple(t.shape), f"at most {INT32_LIMIT} elements for cuDNN's int32 ragged offsets")


# -- graph specs -----------------------------------------------------------------------------------------
def decode_spec(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any) -> SdpaSpec:
    """Paged decode: q (B, Hq, D) as (B, Hq, 1, D); out (B, Hq, Dv); stats (B, Hq)."""
    b, hq, d = q.shape
    dv = cache.head_dim_v
    k, v = pages_hnd(cache)
    qs = TensorSpec((b, hq, 1, d), (q.stride(0), q.stride(1), q.stride(0), q.stride(2)), q.dtype)
    os_ = TensorSpec((b, hq, 1, dv), (hq * dv, dv, hq * dv, 1), q.dtype)
    stats = TensorSpec((b, hq, 1, 1), (hq, 1, hq, 1), torch.float32) if p.return_lse else None
    window = p.window_left >= 0  # decode needs no causal band unless a window asks for one
    return SdpaSpec(qs, spec_of(k), spec_of(v), os_, stats, b, spec_of(table_4d(table.block_table)),
                    table.max_pages * cache.page_size, p.sm_scale, window, left_bound(p.window_left))


def prefill_spec(q: torch.Tensor, cache: PagedKVCache, table: PageTable, p: Any, s_q: int) -> SdpaSpec:
    """Paged prefill: ragged q (Tq, Hq, D) up to s_q tokens per request; out (Tq, Hq, Dv) ragged;
    stats dense (B, s_q, Hq)."""
    b, hq, dv = table.batch_size, q.shape[1], cache.head_dim_v
    k, v = pages_hnd(cache)
    os_ = TensorSpec((b, hq, s_q, dv), (s_q * hq * dv, dv, hq * dv, 1), q.dtype, "o_off")
    stats = TensorSpec((b, hq, s_q, 1), (s_q * hq, 1, hq, 1), torch.float32) if p.return_lse else None
    return SdpaSpec(_ragged_spec(q, b, s_q, "q_off"), spec_of(k), spec_of(v), os_, stats, b,
                    spec_of(table_4d(table.block_table)), table.max_pages * cache.page_size, p.sm_scale, p.causal,
                    left_bound(p.window_left))


def ragged_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, p: Any, s_q: int, s_kv: int) -> SdpaSpec:
    """Ragged prefill: q, k, v packed (T, H, D) by their indptrs; out (Tq, Hq, Dv) ragged."""
    hq, dv = q.shape[1], v.shape[2]
    os_ = TensorSpec((batch, hq, s_q, dv), (s_q * hq * dv, dv, hq * dv, 1), q.dtype, "o_off")
    stats = TensorSpec((batch, hq, s_q, 1), (s_q * hq, 1, hq, 1), torch.float32) if p.return_lse else None
    return SdpaSpec(_ragged_spec(q, batch, s_q, "q_off"), _ragged_spec(k, batch, s_kv, "k_off"),
                    _ragged_spec(v, batch, s_kv, "v_off"), os_, stats, batch, None, None, p.sm_scale, p.causal,
                    left_bound(p.window_left))


def uniform_spec(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int, p: Any, s_q: int, s_kv: int
                 ) -> SdpaSpec:
    """Ragged prefill whose requests all have s_q queries and s_kv keys: plain strided (B, H, S, D) views,
    no ragged offsets and no padding mask (cuDNN's faster path; torch SDPA's)."""
    hq, dv = q.shape[1], v.shape[2]

    def dense(t: torch.Tensor, s: int) -> TensorSpec:
        tok, head, dim = t.stride()
        return TensorSpec((batch, t.shape[1], s, t.shape[2]), (s * tok, head, tok, dim), t.dtype)

    os_ = TensorSpec((batch, hq, s_q, dv), (s_q * hq * dv, dv, hq * dv, 1), q.dtype)
    stats = TensorSpec((batch, hq, s_q, 1), (s_q * hq, 1, hq, 1), torch.float32) if p.return_lse else None
    return SdpaSpec(dense(q, s_q), dense(k, s_kv), dense(v, s_kv), os_, stats, batch, None, None, p.sm_scale, p.causal,
                    left_bound(p.window_left), padding=False)


def int_specs(spec: SdpaSpec) -> dict[str, TensorSpec]:
    """The int32 side tensors of a spec: lengths and ragged offsets, by role."""
    b = spec.batch
    out = {"seq_q": _int_spec((b, 1, 1, 1)), "seq_kv": _int_spec((b, 1, 1, 1))} if spec.padding else {}
    for t in (spec.q, spec.k, spec.v, spec.o):
        if t.ragged is not None:
            out[t.ragged] = _int_spec((b + 1, 1, 1, 1))
    return out
