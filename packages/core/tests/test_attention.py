"""Attention reference kernels against independent formulations, and the attention public API.

The oracle here shares no code with the reference: it gathers each request's K/V token by token
with Python indexing, expands GQA heads, and calls torch's scaled_dot_product_attention in
float64 (or writes the soft-capped softmax out by hand, which SDPA cannot express).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import cast

import pytest
import torch
import torch.nn.functional as F

import kernel_switchboard as ksb
from kernel_switchboard.capability import bucket
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, indptr, mla_case, paged_kv, prefill_case

ATTENTION_OPS = ("attention.decode", "attention.prefill", "attention.prefill_ragged", "attention.mla_decode",
                 "attention.merge_states", "attention.dense")
test_reference_conformance = conformance_test("reference", device="cpu", size="small", ops=ATTENTION_OPS)

F16, BF16, F32, E4M3 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn


# -- the independent oracle --------------------------------------------------------------------------------
def gather_request(cache: ksb.PagedKVCache, table: ksb.PageTable, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's K (L, Hkv, D) and V (L, Hkv, Dv) in float64, read token by token."""
    ps, n = cache.page_size, int(table.seq_lens[b])
    pages = table.block_table[b].tolist()

    def token(t: torch.Tensor, i: int) -> torch.Tensor:
        page, slot = pages[i // ps], i % ps
        return t[page, slot] if cache.layout == "NHD" else t[page, :, slot]

    ks = [token(cache.k_pages, i).double() for i in range(n)]
    vs = [token(cache.v_pages, i).double() for i in range(n)]
    k = torch.stack(ks) if ks else torch.zeros(0, cache.num_kv_heads, cache.head_dim, dtype=torch.float64)
    v = torch.stack(vs) if vs else torch.zeros(0, cache.num_kv_heads, cache.head_dim_v, dtype=torch.float64)
    if cache.k_scale is not None and cache.v_scale is not None:  # fp8 pages
        k, v = k * cache.k_scale, v * cache.v_scale
    return k, v


def oracle(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True, sm_scale: float | None = None,
           cap: float | None = None, window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One request: q (M, Hq, D), k (L, Hkv, D), v (L, Hkv, Dv) -> out (M, Hq, Dv), lse (M, Hq), float64.

    Queries are the last M positions of the L-token sequence (position L - M + i)."""
    m, hq, d = q.shape
    n, hkv = k.shape[:2]
    scale = 1 / math.sqrt(d) if sm_scale is None else sm_scale
    qh = q.double().transpose(0, 1)  # (Hq, M, D)
    kh = k.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)  # (Hq, L, D)
    vh = v.repeat_interleave(hq // hkv, dim=1).transpose(0, 1)
    qpos = torch.arange(m)[:, None] + (n - m)
    kpos = torch.arange(n)[None, :]
    allowed = torch.ones(m, n, dtype=torch.bool)
    if causal:
        allowed &= kpos <= qpos
    if window is not None and window >= 0:
        allowed &= kpos >= qpos - window
    logits = qh @ kh.transpose(1, 2) * scale
    if cap is not None:
        logits = cap * torch.tanh(logits / cap)
    logits = logits.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1).transpose(0, 1)  # (M, Hq)
    if cap is None and n:
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed, scale=scale)
    else:
        out = torch.softmax(logits, dim=-1) @ vh if n else torch.zeros(hq, m, v.shape[-1], dtype=torch.float64)
    empty = ~allowed.any(dim=-1)  # (M,)
    out = out.nan_to_num(0.0).masked_fill(empty[None, :, None], 0.0)
    return out.transpose(0, 1), lse


def assert_matches(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    tol = {F16: 3e-3, BF16: 2e-2, F32: 1e-5}[dtype]
    want = want.to(torch.float64)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{what}: non-finite entries differ"
    torch.testing.assert_close(got.double()[finite], want[finite], atol=tol, rtol=tol, msg=what)


# -- decode -------------------------------------------------------------------------------------------------
DECODE_SPECS = [
    AttnSpec(F32, "NHD", 16, 4, 4, kv_lens=(0, 1, 37)),
    AttnSpec(F32, "HND", 1, 4, 2, kv_lens=(5, 1, 23)),
    AttnSpec(F16, "NHD", 3, 4, 1, kv_lens=(17, 40)),
    AttnSpec(BF16, "HND", 16, 8, 1, kv_lens=(33, 2)),
    AttnSpec(F32, "NHD", 16, 4, 2, head_dim=64, head_dim_v=32, kv_lens=(20, 9)),
    AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(12, 31), kv_dtype=E4M3),
    AttnSpec(F16, "HND", 16, 4, 2, kv_lens=(29, 16, 1), window=6),
    AttnSpec(F32, "NHD", 16, 4, 2, kv_lens=(29, 7), soft_cap=4.0, window=3),
]


@pytest.mark.parametrize("spec", DECODE_SPECS, ids=lambda s: s.tag("decode"))
def test_decode_matches_sdpa(spec: AttnSpec) -> None:
    spec = replace(spec, lse=True)
    case = decode_case(spec, "cpu", seed=3)
    q, cache, table = case.args
    out, lse = ksb.attention.decode(q, cache, table, **case.kwargs)
    assert out.dtype == q.dtype and out.shape == (q.shape[0], q.shape[1], spec.dv)
    assert lse.dtype == torch.float32 and lse.shape == q.shape[:2]
    for b in range(q.shape[0]):
        k, v = gather_request(cache, table, b)
        want_o, want_l = oracle(q[b:b + 1], k, v, cap=spec.soft_cap, window=spec.window)
        assert_matches(out[b], want_o[0], spec.dtype, f"out of request {b}")
        assert_matches(lse[b], want_l[0], F32 if spec.dtype == F32 else F16, f"lse of request {b}")


def test_empty_sequence_gives_zero_output_and_minus_inf_lse() -> None:
    case = decode_case(AttnSpec(F32, kv_lens=(0, 5, 0)), "cpu")
    q, cache, table = case.args
    out, lse = ksb.attention.decode(q, cache, table, return_lse=True)
    assert torch.all(out[0] == 0) and torch.all(out[2] == 0)
    assert torch.all(lse[0] == float("-inf")) and torch.all(torch.isfinite(lse[1]))


def test_naive_python_loop_softmax_with_cap_window_and_gqa() -> None:
    """A tiny case written with Python floats only: logits, cap, window, softmax, LSE."""
    g = torch.Generator().manual_seed(1)
    hq, hkv, d, ps, cap, window = 4, 2, 3, 2, 2.0, 2
    lens = [5, 3]
    k_pages = torch.randn(6, ps, hkv, d, generator=g)
    v_pages = torch.randn(6, ps, hkv, d, generator=g)
    block = torch.tensor([[4, 0, 2], [5, 1, 3]], dtype=torch.int32)
    q = torch.randn(2, hq, d, generator=g)
    cache = ksb.PagedKVCache(k_pages, v_pages)
    table = ksb.PageTable(block, torch.tensor(lens, dtype=torch.int32))
    out, lse = ksb.attention.decode(q, cache, table, sm_scale=0.7, logits_soft_cap=cap, window_left=window,
                                    return_lse=True)
    for b, n in enumerate(lens):
        for h in range(hq):
            kvh = h // (hq // hkv)
            logits, vals = [], []
            for pos in range(n):
                if pos < n - 1 - window:
                    continue
                page, slot = int(block[b, pos // ps]), pos % ps
                s = sum(float(q[b, h, i]) * float(k_pages[page, slot, kvh, i]) for i in range(d)) * 0.7
                logits.append(cap * math.tanh(s / cap))
                vals.append([float(v_pages[page, slot, kvh, i]) for i in range(d)])
            mx = max(logits)
            w = [math.exp(s - mx) for s in logits]
            total = sum(w)
            want = [sum(wj * vj[i] for wj, vj in zip(w, vals)) / total for i in range(d)]
            assert out[b, h].tolist() == pytest.approx(want, abs=1e-5)
            assert float(lse[b, h]) == pytest.approx(mx + math.log(total), abs=1e-5)


# -- prefill --------------------------------------------------------------------------------------------------
PREFILL_SPECS = [
    AttnSpec(F32, "NHD", 16, 4, 2, kv_lens=(7, 1, 20, 0), q_lens=(7, 1, 5, 0)),  # prefill, decode row, append, empty
    AttnSpec(F32, "HND", 1, 4, 1, kv_lens=(9, 13), q_lens=(9, 4), causal=False),
    AttnSpec(F16, "NHD", 4, 4, 4, kv_lens=(11, 6), q_lens=(3, 6), window=2),
    AttnSpec(F32, "NHD", 16, 2, 1, head_dim=192, head_dim_v=128, kv_lens=(9, 14), q_lens=(9, 4)),
    AttnSpec(F32, "HND", 8, 4, 2, kv_lens=(19, 3), q_lens=(4, 3), soft_cap=3.0, kv_dtype=E4M3),
]


@pytest.mark.parametrize("spec", PREFILL_SPECS, ids=lambda s: s.tag("prefill"))
def test_prefill_matches_sdpa(spec: AttnSpec) -> None:
    spec = replace(spec, lse=True)
    case = prefill_case(spec, "cpu", seed=5)
    q, qo, cache, table = case.args
    out, lse = ksb.attention.prefill(q, qo, cache, table, **case.kwargs)
    assert out.shape == (q.shape[0], q.shape[1], spec.dv) and lse.shape == q.shape[:2]
    starts = qo.tolist()
    for b in range(len(spec.kv_lens)):
        lo, hi = starts[b], starts[b + 1]
        k, v = gather_request(cache, table, b)
        want_o, want_l = oracle(q[lo:hi], k, v, causal=spec.causal, cap=spec.soft_cap, window=spec.window)
        assert_matches(out[lo:hi], want_o, spec.dtype, f"out of request {b}")
        assert_matches(lse[lo:hi], want_l, F32 if spec.dtype == F32 else F16, f"lse of request {b}")


def test_prefill_ragged_matches_sdpa_and_paged() -> None:
    spec = AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(7, 1, 20, 0), q_lens=(7, 1, 5, 0), lse=True)
    q, qo, cache, table = prefill_case(spec, "cpu", seed=2).args
    ks, vs = zip(*(gather_request(cache, table, b) for b in range(4)))
    k, v = torch.cat(ks).float(), torch.cat(vs).float()
    kv_ind = indptr(spec.kv_lens, "cpu")
    for causal in (True, False):
        out, lse = ksb.attention.prefill_ragged(q, k, v, qo, kv_ind, causal=causal, return_lse=True)
        paged, paged_lse = ksb.attention.prefill(q, qo, cache, table, causal=causal, return_lse=True)
        torch.testing.assert_close(out, paged, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(lse, paged_lse, atol=1e-6, rtol=1e-6)
        for b, (lo, hi) in enumerate(zip(qo.tolist(), qo.tolist()[1:])):
            want_o, _ = oracle(q[lo:hi], ks[b], vs[b], causal=causal)
            assert_matches(out[lo:hi], want_o, F32, f"request {b}")


def test_decode_equals_prefill_of_one_token_per_request() -> None:
    spec = AttnSpec(F16, "HND", 16, 4, 2, kv_lens=(30, 1, 12), soft_cap=8.0, window=5)
    q, cache, table = decode_case(spec, "cpu").args
    one = torch.arange(4, dtype=torch.int32)
    a = ksb.attention.decode(q, cache, table, logits_soft_cap=8.0, window_left=5)
    b = ksb.attention.prefill(q, one, cache, table, logits_soft_cap=8.0, window_left=5)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert "mixed_batch" not in ksb.explain("attention.prefill", q, one, cache, table).problem.features


def test_mla_decode_matches_expanded_attention() -> None:
    case = mla_case(F32, (0, 9, 21), 4, 4, "cpu", lse=True, dc=32, dr=8)
    q_nope, q_pe, ckv, kpe, table = case.args
    out, lse = ksb.attention.mla_decode(q_nope, q_pe, ckv, kpe, table, **case.kwargs)
    ps = ckv.shape[1]
    for b in range(3):
        n = int(table.seq_lens[b])
        rows = [(int(table.block_table[b, i // ps]), i % ps) for i in range(n)]
        k = torch.stack([torch.cat((ckv[p, s], kpe[p, s])) for p, s in rows])[:, None] if n else torch.zeros(0, 1, 40)
        v = torch.stack([ckv[p, s] for p, s in rows])[:, None] if n else torch.zeros(0, 1, 32)
        q = torch.cat((q_nope[b], q_pe[b]), dim=-1)[None]
        want_o, want_l = oracle(q, k.double(), v.double(), sm_scale=case.kwargs["sm_scale"])
        assert_matches(out[b], want_o[0], F32, f"request {b}")
        assert_matches(lse[b], want_l[0], F32, f"lse {b}")


def test_mla_decode_of_several_new_tokens_per_request_is_causal() -> None:
    """q (B, T, H, D): each request's T newest tokens, every one attending to the cache up to itself; a request
    shorter than T has empty first rows (out 0, lse -inf). Against the expanded oracle, position by position."""
    case = mla_case(F32, (9, 2, 21), 4, 4, "cpu", lse=True, dc=32, dr=8)
    _, _, ckv, kpe, table = case.args
    t = 3
    g = torch.Generator().manual_seed(7)
    qn, qp = torch.randn(3, t, 4, 32, generator=g), torch.randn(3, t, 4, 8, generator=g)
    out, lse = ksb.attention.mla_decode(qn, qp, ckv, kpe, table, **case.kwargs)
    assert out.shape == (3, t, 4, 32) and lse.shape == (3, t, 4)
    ps = ckv.shape[1]
    for b in range(3):
        n = int(table.seq_lens[b])
        rows = [(int(table.block_table[b, i // ps]), i % ps) for i in range(n)]
        k = torch.stack([torch.cat((ckv[p, s], kpe[p, s])) for p, s in rows])[:, None]
        v = torch.stack([ckv[p, s] for p, s in rows])[:, None]
        for i in range(t):
            seen = n - t + i + 1  # this token and the ones before it
            if seen <= 0:
                assert bool((out[b, i] == 0).all()) and bool((lse[b, i] == float("-inf")).all()), (b, i)
                continue
            q = torch.cat((qn[b, i], qp[b, i]), dim=-1)[None]
            want_o, want_l = oracle(q, k[:seen].double(), v[:seen].double(), sm_scale=case.kwargs["sm_scale"])
            assert_matches(out[b, i], want_o[0], F32, f"request {b} token {i}")
            assert_matches(lse[b, i], want_l[0], F32, f"lse {b} {i}")
    plain = ksb.attention.mla_decode(qn, qp, ckv, kpe, table, sm_scale=case.kwargs["sm_scale"])
    torch.testing.assert_close(plain, out, atol=0, rtol=0)
    with pytest.raises(ksb.InvalidArgumentError, match=r"q_pe\.shape"):
        ksb.attention.mla_decode(qn, qp[:, :2], ckv, kpe, table)
    with pytest.raises(ksb.InvalidArgumentError, match=r"table\.batch_size"):
        ksb.attention.mla_decode(qn[:2], qp[:2], ckv, kpe, table)


def test_problem_records_features_and_buckets() -> None:
    spec = AttnSpec(F16, "HND", 16, 8, 2, head_dim=64, kv_lens=(30, 1, 12), q_lens=(30, 1, 4), kv_dtype=E4M3)
    q, qo, cache, table = prefill_case(spec, "cpu").args
    sel = ksb.explain("attention.prefill", q, qo, cache, table, logits_soft_cap=5.0, window_left=3, return_lse=True)
    p = sel.problem
    assert p.features == {"paged", "causal", "mixed_batch", "soft_cap", "sliding_window", "return_lse", "fp8_kv"}
    assert (p.dtype, p.kv_dtype, p.layout, p.page_size, p.group_size) == (F16, E4M3, "HND", 16, 4)
    assert (p.batch, p.max_q_len, p.max_kv_len) == (4, 32, 32)
    assert "reference:prefill" in str(sel)


# -- bad inputs -------------------------------------------------------------------------------------------------
def _decode_args() -> tuple[torch.Tensor, ksb.PagedKVCache, ksb.PageTable]:
    return decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(5, 9)), "cpu").args  # type: ignore[return-value]


def test_decode_bad_inputs_name_the_argument() -> None:
    q, cache, table = _decode_args()
    bad = {
        r"q\.dtype": lambda: ksb.attention.decode(q.to(torch.int32), cache, table),
        r"q\.shape": lambda: ksb.attention.decode(q[0], cache, table),
        r"q\.stride": lambda: ksb.attention.decode(torch.randn(2, 64, 4).transpose(1, 2), cache, table),
        r"q\.shape.*head_dim": lambda: ksb.attention.decode(q[..., :32], cache, table),
        r"q\.shape.*num_q_heads": lambda: ksb.attention.decode(q[:, :3], cache, table),
        r"cache\.dtype": lambda: ksb.attention.decode(q.half(), cache, table),
        r"cache\.device": lambda: ksb.attention.decode(q.to("meta"), cache, table),
        r"table\.batch_size": lambda: ksb.attention.decode(q[:1], cache, table),
        r"cache=": lambda: ksb.attention.decode(q, table, table),  # type: ignore[arg-type]
        r"sm_scale": lambda: ksb.attention.decode(q, cache, table, sm_scale=0.0),
        r"logits_soft_cap": lambda: ksb.attention.decode(q, cache, table, logits_soft_cap=-1.0),
        r"window_left": lambda: ksb.attention.decode(q, cache, table, window_left=-2),
    }
    for pattern, call in bad.items():
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()


def test_decode_rejects_pages_out_of_range_and_sequences_longer_than_their_pages() -> None:
    q, cache, table = _decode_args()
    block = table.block_table.clone()
    block[1, 0] = cache.num_pages
    with pytest.raises(ksb.InvalidArgumentError, match="block_table"):
        ksb.attention.decode(q, cache, ksb.PageTable(block, table.seq_lens))
    too_long = torch.tensor([5, table.max_pages * cache.page_size + 1], dtype=torch.int32)
    with pytest.raises(ksb.InvalidArgumentError, match="seq_lens"):
        ksb.attention.decode(q, cache, ksb.PageTable(table.block_table, too_long))


def test_prefill_bad_indptr_names_the_argument() -> None:
    spec = AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(5, 9), q_lens=(2, 3))
    q, qo, cache, table = prefill_case(spec, "cpu").args
    bad = {
        r"qo_indptr\.dtype": qo.long(),
        r"qo_indptr\.shape": qo[:-1],
        r"qo_indptr=.*non-decreasing": torch.tensor([0, 6, 5], dtype=torch.int32),
        r"qo_indptr=.*ending at q\.shape\[0\]": torch.tensor([0, 2, 4], dtype=torch.int32),
        r"qo_indptr=.*non-contiguous": torch.tensor([0, 9, 2, 9, 5, 9], dtype=torch.int32)[::2],
    }
    for pattern, ind in bad.items():
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            ksb.attention.prefill(q, ind, cache, table)
    long_q = torch.randn(11, 4, 64)
    too_many = torch.tensor([0, 6, 11], dtype=torch.int32)  # 6 queries > kv length 5
    with pytest.raises(ksb.InvalidArgumentError, match=r"qo_indptr=.*kv length"):
        ksb.attention.prefill(long_q, too_many, cache, table)
    ksb.attention.prefill(long_q, too_many, cache, table, causal=False)  # fine without a causal mask


def test_ragged_mla_and_merge_bad_inputs_name_the_argument() -> None:
    q, k, v = torch.randn(5, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 8)
    qo, kv = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    ksb.attention.prefill_ragged(q, k, v, qo, kv)
    with pytest.raises(ksb.InvalidArgumentError, match=r"k\.dtype"):
        ksb.attention.prefill_ragged(q, k.half(), v, qo, kv)
    with pytest.raises(ksb.InvalidArgumentError, match=r"v\.shape"):
        ksb.attention.prefill_ragged(q, k, v[:6], qo, kv)
    with pytest.raises(ksb.InvalidArgumentError, match=r"kv_indptr=.*k\.shape\[0\]"):
        ksb.attention.prefill_ragged(q, k, v, qo, torch.tensor([0, 3, 6], dtype=torch.int32))
    with pytest.raises(ksb.InvalidArgumentError, match=r"kv_indptr\.shape"):
        ksb.attention.prefill_ragged(q, k, v, qo, kv[:2])
    case = mla_case(F32, (3, 5), 2, 4, "cpu", dc=32, dr=8)
    q_nope, q_pe, ckv, kpe, table = case.args
    with pytest.raises(ksb.InvalidArgumentError, match=r"ckv_pages\.shape"):
        ksb.attention.mla_decode(q_nope, q_pe, ckv[..., :16], kpe, table)
    with pytest.raises(ksb.InvalidArgumentError, match=r"q_pe\.dtype"):
        ksb.attention.mla_decode(q_nope, q_pe.half(), ckv, kpe, table)
    o, lse = torch.randn(3, 2, 8), torch.randn(3, 2)
    with pytest.raises(ksb.InvalidArgumentError, match=r"lse_a\.dtype"):
        ksb.attention.merge_states(o, lse.double(), o, lse)
    with pytest.raises(ksb.InvalidArgumentError, match=r"lse_b\.shape"):
        ksb.attention.merge_states(o, lse, o, lse[:2])
    with pytest.raises(ksb.InvalidArgumentError, match=r"out_b"):
        ksb.attention.merge_states(o, lse, o.half(), lse)


# -- torch.compile and custom ops ----------------------------------------------------------------------------------
def test_torch_compile_fullgraph_traces_decode_and_prefill() -> None:
    spec = AttnSpec(F32, "HND", 4, 4, 2, kv_lens=(7, 12), q_lens=(3, 12))
    q, qo, cache, table = prefill_case(spec, "cpu").args
    qd = q[:2].contiguous()

    def f(qd: torch.Tensor, q: torch.Tensor, qo: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out, lse = ksb.attention.decode(qd, cache, table, logits_soft_cap=5.0, return_lse=True)
        pre = cast(torch.Tensor, ksb.attention.prefill(q, qo, cache, table, window_left=4))
        return out * 2, lse, pre + 1

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(qd, q, qo)
    for g, w in zip(got, f(qd, q, qo)):
        torch.testing.assert_close(g, w)


def test_torch_compile_fullgraph_traces_ragged_mla_and_merge() -> None:
    q, k, v = torch.randn(5, 4, 16), torch.randn(7, 2, 16), torch.randn(7, 2, 16)
    qo, kv = torch.tensor([0, 2, 5], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32)
    q_nope, q_pe, ckv, kpe, table = mla_case(F32, (3, 5), 2, 4, "cpu", dc=32, dr=8).args

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a, lse_a = ksb.attention.prefill_ragged(q, k, v, qo, kv, return_lse=True)
        b, lse_b = ksb.attention.prefill_ragged(q, k, v, qo, kv, causal=False, return_lse=True)
        out, _ = ksb.attention.merge_states(a, lse_a, b, lse_b)
        mla = cast(torch.Tensor, ksb.attention.mla_decode(q_nope, q_pe, ckv, kpe, table, sm_scale=0.1))
        two_new = cast(torch.Tensor, ksb.attention.mla_decode(q_nope[:, None].expand(-1, 2, -1, -1),
                                                              q_pe[:, None].expand(-1, 2, -1, -1), ckv, kpe, table))
        return out, mla, two_new

    got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    for g, w in zip(got, f(q, k, v)):
        torch.testing.assert_close(g, w)


def _paged_op_args(kv_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor, tuple[object, ...]]:
    spec = AttnSpec(F32, "HND", 4, 4, 2, kv_lens=(7, 12), q_lens=(3, 12), kv_dtype=kv_dtype)
    q, qo, cache, table = prefill_case(spec, "cpu").args
    return q, qo, (cache.k_pages, cache.v_pages, cache.layout, cache.k_scale, cache.v_scale, None, None,
                   table.block_table, table.seq_lens, table.max_seq_len)


def test_opcheck_attention_ops() -> None:
    q, qo, paged = _paged_op_args(None)
    torch.library.opcheck(torch.ops.ksb.attention_decode.default, (q[:2].contiguous(), *paged, None, 5.0, 3, True, None))
    torch.library.opcheck(torch.ops.ksb.attention_decode.default, (q[:2].contiguous(), *paged, 0.3, None, None, False,
                                                                   None))
    torch.library.opcheck(torch.ops.ksb.attention_prefill.default, (q, qo, *paged, True, None, None, None, 2, True,
                                                                    None))
    # fp8 pages: torch's schema checker cannot multiply fp8 tensors, so only the fake / AOT checks
    q, qo, paged = _paged_op_args(E4M3)
    fp8_utils = ("test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.ksb.attention_decode.default, (q[:2].contiguous(), *paged, None, None, None, True,
                                                                   None), test_utils=fp8_utils)
    torch.library.opcheck(torch.ops.ksb.attention_prefill.default, (q, qo, *paged, True, None, None, None, None, False,
                                                                    None), test_utils=fp8_utils)
    k, v = torch.randn(19, 2, 64), torch.randn(19, 2, 64)
    torch.library.opcheck(torch.ops.ksb.attention_prefill_ragged.default,
                          (q, k, v, qo, torch.tensor([0, 7, 19], dtype=torch.int32), True, None, None, None, False,
                           None))
    q_nope, q_pe, ckv, kpe, mtable = mla_case(F32, (3, 5), 2, 4, "cpu", dc=32, dr=8).args
    torch.library.opcheck(torch.ops.ksb.attention_mla_decode.default,
                          (q_nope, q_pe, ckv, kpe, mtable.block_table, mtable.seq_lens, None, 0.1, True, None))
    o, lse = torch.randn(3, 2, 8), torch.randn(3, 2)
    torch.library.opcheck(torch.ops.ksb.attention_merge_states.default, (o, lse, o * 2, lse - 1, None))


def test_params_validation_is_cached_but_still_rejects() -> None:
    q, cache, table = _decode_args()
    for _ in range(3):
        ksb.attention.decode(q, cache, table, sm_scale=0.2)
        with pytest.raises(ksb.InvalidArgumentError, match="sm_scale"):
            ksb.attention.decode(q, cache, table, sm_scale=float("nan"))
    with pytest.raises(ksb.InvalidArgumentError, match="sm_scale"):
        ksb.attention.decode(q, cache, table, sm_scale=[1.0])  # type: ignore[arg-type]


# -- GPU ---------------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("spec", DECODE_SPECS[:6], ids=lambda s: s.tag("decode"))
def test_reference_decode_on_gpu_matches_cpu(spec: AttnSpec) -> None:
    spec = replace(spec, lse=True)
    cpu = decode_case(spec, "cpu", seed=4)
    gpu = decode_case(spec, "cuda", seed=4)
    a = cpu.run("reference")[1]
    b = gpu.run("reference")[1]
    for x, y in zip(a, b):
        torch.testing.assert_close(y.cpu(), x, atol=2e-2 if spec.dtype == BF16 else 2e-3, rtol=1e-2)


@pytest.mark.gpu
def test_paged_kv_builds_on_gpu() -> None:
    cache, table = paged_kv(torch.Generator().manual_seed(0), AttnSpec(BF16), "cuda")
    assert cache.device.type == "cuda" and table.block_table.is_cuda


@pytest.mark.parametrize(("op", "shape"), [
    ("attention.decode", dict(batch=2, kv_len=20, q_heads=4, kv_heads=2, head_dim=64, page_size=4, dtype="fp16",
                              layout="HND", soft_cap=5.0, lse=True)),
    ("attention.decode", dict(batch=2, kv_len=9, num_q_heads=4, num_kv_heads=1, head_dim=32, kv_dtype="e4m3",
                              dtype="float32")),
    ("attention.prefill", dict(batch=2, kv_len=12, q_len=5, q_heads=4, kv_heads=2, head_dim=32, window=3)),
    ("attention.prefill_ragged", dict(batch=3, kv_len=7, q_heads=2, kv_heads=2, head_dim=32, causal=False)),
    ("attention.mla_decode", dict(batch=2, kv_len=9, num_heads=2, head_dim=32, head_dim_pe=8, page_size=4)),
    ("attention.merge_states", dict(tokens=3, q_heads=2, head_dim=16)),
])
def test_example_builds_a_runnable_case(op: str, shape: dict[str, object]) -> None:
    from kernel_switchboard.testing.cases.attention import example

    case = example(op, "cpu", **shape)
    assert case.op == op
    sel = ksb.explain(op, *case.args, **case.kwargs)
    case.compare("reference")
    if "batch" in shape and op != "attention.merge_states":
        assert sel.problem.batch == bucket(int(shape["batch"]))  # type: ignore[call-overload]


def test_custom_op_reuses_the_checked_table_until_its_tensors_change() -> None:
    from kernel_switchboard.ops.attention import table_of

    table = _decode_args()[2]
    a = table_of(table.block_table, table.seq_lens, None)
    assert table_of(table.block_table, table.seq_lens, None) is a
    table.seq_lens[0] = 1  # an in-place change bumps the version counter: checked again
    b = table_of(table.block_table, table.seq_lens, None)
    assert b is not a and b.max_seq_len == 9
    with torch.inference_mode():
        bt, sl = table.block_table.clone(), table.seq_lens.clone()
        assert table_of(bt, sl, None) is not table_of(bt, sl, None)  # no version counter: never cached


def test_decode_and_prefill_under_inference_mode() -> None:
    spec = AttnSpec(F16, "NHD", 4, 4, 2, kv_lens=(9, 3), q_lens=(4, 3))
    q, qo, cache, table = prefill_case(spec, "cpu").args
    want = ksb.attention.prefill(q, qo, cache, table)
    with torch.inference_mode():
        got = ksb.attention.prefill(q, qo, cache, table)
        dec = ksb.attention.decode(q[:2].contiguous(), cache, table)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert dec.shape == (2, 4, 64)


@pytest.mark.parametrize("kv_dtype", [None, torch.float8_e4m3fn])
def test_finite_stale_slots_replace_only_the_unwritten_slots_and_are_detectable(kv_dtype: torch.dtype | None) -> None:
    """For kernels that declare ``reads_stale_slots`` the conformance cases hold STALE_VALUE where they hold
    NaN for the others: every written value stays, and a kernel that gave the stale slots any weight (here: the
    reference attending the whole last page) misses the reference by far more than the tolerance."""
    from kernel_switchboard.testing import finite_stale
    from kernel_switchboard.testing.case import STALE_VALUE, assert_close, tolerance

    spec = AttnSpec(torch.bfloat16, "HND", 16, 8, 2, 64, kv_lens=(33, 5, 16), kv_dtype=kv_dtype)
    case = decode_case(spec, "cpu", seed=3)
    q, cache, table = case.args
    finite = finite_stale(cache)
    for pages, got in ((cache.k_pages, finite.k_pages), (cache.v_pages, finite.v_pages)):
        was_nan = pages.float().isnan()
        assert was_nan.any() and not got.float().isnan().any()
        assert torch.equal(got.float()[~was_nan], pages.float()[~was_nan])
        assert (got.float()[was_nan] == STALE_VALUE).all()
    case.compare("reference", finite_stale_slots=True)  # the reference ignores stale slots, NaN or finite
    whole_pages = ksb.PageTable(table.block_table, (table.seq_lens + 15) // 16 * 16)
    want = ksb.attention.decode(q, finite, table, backend="reference")[0]
    leaky = ksb.attention.decode(q, finite, whole_pages, backend="reference")[0]
    atol, rtol = tolerance(torch.bfloat16)
    with pytest.raises(AssertionError, match="outside"):
        assert_close(leaky, want, atol=atol, rtol=rtol)


# -- attention.dense ---------------------------------------------------------------------------------------
def _dense_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, causal: bool,
                scale: float) -> torch.Tensor:
    """One query row at a time in float64: the keys it keeps, their softmax, the weighted values."""
    b, hq, lq, _ = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    full = None if bias is None else bias.expand(b, hq, lq, lk)
    out = torch.zeros(b, hq, lq, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kh = h // (hq // hkv)
            for i in range(lq):
                logits, keys = [], []
                for j in range(lk):
                    if causal and j > lk - lq + i:
                        continue
                    s = float(q[bi, h, i].double() @ k[bi, kh, j].double()) * scale
                    if full is not None and full.dtype == torch.bool:
                        if not full[bi, h, i, j]:
                            continue
                    elif full is not None:
                        s += float(full[bi, h, i, j])
                    if s != float("-inf"):
                        logits.append(s)
                        keys.append(j)
                if keys:
                    w = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                    out[bi, h, i] = w @ v[bi, kh, keys].double()
    return out


def test_dense_reference_matches_a_row_by_row_oracle() -> None:
    from kernel_switchboard.testing.cases.attention_dense import dense_case, dense_specs

    for i, spec in enumerate(dense_specs("small")):
        q, k, v, bias = dense_case(spec, "cpu", seed=i).args
        got = ksb.attention.dense(q, k, v, bias, causal=spec.causal, backend="reference")
        want = _dense_loop(q, k, v, bias, spec.causal, q.shape[-1] ** -0.5)
        atol = 1e-6 if q.dtype == F32 else 2e-2
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=atol, msg=spec.tag())
        assert (got.abs().sum(-1) == 0).any(), f"{spec.tag()}: the case has a row that keeps nothing (out 0)"


@pytest.mark.parametrize(("change", "match"), [
    (dict(k=torch.randn(2, 3, 7, 16)), r"k.shape\[1\]=3"),
    (dict(v=torch.randn(2, 2, 6, 16)), r"v.shape=\(2, 2, 6, 16\)"),
    (dict(attn_bias=torch.zeros(2, 4, 5, 6)), r"attn_bias.shape=\(2, 4, 5, 6\).*broadcastable to \(B, Hq, Lq, Lk\)"),
    (dict(attn_bias=torch.zeros(5, 7, dtype=torch.float64)), r"attn_bias.dtype=torch.float64"),
    (dict(k=torch.randn(2, 2, 7, 16, dtype=torch.float16)), r"k.dtype=torch.float16.*q's dtype"),
])
def test_dense_bad_arguments_name_the_argument(change: dict[str, torch.Tensor], match: str) -> None:
    args = dict(q=torch.randn(2, 4, 5, 16), k=torch.randn(2, 2, 7, 16), v=torch.randn(2, 2, 7, 16), attn_bias=None)
    args.update(change)
    with pytest.raises(ValueError, match=match):
        ksb.attention.dense(args["q"], args["k"], args["v"], args["attn_bias"])


def test_dense_traces_under_torch_compile_as_one_custom_op() -> None:
    q, k, v = torch.randn(1, 4, 5, 16), torch.randn(1, 2, 7, 16), torch.randn(1, 2, 7, 16)
    mask = torch.rand(1, 1, 5, 7) > 0.3
    compiled = torch.compile(lambda *a: ksb.attention.dense(*a, causal=True) * 2, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, mask), 2 * ksb.attention.dense(q, k, v, mask, causal=True))
