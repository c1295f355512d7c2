"""Triton attention kernels against the reference kernels: decode, prefill, ragged, MLA, merge.

CPU runs use Triton's interpreter (TRITON_INTERPRET=1; the kernels then upcast dot operands to
float32, so bf16 inputs are checked with real numbers) on tiny shapes; ``gpu`` tests repeat the
checks at real sizes and capture plans in CUDA graphs.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.errors import KernelUnavailableError
from kernel_switchboard.paged import PagedKVCache, PageTable
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import unwritten_slots
from kernel_switchboard_triton._attn_common import _exp2_fma
from kernel_switchboard_triton._common import has_tma

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
FP8 = torch.float8_e4m3fn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make_cache(kv_lens: list[int], page_size: int, kv_heads: int, head_dim: int, head_dim_v: int | None = None, *,
               dtype: torch.dtype = torch.float16, layout: str = "NHD", fp8: bool = False, seed: int = 0,
               spare_pages: int = 3) -> tuple[PagedKVCache, PageTable]:
    """A cache with shuffled pages and its table; every slot no request's tokens occupy (spare pages, page
    tails) holds NaN, which no kernel may let through."""
    g = _gen(seed)
    dv = head_dim if head_dim_v is None else head_dim_v
    max_pages = max(1, max(math.ceil(n / page_size) for n in kv_lens))
    num_pages = len(kv_lens) * max_pages + spare_pages
    block_table = torch.randperm(num_pages, generator=g)[: len(kv_lens) * max_pages].view(len(kv_lens), max_pages)

    def pages(d: int) -> torch.Tensor:
        shape = (num_pages, page_size, kv_heads, d) if layout == "NHD" else (num_pages, kv_heads, page_size, d)
        return torch.randn(shape, generator=g)

    k, v = pages(head_dim), pages(dv)
    unused = unwritten_slots(block_table, torch.tensor(kv_lens), num_pages, page_size)
    unused = unused[:, :, None, None] if layout == "NHD" else unused[:, None, :, None]
    k, v = k.masked_fill(unused, float("nan")), v.masked_fill(unused, float("nan"))
    if fp8:
        cache = PagedKVCache((k * 2).to(FP8).to(DEVICE), (v * 2).to(FP8).to(DEVICE), layout, k_scale=0.5, v_scale=0.75)
    else:
        cache = PagedKVCache(k.to(DEVICE, dtype), v.to(DEVICE, dtype), layout)
    table = PageTable(block_table.to(DEVICE, torch.int32), torch.tensor(kv_lens, dtype=torch.int32, device=DEVICE))
    return cache, table


def _randn(*shape: int, dtype: torch.dtype = torch.float16, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed)).to(DEVICE, dtype)


def _indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)


def _close(got: object, want: object, dtype: torch.dtype) -> None:
    atol, rtol = tolerance(dtype)
    gots = got if isinstance(got, tuple) else (got,)
    wants = want if isinstance(want, tuple) else (want,)
    assert len(gots) == len(wants)
    for g, w in zip(gots, wants):
        assert isinstance(g, torch.Tensor) and isinstance(w, torch.Tensor)
        assert_close(g, w, atol=atol, rtol=rtol)


def _both(fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    return fn(*args, backend="triton", **kwargs), fn(*args, backend="reference", **kwargs)


# -- decode -------------------------------------------------------------------------------------------
DECODE_CASES = [
    # dtype, layout, page_size, kv_lens, heads (q, kv), head_dim (qk, v), kwargs, fp8
    (torch.float16, "NHD", 16, [1, 37, 70], (8, 2), (64, 64), {}, False),
    (torch.bfloat16, "HND", 16, [50, 3], (8, 2), (64, 64), {}, False),
    (torch.bfloat16, "NHD", 1, [9, 21], (4, 4), (64, 64), {"logits_soft_cap": 5.0}, False),
    (torch.float16, "HND", 1, [33, 2], (6, 2), (64, 64), {"window_left": 7}, False),
    (torch.float16, "NHD", 5, [26, 14], (4, 1), (64, 64), {"window_left": 0}, False),
    (torch.float16, "NHD", 16, [40, 17], (8, 2), (64, 64), {"sm_scale": 0.3}, True),
    (torch.bfloat16, "HND", 4, [29, 11], (4, 2), (192, 128), {"logits_soft_cap": 20.0}, False),
]


@pytest.mark.parametrize("case", DECODE_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-p{c[2]}-{c[5]}-{c[6]}-fp8{c[7]}")
def test_decode_matches_reference(case: tuple) -> None:  # type: ignore[type-arg]
    dtype, layout, ps, lens, (hq, hkv), (d, dv), kwargs, fp8 = case
    cache, table = make_cache(lens, ps, hkv, d, dv, dtype=dtype, layout=layout, fp8=fp8)
    q = _randn(len(lens), hq, d, dtype=dtype)
    got, want = _both(ksb.attention.decode, q, cache, table, return_lse=True, **kwargs)
    _close(got, want, FP8 if fp8 else dtype)


@pytest.mark.parametrize("splits", [1, 2, 3, 7])
def test_decode_split_counts_agree(splits: int) -> None:
    from kernel_switchboard_triton._decode import DecodePlan

    lens = [1, 45, 80, 16]
    cache, table = make_cache(lens, 8, 2, 64, dtype=torch.float16, layout="HND")
    q = _randn(len(lens), 4, 64)
    want = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference")
    plan = DecodePlan(table, num_q_heads=4, num_kv_heads=2, head_dim=64, head_dim_v=64, sm_scale=0.125,
                      logits_soft_cap=None, window_left=-1, max_kv_len=80, num_splits=splits)
    assert plan.cfg.num_splits == splits
    out = torch.full((4, 4, 64), float("nan"), dtype=torch.float16, device=DEVICE)
    lse = torch.full((4, 4), float("nan"), device=DEVICE)
    plan.run(q, cache, out, lse)
    _close((out, lse), want, torch.float16)


def test_decode_empty_sequence_gives_zero_and_minus_inf() -> None:
    cache, table = make_cache([0, 20], 16, 2, 64)
    q = _randn(2, 4, 64)
    got, want = _both(ksb.attention.decode, q, cache, table, return_lse=True)
    _close(got, want, torch.float16)
    assert torch.all(got[0][0] == 0) and torch.all(got[1][0] == -math.inf)


def test_decode_plan_run_equals_run_and_sees_table_updates() -> None:
    cache, full = make_cache([31, 13, 51], 16, 2, 64, dtype=torch.bfloat16)  # one more token each is written
    table = PageTable(full.block_table, torch.tensor([30, 12, 50], dtype=torch.int32, device=DEVICE))
    q = _randn(3, 8, 64, dtype=torch.bfloat16)
    plan = ksb.attention.plan_decode(table, num_q_heads=8, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16,
                                     page_size=16, return_lse=True, max_kv_len=64, backend="triton")
    assert plan.kernel.id == "triton:decode_splitkv"
    out, lse = plan.run(q, cache)
    _close((out, lse), ksb.attention.decode(q, cache, table, return_lse=True, backend="triton"), torch.bfloat16)
    table.seq_lens.copy_(torch.tensor([31, 13, 51], dtype=torch.int32))  # a decode step appended one token each
    out, lse = plan.run(q, cache)
    _close((out, lse), ksb.attention.decode(q, cache, PageTable(table.block_table, table.seq_lens), return_lse=True,
                                            backend="reference"), torch.bfloat16)


def _decode_plan(table: PageTable, splits: int, hq: int = 4, hkv: int = 2, d: int = 64):  # type: ignore[no-untyped-def]
    from kernel_switchboard_triton._decode import DecodePlan

    return DecodePlan(table, num_q_heads=hq, num_kv_heads=hkv, head_dim=d, head_dim_v=d, sm_scale=d ** -0.5,
                      logits_soft_cap=None, window_left=-1, max_kv_len=int(table.seq_lens.max()), num_splits=splits)


def _planned_run(plan, q: torch.Tensor, cache: PagedKVCache, table: PageTable) -> None:  # type: ignore[no-untyped-def]
    """One run of ``plan`` into fresh NaN outputs, against the reference."""
    out = torch.full((q.shape[0], q.shape[1], q.shape[2]), float("nan"), dtype=q.dtype, device=DEVICE)
    lse = torch.full(q.shape[:2], float("nan"), device=DEVICE)
    plan.run(q, cache, out, lse)
    want = ksb.attention.decode(q, cache, table, return_lse=True, sm_scale=q.shape[2] ** -0.5, backend="reference")
    _close((out, lse), want, FP8 if cache.is_fp8 else q.dtype)


@pytest.mark.parametrize("splits", [1, 3])
def test_decode_plan_runs_repeat_the_kept_launches_with_each_runs_tensors(splits: int) -> None:
    """A plan's later runs launch the kernels of its first with their own queries, pages and outputs (the kept
    launch is reused, not rebuilt); a run whose tensors the kept arguments cannot describe (other strides, another
    layout) is launched anew."""
    lens = [1, 45, 80]
    cache, table = make_cache(lens, 8, 2, 64, dtype=torch.bfloat16)
    plan = _decode_plan(table, splits)
    _planned_run(plan, _randn(3, 4, 64, dtype=torch.bfloat16), cache, table)
    kept = plan._launch
    # other pages of the same shapes (other values, the unused slots' NaN where they were)
    other = PagedKVCache(cache.k_pages.flip(-1).contiguous(), cache.v_pages * -1.5, "NHD")
    _planned_run(plan, _randn(3, 4, 64, dtype=torch.bfloat16, seed=7), other, table)
    assert plan._launch is kept
    wide = _randn(3, 6, 64, dtype=torch.bfloat16, seed=8)[:, 1:5]  # the queries' head stride is unchanged, not the
    _planned_run(plan, wide, other, table)                          # batch stride: launched anew
    assert plan._launch is not kept
    hnd, _ = make_cache(lens, 8, 2, 64, dtype=torch.bfloat16, layout="HND")
    _planned_run(plan, _randn(3, 4, 64, dtype=torch.bfloat16, seed=9), hnd, table)


def test_a_decode_plan_keeps_no_runs_tensors_alive() -> None:
    """The launches a plan keeps for its later runs hold none of a run's queries, pages or outputs."""
    import gc
    import weakref

    cache, table = make_cache([30, 9], 8, 2, 64, dtype=torch.bfloat16)
    plan = _decode_plan(table, 2)
    q = _randn(2, 4, 64, dtype=torch.bfloat16)
    out = torch.empty(2, 4, 64, dtype=torch.bfloat16, device=DEVICE)
    plan.run(q, cache, out)
    assert plan._launch is not None
    refs = [weakref.ref(t) for t in (q, cache.k_pages, cache.v_pages, out)]
    del q, cache, out
    gc.collect()
    assert all(r() is None for r in refs)


