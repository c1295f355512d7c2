"""Independent float64 torch definitions that tests of ``kernel_switchboard.flashinfer`` compare with, and builders
of inputs in FlashInfer's forms (CSR pages in NHD or HND, scattered over a page pool, optionally fp8)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

LOG2E = 1.0 / math.log(2.0)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, sm_scale: float | None = None,
              soft_cap: float | None = None, window_left: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: q (Tq, Hq, D), k (Tk, Hkv, D), v (Tk, Hkv, Dv); query i sits at position Tk - Tq + i.
    Returns out (Tq, Hq, Dv) and the base-2 log-sum-exp (Tq, Hq), float64; rows with nothing to attend: 0, -inf."""
    tq, hq, d = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    kk = k.double().repeat_interleave(group, 1)
    vv = v.double().repeat_interleave(group, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) * (sm_scale if sm_scale is not None else 1 / math.sqrt(d))
    if soft_cap:
        s = soft_cap * torch.tanh(s / soft_cap)
    pos = torch.arange(tq)[:, None] + (tk - tq)
    key = torch.arange(tk)[None, :]
    keep = torch.ones(tq, tk, dtype=torch.bool)
    if causal:
        keep &= key <= pos
    if window_left >= 0:
        keep &= key >= pos - window_left
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)  # (H, Tq)
    p = torch.where(torch.isfinite(lse)[..., None], torch.exp(s - lse[..., None]), torch.zeros_like(s))
    out = torch.einsum("hqk,khd->qhd", p, vv)
    return out, (lse * LOG2E).transpose(0, 1).contiguous()


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, tol: float | None = None) -> None:
    """Assert closeness for outputs computed from ``dtype`` inputs (-inf must match -inf)."""
    tol = tol or {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    got, want = got.double().cpu(), want.double().cpu()
    assert got.shape == want.shape, (got.shape, want.shape)
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf), "infinite entries differ"
    torch.testing.assert_close(got[~inf], want[~inf], rtol=tol, atol=tol)


@dataclass
class Paged:
    """Requests' K/V scattered over a page pool, in FlashInfer's CSR form."""

    k_pages: torch.Tensor
    v_pages: torch.Tensor
    indptr: torch.Tensor
    indices: torch.Tensor
    last_page_len: torch.Tensor
    keys: list[torch.Tensor] = field(default_factory=list)  # per request (kv_len, Hkv, D), what attention reads
    values: list[torch.Tensor] = field(default_factory=list)
    layout: str = "NHD"

    def combined(self) -> torch.Tensor:
        """One (pages, 2, ...) tensor holding K at [:, 0] and V at [:, 1]."""
        return torch.stack((self.k_pages, self.v_pages), dim=1)

    @property
    def seq_lens(self) -> torch.Tensor:
        return torch.tensor([k.shape[0] for k in self.keys], dtype=torch.int32)


def make_paged(kv_lens: list[int], page_size: int, num_kv_heads: int, head_dim: int, *, head_dim_v: int | None = None,
               layout: str = "NHD", dtype: torch.dtype = torch.float32, spare_pages: int = 3,
               scales: tuple[float, float] | None = None, empty_last: int = 0) -> Paged:
    """Random K/V for each request, scattered over a shuffled pool of pages. fp8 ``dtype`` stores value / scale
    (``scales`` = (k_scale, v_scale)); ``keys`` / ``values`` hold what the pages mean (stored * scale). Requests of
    length 0 get no pages and ``last_page_len`` ``empty_last``."""
    dv = head_dim if head_dim_v is None else head_dim_v
    counts = [-(-n // page_size) for n in kv_lens]
    total = sum(counts) + spare_pages
    order = torch.randperm(total)
    k_pool = torch.randn(total, page_size, num_kv_heads, head_dim)
    v_pool = torch.randn(total, page_size, num_kv_heads, dv)
    fp8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    ks, vs = scales or (1.0, 1.0)
    if fp8:
        k_store, v_store = (k_pool / ks).to(dtype), (v_pool / vs).to(dtype)
        k_pool, v_pool = k_store.float() * ks, v_store.float() * vs
    else:
        k_store, v_store = k_pool.to(dtype), v_pool.to(dtype)
        k_pool, v_pool = k_store.float(), v_store.float()
    indptr, indices, last, keys, values = [0], [], [], [], []
    at = 0
    for n, c in zip(kv_lens, counts):
        pages = order[at:at + c].tolist()
        at += c
        indices += pages
        indptr.append(len(indices))
        last.append(n - (c - 1) * page_size if c else empty_last)
        keys.append(torch.cat([k_pool[p] for p in pages])[:n] if c else torch.zeros(0, num_kv_heads, head_dim))
        values.append(torch.cat([v_pool[p] for p in pages])[:n] if c else torch.zeros(0, num_kv_heads, dv))
    if layout == "HND":
        k_store, v_store = k_store.transpose(1, 2).contiguous(), v_store.transpose(1, 2).contiguous()
    i32 = torch.int32
    return Paged(k_store, v_store, torch.tensor(indptr, dtype=i32), torch.tensor(indices, dtype=i32),
                 torch.tensor(last, dtype=i32), keys, values, layout)


def other_layer(paged: Paged, scales: tuple[float, float] = (1.0, 1.0)) -> Paged:
    """Another layer of the same step: new pages of the same shape and dtype, the same CSR description."""
    ks, vs = scales
    fp8 = paged.k_pages.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    k = torch.randn(paged.k_pages.shape).to(paged.k_pages.dtype)
    v = torch.randn(paged.v_pages.shape).to(paged.v_pages.dtype)
    k_nhd = k if paged.layout == "NHD" else k.transpose(1, 2)
    v_nhd = v if paged.layout == "NHD" else v.transpose(1, 2)
    keys, values = [], []
    for b, old in enumerate(paged.keys):
        pages = paged.indices[paged.indptr[b]:paged.indptr[b + 1]].tolist()
        n = old.shape[0]
        keys.append(torch.cat([k_nhd[p].float() * (ks if fp8 else 1.0) for p in pages])[:n] if pages else old)
        values.append(torch.cat([v_nhd[p].float() * (vs if fp8 else 1.0) for p in pages])[:n] if pages
                      else paged.values[b])
    return Paged(k, v, paged.indptr, paged.indices, paged.last_page_len, keys, values, paged.layout)


def qo_indptr(qo_lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(qo_lens).cumsum(0).tolist()], dtype=torch.int32)


def workspace(device: str | torch.device = "cpu") -> torch.Tensor:
    return torch.empty(8 << 20, dtype=torch.uint8, device=device)
