"""``kernel_switchboard.flashinfer`` prefill: the paged and ragged wrappers (ragged batches with empty requests,
causal and not, LSE, CUDA-graph buffers), SGLang's extend sequence (ragged new tokens + paged prefix + merge_state)
and ``single_prefill_with_kv_cache``, against the float64 oracle."""

from __future__ import annotations

import pytest
import torch
from fi_oracle import Paged, attention, close, make_paged, qo_indptr, workspace

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

KV_HEADS = 2
KV_LENS = [0, 7, 20, 45, 3]
QO_LENS = [0, 3, 20, 1, 0]


def expected(paged: Paged, q: torch.Tensor, qo_lens: list[int], **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    outs, lses, at = [], [], 0
    for b, n in enumerate(qo_lens):
        o, s = attention(q[at:at + n], paged.keys[b], paged.values[b], **kw)  # type: ignore[arg-type]
        outs.append(o)
        lses.append(s)
        at += n
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize(("layout", "page_size", "group", "head_dim", "causal"),
                         [("NHD", 1, 1, 64, True), ("HND", 16, 4, 128, False), ("NHD", 64, 8, 256, True),
                          ("HND", 1, 8, 64, False), ("NHD", 16, 1, 256, False), ("HND", 64, 4, 128, True)])
def test_paged_prefill_matches_oracle(layout: str, page_size: int, group: int, head_dim: int, causal: bool) -> None:
    paged = make_paged(KV_LENS, page_size, KV_HEADS, head_dim, layout=layout)
    hq = KV_HEADS * group
    q = torch.randn(sum(QO_LENS), hq, head_dim)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), layout)
    wrapper.plan(qo_indptr(QO_LENS), paged.indptr, paged.indices, paged.last_page_len, hq, KV_HEADS, head_dim,
                 page_size, causal=causal, q_data_type=torch.float32)
    out, lse = wrapper.run(q, paged.combined() if causal else (paged.k_pages, paged.v_pages), return_lse=True)
    want_out, want_lse = expected(paged, q, QO_LENS, causal=causal)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)


def test_paged_prefill_bf16_window_cap_and_head_dim_vo() -> None:
    paged = make_paged(KV_LENS, 16, KV_HEADS, 128, head_dim_v=64, dtype=torch.bfloat16)
    q = torch.randn(sum(QO_LENS), 4, 128).bfloat16()
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(qo_indptr(QO_LENS), paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 128, 16,
                 head_dim_vo=64, causal=True, window_left=8, logits_soft_cap=25.0, q_data_type=torch.bfloat16)
    out = wrapper.run(q, (paged.k_pages, paged.v_pages))
    assert out.shape == (sum(QO_LENS), 4, 64) and out.dtype == torch.bfloat16
    close(out, expected(paged, q, QO_LENS, causal=True, window_left=8, soft_cap=25.0)[0], torch.bfloat16)


def test_paged_prefill_fp8_pages() -> None:
    paged = make_paged(KV_LENS, 16, KV_HEADS, 64, dtype=torch.float8_e4m3fn, scales=(0.25, 4.0))
    q = torch.randn(sum(QO_LENS), 4, 64)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(qo_indptr(QO_LENS), paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16,
                 causal=True, q_data_type=torch.float32, kv_data_type=torch.float8_e4m3fn)
    out = wrapper.run(q, paged.combined(), k_scale=0.25, v_scale=4.0)
    close(out, expected(paged, q, QO_LENS, causal=True)[0], torch.float32)


def test_paged_prefill_sglang_forward() -> None:
    """SGLang's paged extend: the deprecated ``forward`` sets causal / sm_scale / window per call."""
    paged = make_paged(KV_LENS, 1, KV_HEADS, 64)
    q = torch.randn(sum(QO_LENS), 4, 64)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD", backend="fa2")
    wrapper.begin_forward(qo_indptr(QO_LENS), paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 1,
                          q_data_type=torch.float32, kv_data_type=torch.float32)
    kv = (paged.k_pages[:, 0], paged.v_pages[:, 0])
    out = wrapper.forward(q, kv, causal=True, sm_scale=0.2, window_left=-1, logits_soft_cap=None, k_scale=1.0,
                          v_scale=1.0)
    close(out, expected(paged, q, QO_LENS, causal=True, sm_scale=0.2)[0], torch.float32)
    out, lse = wrapper.forward_return_lse(q, kv, causal=False, sm_scale=0.2)
    want_out, want_lse = expected(paged, q, QO_LENS, causal=False, sm_scale=0.2)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)