def test_decode_plan_runs_take_each_runs_fp8_scales() -> None:
    """fp8 pages: a float scale is folded into the kept launch's arguments, so a run with other float scales is
    launched anew; tensor scales are read at every run."""
    lens = [40, 17]
    cache, table = make_cache(lens, 16, 2, 64, dtype=torch.float16, fp8=True)
    plan = _decode_plan(table, 2)
    q = _randn(2, 4, 64)
    _planned_run(plan, q, cache, table)
    kept = plan._launch
    _planned_run(plan, q, PagedKVCache(cache.k_pages, cache.v_pages, "NHD", k_scale=0.25, v_scale=2.0), table)
    assert plan._launch is not kept
    for k_scale, v_scale in ((0.5, 0.75), (0.125, 3.0)):
        scales = (torch.full((2,), k_scale, device=DEVICE), torch.full((2,), v_scale, device=DEVICE))
        _planned_run(plan, q, PagedKVCache(cache.k_pages, cache.v_pages, "NHD", *scales), table)


def test_capability_rejects_what_the_kernels_do_not_do() -> None:
    cache, table = make_cache([10], 16, 1, 112)  # 112 = 64 + 48: prefill's qk split needs power-of-two parts
    with pytest.raises(KernelUnavailableError, match="head_dim=112"):
        ksb.attention.decode(_randn(1, 2, 112), cache, table, backend="triton")
    from kernel_switchboard.variants_lib import VARIANTS

    cache, table = make_cache([10], 16, 1, 80)
    with pytest.raises(KernelUnavailableError, match="head_dim=80 with a custom variant"):
        ksb.attention.prefill(_randn(10, 2, 80), _indptr([10]), cache, table, variant=VARIANTS["sliding_window"],
                              variant_args=(5,), backend="triton")
    cache, table = make_cache([10], 16, 1, 64, dtype=torch.float32)  # float32: the kernels' dots are 16-bit
    with pytest.raises(KernelUnavailableError, match="kv_dtype=float32"):
        ksb.attention.decode(_randn(1, 2, 64, dtype=torch.float32), cache, table, backend="triton")


