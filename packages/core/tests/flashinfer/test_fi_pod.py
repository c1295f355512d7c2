"""``kernel_switchboard.flashinfer`` POD: ``BatchPODWithPagedKVCacheWrapper`` (paged prefill and decode requests of
one cache, through ``attention.plan_pod``) and ``PODWithPagedKVCacheWrapper`` (one prefill request over its own K/V
beside paged decode requests), driven with FlashInfer 0.6's call sequence, against the float64 oracle; and what they
refuse by name."""

from __future__ import annotations

import pytest
import torch
from fi_oracle import Paged, attention, close, make_paged, other_layer, qo_indptr, workspace

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

KV_HEADS = 2
I32 = torch.int32


def _parts(pool: Paged, prefill: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The CSR pages of the pool's first ``prefill`` requests and of the others (the decode requests)."""
    cut = int(pool.indptr[prefill])
    p = (pool.indptr[:prefill + 1], pool.indices[:cut], pool.last_page_len[:prefill])
    d = (pool.indptr[prefill:] - cut, pool.indices[cut:], pool.last_page_len[prefill:])
    return p, d


def _expected(pool: Paged, q_p: torch.Tensor, qo_lens: list[int], q_d: torch.Tensor, causal: bool,
              **kw: object) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(out_p, lse_p, out_d, lse_d): each prefill request's queries over its keys (``causal``), each decode request's
    one query over its keys."""
    prefill, at = [], 0
    for b, n in enumerate(qo_lens):
        prefill.append(attention(q_p[at:at + n], pool.keys[b], pool.values[b], causal=causal, **kw))  # type: ignore[arg-type]
        at += n
    first = len(qo_lens)
    decode = [attention(q_d[b:b + 1], pool.keys[first + b], pool.values[first + b], causal=True, **kw)  # type: ignore[arg-type]
              for b in range(q_d.shape[0])]
    return (torch.cat([o for o, _ in prefill]), torch.cat([s for _, s in prefill]),
            torch.cat([o for o, _ in decode]), torch.cat([s for _, s in decode]))


POD_CASES = [("NHD", 16, 1, True), ("HND", 1, 4, True), ("NHD", 64, 2, False), ("HND", 16, 1, False)]


@pytest.mark.parametrize(("layout", "page_size", "group", "causal"), POD_CASES)
def test_batch_pod(layout: str, page_size: int, group: int, causal: bool) -> None:
    qo_lens, kv_p = [5, 0, 12], [9, 3, 12]
    kv_d = [0, 17, 70, 1]
    pool = make_paged(kv_p + kv_d, page_size, KV_HEADS, 64, layout=layout)
    (ip, xp, lp), (idp, xd, ld) = _parts(pool, len(kv_p))
    hq = KV_HEADS * group
    q_p, q_d = torch.randn(sum(qo_lens), hq, 64), torch.randn(len(kv_d), hq, 64)
    wrapper = flashinfer.BatchPODWithPagedKVCacheWrapper(workspace(), layout)
    wrapper.plan(qo_indptr(qo_lens), ip, xp, lp, torch.arange(len(kv_d) + 1, dtype=I32), idp, xd, ld,
                 num_qo_heads=hq, num_kv_heads=KV_HEADS, head_dim=64, page_size=page_size,
                 q_data_type=torch.float32, sm_scale=0.1)
    kv = pool.combined() if group != 1 else (pool.k_pages, pool.v_pages)
    out_p, out_d = wrapper.run(q_p, kv, q_d, kv, causal_p=causal)
    want_p, want_lse_p, want_d, want_lse_d = _expected(pool, q_p, qo_lens, q_d, causal, sm_scale=0.1)
    close(out_p, want_p, torch.float32)
    close(out_d, want_d, torch.float32)
    (out_p, out_d), (lse_p, lse_d) = wrapper.run(q_p, kv, q_d, kv, causal_p=causal, return_lse=True)
    close(out_p, want_p, torch.float32)
    close(lse_p, want_lse_p, torch.float32)
    close(out_d, want_d, torch.float32)
    close(lse_d, want_lse_d, torch.float32)
    # another layer of the step: its own cache, the same plans
    plans = dict(wrapper._plans)
    layer2 = other_layer(pool)
    kv2 = layer2.combined()
    out_p, out_d = wrapper.run(q_p, kv2, q_d, kv2, causal_p=causal)
    want_p, _, want_d, _ = _expected(layer2, q_p, qo_lens, q_d, causal, sm_scale=0.1)
    close(out_p, want_p, torch.float32)
    close(out_d, want_d, torch.float32)
    assert wrapper._plans == plans


def test_batch_pod_window_half_precision_and_fp8_pages() -> None:
    qo_lens, kv_p, kv_d = [6, 2], [30, 2], [40, 9]
    pool = make_paged(kv_p + kv_d, 16, KV_HEADS, 128, dtype=torch.float8_e4m3fn)
    (ip, xp, lp), (idp, xd, ld) = _parts(pool, 2)
    q_p, q_d = torch.randn(8, 8, 128).bfloat16(), torch.randn(2, 8, 128).bfloat16()
    wrapper = flashinfer.BatchPODWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(qo_indptr(qo_lens), ip, xp, lp, torch.arange(3, dtype=I32), idp, xd, ld, 8, KV_HEADS, 128, 16,
                 window_left=7, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    kv = pool.combined()
    out_p, out_d = wrapper.run(q_p, kv, q_d, kv, causal_p=True, k_scale=1.0, v_scale=None)
    assert out_p.dtype == out_d.dtype == torch.bfloat16
    want_p, _, want_d, _ = _expected(pool, q_p, qo_lens, q_d, True, window_left=7)
    close(out_p, want_p, torch.bfloat16)
    close(out_d, want_d, torch.bfloat16)


def test_batch_pod_refusals() -> None:
    pool = make_paged([4, 6, 9], 16, KV_HEADS, 64)
    (ip, xp, lp), (idp, xd, ld) = _parts(pool, 1)
    wrapper = flashinfer.BatchPODWithPagedKVCacheWrapper(workspace(), "NHD")
    with pytest.raises(InvalidArgumentError, match="qo_indptr_d"):  # two queries for a decode request
        wrapper.plan(qo_indptr([2]), ip, xp, lp, qo_indptr([1, 2]), idp, xd, ld, 4, KV_HEADS, 64, 16,
                     q_data_type=torch.float32)
    with pytest.raises(InvalidArgumentError, match="pos_encoding_mode"):
        wrapper.plan(qo_indptr([2]), ip, xp, lp, qo_indptr([1, 1]), idp, xd, ld, 4, KV_HEADS, 64, 16,
                     pos_encoding_mode="ROPE_LLAMA", q_data_type=torch.float32)
    q_p, q_d = torch.randn(2, 4, 64), torch.randn(2, 4, 64)
    with pytest.raises(InvalidArgumentError, match="plan"):
        wrapper.run(q_p, pool.combined(), q_d, pool.combined())
    wrapper.plan(qo_indptr([2]), ip, xp, lp, qo_indptr([1, 1]), idp, xd, ld, 4, KV_HEADS, 64, 16,
                 q_data_type=torch.float32)
    kv = (pool.k_pages, pool.v_pages)
    with pytest.raises(InvalidArgumentError, match="paged_kv_cache_d"):  # two caches: not one launch
        wrapper.run(q_p, kv, q_d, (pool.k_pages.clone(), pool.v_pages))
    for name in ("q_scale", "k_scale", "v_scale"):  # FlashInfer scales the decode part only
        with pytest.raises(InvalidArgumentError, match=name):
            wrapper.run(q_p, kv, q_d, kv, **{name: 0.5})
    with pytest.raises(InvalidArgumentError, match="custom_mask_p"):
        wrapper.run(q_p, kv, q_d, kv, custom_mask_p=torch.ones(2, 4, dtype=torch.bool))
    out_p, out_d = wrapper.run(q_p, kv, q_d, (pool.k_pages, pool.v_pages))  # the same tensors, a new tuple
    assert out_p.shape == (2, 4, 64) and out_d.shape == (2, 4, 64)


# -- PODWithPagedKVCacheWrapper ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("layout_p", "causal", "window"), [("NHD", True, -1), ("HND", False, -1), ("NHD", True, 4)])
def test_pod(layout_p: str, causal: bool, window: int) -> None:
    """FlashInfer's POD test sequence: one prefill request over its K/V, decode requests over the paged cache."""
    kv_d = [7, 0, 33]
    paged = make_paged(kv_d, 16, KV_HEADS, 64, layout="HND")
    q_p, k_p, v_p = torch.randn(9, 8, 64), torch.randn(12, KV_HEADS, 64), torch.randn(12, KV_HEADS, 64)
    q_d = torch.randn(len(kv_d), 8, 64)
    wrapper = flashinfer.PODWithPagedKVCacheWrapper(workspace(), "HND")
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 8, KV_HEADS, 64, 16, window_left=5,
                 data_type=torch.float32, q_data_type=torch.float32, sm_scale=0.2)
    kp, vp = (k_p, v_p) if layout_p == "NHD" else (k_p.transpose(0, 1).contiguous(), v_p.transpose(0, 1).contiguous())
    out_p, out_d = wrapper.run(q_p, kp, vp, q_d, paged.combined(), causal_p=causal, kv_layout_p=layout_p,
                               window_left_p=window, sm_scale_p=0.15, return_lse_p=True)
    close(out_p, attention(q_p, k_p, v_p, causal=causal, sm_scale=0.15, window_left=window)[0], torch.float32)
    want_d = torch.cat([attention(q_d[b:b + 1], paged.keys[b], paged.values[b], causal=True, sm_scale=0.2,
                                  window_left=5)[0] for b in range(len(kv_d))])
    close(out_d, want_d, torch.float32)
    # the planned decode options repeated, and the decode scales (FlashInfer: v_scale multiplies out_d)
    out_p2, out_d2 = wrapper.run(q_p, kp, vp, q_d, paged.combined(), causal_p=causal, kv_layout_p=layout_p,
                                 window_left_p=window, sm_scale_p=0.15, sm_scale_d=0.2, window_left_d=5, v_scale=2.0)
    close(out_p2, out_p, torch.float32)
    close(out_d2, want_d * 2.0, torch.float32)