@pytest.mark.parametrize("causal", [True, False])
def test_ragged_prefill(causal: bool) -> None:
    kv_lens, qo_lens = [3, 4, 12, 0], [0, 4, 9, 0]
    k, v = torch.randn(sum(kv_lens), KV_HEADS, 128), torch.randn(sum(kv_lens), KV_HEADS, 64)
    q = torch.randn(sum(qo_lens), 8, 128)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD", backend="cutlass")
    wrapper.plan(qo_indptr(qo_lens), qo_indptr(kv_lens), 8, KV_HEADS, 128, head_dim_vo=64, causal=causal,
                 q_data_type=torch.float32)
    out, lse_buf = torch.empty(sum(qo_lens), 8, 64), torch.empty(sum(qo_lens), 8)
    got, lse = wrapper.run(q, k, v, out=out, lse=lse_buf, return_lse=True)
    assert got.data_ptr() == out.data_ptr() and lse.data_ptr() == lse_buf.data_ptr()
    for bad in (out.half(), out[:-1], torch.empty(sum(qo_lens), 64, 8).transpose(1, 2)):
        with pytest.raises(InvalidArgumentError, match=r"^out="):
            wrapper.run(q, k, v, out=bad)
    outs, lses, qa, ka = [], [], 0, 0
    for nq, nk in zip(qo_lens, kv_lens):
        o, s = attention(q[qa:qa + nq], k[ka:ka + nk], v[ka:ka + nk], causal=causal)
        outs.append(o)
        lses.append(s)
        qa, ka = qa + nq, ka + nk
    close(out, torch.cat(outs), torch.float32)
    close(lse, torch.cat(lses), torch.float32)


def test_sglang_extend_with_prefix() -> None:
    """SGLang's extend: causal ragged attention over the new tokens, non-causal paged attention over the cached
    prefix, merged with ``merge_state``: equal to causal attention over prefix + new tokens."""
    prefix, new = [16, 5, 0], [3, 7, 4]
    paged = make_paged(prefix, 1, KV_HEADS, 64)
    q = torch.randn(sum(new), 4, 64)
    k_new, v_new = torch.randn(sum(new), KV_HEADS, 64), torch.randn(sum(new), KV_HEADS, 64)
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace(), "NHD")
    ragged.begin_forward(qo_indptr(new), qo_indptr(new), 4, KV_HEADS, 64, q_data_type=torch.float32)
    paged_w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), "NHD")
    paged_w.begin_forward(qo_indptr(new), paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 1,
                          q_data_type=torch.float32)
    o1, s1 = ragged.forward_return_lse(q, k_new, v_new, causal=True, sm_scale=0.125)
    o2, s2 = paged_w.forward_return_lse(q, (paged.k_pages[:, 0], paged.v_pages[:, 0]), causal=False, sm_scale=0.125)
    out, _ = flashinfer.merge_state(o1, s1, o2, s2)
    want, at = [], 0
    for b, n in enumerate(new):
        k = torch.cat((paged.keys[b], k_new[at:at + n]))
        v = torch.cat((paged.values[b], v_new[at:at + n]))
        want.append(attention(q[at:at + n], k, v, causal=True, sm_scale=0.125)[0])
        at += n
    close(out, torch.cat(want), torch.float32)