# -- prefill ------------------------------------------------------------------------------------------
PREFILL_CASES = [
    # dtype, layout, page_size, qo_lens, kv_lens, heads, dims, kwargs
    (torch.float16, "NHD", 16, [5, 20, 1], [5, 40, 33], (4, 2), (64, 64), {}),  # prefill + append + decode row
    (torch.bfloat16, "HND", 1, [7, 3], [7, 19], (4, 1), (64, 64), {"causal": False}),
    (torch.float16, "NHD", 16, [18, 1, 1], [30, 9, 40], (6, 2), (64, 64), {"window_left": 6}),
    (torch.bfloat16, "NHD", 8, [12, 4], [12, 25], (2, 2), (64, 64), {"logits_soft_cap": 8.0, "causal": False,
                                                                     "window_left": 3}),
    (torch.bfloat16, "HND", 4, [9, 2], [9, 14], (4, 2), (192, 128), {}),
]


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[1]}-p{c[2]}-{c[6]}-{c[7]}")
def test_prefill_paged_matches_reference(case: tuple) -> None:  # type: ignore[type-arg]
    dtype, layout, ps, qo, kv, (hq, hkv), (d, dv), kwargs = case
    cache, table = make_cache(kv, ps, hkv, d, dv, dtype=dtype, layout=layout)
    q = _randn(sum(qo), hq, d, dtype=dtype)
    got, want = _both(ksb.attention.prefill, q, _indptr(qo), cache, table, return_lse=True, **kwargs)
    _close(got, want, dtype)


def test_prefill_fp8_kv() -> None:
    cache, table = make_cache([20, 9], 16, 2, 64, fp8=True)
    q = _randn(11, 4, 64)
    got, want = _both(ksb.attention.prefill, q, _indptr([8, 3]), cache, table, return_lse=True)
    _close(got, want, FP8)


@pytest.mark.parametrize("case", PREFILL_CASES, ids=lambda c: f"{str(c[0])[6:]}-{c[6]}-{c[7]}")
def test_prefill_ragged_matches_reference(case: tuple) -> None:  # type: ignore[type-arg]
    dtype, _, _, qo, kv, (hq, hkv), (d, dv), kwargs = case
    q = _randn(sum(qo), hq, d, dtype=dtype)
    k, v = _randn(sum(kv), hkv, d, dtype=dtype, seed=2), _randn(sum(kv), hkv, dv, dtype=dtype, seed=3)
    got, want = _both(ksb.attention.prefill_ragged, q, k, v, _indptr(qo), _indptr(kv), return_lse=True, **kwargs)
    _close(got, want, dtype)


