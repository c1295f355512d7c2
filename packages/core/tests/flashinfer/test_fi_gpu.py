"""``kernel_switchboard.flashinfer`` beside the real FlashInfer (0.6.18) on a GPU: identical inputs through both,
outputs compared within the dtype's tolerance, samplers compared by their token distributions; and the compat
wrappers captured in a CUDA graph with the caller's buffers rewritten between replays.

Skipped without CUDA; the comparisons also skip without an importable ``flashinfer``. FlashInfer compiles each
kernel on first use (seconds to minutes): the configurations here reuse the bench preset's (bf16, head_dim 128,
32 / 8 heads) where they can; tests marked ``slow`` compile extra modules (fp8 KV, soft cap, window).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import pytest
import torch
from fi_oracle import make_paged, qo_indptr

import kernel_switchboard.flashinfer as compat

pytestmark = pytest.mark.gpu
DEV = "cuda"
BF16 = torch.bfloat16
HQ, HKV, D = 32, 8, 128


@pytest.fixture(scope="module")
def fi() -> Any:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return pytest.importorskip("flashinfer")


@pytest.fixture
def ws() -> torch.Tensor:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return torch.zeros(128 << 20, dtype=torch.uint8, device=DEV)


def _near(got: torch.Tensor, want: torch.Tensor, tol: float = 2e-2) -> None:
    """Within bf16 tolerance (relative to the output's scale); infinities must agree."""
    got, want = got.float(), want.float()
    inf = torch.isinf(want)
    assert torch.equal(torch.isinf(got), inf)
    torch.testing.assert_close(got[~inf], want[~inf], rtol=tol, atol=tol)


def _paged(lens: list[int], page: int, layout: str, dtype: torch.dtype = BF16, **kw: Any) -> Any:
    p = make_paged(lens, page, HKV, D, layout=layout, dtype=dtype, **kw)
    for name in ("k_pages", "v_pages", "indptr", "indices", "last_page_len"):
        setattr(p, name, getattr(p, name).to(DEV))
    return p


LENS = [1, 17, 300, 2048, 0, 999]


# -- attention ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tensor_cores", [False, True])
@pytest.mark.parametrize(("layout", "page"), [("NHD", 16), ("HND", 16), ("NHD", 64), ("HND", 1)])
def test_decode(fi: Any, ws: torch.Tensor, layout: str, page: int, tensor_cores: bool) -> None:
    p = _paged(LENS, page, layout)
    q = torch.randn(len(LENS), HQ, D, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi, compat):
        w = mod.BatchDecodeWithPagedKVCacheWrapper(torch.zeros_like(ws), layout, use_tensor_cores=tensor_cores)
        w.plan(p.indptr, p.indices, p.last_page_len, HQ, HKV, D, page, q_data_type=BF16)
        outs.append(w.run(q, p.combined(), return_lse=True))
    rows = [0, 1, 2, 3, 5]  # request 4 has no pages (CUDA-graph padding): its row is not part of FlashInfer's contract
    _near(outs[1][0][rows], outs[0][0][rows])
    _near(outs[1][1][rows], outs[0][1][rows], 1e-2)
    assert not bool(outs[1][0][4].any()) and bool(torch.isinf(outs[1][1][4]).all())


@pytest.mark.slow
@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_decode_fp8_scales(fi: Any, ws: torch.Tensor, fp8: torch.dtype) -> None:
    p = _paged(LENS, 16, "NHD", dtype=fp8, scales=(0.5, 2.0))
    q = torch.randn(len(LENS), HQ, D, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi, compat):
        w = mod.BatchDecodeWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD", use_tensor_cores=True)
        w.plan(p.indptr, p.indices, p.last_page_len, HQ, HKV, D, 16, q_data_type=BF16, kv_data_type=fp8)
        outs.append(w.run(q, (p.k_pages, p.v_pages), k_scale=0.5, v_scale=2.0))
    _near(outs[1], outs[0], 3e-2)


@pytest.mark.slow
def test_decode_window_and_soft_cap(fi: Any, ws: torch.Tensor) -> None:
    p = _paged(LENS, 16, "NHD")
    q = torch.randn(len(LENS), HQ, D, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi, compat):
        w = mod.BatchDecodeWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD", use_tensor_cores=True)
        w.plan(p.indptr, p.indices, p.last_page_len, HQ, HKV, D, 16, q_data_type=BF16, window_left=127,
               logits_soft_cap=30.0)
        outs.append(w.run(q, (p.k_pages, p.v_pages)))
    _near(outs[1], outs[0])


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_prefill(fi: Any, ws: torch.Tensor, layout: str) -> None:
    kv, qo = [40, 300, 0, 1024, 7], [40, 1, 0, 512, 3]
    p = _paged(kv, 16, layout)
    q = torch.randn(sum(qo), HQ, D, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi, compat):
        w = mod.BatchPrefillWithPagedKVCacheWrapper(torch.zeros_like(ws), layout)
        w.plan(qo_indptr(qo).to(DEV), p.indptr, p.indices, p.last_page_len, HQ, HKV, D, 16, causal=True,
               q_data_type=BF16)
        outs.append(w.run(q, (p.k_pages, p.v_pages), return_lse=True))
    _near(outs[1][0], outs[0][0])
    _near(outs[1][1], outs[0][1], 1e-2)


@pytest.mark.parametrize("causal", [True, False])
def test_ragged_prefill(fi: Any, ws: torch.Tensor, causal: bool) -> None:
    kv, qo = [40, 300, 1024, 7], [40, 1, 512, 3]
    k = torch.randn(sum(kv), HKV, D, dtype=BF16, device=DEV)
    v = torch.randn(sum(kv), HKV, D, dtype=BF16, device=DEV)
    q = torch.randn(sum(qo), HQ, D, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi, compat):
        w = mod.BatchPrefillWithRaggedKVCacheWrapper(torch.zeros_like(ws), "NHD")
        w.plan(qo_indptr(qo).to(DEV), qo_indptr(kv).to(DEV), HQ, HKV, D, causal=causal, q_data_type=BF16)
        outs.append(w.run(q, k, v, return_lse=True))
    _near(outs[1][0], outs[0][0])
    _near(outs[1][1], outs[0][1], 1e-2)


def test_cascade(fi: Any, ws: torch.Tensor) -> None:
    prefix, own, page = 64, [9, 130, 40], 16
    pool = _paged([prefix, *own], page, "NHD")
    q = torch.randn(len(own), HQ, D, dtype=BF16, device=DEV)
    i32 = torch.int32
    args = ([torch.tensor([0, len(own)], dtype=i32, device=DEV), torch.arange(len(own) + 1, dtype=i32, device=DEV)],
            [torch.tensor([0, prefix // page], dtype=i32, device=DEV), pool.indptr[1:] - pool.indptr[1]],
            [pool.indices[: pool.indptr[1]], pool.indices[pool.indptr[1]:]],
            [torch.tensor([page], dtype=i32, device=DEV), pool.last_page_len[1:]])
    outs = []
    for mod in (fi, compat):
        w = mod.MultiLevelCascadeAttentionWrapper(2, torch.zeros_like(ws), "NHD")
        w.plan(*args, HQ, HKV, D, page, causal=True, q_data_type=BF16)
        outs.append(w.run(q, pool.combined()))
    _near(outs[1], outs[0])


def test_mla_decode(fi: Any, ws: torch.Tensor) -> None:
    b, heads, ckv_dim, kpe_dim, page = 16, 128, 512, 64, 64
    lens = torch.tensor([1, 64, 65, 4000] * 4, dtype=torch.int32, device=DEV)
    counts = (lens + page - 1) // page
    indptr = torch.cat((torch.zeros(1, dtype=torch.int32, device=DEV), counts.cumsum(0).to(torch.int32)))
    indices = torch.randperm(int(indptr[-1]) + 5, device=DEV)[: int(indptr[-1])].to(torch.int32)
    ckv = torch.randn(int(indptr[-1]) + 5, page, ckv_dim, dtype=BF16, device=DEV)
    kpe = torch.randn(int(indptr[-1]) + 5, page, kpe_dim, dtype=BF16, device=DEV)
    q_nope = torch.randn(b, heads, ckv_dim, dtype=BF16, device=DEV)
    q_pe = torch.randn(b, heads, kpe_dim, dtype=BF16, device=DEV)
    qo = torch.arange(b + 1, dtype=torch.int32, device=DEV)
    outs = []
    for mod in (fi.mla, compat):
        w = mod.BatchMLAPagedAttentionWrapper(torch.zeros_like(ws))
        w.plan(qo, indptr, indices, lens, heads, ckv_dim, kpe_dim, page, False, 1 / math.sqrt(192), BF16, BF16)
        outs.append(w.run(q_nope, q_pe, ckv, kpe, return_lse=True))
    _near(outs[1][0], outs[0][0])
    _near(outs[1][1], outs[0][1], 1e-2)


def test_mla_uneven_query_counts(fi: Any, ws: torch.Tensor) -> None:
    """Chunked prefill of DeepSeek-style MLA: uneven new-token counts per request (one without), causal."""
    heads, ckv_dim, kpe_dim, page = 128, 512, 64, 64
    qo_lens, kv_lens = [1, 7, 0, 64, 300], [64, 300, 5, 1024, 300]
    lens = torch.tensor(kv_lens, dtype=torch.int32, device=DEV)
    counts = (lens + page - 1) // page
    indptr = torch.cat((torch.zeros(1, dtype=torch.int32, device=DEV), counts.cumsum(0).to(torch.int32)))
    pool = int(indptr[-1]) + 5
    indices = torch.randperm(pool, device=DEV)[: int(indptr[-1])].to(torch.int32)
    ckv = torch.randn(pool, page, ckv_dim, dtype=BF16, device=DEV)
    kpe = torch.randn(pool, page, kpe_dim, dtype=BF16, device=DEV)
    rows = sum(qo_lens)
    q_nope = torch.randn(rows, heads, ckv_dim, dtype=BF16, device=DEV)
    q_pe = torch.randn(rows, heads, kpe_dim, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi.mla, compat):
        w = mod.BatchMLAPagedAttentionWrapper(torch.zeros_like(ws))
        w.plan(qo_indptr(qo_lens).to(DEV), indptr, indices, lens, heads, ckv_dim, kpe_dim, page, True,
               1 / math.sqrt(192), BF16, BF16)
        outs.append(w.run(q_nope, q_pe, ckv, kpe, return_lse=True))
    _near(outs[1][0], outs[0][0])
    _near(outs[1][1], outs[0][1], 1e-2)


def _pod_parts(pool: Any, prefill: int) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    cut = int(pool.indptr[prefill])
    return ((pool.indptr[:prefill + 1], pool.indices[:cut], pool.last_page_len[:prefill]),
            (pool.indptr[prefill:] - cut, pool.indices[cut:], pool.last_page_len[prefill:]))


@pytest.mark.slow
def test_batch_pod(fi: Any, ws: torch.Tensor) -> None:
    """Paged prefill and decode requests of one cache: FlashInfer's batch POD and the compat wrapper (plan_pod)."""
    qo_lens, kv_p, kv_d = [512, 40, 3], [1024, 40, 300], [17, 2048, 1, 999, 64, 300, 5, 4000]
    pool = _paged(kv_p + kv_d, 16, "NHD")
    (ip, xp, lp), (idp, xd, ld) = _pod_parts(pool, len(kv_p))
    q_p = torch.randn(sum(qo_lens), HQ, D, dtype=BF16, device=DEV)
    q_d = torch.randn(len(kv_d), HQ, D, dtype=BF16, device=DEV)
    kv = pool.combined()
    outs = []
    for mod in (fi, compat):
        w = mod.BatchPODWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD")
        w.plan(qo_indptr(qo_lens).to(DEV), ip, xp, lp, torch.arange(len(kv_d) + 1, dtype=torch.int32, device=DEV),
               idp, xd, ld, HQ, HKV, D, 16, q_data_type=BF16, kv_data_type=BF16)
        outs.append(w.run(q_p, kv, q_d, kv, causal_p=True, return_lse=True))
    for part in range(2):
        _near(outs[1][0][part], outs[0][0][part])
        _near(outs[1][1][part], outs[0][1][part], 1e-2)


@pytest.mark.slow
def test_pod(fi: Any, ws: torch.Tensor) -> None:
    """FlashInfer's POD test sequence: one prefill request over its own K/V beside paged decode requests."""
    kv_d = [127, 2048, 1, 300]
    p = _paged(kv_d, 16, "NHD")
    q_p = torch.randn(127, HQ, D, dtype=BF16, device=DEV)
    k_p = torch.randn(300, HKV, D, dtype=BF16, device=DEV)
    v_p = torch.randn(300, HKV, D, dtype=BF16, device=DEV)
    q_d = torch.randn(len(kv_d), HQ, D, dtype=BF16, device=DEV)
    outs = []
    for mod in (fi, compat):
        w = mod.PODWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD")
        w.plan(p.indptr, p.indices, p.last_page_len, HQ, HKV, D, 16, data_type=BF16, q_data_type=BF16)
        outs.append(w.run(q_p, k_p, v_p, q_d, p.combined(), causal_p=True))
    _near(outs[1][0], outs[0][0])
    _near(outs[1][1], outs[0][1])


def test_decode_tensor_scales_equal_float_scales(ws: torch.Tensor) -> None:
    """fp8 pages read with k_scale / v_scale tensors (per tensor and per KV head) on the GPU kernels: equal to the
    same scales as floats (per head: to each head's float scale), and an in-place update is read by the next run."""
    p = _paged(LENS, 16, "NHD", dtype=torch.float8_e4m3fn)
    q = torch.randn(len(LENS), HQ, D, dtype=BF16, device=DEV)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(p.indptr, p.indices, p.last_page_len, HQ, HKV, D, 16, q_data_type=BF16, kv_data_type=torch.float8_e4m3fn)
    kv = p.combined()
    want = w.run(q, kv, k_scale=0.5, v_scale=2.0)
    ks, vs = torch.tensor(0.5, device=DEV), torch.tensor([2.0], device=DEV)
    _near(w.run(q, kv, k_scale=ks, v_scale=vs), want, 1e-2)
    ks.fill_(1.5)
    _near(w.run(q, kv, k_scale=ks, v_scale=vs), w.run(q, kv, k_scale=1.5, v_scale=2.0), 1e-2)
    heads_k = torch.tensor([0.5 + h / 8 for h in range(HKV)], device=DEV)
    got = w.run(q, kv, k_scale=heads_k, v_scale=vs)
    group = HQ // HKV
    for h in range(HKV):
        ref = w.run(q, kv, k_scale=float(heads_k[h]), v_scale=2.0)
        _near(got[:, h * group:(h + 1) * group], ref[:, h * group:(h + 1) * group], 1e-2)


def test_merge_state(fi: Any) -> None:
    v_a, v_b = (torch.randn(100, HQ, D, dtype=BF16, device=DEV) for _ in range(2))
    s_a, s_b = (torch.randn(100, HQ, device=DEV) * 3 for _ in range(2))
    for got, want in zip(compat.merge_state(v_a, s_a, v_b, s_b), fi.merge_state(v_a, s_a, v_b, s_b)):
        _near(got, want)
    v, s = torch.randn(100, 3, HQ, D, dtype=BF16, device=DEV), torch.randn(100, 3, HQ, device=DEV)
    for got, want in zip(compat.merge_states(v, s), fi.merge_states(v, s)):
        _near(got, want)


# -- the rest --------------------------------------------------------------------------------------------------------
def test_page_functions(fi: Any) -> None:
    p = _paged([20, 3, 90], 16, "HND")
    append = qo_indptr([4, 3, 10]).to(DEV)
    seq = fi.get_seq_lens(p.indptr, p.last_page_len, 16)
    assert torch.equal(compat.get_seq_lens(p.indptr, p.last_page_len, 16), seq)
    want = fi.get_batch_indices_positions(append, seq, 17)
    got = compat.get_batch_indices_positions(append, seq, 17)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    k, v = torch.randn(17, HKV, D, dtype=BF16, device=DEV), torch.randn(17, HKV, D, dtype=BF16, device=DEV)
    caches = [p.combined(), p.combined()]
    for mod, cache in zip((fi, compat), caches):
        mod.append_paged_kv_cache(k, v, *want, cache, p.indices, p.indptr, p.last_page_len, kv_layout="HND")
    assert torch.equal(caches[0], caches[1])


def test_norm_rope_activation(fi: Any) -> None:
    x, w = torch.randn(300, 4096, dtype=BF16, device=DEV), torch.randn(4096, dtype=BF16, device=DEV)
    for name in ("rmsnorm", "gemma_rmsnorm"):
        _near(getattr(compat, name)(x, w), getattr(fi, name)(x, w))
    for name in ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"):
        pairs = [(x.clone(), x.flip(0).clone()) for _ in range(2)]
        getattr(fi, name)(*pairs[0], w)
        getattr(compat, name)(*pairs[1], w)
        _near(pairs[1][0], pairs[0][0])
        _near(pairs[1][1], pairs[0][1])
    g, b = torch.randn(4096, device=DEV), torch.randn(4096, device=DEV)
    _near(compat.layernorm(x, g, b), fi.layernorm(x, g, b))
    y = torch.randn(300, 2 * 4096, dtype=BF16, device=DEV)
    for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        _near(getattr(compat, name)(y), getattr(fi, name)(y))
    q, k = torch.randn(300, HQ, D, dtype=BF16, device=DEV), torch.randn(300, HKV, D, dtype=BF16, device=DEV)
    pos = torch.randint(0, 4000, (300,), device=DEV, dtype=torch.int32)
    for name, kw in (("apply_rope_pos_ids", {}), ("apply_rope_pos_ids", {"interleave": True, "rope_scale": 2.0}),
                     ("apply_llama31_rope_pos_ids", {})):
        for got, want in zip(getattr(compat, name)(q, k, pos, **kw), getattr(fi, name)(q, k, pos, **kw)):
            _near(got, want)
    indptr, offsets = qo_indptr([100, 0, 200]).to(DEV), torch.tensor([5, 0, 3000], dtype=torch.int32, device=DEV)
    for got, want in zip(compat.apply_rope(q, k, indptr, offsets), fi.apply_rope(q, k, indptr, offsets)):
        _near(got, want)
    inv = 1.0 / 1e4 ** (torch.arange(0, D, 2, device=DEV).float() / D)
    ang = torch.arange(4096, device=DEV).float()[:, None] * inv
    cache = torch.cat((ang.cos(), ang.sin()), -1)
    for is_neox in (True, False):
        got = compat.apply_rope_with_cos_sin_cache(pos.long(), q.flatten(1), k.flatten(1), D, cache, is_neox)
        want = fi.apply_rope_with_cos_sin_cache(pos.long(), q.flatten(1), k.flatten(1), D, cache, is_neox)
        for a, b_ in zip(got, want):
            _near(a, b_)


def _tv(a: torch.Tensor, b: torch.Tensor, vocab: int) -> float:
    ca = torch.bincount(a.long(), minlength=vocab).double()
    cb = torch.bincount(b.long(), minlength=vocab).double()
    return 0.5 * float((ca / ca.sum() - cb / cb.sum()).abs().sum())


@pytest.mark.parametrize("name", ["top_p", "top_k_top_p", "top_k", "min_p", "plain", "logits_top_k_top_p"])
def test_sampling_distributions(fi: Any, name: str) -> None:
    """Same distribution: 100k draws from one row (softmax of fixed logits over 64 tokens) by each implementation;
    the total variation between the two histograms stays under 0.02 (its expected size here is ~0.005)."""
    vocab, draws = 64, 100_000
    logits = torch.randn(vocab, device=DEV) * 2
    probs = torch.softmax(logits, -1)[None].expand(draws, -1).contiguous()
    rows_logits = logits[None].expand(draws, -1).contiguous()
    calls = {
        "top_p": lambda m: m.top_p_sampling_from_probs(probs, 0.8),
        "top_k_top_p": lambda m: m.top_k_top_p_sampling_from_probs(probs, 10, 0.8),
        "top_k": lambda m: m.top_k_sampling_from_probs(probs, 7),
        "min_p": lambda m: m.min_p_sampling_from_probs(probs, 0.1),
        "plain": lambda m: m.sampling_from_probs(probs),
        "logits_top_k_top_p": lambda m: m.top_k_top_p_sampling_from_logits(rows_logits, 10, 0.8),
    }
    theirs, ours = calls[name](fi), calls[name](compat)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert _tv(ours, theirs, vocab) < 0.02


def test_sampling_exact_functions(fi: Any) -> None:
    probs = torch.softmax(torch.randn(8, 1000, device=DEV), -1)
    logits = torch.randn(8, 1000, device=DEV)
    _near(compat.top_p_renorm_probs(probs, 0.7), fi.top_p_renorm_probs(probs, 0.7), 1e-4)
    _near(compat.top_k_renorm_probs(probs, 20), fi.top_k_renorm_probs(probs, 20), 1e-4)
    _near(compat.top_k_mask_logits(logits, 20), fi.top_k_mask_logits(logits, 20), 1e-6)
    _near(compat.softmax(logits, 0.7), fi.sampling.softmax(logits, 0.7), 1e-4)


def test_chain_speculative_sampling(fi: Any) -> None:
    b, n, vocab = 2000, 3, 16
    target = torch.softmax(torch.randn(1, n + 1, vocab, device=DEV) * 2, -1).expand(b, -1, -1).contiguous()
    draft = torch.softmax(torch.randn(1, n, vocab, device=DEV) * 2, -1).expand(b, -1, -1).contiguous()
    ids = torch.multinomial(draft[:, 0], n, replacement=True).to(torch.int32)
    ours, theirs = compat.chain_speculative_sampling(draft, ids, target), fi.chain_speculative_sampling(draft, ids,
                                                                                                       target)
    assert ours[0].dtype == theirs[0].dtype and ours[0].shape == theirs[0].shape
    assert abs(float(ours[2].float().mean()) - float(theirs[2].float().mean())) < 0.15  # emitted drafts per request
    assert _tv(ours[0][:, 0] + 1, theirs[0][:, 0] + 1, vocab + 1) < 0.05  # the first output token's distribution


def test_gemm(fi: Any) -> None:
    a = torch.randn(4, 64, 256, device=DEV).to(torch.float8_e4m3fn)
    b = torch.randn(4, 128, 256, device=DEV).to(torch.float8_e4m3fn).transpose(1, 2)
    sa, sb = torch.tensor(0.5, device=DEV), torch.tensor(0.25, device=DEV)
    _near(compat.bmm_fp8(a, b, sa, sb, BF16), fi.bmm_fp8(a, b, sa, sb, BF16))


def test_signatures_match_flashinfer(fi: Any) -> None:
    """Every served name takes FlashInfer's parameters, in FlashInfer's order (the compat layer may accept more)."""
    mismatches = []
    for name in compat.__all__:
        ours, theirs = getattr(compat, name), getattr(fi, name, None)
        if theirs is None or inspect.ismodule(ours) or not callable(ours):
            continue
        targets = [("", ours, theirs)]
        if inspect.isclass(ours):
            targets = [(f".{m}", getattr(ours, m), getattr(theirs, m)) for m in ("__init__", "plan", "run")
                       if hasattr(ours, m) and hasattr(theirs, m)]
        for suffix, mine, ref in targets:
            want = list(inspect.signature(ref).parameters)
            got = list(inspect.signature(mine).parameters)
            if got[: len(want)] != want:
                mismatches.append(f"{name}{suffix}: {got} != {want}")
    assert not mismatches, "\n".join(mismatches)


# -- CUDA graphs -------------------------------------------------------------------------------------------------
def test_decode_wrapper_in_a_cuda_graph(ws: torch.Tensor) -> None:
    """vLLM's use: buffers sliced from persistent ones, plan, capture ``run``, then new steps written into the
    buffers and replayed; each replay equals an eager run of the same step. ``run`` allocates nothing."""
    batch, page, rows, width = 8, 16, 32, 256
    indptr_all = torch.zeros(rows + 1, dtype=torch.int32, device=DEV)
    indices_all = torch.zeros(rows * width, dtype=torch.int32, device=DEV)
    last_all = torch.ones(rows, dtype=torch.int32, device=DEV)
    w = compat.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, use_tensor_cores=True,
                                                  paged_kv_indptr_buffer=indptr_all[: batch + 1],
                                                  paged_kv_indices_buffer=indices_all,
                                                  paged_kv_last_page_len_buffer=last_all[:batch])
    first = _paged([5, 100, 0, 33, 1000, 7, 64, 2000], page, "NHD", spare_pages=600)
    w.plan(first.indptr, first.indices, first.last_page_len, HQ, HKV, D, page, q_data_type=BF16)
    q = torch.randn(batch, HQ, D, dtype=BF16, device=DEV)
    out = torch.empty(batch, HQ, D, dtype=BF16, device=DEV)
    kv = (first.k_pages, first.v_pages)
    w.run(q, kv, out=out)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    w.run(q, kv, out=out)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "run allocated device memory"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, kv, out=out)
    eager = compat.BatchDecodeWithPagedKVCacheWrapper(torch.zeros_like(ws), "NHD")
    for lens in ([2000, 1, 1, 1, 0, 3, 17, 4000], [1] * 8):
        indptr, indices, last = _step(lens, page, first.k_pages.shape[0])
        indptr_all[: batch + 1].copy_(indptr)
        indices_all[: indices.numel()].copy_(indices)
        last_all[:batch].copy_(last)
        graph.replay()
        eager.plan(indptr, indices, last, HQ, HKV, D, page, q_data_type=BF16)
        _near(out, eager.run(q, kv), 1e-2)


def test_decode_combined_cache_in_a_cuda_graph(ws: torch.Tensor) -> None:
    """vLLM passes a fresh view of its (pages, 2, ...) layer cache at every call: after the first run the compat
    layer serves it from the remembered split, allocating nothing, and a captured run replays correctly."""
    batch, page = 4, 16
    p = _paged([5, 100, 33, 1000], page, "NHD")
    kv = p.combined()
    w = compat.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(p.indptr, p.indices, p.last_page_len, HQ, HKV, D, page, q_data_type=BF16)
    q = torch.randn(batch, HQ, D, dtype=BF16, device=DEV)
    out = torch.empty(batch, HQ, D, dtype=BF16, device=DEV)
    w.run(q, kv.permute(0, 1, 2, 3, 4), out=out)
    torch.cuda.synchronize()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    w.run(q, kv.permute(0, 1, 2, 3, 4), out=out)
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before, "run allocated device memory"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(q, kv.permute(0, 1, 2, 3, 4), out=out)
    kv.copy_(torch.randn_like(kv, dtype=torch.float32).to(BF16))  # the next step's cache contents, in place
    graph.replay()
    _near(out, w.run(q, (kv[:, 0], kv[:, 1])), 1e-2)


def _step(lens: list[int], page: int, pool: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A new step's CSR pages: random pages of a pool of ``pool`` pages (padding requests: no pages, last 1)."""
    counts = [-(-n // page) for n in lens]
    indptr = torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    indices = torch.randperm(pool, device=DEV)[: sum(counts)].to(torch.int32)
    last = torch.tensor([n - (c - 1) * page if c else 1 for n, c in zip(lens, counts)], dtype=torch.int32,
                        device=DEV)
    return indptr, indices, last