def test_paged_prefill_cuda_graph_buffers() -> None:
    """SGLang's target-verify wrapper: fixed qo / page buffers, rewritten in place between runs."""
    batch, draft, page_size = 3, 2, 16
    qo_buf = torch.zeros(batch + 1, dtype=torch.int32)
    indptr_buf = torch.zeros(batch + 1, dtype=torch.int32)
    indices_buf = torch.zeros(batch * 10, dtype=torch.int32)
    last_buf = torch.ones(batch, dtype=torch.int32)
    wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, paged_kv_indptr_buf=indptr_buf,
        paged_kv_indices_buf=indices_buf, paged_kv_last_page_len_buf=last_buf)
    qo = qo_indptr([draft] * batch)
    step1 = make_paged([5, 40, 17], page_size, KV_HEADS, 64, spare_pages=8)
    wrapper.plan(qo, step1.indptr, step1.indices, step1.last_page_len, 4, KV_HEADS, 64, page_size, causal=True,
                 q_data_type=torch.float32)
    q = torch.randn(batch * draft, 4, 64)
    close(wrapper.run(q, (step1.k_pages, step1.v_pages)), expected(step1, q, [draft] * batch, causal=True)[0],
          torch.float32)
    step2 = make_paged([33, 2, 60], page_size, KV_HEADS, 64, spare_pages=2)
    step2 = Paged(step1.k_pages, step1.v_pages, step2.indptr, step2.indices, step2.last_page_len,
                  [_gather(step1, step2, b, n) for b, n in enumerate([33, 2, 60])],
                  [_gather(step1, step2, b, n, values=True) for b, n in enumerate([33, 2, 60])])
    indptr_buf.copy_(step2.indptr)
    indices_buf[: step2.indices.numel()].copy_(step2.indices)
    last_buf.copy_(step2.last_page_len)
    close(wrapper.run(q, (step1.k_pages, step1.v_pages)), expected(step2, q, [draft] * batch, causal=True)[0],
          torch.float32)


def _gather(pool: Paged, step: Paged, b: int, n: int, values: bool = False) -> torch.Tensor:
    pages = step.indices[step.indptr[b]:step.indptr[b + 1]].tolist()
    src = pool.v_pages if values else pool.k_pages
    return torch.cat([src[p] for p in pages])[:n].float()


def test_ragged_cuda_graph_refuses_a_longer_request() -> None:
    qo_buf, kv_buf = torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace(), use_cuda_graph=True, qo_indptr_buf=qo_buf,
                                                             kv_indptr_buf=kv_buf)
    wrapper.plan(qo_indptr([2, 2]), qo_indptr([5, 5]), 4, KV_HEADS, 64, causal=True, q_data_type=torch.float32)
    with pytest.raises(InvalidArgumentError, match="qo_indptr"):
        wrapper.plan(qo_indptr([1, 3]), qo_indptr([5, 5]), 4, KV_HEADS, 64, causal=True, q_data_type=torch.float32)


@pytest.mark.parametrize(("layout", "causal"), [("NHD", True), ("HND", False)])
def test_single_prefill(layout: str, causal: bool) -> None:
    q, k, v = torch.randn(9, 8, 64), torch.randn(14, KV_HEADS, 64), torch.randn(14, KV_HEADS, 64)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    out, lse = flashinfer.single_prefill_with_kv_cache(q, kk, vv, causal=causal, kv_layout=layout,
                                                       logits_soft_cap=10.0, return_lse=True)
    want_out, want_lse = attention(q, k, v, causal=causal, soft_cap=10.0)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    out2, lse2 = flashinfer.single_prefill_with_kv_cache_return_lse(q, kk, vv, causal=causal, kv_layout=layout,
                                                                    logits_soft_cap=10.0)
    close(out2, want_out, torch.float32)
    close(lse2, want_lse, torch.float32)


def test_single_prefill_custom_mask() -> None:
    q, k, v = torch.randn(5, 4, 64), torch.randn(11, KV_HEADS, 64), torch.randn(11, KV_HEADS, 64)
    mask = torch.rand(5, 11) > 0.4
    mask[:, 0] = True
    out = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    kk, vv = k.double().repeat_interleave(2, 1), v.double().repeat_interleave(2, 1)
    s = torch.einsum("qhd,khd->hqk", q.double(), kk) / 8
    s = s.masked_fill(~mask, float("-inf"))
    close(out, torch.einsum("hqk,khd->qhd", s.softmax(-1), vv), torch.float32)
    with pytest.raises(InvalidArgumentError, match="return_lse"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, return_lse=True)