def test_pod_fp8_decode_pages_with_tensor_scales() -> None:
    kv_d = [5, 20]
    paged = make_paged(kv_d, 4, KV_HEADS, 64, dtype=torch.float8_e4m3fn)
    wrapper = flashinfer.PODWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 4, q_data_type=torch.float32,
                 kv_data_type=torch.float8_e4m3fn)
    q_p, k_p, v_p = torch.randn(3, 4, 64), torch.randn(3, KV_HEADS, 64), torch.randn(3, KV_HEADS, 64)
    q_d = torch.randn(2, 4, 64)
    ks, vs = torch.tensor([0.5, 2.0]), torch.tensor(1.5)
    out_p, out_d = wrapper.run(q_p, k_p, v_p, q_d, (paged.k_pages, paged.v_pages), causal_p=True, k_scale=ks,
                               v_scale=vs)
    close(out_p, attention(q_p, k_p, v_p, causal=True)[0], torch.float32)
    want_d = torch.cat([attention(q_d[b:b + 1], paged.keys[b].double() * ks.double()[:, None],
                                  paged.values[b].double() * 1.5, causal=True)[0] for b in range(2)])
    close(out_d, want_d, torch.float32)


def test_pod_refusals() -> None:
    paged = make_paged([5, 9], 16, KV_HEADS, 64)
    wrapper = flashinfer.PODWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, q_data_type=torch.float32,
                 sm_scale=0.1)
    q_p, k_p, v_p, q_d = torch.randn(3, 4, 64), torch.randn(5, KV_HEADS, 64), torch.randn(5, KV_HEADS, 64), \
        torch.randn(2, 4, 64)
    kv = (paged.k_pages, paged.v_pages)
    cases: list[tuple[dict[str, object], str]] = [
        ({"custom_mask_d": torch.ones(1, 1, dtype=torch.bool)}, "custom_mask_d"),  # FlashInfer would ignore it
        ({"packed_custom_mask_p": torch.ones(1, dtype=torch.uint8)}, "packed_custom_mask_p"),
        ({"sm_scale_d": 0.3}, "sm_scale_d"),  # FlashInfer takes plan()'s: a different value is not honoured
        ({"window_left_d": 3}, "window_left_d"),
        ({"pos_encoding_mode_p": "ROPE_LLAMA"}, "pos_encoding_mode"),
        ({"pos_encoding_mode_d": "ALIBI"}, "pos_encoding_mode_d"),
        ({"kv_layout_p": "XYZ"}, "kv_layout"),
    ]
    for kwargs, name in cases:
        with pytest.raises(InvalidArgumentError, match=name):
            wrapper.run(q_p, k_p, v_p, q_d, kv, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="k_p"):
        wrapper.run(q_p, k_p.bfloat16(), v_p.bfloat16(), q_d, kv)
    with pytest.raises(InvalidArgumentError, match="qo_indptr"):  # causal: more queries than keys
        wrapper.run(torch.randn(6, 4, 64), k_p, v_p, q_d, kv, causal_p=True)
    with pytest.raises(InvalidArgumentError, match="jit_args"):
        flashinfer.PODWithPagedKVCacheWrapper(workspace(), "NHD", jit_args=["custom"])
