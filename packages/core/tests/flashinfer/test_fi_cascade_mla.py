"""``kernel_switchboard.flashinfer`` cascade and MLA: merging states in base-2 log-sum-exp, the multi-level cascade
wrapper over a shared prefix (vLLM's two-level call), and the MLA wrapper (decode, several new tokens, LSE bases,
CUDA-graph buffers), against the float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch
from fi_oracle import LOG2E, attention, close, make_paged, qo_indptr, workspace

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

KV_HEADS = 2


def _states() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Attention of 6 queries over 30 keys split in two segments (the first 10 keys empty for the last query)."""
    q, k, v = torch.randn(6, 4, 64), torch.randn(30, KV_HEADS, 64), torch.randn(30, KV_HEADS, 64)
    oa, sa = attention(q, k[:10], v[:10], causal=False)
    ob, sb = attention(q, k[10:], v[10:], causal=False)
    oall, sall = attention(q, k, v, causal=False)
    sa[-1] = float("-inf")  # an empty segment for the last query: the merge keeps the other one
    oa[-1] = 0
    oall[-1], sall[-1] = ob[-1], sb[-1]
    return oa.float(), sa.float(), ob.float(), sb.float(), oall, sall


def test_merge_state_in_base_2() -> None:
    oa, sa, ob, sb, oall, sall = _states()
    out, lse = flashinfer.merge_state(oa, sa, ob, sb)
    close(out, oall, torch.float32)
    close(lse, sall, torch.float32)


def test_merge_state_in_place_with_mask() -> None:
    oa, sa, ob, sb, oall, sall = _states()
    mask = torch.tensor([True, False, True, True, False, True])
    v, s = oa.clone(), sa.clone()
    flashinfer.merge_state_in_place(v, s, ob, sb, mask=mask)
    close(v, torch.where(mask[:, None, None], oall, oa.double()), torch.float32)
    close(s, torch.where(mask[:, None], sall, sa.double()), torch.float32)
    v, s = oa.clone(), sa.clone()
    flashinfer.merge_state_in_place(v, s, ob, sb)
    close(v, oall, torch.float32)


def test_merge_states_of_several() -> None:
    q, k, v = torch.randn(5, 4, 64), torch.randn(24, KV_HEADS, 64), torch.randn(24, KV_HEADS, 64)
    parts = [attention(q, k[a:b], v[a:b], causal=False) for a, b in ((0, 7), (7, 8), (8, 24))]
    vs = torch.stack([p[0] for p in parts], 1).float()
    ss = torch.stack([p[1] for p in parts], 1).float()
    out, lse = flashinfer.merge_states(vs, ss)
    want_out, want_lse = attention(q, k, v, causal=False)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)


@pytest.mark.parametrize(("layout", "qo_lens"), [("NHD", [1, 1, 1]), ("HND", [4, 0, 6])])
def test_cascade_shared_prefix(layout: str, qo_lens: list[int]) -> None:
    """vLLM's two-level cascade: level 0 is the shared prefix (all queries, not causal), level 1 each request's own
    pages (causal); equal to causal attention over prefix + own tokens."""
    page_size, prefix_len = 16, 32
    own = [9, 6, 20]
    pool = make_paged([prefix_len, *own], page_size, KV_HEADS, 64, layout=layout)
    prefix_pages = pool.indices[: pool.indptr[1]]
    own_indptr = pool.indptr[1:] - pool.indptr[1]
    own_indices = pool.indices[pool.indptr[1]:]
    q = torch.randn(sum(qo_lens), 8, 64)
    wrapper = flashinfer.MultiLevelCascadeAttentionWrapper(2, workspace(), layout)
    total = torch.tensor([0, sum(qo_lens)], dtype=torch.int32)
    wrapper.plan(qo_indptr_arr=[total, qo_indptr(qo_lens)],
                 paged_kv_indptr_arr=[torch.tensor([0, prefix_pages.numel()], dtype=torch.int32), own_indptr],
                 paged_kv_indices_arr=[prefix_pages, own_indices],
                 paged_kv_last_page_len=[torch.tensor([page_size], dtype=torch.int32), pool.last_page_len[1:]],
                 num_qo_heads=8, num_kv_heads=KV_HEADS, head_dim=64, page_size=page_size, causal=True,
                 sm_scale=0.1, q_data_type=torch.float32)
    out = wrapper.run(q, pool.combined())
    want, at = [], 0
    for b, n in enumerate(qo_lens):
        k = torch.cat((pool.keys[0], pool.keys[b + 1]))
        v = torch.cat((pool.values[0], pool.values[b + 1]))
        want.append(attention(q[at:at + n], k, v, causal=True, sm_scale=0.1)[0])
        at += n
    close(out, torch.cat(want), torch.float32)