@triton.jit
def _apply_exp2_fma(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, _exp2_fma(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def test_exp2_on_fma_pipe_is_within_its_error_bound() -> None:
    """``_exp2_fma`` (the soft-capped prefill's exponentials without the SFU) over [-126, 0] and at its edges:
    relative error <= 1.02e-4 against float64, and -127 (masked keys) gives 0 exactly."""
    x = torch.cat([torch.linspace(-126.0, 0.0, 4093), torch.tensor([-0.5, -0.5 - 1e-6, -127.0])])
    x = x.to(DEVICE, torch.float32)
    y = torch.empty_like(x)
    _apply_exp2_fma[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    want = torch.exp2(x[:-1].double())
    assert ((y[:-1].double() - want).abs() / want).max().item() <= 1.02e-4
    assert y[-1].item() == 0.0


@pytest.mark.parametrize("exp2_fma", [False, True])
@pytest.mark.parametrize("cap", [30.0, 41.0, 50.0])
@pytest.mark.parametrize("raw", [0.0, -64.0])
def test_prefill_soft_cap_rows_far_below_the_cap_match_reference(cap: float, raw: float, exp2_fma: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 prefill under a soft cap up to ``FIXED_MAX_CAP`` (about 41.6) subtracts the cap instead of a running
    row maximum (its exponentials on the SFU, or by the polynomial of ``PrefillConfig.exp2_fma``); a row whose every
    score lies far below the cap (raw scores about ``raw``: capped near -cap + 4) keeps its weights, which reach
    2^-120 and stay normal numbers. Cap 50 keeps the running maximum."""
    from kernel_switchboard_triton import _prefill
    from kernel_switchboard_triton._attn_common import fixed_max

    plain = {"SOFTMAX": True, "HAS_SCORE_MOD": False}
    assert fixed_max(cap, torch.bfloat16, False, plain, exp2_fma) == ((1 + exp2_fma) if cap <= 41.0 else 0)
    real_config = _prefill.prefill_config
    monkeypatch.setattr(_prefill, "prefill_config", lambda *a: real_config(*a)._replace(exp2_fma=exp2_fma))
    qo, kv = [5, 3], [5, 12]
    g = _gen(4)
    q = (1.0 + 0.1 * torch.randn(sum(qo), 4, 64, generator=g)).to(DEVICE, torch.bfloat16)
    k = (raw / 64 + 0.3 * torch.randn(sum(kv), 2, 64, generator=g)).to(DEVICE, torch.bfloat16)
    v = _randn(sum(kv), 2, 64, dtype=torch.bfloat16, seed=3)
    kwargs = {"logits_soft_cap": cap, "sm_scale": 1.0, "return_lse": True}
    got, want = _both(ksb.attention.prefill_ragged, q, k, v, _indptr(qo), _indptr(kv), **kwargs)
    _close(got, want, torch.bfloat16)
    assert torch.isfinite(got[0]).all()


def _force_tma(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Turn ``PrefillConfig.tma`` on; returns the list of descriptor pairs (or None) each launch got."""
    from kernel_switchboard_triton import _prefill

    real_config, real_descriptors, routes = _prefill.prefill_config, _prefill.tma_descriptors, []
    monkeypatch.setattr(_prefill, "prefill_config", lambda *a: real_config(*a)._replace(tma=True))
    monkeypatch.setattr(_prefill, "tma_descriptors", lambda *a: routes.append(real_descriptors(*a)) or routes[-1])
    return routes


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("case", [c for c in PREFILL_CASES if c[6][0] == c[6][1]], ids=lambda c: f"{str(c[0])[6:]}-{c[7]}")
def test_prefill_narrow_diagonal_tiles_match_reference(case: tuple, tma: bool,  # type: ignore[type-arg]
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``PrefillConfig.diag_n``: 16-key tiles at the causal diagonal and the sequence end after 32-key tiles,
    ragged and paged (by TMA where the descriptors allow, else pointer loads)."""
    from kernel_switchboard_triton import _prefill

    real = _prefill.prefill_config
    monkeypatch.setattr(_prefill, "prefill_config",
                        lambda *a: real(*a)._replace(block_m=32, block_n=32, diag_n=16, tma=tma))
    dtype, layout, ps, qo, kv, (hq, hkv), (d, dv), kwargs = case
    q = _randn(sum(qo), hq, d, dtype=dtype)
    k, v = _randn(sum(kv), hkv, d, dtype=dtype, seed=2), _randn(sum(kv), hkv, dv, dtype=dtype, seed=3)
    got, want = _both(ksb.attention.prefill_ragged, q, k, v, _indptr(qo), _indptr(kv), return_lse=True, **kwargs)
    _close(got, want, dtype)
    cache, table = make_cache(kv, ps, hkv, d, dv, dtype=dtype, layout=layout)
    got, want = _both(ksb.attention.prefill, q, _indptr(qo), cache, table, return_lse=True, **kwargs)
    _close(got, want, dtype)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("case", [c for c in PREFILL_CASES if c[2] % 16 == 0 and c[6][0] == c[6][1]],
                         ids=lambda c: f"{str(c[0])[6:]}-p{c[2]}-{c[7]}")
def test_prefill_paged_tma_tiles_match_reference(case: tuple, layout: str,  # type: ignore[type-arg]
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Page tiles by TMA (``PrefillConfig.tma``, on by default on Hopper; a tile never crosses a page): the unwritten rest of each
    request's last page holds NaN, which must not reach the output."""
    dtype, _, ps, qo, kv, (hq, hkv), (d, dv), kwargs = case
    routes = _force_tma(monkeypatch)
    cache, table = make_cache(kv, ps, hkv, d, dv, dtype=dtype, layout=layout)
    q = _randn(sum(qo), hq, d, dtype=dtype)
    got, want = _both(ksb.attention.prefill, q, _indptr(qo), cache, table, return_lse=True, **kwargs)
    _close(got, want, dtype)
    if triton_interpreting():  # 16-token tiles: every page size here holds whole tiles
        assert routes and all(r is not None for r in routes)


@pytest.mark.parametrize("case", [c for c in PREFILL_CASES if c[6][0] == c[6][1]], ids=lambda c: f"{str(c[0])[6:]}-{c[7]}")
def test_prefill_ragged_tma_tiles_match_reference(case: tuple, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    """K/V tiles by TMA (``PrefillConfig.tma``, default on Hopper): whole tiles cross into the next request's rows, whose NaN
    (poisoned here) must reach neither this request's scores nor its output."""
    dtype, _, _, qo, kv, (hq, hkv), (d, dv), kwargs = case
    routes = _force_tma(monkeypatch)
    q = _randn(sum(qo), hq, d, dtype=dtype)
    k, v = _randn(sum(kv), hkv, d, dtype=dtype, seed=2), _randn(sum(kv), hkv, dv, dtype=dtype, seed=3)
    got, want = _both(ksb.attention.prefill_ragged, q, k, v, _indptr(qo), _indptr(kv), return_lse=True, **kwargs)
    _close(got, want, dtype)
    k[kv[0]:], v[kv[0]:] = float("nan"), float("nan")  # every request but the first: NaN
    first = ksb.attention.prefill_ragged(q, k, v, _indptr(qo), _indptr(kv), return_lse=True, backend="triton", **kwargs)
    _close(tuple(t[:qo[0]] for t in first), tuple(t[:qo[0]] for t in want), dtype)
    if has_tma(torch.device(DEVICE)):
        assert routes and all(r is not None for r in routes)


def test_prefill_plan_run_equals_run() -> None:
    qo, kv = [6, 1, 1], [6, 20, 9]
    cache, table = make_cache(kv, 16, 2, 64, dtype=torch.bfloat16)
    q, qo_indptr = _randn(8, 4, 64, dtype=torch.bfloat16), _indptr(qo)
    plan = ksb.attention.plan_prefill(table, qo_indptr, num_q_heads=4, num_kv_heads=2, head_dim=64,
                                      dtype=torch.bfloat16, page_size=16, return_lse=True, backend="triton")
    assert plan.kernel.id == "triton:prefill_paged"
    _close(plan.run(q, cache), ksb.attention.prefill(q, qo_indptr, cache, table, return_lse=True, backend="triton"),
           torch.bfloat16)


def test_prefill_ragged_plan_run_equals_run() -> None:
    qo, kv = [6, 1, 3], [6, 20, 9]
    q, k, v = _randn(10, 4, 64, dtype=torch.bfloat16), _randn(35, 2, 64, dtype=torch.bfloat16, seed=2), \
        _randn(35, 2, 64, dtype=torch.bfloat16, seed=3)
    plan = ksb.attention.plan_prefill_ragged(_indptr(qo), _indptr(kv), num_q_heads=4, num_kv_heads=2, head_dim=64,
                                             dtype=torch.bfloat16, logits_soft_cap=20.0, return_lse=True,
                                             backend="triton")
    assert plan.kernel.id == "triton:prefill_ragged"
    want = ksb.attention.prefill_ragged(q, k, v, _indptr(qo), _indptr(kv), logits_soft_cap=20.0, return_lse=True,
                                        backend="reference")
    _close(plan.run(q, k, v), want, torch.bfloat16)


@pytest.mark.parametrize("splits", [1, 3, "invariant"])
def test_kernels_write_the_lse_in_base_2_when_the_plan_asks(splits: int | str) -> None:
    """Plans made with ``lse_base2=True`` run the decode (one split, merged splits, the batch-invariant ordered
    merge), paged prefill and ragged prefill kernels writing log2 of the softmax denominator themselves: no
    conversion after the run, and equal to the reference's natural LSE x log2(e); empty requests stay -inf."""
    from kernel_switchboard.ops.attention_runner import LOG2E, Base2LSE
    from kernel_switchboard_triton._decode import DecodePlan

    lens, qo = [0, 45, 80, 16], [0, 3, 1, 5]
    cache, table = make_cache(lens, 8, 2, 64, dtype=torch.float16, layout="HND")
    q = _randn(len(lens), 4, 64)
    want_o, want_lse = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference")
    plan = DecodePlan(table, num_q_heads=4, num_kv_heads=2, head_dim=64, head_dim_v=64, sm_scale=0.125,
                      logits_soft_cap=None, window_left=-1, max_kv_len=80, lse_base2=True,
                      num_splits=None if splits == "invariant" else splits, invariant=splits == "invariant")
    out = torch.full((4, 4, 64), float("nan"), dtype=torch.float16, device=DEVICE)
    lse = torch.full((4, 4), float("nan"), device=DEVICE)
    plan.run(q, cache, out, lse)
    _close((out, lse), (want_o, want_lse * LOG2E), torch.float16)
    assert torch.all(lse[0] == -math.inf)
    if splits != 1:
        return
    planned = ksb.attention.plan_decode(table, num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=torch.float16,
                                        layout="HND", page_size=8, return_lse=True, lse_base2=True, backend="triton")
    assert not isinstance(planned._runner, Base2LSE)
    _close(planned.run(q, cache), (want_o, want_lse * LOG2E), torch.float16)

    qp, qo_indptr = _randn(sum(qo), 4, 64, seed=2), _indptr(qo)
    want = ksb.attention.prefill(qp, qo_indptr, cache, table, return_lse=True, backend="reference")
    prefill = ksb.attention.plan_prefill(table, qo_indptr, num_q_heads=4, num_kv_heads=2, head_dim=64,
                                         dtype=torch.float16, layout="HND", page_size=8, return_lse=True,
                                         lse_base2=True, backend="triton")
    assert not isinstance(prefill._runner, Base2LSE)
    _close(prefill.run(qp, cache), (want[0], want[1] * LOG2E), torch.float16)

    k, v = _randn(sum(lens), 2, 64, seed=3), _randn(sum(lens), 2, 64, seed=4)
    want = ksb.attention.prefill_ragged(qp, k, v, qo_indptr, _indptr(lens), return_lse=True, backend="reference")
    ragged = ksb.attention.plan_prefill_ragged(qo_indptr, _indptr(lens), num_q_heads=4, num_kv_heads=2, head_dim=64,
                                               dtype=torch.float16, return_lse=True, lse_base2=True, backend="triton")
    assert not isinstance(ragged._runner, Base2LSE)
    _close(ragged.run(qp, k, v), (want[0], want[1] * LOG2E), torch.float16)


def test_prefill_retries_with_fewer_stages_when_shared_memory_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """A config whose shared memory does not fit (OutOfResources at launch) runs with one stage fewer."""
    import triton

    from kernel_switchboard_triton import _prefill

    real, stages = _prefill._prefill_kernel, []

    class Tight:
        def __getitem__(self, grid):  # noqa: ANN001, ANN204 - mimics a jit kernel's launcher
            def launch(*args, num_stages, **kwargs):  # noqa: ANN002, ANN003, ANN202
                stages.append(num_stages)
                if num_stages > 1:
                    raise triton.runtime.errors.OutOfResources(229376, 232448, "shared memory")
                return real[grid](*args, num_stages=num_stages, **kwargs)
            return launch

    monkeypatch.setattr(_prefill, "_prefill_kernel", Tight())
    monkeypatch.setattr(_prefill, "prefill_config",
                        lambda *a: _prefill.PrefillConfig(16, 16, 1, 2, triton_interpreting()))
    q, k, v = _randn(5, 2, 64), _randn(5, 1, 64, seed=2), _randn(5, 1, 64, seed=3)
    got, want = _both(ksb.attention.prefill_ragged, q, k, v, _indptr([5]), _indptr([5]))
    assert stages == [2, 1]
    _close(got, want, torch.float16)


# -- MLA ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("heads", "page_size", "lens", "tma_interpreted"),
                         [(16, 16, [40, 3], True), (20, 32, [100, 31, 0], True), (20, 1, [7, 33], False)])
def test_mla_decode_matches_reference(heads: int, page_size: int, lens: list[int], tma_interpreted: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Page tiles by TMA (tiles within a page) or by pointer gathers; unwritten slots hold NaN and must not leak."""
    from kernel_switchboard_triton import _mla

    routes = []
    real = _mla._tma_descriptors
    monkeypatch.setattr(_mla, "_tma_descriptors", lambda *a: routes.append(real(*a)) or routes[-1])
    g = _gen(5)
    width = max(math.ceil(n / page_size) for n in lens)
    pages = len(lens) * width + 8
    ckv = (torch.randn(pages, page_size, 512, generator=g) * 0.3).to(DEVICE, torch.bfloat16)
    kpe = torch.randn(pages, page_size, 64, generator=g).to(DEVICE, torch.bfloat16)
    bt = torch.randperm(pages, generator=g)[: len(lens) * width].view(len(lens), width).to(DEVICE, torch.int32)
    written = torch.zeros(pages, page_size, dtype=torch.bool, device=DEVICE)
    for i, n in enumerate(lens):
        pos = torch.arange(n, device=DEVICE)
        written[bt[i, pos // page_size].long(), pos % page_size] = True
    ckv[~written] = float("nan")
    kpe[~written] = float("nan")
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    qn, qp = _randn(len(lens), heads, 512, dtype=torch.bfloat16), _randn(len(lens), heads, 64, dtype=torch.bfloat16)
    got, want = _both(ksb.attention.mla_decode, qn, qp, ckv, kpe, table, sm_scale=0.04, return_lse=True)
    if triton_interpreting():  # 16-token tiles: pages of 16 and 32 take the TMA kernel
        assert [r is not None for r in routes] == [tma_interpreted]
    assert not got[0].isnan().any()
    _close(got, want, torch.bfloat16)


def test_mla_decode_reads_latent_and_rope_views_of_one_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM keeps [ckv | kpe] in one (P, S, 576) cache: the kernels take the two strided views as they are."""
    from kernel_switchboard_triton import _mla

    routes = []
    real = _mla._tma_descriptors
    monkeypatch.setattr(_mla, "_tma_descriptors", lambda *a: routes.append(real(*a)) or routes[-1])
    g = _gen(8)
    lens, page_size = [70, 5], 16
    cache = (torch.randn(12, page_size, 576, generator=g) * 0.3).to(DEVICE, torch.bfloat16)
    ckv, kpe = cache[..., :512], cache[..., 512:]
    bt = torch.randperm(12, generator=g)[:10].view(2, 5).to(DEVICE, torch.int32)
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    qn, qp = _randn(2, 16, 512, dtype=torch.bfloat16), _randn(2, 16, 64, dtype=torch.bfloat16)
    got, want = _both(ksb.attention.mla_decode, qn, qp, ckv, kpe, table, sm_scale=0.04, return_lse=True)
    if triton_interpreting():
        assert routes and routes[-1] is not None  # strided views still take the TMA kernel
    _close(got, want, torch.bfloat16)


def test_mla_plan_serves_two_layers_and_in_place_table_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan_mla_decode`` on the Triton kernel: split schedule and workspace made once (several splits in the
    interpreter at these lengths), each layer's pages passed at run, seq_lens shortened in place between runs; each
    layer's page operands (TMA descriptors) made at its first run only."""
    from kernel_switchboard_triton import _mla

    made = []
    real_operands = _mla.page_operands
    monkeypatch.setattr(_mla, "page_operands", lambda ckv, kpe, cfg: made.append(ckv) or real_operands(ckv, kpe, cfg))
    g = _gen(9)
    lens, page_size, heads = [45, 7, 0], 16, 16
    bt = torch.randperm(16, generator=g)[:9].view(3, 3).to(DEVICE, torch.int32)
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    layers = [((torch.randn(16, page_size, 512, generator=g) * 0.3).to(DEVICE, torch.bfloat16),
               torch.randn(16, page_size, 64, generator=g).to(DEVICE, torch.bfloat16)) for _ in range(2)]
    qn, qp = _randn(3, heads, 512, dtype=torch.bfloat16), _randn(3, heads, 64, dtype=torch.bfloat16, seed=2)
    plan = ksb.attention.plan_mla_decode(table, num_heads=heads, head_dim_ckv=512, head_dim_kpe=64,
                                         dtype=torch.bfloat16, page_size=page_size, sm_scale=0.04, return_lse=True,
                                         backend="triton")
    runner = plan._runner
    assert isinstance(runner, _mla.MLARunner) and runner.plan.cfg.num_splits > 1
    for new_lens in (lens, [30, 7, 1]):
        table.seq_lens.copy_(torch.tensor(new_lens, dtype=torch.int32))
        for ckv, kpe in layers:
            want = ksb.attention.mla_decode(qn, qp, ckv, kpe, PageTable(bt, table.seq_lens.clone()), sm_scale=0.04,
                                            return_lse=True, backend="reference")
            _close(plan.run(qn, qp, ckv, kpe), want, torch.bfloat16)
    assert [m is ckv for m, (ckv, _) in zip(made, layers, strict=True)] == [True, True]  # once per layer


def test_mla_decode_of_several_new_tokens_per_request() -> None:
    """Multi-token prediction / speculative verification: q (B, T, H, D), each new token causal, eager and planned,
    on the Triton kernel (B * T rows sharing their request's pages)."""
    g = _gen(12)
    lens, page_size, heads, t = [40, 2, 0], 16, 16, 3
    bt = torch.randperm(12, generator=g)[:9].view(3, 3).to(DEVICE, torch.int32)
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device=DEVICE))
    ckv = (torch.randn(12, page_size, 512, generator=g) * 0.3).to(DEVICE, torch.bfloat16)
    kpe = torch.randn(12, page_size, 64, generator=g).to(DEVICE, torch.bfloat16)
    qn, qp = _randn(3, t, heads, 512, dtype=torch.bfloat16), _randn(3, t, heads, 64, dtype=torch.bfloat16, seed=2)
    want = ksb.attention.mla_decode(qn, qp, ckv, kpe, table, sm_scale=0.04, return_lse=True, backend="reference")
    _close(ksb.attention.mla_decode(qn, qp, ckv, kpe, table, sm_scale=0.04, return_lse=True, backend="triton"), want,
           torch.bfloat16)
    plan = ksb.attention.plan_mla_decode(table, num_heads=heads, head_dim_ckv=512, head_dim_kpe=64,
                                         dtype=torch.bfloat16, page_size=page_size, sm_scale=0.04, return_lse=True,
                                         q_len=t, backend="triton")
    _close(plan.run(qn, qp, ckv, kpe), want, torch.bfloat16)


def test_mla_cluster_config_is_refused_where_the_cluster_kernel_cannot_run() -> None:
    """``MLAConfig.cluster`` names the 2-CTA Gluon kernel: with another kernel (here the interpreter's) the launch is
    refused with the reason, never run as something else."""
    from kernel_switchboard_triton import _mla

    bt = torch.arange(4, dtype=torch.int32, device=DEVICE).view(1, 4)
    table = PageTable(bt, torch.tensor([50], dtype=torch.int32, device=DEVICE))
    ckv, kpe = _randn(4, 16, 512), _randn(4, 16, 64, seed=2)
    cfg = _mla.mla_config(torch.device(DEVICE), 1, 16, 64, 16)._replace(cluster=True)
    p = SimpleNamespace(sm_scale=0.04, max_kv_len=50, return_lse=False)
    with pytest.raises(ValueError, match="cluster=True needs gluon_ws"):
        _mla.mla_decode(_randn(1, 16, 512), _randn(1, 16, 64, seed=3), ckv, kpe, table, p, cfg)


# -- merge_states -------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_merge_states_matches_reference(dtype: torch.dtype) -> None:
    oa, ob = _randn(5, 6, 64, dtype=dtype), _randn(5, 6, 64, dtype=dtype, seed=2)
    la, lb = _randn(5, 6, dtype=torch.float32, seed=3), _randn(5, 6, dtype=torch.float32, seed=4)
    la[0, 0] = -math.inf
    la[1, 1] = lb[1, 1] = -math.inf  # both empty: out 0, lse -inf
    got, want = _both(ksb.attention.merge_states, oa, la, ob, lb)
    _close(got, want, dtype)
    assert got[1][1, 1] == -math.inf and torch.all(got[0][1, 1] == 0)


def test_benchmark_script_runs_on_tiny_shapes() -> None:
    """The H200 benchmark (benchmarks/attention.py) on tiny shapes: every row checked, none failing."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "attention.py"
    spec = importlib.util.spec_from_file_location("ksb_bench_attention", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.bench_attention(DEVICE, sweep=False, sizes=module.SMOKE)
    assert rows and all("error" not in r for r in rows), [r for r in rows if "error" in r]
    assert {r["workload"].split()[0] for r in rows} == {"decode", "prefill", "mla"}
    assert "decode" in module.summary(rows)


def test_split_model_fills_one_wave_for_small_batches() -> None:
    from kernel_switchboard_triton._attn_common import choose_splits

    slots = 264  # 132 SMs x 2 resident programs (H200, d128, 3 stages)
    assert choose_splits(16 * 8, 2048, 64, slots) == 2  # 128 streams -> 256 programs, one wave
    assert choose_splits(128 * 8, 8192, 64, slots) == 1  # already ~4 waves
    assert choose_splits(1 * 8, 65536, 64, slots) == 32  # one long request spreads over the GPU
    assert choose_splits(4, 100, 64, slots) == 1  # too short to split
    assert choose_splits(1, 10**6, 64, slots, max_splits=64) <= 64


def test_batch_one_decode_takes_short_tiles_to_split_further(monkeypatch) -> None:
    from kernel_switchboard_triton import _attn_common, _decode

    # an H200 as decode_config sees it: sm_90, 132 SMs (the interpreter's own config is bypassed)
    monkeypatch.setattr(_decode, "interpreting", lambda: False)
    monkeypatch.setattr(_decode, "cc_major", lambda device: 9)
    monkeypatch.setattr(_attn_common, "cc_major", lambda device: 9)
    monkeypatch.setattr(_decode, "sm_count", lambda device: 132)
    config = _decode.decode_config.__wrapped__
    gpu = torch.device("cuda", 0)
    one = config(gpu, 1, 8, 4, 128, 4096)
    assert (one.block_n, one.num_splits, one.num_stages) == (32, 64, 4)  # 64-key tiles would stop at 32 splits
    busy = config(gpu, 1, 8, 4, 128, 8192)  # 64 splits of 64-key tiles already fill half the slots
    assert (busy.block_n, busy.num_splits) == (64, 64)
    batch = config(gpu, 16, 8, 4, 128, 2048)
    assert batch.block_n == 64 and batch.num_splits > 1
    assert config(gpu, 1, 8, 4, 128, 4096, num_splits=8).block_n == 64  # an explicit split count keeps the tiles


def test_kernel_plan_runs_into_given_buffers_or_new_ones() -> None:
    """The kernel's plan follows the core's runner contract: it writes the buffers it is given, and a run given none
    returns new tensors (never ones a later run overwrites)."""
    from kernel_switchboard_triton._decode import plan_decode

    cache, table = make_cache([30, 12], 16, 2, 64, dtype=torch.bfloat16)
    q = _randn(2, 4, 64, dtype=torch.bfloat16)
    plan = ksb.attention.plan_decode(table, num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16,
                                     page_size=16, return_lse=True, backend="triton")
    want = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference")
    kernel_plan = plan_decode(plan.problem, table, plan.params)
    first = kernel_plan.run(q, cache, None, None)
    second = kernel_plan.run(q, cache, None, None)
    assert first[0] is not second[0] and first[1] is not second[1]
    _close(first, want, torch.bfloat16)
    out = torch.full((2, 4, 64), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    lse = torch.full((2, 4), float("nan"), device=DEVICE)
    got = kernel_plan.run(q, cache, out, lse)
    assert got[0] is out and got[1] is lse
    _close((out, lse), want, torch.bfloat16)


# -- dense ----------------------------------------------------------------------------------------------
def test_dense_reads_transposed_blhd_inputs_in_place_and_matches_reference() -> None:
    """q/k/v made as (B, L, H, D) and transposed to (B, H, L, D), as after a QKV projection: the packed tokens
    are views (no copy); no bias, causal with Lq < Lk, GQA."""
    from kernel_switchboard_triton.dense import _packed

    q = _randn(2, 12, 4, 64, dtype=torch.bfloat16).transpose(1, 2)
    k = _randn(2, 30, 2, 64, dtype=torch.bfloat16, seed=2).transpose(1, 2)
    v = _randn(2, 30, 2, 64, dtype=torch.bfloat16, seed=3).transpose(1, 2)
    assert _packed(q).data_ptr() == q.data_ptr() and _packed(q)._base is not None
    got, want = _both(ksb.attention.dense, q, k, v, causal=True)
    _close(got, want, torch.bfloat16)


@pytest.mark.parametrize("wide", [False, True], ids=["int32-offsets", "int64-offsets"])
def test_dense_on_random_shapes_and_broadcast_biases(wide: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard.testing.cases.attention_dense import dense_random_cases
    from kernel_switchboard_triton import dense

    if wide:  # every bias takes the int64 offsets of biases spanning 2^31 elements or more
        monkeypatch.setattr(dense, "WIDE_SPAN", 0)
    for q, k, v, bias, causal in dense_random_cases(12, 2, (torch.float16, torch.bfloat16), 64):
        q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
        bias = None if bias is None else bias.to(DEVICE)
        got, want = _both(ksb.attention.dense, q, k, v, bias, causal=causal)
        _close(got, want, q.dtype)


#: ``triton:dense`` on the H200, ``switchboard bench --preset dense``, ms
DENSE_H200_MS = {"encoder 8x1024 mask": 0.547, "encoder 8x1024 bias": 0.457, "1x4096 causal + bias": 0.369,
                 "cross-attention 77x1024": 0.196}


def test_dense_cost_stays_within_a_third_of_the_h200_times() -> None:
    from kernel_switchboard.testing.cases.attention_dense import bench_problems, cost_ratios
    from kernel_switchboard_triton.catalog.attention import _dense_cost

    ratios = cost_ratios(_dense_cost, DENSE_H200_MS)
    assert all(0.75 <= r <= 1.33 for r in ratios.values()), ratios

    captured = bench_problems()["cross-attention 77x1024"]
    captured = captured._replace(features=captured.features | {"cuda_graph"})  # type: ignore[attr-defined]
    assert _dense_cost(captured) < 0.05e-3  # replayed from a CUDA graph: no eager host floor


def test_attention_kernels_compile_for_hopper_through_their_launchers() -> None:
    """Decode and paged prefill at head dims 96 and 80, fp8 e4m3 and e5m2 pages, and bf16 under a soft cap (the
    prefill's softmax against the cap, half its exponentials on the FMA pipe), launched on CPU tensors under a fake
    sm_90 driver (``hopper_compile.py``): every kernel the launchers pick compiles for Hopper, ptxas included, with
    their Hopper configuration (the interpreter runs other tile sizes and no GPU compiler)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = Path(__file__).with_name("hopper_compile.py")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(results) == 8
    for result in results:
        assert "error" not in result, result
        names = {k["name"] for k in result["kernels"]}
        assert ("_decode_split_kernel" if result["problem"].startswith("decode") else "_prefill_kernel") in names
        assert all(k["arch"] == 90 and k["shared"] <= 227 * 1024 for k in result["kernels"]), result


_MLA_GLUON_SIG = {"qn_ptr": "*bf16", "qp_ptr": "*bf16", "ckv_desc": "", "kpe_desc": "", "block_table_ptr": "*i32",
                  "seq_lens_ptr": "*i32", "o_ptr": "*bf16", "lse_ptr": "*fp32", "heads": "i32",
                  **{name: "i32" for name in ("stride_qnb", "stride_qnh", "stride_qpb", "stride_qph", "stride_bt",
                                              "stride_ob", "stride_oh", "stride_os", "stride_lb", "stride_lh")},
                  "qk_scale": "fp32"}
_MLA_GLUON_DESCRIPTORS = {"ckv_desc": ("bfloat16", [64, 512]), "kpe_desc": ("bfloat16", [64, 64])}


def test_gluon_mla_kernel_compiles_for_hopper() -> None:
    """The Gluon MLA kernel runs only on a GPU; here it is compiled for sm_90 (ptxas included) so an API change of
    Triton's Gluon shows in CI: scores on m64n32 wgmma (each warpgroup half of the keys), the output on m64n256
    (each half of the 512 columns), no spills, within the 227 KB of shared memory."""
    pytest.importorskip("triton.experimental.gluon")
    from gluon_compile import compile_for_hopper

    kernel = compile_for_hopper("kernel_switchboard_triton._mla_gluon", "mla_decode_kernel", _MLA_GLUON_SIG,
                                _MLA_GLUON_DESCRIPTORS, {"PAGE_SIZE": 64, "NUM_SPLITS": 1, "STAGES": 2, "num_warps": 8},
                                8)
    assert "m64n32k16" in kernel["ptx"] and "m64n256k16" in kernel["ptx"]
    assert kernel["spill_stores"] == 0, kernel | {"ptx": "..."}
    assert kernel["shared"] <= 227 * 1024


def test_gluon_ws_mla_kernel_compiles_for_hopper() -> None:
    """The warp-specialised Gluon MLA kernel (the Hopper default), compiled for sm_90: whole 64 x 64 score tiles (m64n64),
    half of the output columns per warpgroup (m64n256), partitions with their own register budgets, tiles loaded in
    pieces; no spills with Triton 3.6 / 3.7 (148 bytes with newer ptxas flags: ``gluon_compile.spill_limit``)."""
    pytest.importorskip("triton.experimental.gluon")
    from gluon_compile import compile_for_hopper, spill_limit

    from kernel_switchboard_triton._mla_gluon_ws import PIECE_COLS

    boxes = {**_MLA_GLUON_DESCRIPTORS, "ckv_desc": ("bfloat16", [64, 64])}  # the latent tiles load in 64-column boxes
    kernel = compile_for_hopper("kernel_switchboard_triton._mla_gluon_ws", "mla_decode_ws_kernel", _MLA_GLUON_SIG,
                                boxes, {"PAGE_SIZE": 64, "NUM_SPLITS": 1, "DC": 512, "PIECE": PIECE_COLS, "CTAS": 1,
                                        "num_warps": 4}, 4, maxnreg=168)
    ptx = kernel["ptx"]
    assert "m64n64k16" in ptx and "m64n256k16" in ptx and "m64n32k16" not in ptx
    assert ptx.count("cp.async.bulk.tensor") == 2 * 9  # full and partial tiles: 8 latent boxes and k_pe each
    assert "setmaxnreg.dec.sync.aligned.u32 \t40" in ptx  # the loader warp gives registers back
    assert kernel["spill_stores"] <= spill_limit(0, 148), kernel | {"ptx": "..."}
    assert kernel["shared"] <= 227 * 1024


_PREFILL_WS_SIG = {"q_ptr": "*bf16", "k_desc": "", "v_desc": "", "qo_indptr_ptr": "*i32", "kv_indptr_ptr": "*i32",
                   "block_table_ptr": "*i32", "seq_lens_ptr": "*i32", "o_ptr": "*bf16", "lse_ptr": "*fp32",
                   "counter": "*i32", "words": "*i32",
                   **{name: "i32" for name in ("stride_qt", "stride_qh", "stride_bt", "stride_ot", "stride_oh",
                                               "stride_lt", "stride_lh")},
                   "qk_scale": "fp32", "cap_log2": "fp32", "batch": "i32", "n_items": "i32"}


@pytest.mark.parametrize(("paged", "vec_b", "dynamic"), [(False, 32, True), (True, 32, True), (False, 0, True),
                                                         (False, 32, False)], ids=str)
def test_gluon_ws_prefill_kernel_compiles_for_hopper(paged: bool, vec_b: int, dynamic: bool) -> None:
    """The warp-specialised soft-capped prefill (``PrefillConfig.gluon_ws``), compiled for sm_90: 64 x 128 score and
    output tiles per consumer warpgroup (m64n128), P from registers, the queries by cp.async, the loader warp's
    registers given back, no spills beyond what ptxas was measured to need (Triton 3.6, the GPU image's: 8 bytes;
    3.9, whose ptxas runs with ``--regAllocOptLevel=2``: 228), within the 227 KB of shared memory; requests found by
    vector loads (``vec_b`` 32) or binary search; persistent programs claiming items from a counter (``dynamic``,
    the default) or one item per program."""
    pytest.importorskip("triton.experimental.gluon")
    from gluon_compile import compile_for_hopper, spill_limit

    descriptors = {"k_desc": ("bfloat16", [128, 128]), "v_desc": ("bfloat16", [128, 128])}
    kernel = compile_for_hopper("kernel_switchboard_triton._prefill_gluon_ws", "prefill_ws_kernel", _PREFILL_WS_SIG,
                                descriptors, {"GROUP": 4, "NUM_KV_HEADS": 8, "PAGE_SIZE": 128, "PAGED": paged,
                                              "HND": False, "CAUSAL": True, "RETURN_LSE": True, "LSE_BASE2": False,
                                              "VEC_B": vec_b, "LOG_B": 4, "DYNAMIC": dynamic, "num_warps": 4}, 4,
                                maxnreg=168, aligned=("q_ptr", "stride_qt", "stride_qh"))
    ptx = kernel["ptx"]
    assert "m64n128k16" in ptx and "tanh.approx.f32" in ptx and "cp.async.cg.shared.global" in ptx
    assert ("atom.global" in ptx) == dynamic
    assert "setmaxnreg.dec.sync.aligned.u32 \t40" in ptx
    assert ".local" not in ptx  # no local arrays
    # the binary search's 28 bytes (Triton 3.6) are the loader warp's (40 registers), outside the consumers' loops
    limit = spill_limit(28 if vec_b == 0 else 8, 228)
    assert kernel["registers"] == 168 and kernel["spill_stores"] <= limit, kernel | {"ptx": "..."}
    assert kernel["shared"] <= 227 * 1024


def test_gluon_ws_mla_kernel_compiles_as_a_2cta_cluster() -> None:
    """``MLAConfig.cluster`` (Triton >= 3.9): the same kernel on 2-CTA clusters of 128 heads, compiled for sm_90.
    Each latent box is loaded once for both CTAs (a multicast copy, issued by CTA 0), the consumers free ring slots
    on CTA 0's barriers (remote arrivals), and each CTA keeps the one-CTA kernel's registers and shared memory (its
    spills: 184 bytes, as measured with Triton 3.9's ptxas flags; the one-CTA kernel's 148)."""
    pytest.importorskip("triton.experimental.gluon")
    from gluon_compile import compile_for_hopper

    from kernel_switchboard_triton._common import gluon_clusters
    from kernel_switchboard_triton._mla_gluon_ws import PIECE_COLS

    if not gluon_clusters():
        pytest.skip("multi-CTA Gluon kernels need Triton >= 3.9")
    whole_in_each = [[0, 0]]
    boxes = {"ckv_desc": ("bfloat16", [64, 64], whole_in_each), "kpe_desc": ("bfloat16", [64, 64], whole_in_each)}
    kernel = compile_for_hopper("kernel_switchboard_triton._mla_gluon_ws", "mla_decode_ws_kernel", _MLA_GLUON_SIG,
                                boxes, {"PAGE_SIZE": 64, "NUM_SPLITS": 1, "DC": 512, "PIECE": PIECE_COLS, "CTAS": 2,
                                        "num_warps": 4}, 4, maxnreg=168, num_ctas=2)
    ptx = kernel["ptx"]
    assert ".reqnctapercluster 2" in ptx
    assert ptx.count("multicast::cluster") == 2 * 9  # every box of the full and partial tiles, multicast
    assert "mbarrier.arrive.shared::cluster" in ptx  # slots freed on CTA 0's barriers
    assert "m64n64k16" in ptx and "m64n256k16" in ptx  # 64 heads per CTA, as in one CTA
    assert kernel["registers"] == 168 and kernel["spill_stores"] <= 184, kernel | {"ptx": "..."}
    assert kernel["shared"] <= 227 * 1024