# -- MLA -----------------------------------------------------------------------------------------------------------
CKV, KPE, HEADS = 64, 16, 8


def _mla_pages(kv_lens: list[int], page_size: int) -> tuple:
    counts = [-(-n // page_size) for n in kv_lens]
    total = sum(counts) + 2
    ckv, kpe = torch.randn(total, page_size, CKV), torch.randn(total, page_size, KPE)
    order = torch.randperm(total).tolist()
    indptr, indices, at = [0], [], 0
    for c in counts:
        indices += order[at:at + c]
        at += c
        indptr.append(len(indices))
    i32 = torch.int32
    return ckv, kpe, torch.tensor(indptr, dtype=i32), torch.tensor(indices, dtype=i32), torch.tensor(kv_lens, dtype=i32)


def _mla_expected(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv: torch.Tensor, kpe: torch.Tensor,
                  indptr: torch.Tensor, indices: torch.Tensor, kv_lens: list[int], qo_lens: list[int] | int,
                  sm_scale: float, causal: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA in float64, request by request: qo_lens[b] query rows (packed), K = [ckv, kpe], V = ckv over the request's
    kv_lens[b] latent tokens; query i of a request sits at position kv_len - qo_len + i. Rows with nothing to attend:
    out 0, lse -inf. LSE in base 2."""
    qo_lens = [qo_lens] * len(kv_lens) if isinstance(qo_lens, int) else qo_lens
    outs, lses, at = [], [], 0
    for b, (n, t) in enumerate(zip(kv_lens, qo_lens)):
        pages = indices[indptr[b]:indptr[b + 1]].tolist()
        c = torch.cat([ckv[p] for p in pages])[:n].double() if pages else torch.zeros(0, CKV, dtype=torch.float64)
        r = torch.cat([kpe[p] for p in pages])[:n].double() if pages else torch.zeros(0, KPE, dtype=torch.float64)
        qn, qp = q_nope[at:at + t].double(), q_pe[at:at + t].double()
        at += t
        s = (torch.einsum("thd,nd->thn", qn, c) + torch.einsum("thd,nd->thn", qp, r)) * sm_scale
        if causal:
            pos = torch.arange(t)[:, None, None] + n - t
            s = s.masked_fill(torch.arange(n)[None, None, :] > pos, float("-inf"))
        lse = torch.logsumexp(s, -1)
        w = torch.where(torch.isfinite(lse)[..., None], torch.exp(s - lse[..., None]), torch.zeros_like(s))
        outs.append(torch.einsum("thn,nd->thd", w, c))
        lses.append(lse * LOG2E)
    return torch.cat(outs), torch.cat(lses)


def _plan_kind(wrapper: object) -> str:
    return type(next(iter(wrapper._plans.values()))).__name__  # type: ignore[attr-defined]


@pytest.mark.parametrize(("q_len", "page_size"), [(1, 1), (1, 64), (2, 16)])
def test_mla_decode(q_len: int, page_size: int) -> None:
    kv_lens = [3, 17, 40]
    ckv, kpe, indptr, indices, lens = _mla_pages(kv_lens, page_size)
    rows = q_len * len(kv_lens)
    q_nope, q_pe = torch.randn(rows, HEADS, CKV), torch.randn(rows, HEADS, KPE)
    sm_scale = 1 / math.sqrt(128 + 64)
    wrapper = flashinfer.BatchMLAPagedAttentionWrapper(workspace())
    wrapper.plan(qo_indptr([q_len] * len(kv_lens)), indptr, indices, lens, HEADS, CKV, KPE, page_size, q_len > 1,
                 sm_scale, torch.float32, torch.float32)
    assert _plan_kind(wrapper) == "MLADecodePlan"  # one token per request, or T causal ones: decode rows
    out, lse = wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    want_out, want_lse = _mla_expected(q_nope, q_pe, ckv, kpe, indptr, indices, kv_lens, q_len, sm_scale)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    _, lse_e = wrapper.run(q_nope, q_pe, ckv, kpe, return_lse=True, return_lse_base_on_e=True)
    close(lse_e, want_lse / LOG2E, torch.float32)


# uneven query counts (FlashInfer's qo_indptr), requests without new tokens or without cached tokens, non-causal
MLA_PREFILL_CASES = [
    ([3, 17, 0, 40], [2, 5, 0, 1], 1, True),
    ([70, 9, 130], [0, 9, 4], 64, True),
    ([33, 5, 0], [4, 1, 0], 16, True),
    ([5, 12, 0], [3, 3, 3], 16, False),
    ([20, 64, 1], [7, 0, 2], 64, False),
]


@pytest.mark.parametrize(("kv_lens", "qo_lens", "page_size", "causal"), MLA_PREFILL_CASES)
def test_mla_uneven_query_counts(kv_lens: list[int], qo_lens: list[int], page_size: int, causal: bool) -> None:
    """Chunked prefill / mixed batches through ``attention.plan_mla_prefill``, with ``out`` / ``lse`` given."""
    ckv, kpe, indptr, indices, lens = _mla_pages(kv_lens, page_size)
    rows = sum(qo_lens)
    q_nope, q_pe = torch.randn(rows, HEADS, CKV), torch.randn(rows, HEADS, KPE)
    sm_scale = 0.07
    wrapper = flashinfer.BatchMLAPagedAttentionWrapper(workspace())
    wrapper.plan(qo_indptr(qo_lens), indptr, indices, lens, HEADS, CKV, KPE, page_size, causal, sm_scale,
                 torch.float32, torch.float32)
    assert _plan_kind(wrapper) == "MLAPrefillPlan"
    want_out, want_lse = _mla_expected(q_nope, q_pe, ckv, kpe, indptr, indices, kv_lens, qo_lens, sm_scale, causal)
    out, lse = torch.full((rows, HEADS, CKV), float("nan")), torch.full((rows, HEADS), float("nan"))
    got_out, got_lse = wrapper.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse, return_lse=True)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    close(wrapper.run(q_nope, q_pe, ckv, kpe), want_out, torch.float32)
    _, lse_e = wrapper.run_return_lse(q_nope, q_pe, ckv, kpe, return_lse_base_on_e=True)
    close(lse_e, want_lse / LOG2E, torch.float32)
    # another layer of the same step: the same plan over its own latent pages
    ckv2, kpe2 = torch.randn_like(ckv), torch.randn_like(kpe)
    close(wrapper.run(q_nope, q_pe, ckv2, kpe2),
          _mla_expected(q_nope, q_pe, ckv2, kpe2, indptr, indices, kv_lens, qo_lens, sm_scale, causal)[0],
          torch.float32)


def test_mla_uneven_query_counts_bf16() -> None:
    kv_lens, qo_lens = [9, 30], [3, 1]
    ckv, kpe, indptr, indices, lens = _mla_pages(kv_lens, 16)
    ckv, kpe = ckv.bfloat16(), kpe.bfloat16()
    q_nope, q_pe = torch.randn(4, HEADS, CKV).bfloat16(), torch.randn(4, HEADS, KPE).bfloat16()
    wrapper = flashinfer.BatchMLAPagedAttentionWrapper(workspace())
    wrapper.plan(qo_indptr(qo_lens), indptr, indices, lens, HEADS, CKV, KPE, 16, True, 0.1, torch.bfloat16,
                 torch.bfloat16)
    out = wrapper.run(q_nope, q_pe, ckv, kpe)
    assert out.dtype == torch.bfloat16
    close(out, _mla_expected(q_nope, q_pe, ckv, kpe, indptr, indices, kv_lens, qo_lens, 0.1)[0], torch.bfloat16)


def test_mla_cuda_graph_buffers() -> None:
    batch, page_size = 3, 16
    bufs = (torch.arange(batch + 1, dtype=torch.int32), torch.zeros(batch + 1, dtype=torch.int32),
            torch.zeros(batch * 6, dtype=torch.int32), torch.zeros(batch, dtype=torch.int32))
    wrapper = flashinfer.BatchMLAPagedAttentionWrapper(workspace(), use_cuda_graph=True, qo_indptr=bufs[0],
                                                       kv_indptr=bufs[1], kv_indices=bufs[2], kv_len_arr=bufs[3])
    ckv, kpe, indptr, indices, lens = _mla_pages([30, 1, 64], page_size)
    sm_scale = 0.1
    wrapper.plan(bufs[0].clone(), indptr, indices, lens, HEADS, CKV, KPE, page_size, False, sm_scale, torch.float32,
                 torch.float32)
    q_nope, q_pe = torch.randn(batch, HEADS, CKV), torch.randn(batch, HEADS, KPE)
    out = torch.empty(batch, HEADS, CKV)
    wrapper.run(q_nope, q_pe, ckv, kpe, out=out)
    close(out, _mla_expected(q_nope, q_pe, ckv, kpe, indptr, indices, [30, 1, 64], 1, sm_scale)[0], torch.float32)
    lens2 = [64, 50, 2]  # the next step, written into the buffers in place
    order = torch.randperm(ckv.shape[0])[:9].to(torch.int32)
    indptr2 = torch.tensor([0, 4, 8, 9], dtype=torch.int32)
    bufs[1].copy_(indptr2)
    bufs[2][:9].copy_(order)
    bufs[3].copy_(torch.tensor(lens2, dtype=torch.int32))
    wrapper.run(q_nope, q_pe, ckv, kpe, out=out)
    close(out, _mla_expected(q_nope, q_pe, ckv, kpe, indptr2, order, lens2, 1, sm_scale)[0], torch.float32)
    # uneven query counts are served without CUDA graphs only: refused by name here
    with pytest.raises(InvalidArgumentError, match="qo_indptr"):
        wrapper.plan(torch.tensor([0, 2, 3, 3], dtype=torch.int32), indptr, indices, lens, HEADS, CKV, KPE,
                     page_size, True, sm_scale, torch.float32, torch.float32)


def test_mla_refusals() -> None:
    _, _, indptr, indices, lens = _mla_pages([4, 8], 16)
    wrapper = flashinfer.BatchMLAPagedAttentionWrapper(workspace())
    with pytest.raises(InvalidArgumentError, match="qo_indptr"):  # causal queries are the last tokens
        wrapper.plan(qo_indptr([5, 2]), indptr, indices, lens, HEADS, CKV, KPE, 16, True, 0.1, torch.float32,
                     torch.float32)
    with pytest.raises(InvalidArgumentError, match="kv_data_type"):
        wrapper.plan(qo_indptr([1, 1]), indptr, indices, lens, HEADS, CKV, KPE, 16, False, 0.1, torch.bfloat16,
                     torch.float8_e4m3fn)
    wrapper.plan(qo_indptr([1, 3]), indptr, indices, lens, HEADS, CKV, KPE, 16, True, 0.1, torch.float32,
                 torch.float32)
    with pytest.raises(InvalidArgumentError, match="q_nope"):  # 4 packed rows planned
        wrapper.run(torch.randn(3, HEADS, CKV), torch.randn(3, HEADS, KPE), torch.randn(2, 16, CKV),
                    torch.randn(2, 16, KPE))
