"""Plans (plan/run), merge_states and the cascade helper."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.capability import FEATURES, Capability
from kernel_switchboard.reference import attention as ref_attention
from kernel_switchboard.testing.cases.attention import (
    AttnSpec,
    decode_case,
    indptr,
    mla_case,
    prefill_case,
    ragged_case,
    random_pages,
    write_positions,
)

F16, F32 = torch.float16, torch.float32


def _plan_kwargs(q: torch.Tensor, cache: ksb.PagedKVCache, **kw: Any) -> dict[str, Any]:
    return dict(num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=cache.head_dim,
                head_dim_v=cache.head_dim_v, dtype=q.dtype, kv_dtype=cache.dtype, layout=cache.layout,
                page_size=cache.page_size, **kw)


# -- plans --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(0, 9, 23)),
    AttnSpec(F16, "HND", 16, 4, 1, kv_lens=(30, 1), soft_cap=5.0, window=4, lse=True),
    AttnSpec(F32, "NHD", 1, 4, 2, kv_lens=(5, 12), kv_dtype=torch.float8_e4m3fn, lse=True),
], ids=lambda s: s.tag("plan"))
def test_plan_decode_run_equals_decode(spec: AttnSpec) -> None:
    case = decode_case(spec, "cpu")
    q, cache, table = case.args
    plan = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, **case.kwargs))
    assert plan.selection.kernel.id == "reference:decode" and plan.kernel is plan.selection.kernel
    want = ksb.attention.decode(q, cache, table, **case.kwargs)
    got = plan.run(q, cache)
    for g, w in zip(got if spec.lse else (got,), want if spec.lse else (want,)):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_plan_decode_writes_given_outputs_and_sees_in_place_table_updates() -> None:
    q, cache, table = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(17, 9, 23)), "cpu").args
    plan = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, return_lse=True))
    out, lse = torch.full((3, 4, 64), float("nan")), torch.full((3, 4), float("nan"))
    got, got_lse = plan.run(q, cache, out=out, lse=lse)
    assert got is out and got_lse is lse
    torch.testing.assert_close(out, ksb.attention.decode(q, cache, table))
    table.seq_lens.copy_(torch.tensor([3, 9, 1], dtype=torch.int32))  # shorter: inside the planned bound
    want = ksb.attention.decode(q, cache, ksb.PageTable(table.block_table, table.seq_lens.clone()))
    torch.testing.assert_close(plan.run(q, cache)[0], want)


@pytest.mark.parametrize("causal", [True, False])
def test_plan_prefill_run_equals_prefill(causal: bool) -> None:
    spec = AttnSpec(F32, "HND", 4, 4, 2, kv_lens=(7, 1, 20, 0), q_lens=(7, 1, 5, 0), causal=causal, window=6)
    q, qo, cache, table = prefill_case(spec, "cpu").args
    plan = ksb.attention.plan_prefill(table, qo, **_plan_kwargs(q, cache, causal=causal, window_left=6,
                                                                return_lse=True))
    assert plan.selection.kernel.id == "reference:prefill"
    assert "mixed_batch" in plan.problem.features and plan.params.max_q_len == 7
    out, lse = plan.run(q, cache)
    want, want_lse = ksb.attention.prefill(q, qo, cache, table, causal=causal, window_left=6, return_lse=True)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)


@pytest.mark.parametrize("causal", [True, False])
def test_plan_prefill_ragged_run_equals_prefill_ragged(causal: bool) -> None:
    spec = AttnSpec(F32, q_heads=4, kv_heads=2, head_dim=32, head_dim_v=16, kv_lens=(7, 1, 20, 0), q_lens=(7, 1, 5, 0),
                    causal=causal)
    q, k, v, qo, kv = ragged_case(spec, "cpu").args
    plan = ksb.attention.plan_prefill_ragged(qo, kv, num_q_heads=4, num_kv_heads=2, head_dim=32, head_dim_v=16,
                                             dtype=F32, causal=causal, logits_soft_cap=3.0, return_lse=True)
    assert plan.kernel.id == "reference:prefill_ragged"
    assert plan.params.max_q_len == 7 and plan.params.max_kv_len == 20 and "mixed_batch" in plan.problem.features
    out, lse = plan.run(q, k, v)
    want, want_lse = ksb.attention.prefill_ragged(q, k, v, qo, kv, causal=causal, logits_soft_cap=3.0, return_lse=True)
    torch.testing.assert_close(out, want, atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)
    with pytest.raises(ksb.InvalidArgumentError, match=r"k="):
        plan.run(q, k[:-1], v)
    with pytest.raises(ksb.InvalidArgumentError, match=r"kv_indptr\.shape"):
        ksb.attention.plan_prefill_ragged(qo, kv[:-1], num_q_heads=4, num_kv_heads=2, head_dim=32, dtype=F32)
    with pytest.raises(ksb.InvalidArgumentError, match=r"kv_indptr=.*non-decreasing"):
        ksb.attention.plan_prefill_ragged(qo, torch.tensor([0, 9, 3, 20, 28], dtype=torch.int32), num_q_heads=4,
                                          num_kv_heads=2, head_dim=32, dtype=F32, causal=False)


def test_lse_base2_plans_return_the_natural_lse_times_log2e() -> None:
    """``lse_base2=True``: every plan kind returns log2 of the softmax denominator (FlashInfer's LSE); the reference
    kernels write the natural log, so the plan converts after the run (a kernel with ``writes_lse_base2`` does not
    need it); the flag without ``return_lse`` or not a bool is refused by name."""
    from kernel_switchboard.ops.attention_runner import LOG2E, Base2LSE

    spec = AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(0, 9, 23), q_lens=(0, 3, 5))
    q, cache, table = decode_case(spec, "cpu").args
    natural = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, return_lse=True))
    base2 = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, return_lse=True, lse_base2=True))
    assert isinstance(base2._runner, Base2LSE) and not isinstance(natural._runner, Base2LSE)
    (o_e, l_e), (o_2, l_2) = natural.run(q, cache), base2.run(q, cache)
    torch.testing.assert_close(o_2, o_e, atol=0, rtol=0)
    torch.testing.assert_close(l_2, l_e * LOG2E, atol=0, rtol=1e-6)
    assert l_2[0].isneginf().all()  # an empty request stays -inf
    buf = torch.full_like(l_2, float("nan"))
    assert base2.run(q, cache, lse=buf)[1] is buf and torch.equal(buf, l_2)

    q, qo, cache, table = prefill_case(spec, "cpu").args
    kw = _plan_kwargs(q, cache, causal=True, return_lse=True)
    want = ksb.attention.plan_prefill(table, qo, **kw).run(q, cache)[1]
    got = ksb.attention.plan_prefill(table, qo, lse_base2=True, **kw).run(q, cache)[1]
    torch.testing.assert_close(got, want * LOG2E, atol=0, rtol=1e-6)

    q, k, v, qo, kv = ragged_case(spec, "cpu").args
    kw = dict(num_q_heads=4, num_kv_heads=2, head_dim=q.shape[2], dtype=F32, return_lse=True)
    want = ksb.attention.plan_prefill_ragged(qo, kv, **kw).run(q, k, v)[1]
    got = ksb.attention.plan_prefill_ragged(qo, kv, lse_base2=True, **kw).run(q, k, v)[1]
    torch.testing.assert_close(got, want * LOG2E, atol=0, rtol=1e-6)

    with pytest.raises(ksb.InvalidArgumentError, match=r"lse_base2=True.*unless return_lse=True"):
        ksb.attention.plan_prefill_ragged(qo, kv, lse_base2=True, **{**kw, "return_lse": False})
    with pytest.raises(ksb.InvalidArgumentError, match=r"lse_base2=1.*True or False"):
        ksb.attention.plan_prefill_ragged(qo, kv, lse_base2=1, **kw)


def test_plan_bad_arguments_name_the_argument() -> None:
    q, cache, table = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(5, 9)), "cpu").args
    good = _plan_kwargs(q, cache)
    bad = {
        "num_q_heads": dict(good, num_q_heads=3),
        "kv_dtype": dict(good, kv_dtype=torch.float16),
        "dtype": dict(good, dtype=torch.int8),
        "layout": dict(good, layout="NDH"),
        "page_size": dict(good, page_size=0),
        "max_kv_len": dict(good, max_kv_len=10**6),
        "window_left": dict(good, window_left=-5),
    }
    for name, kw in bad.items():
        with pytest.raises(ksb.InvalidArgumentError, match=name):
            ksb.attention.plan_decode(table, **kw)
    plan = ksb.attention.plan_decode(table, **good)
    with pytest.raises(ksb.InvalidArgumentError, match=r"q="):
        plan.run(q[:1], cache)
    with pytest.raises(ksb.InvalidArgumentError, match=r"cache="):
        plan.run(q, cache.to_layout("HND"))
    with pytest.raises(ksb.InvalidArgumentError, match=r"qo_indptr\.shape"):
        ksb.attention.plan_prefill(table, torch.tensor([0, 1], dtype=torch.int32), **good)


class _RunOnlyBackend:
    """A backend whose decode kernel has no ``plan``: the core wraps its ``run``."""

    calls = 0

    @ksb.hookimpl
    def ksb_backend(self) -> ksb.Backend:
        def run(q: torch.Tensor, cache: Any, table: Any, p: Any) -> Any:
            _RunOnlyBackend.calls += 1
            return ref_attention.decode(q, cache, table, p)

        def run_mla(*args: Any) -> Any:
            _RunOnlyBackend.calls += 1
            return ref_attention.mla_decode(*args)

        cap = Capability(devices=frozenset({"cpu"}), features=FEATURES)
        return ksb.Backend("runonly", kernels=[ksb.Kernel("attention.decode", "decode", "runonly", cap, run),
                                               ksb.Kernel("attention.mla_decode", "mla", "runonly", cap, run_mla)])


def test_plan_wraps_a_kernel_without_plan() -> None:
    plugin = _RunOnlyBackend()
    ksb.registry.register(plugin)
    try:
        q, cache, table = decode_case(AttnSpec(F16, "HND", 16, 4, 2, kv_lens=(5, 40)), "cpu").args
        plan = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, return_lse=True), backend="runonly")
        assert plan.kernel.id == "runonly:decode"
        out, lse = plan.run(q, cache)
        assert _RunOnlyBackend.calls == 1
        want, want_lse = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference")
        torch.testing.assert_close(out, want, atol=0, rtol=0)
        torch.testing.assert_close(lse, want_lse, atol=0, rtol=0)
    finally:
        ksb.registry.unregister(plugin)


# -- MLA decode plans ------------------------------------------------------------------------------------------
def _mla_plan(case: Any, **kw: Any) -> Any:
    q_nope, _, ckv, kpe, table = case.args
    return ksb.attention.plan_mla_decode(table, num_heads=q_nope.shape[1], head_dim_ckv=ckv.shape[2],
                                         head_dim_kpe=kpe.shape[2], dtype=q_nope.dtype, page_size=ckv.shape[1],
                                         **case.kwargs, **kw)


@pytest.mark.parametrize("case", [mla_case(F16, (0, 1, 37), 4, 16, "cpu"),
                                  mla_case(F32, (23, 40), 2, 1, "cpu", lse=True, seed=1)], ids=lambda c: c.id)
def test_plan_mla_decode_runs_every_layer_like_mla_decode(case: Any) -> None:
    """One plan per step; each layer passes its own pages (here a second set, NaN still in the unwritten slots) and
    gets what the eager op gives."""
    q_nope, q_pe, ckv, kpe, table = case.args
    plan = _mla_plan(case)
    assert plan.kernel.id == "reference:mla_decode" and "MLADecodePlan" in repr(plan)
    lse = case.kwargs.get("return_lse", False)
    layer2 = (ckv.roll(1, dims=2), kpe * -0.5)
    for pages in ((ckv, kpe), layer2):
        want = ksb.attention.mla_decode(q_nope, q_pe, *pages, table, **case.kwargs)
        got = plan.run(q_nope, q_pe, *pages)
        for g, w in zip(got if lse else (got,), want if lse else (want,)):
            torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_plan_mla_decode_writes_given_outputs_and_sees_in_place_table_updates() -> None:
    case = mla_case(F32, (17, 9, 23), 4, 16, "cpu", lse=True, seed=3)
    q_nope, q_pe, ckv, kpe, table = case.args
    plan = _mla_plan(case)
    out, lse = torch.full((3, 4, 512), float("nan")), torch.full((3, 4), float("nan"))
    got, got_lse = plan.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    assert got is out and got_lse is lse
    torch.testing.assert_close((out, lse), ksb.attention.mla_decode(q_nope, q_pe, ckv, kpe, table, **case.kwargs))
    table.seq_lens.copy_(torch.tensor([3, 9, 1], dtype=torch.int32))  # shorter: inside the planned bound
    want = ksb.attention.mla_decode(q_nope, q_pe, ckv, kpe, ksb.PageTable(table.block_table, table.seq_lens.clone()),
                                    **case.kwargs)
    torch.testing.assert_close(plan.run(q_nope, q_pe, ckv, kpe), want)


def test_plan_mla_decode_bad_arguments_name_the_argument() -> None:
    case = mla_case(F16, (5, 9), 4, 16, "cpu")
    q_nope, q_pe, ckv, kpe, table = case.args
    good = dict(num_heads=4, head_dim_ckv=512, head_dim_kpe=64, dtype=F16, page_size=16)
    bad = {"num_heads": dict(good, num_heads=0), "head_dim_ckv": dict(good, head_dim_ckv=None),
           "dtype": dict(good, dtype=torch.int8), "page_size": dict(good, page_size=0),
           "max_kv_len": dict(good, max_kv_len=10**6)}
    for name, kw in bad.items():
        with pytest.raises(ksb.InvalidArgumentError, match=name):
            ksb.attention.plan_mla_decode(table, **kw)
    with pytest.raises(ksb.InvalidArgumentError, match="table"):
        ksb.attention.plan_mla_decode(table.block_table, **good)
    plan = ksb.attention.plan_mla_decode(table, **good)
    wrong = {"q_nope": (q_nope[:1], q_pe, ckv, kpe), "q_pe": (q_nope, q_pe.float(), ckv, kpe),
             "ckv_pages": (q_nope, q_pe, ckv[:, :8], kpe), "kpe_pages": (q_nope, q_pe, ckv, kpe[1:])}
    for name, args in wrong.items():
        with pytest.raises(ksb.InvalidArgumentError, match=f"{name}="):
            plan.run(*args)


def test_plan_mla_decode_of_several_new_tokens_per_request() -> None:
    """``q_len=T``: queries (B, T, H, D) as in the eager op, over the rows the plan rewrites from the table at every
    run (in-place seq_lens updates seen); given outputs of (B, T, ...) shape are written."""
    case = mla_case(F32, (17, 1, 23), 4, 16, "cpu", lse=True, seed=6)
    _, _, ckv, kpe, table = case.args
    g = torch.Generator().manual_seed(8)
    qn, qp = torch.randn(3, 2, 4, 512, generator=g), torch.randn(3, 2, 4, 64, generator=g)
    plan = _mla_plan(case, q_len=2)
    for lens in ((17, 1, 23), (16, 1, 5)):  # shorter in place: the slots past the case's lengths hold NaN
        table.seq_lens.copy_(torch.tensor(lens, dtype=torch.int32))
        want = ksb.attention.mla_decode(qn, qp, ckv, kpe, ksb.PageTable(table.block_table, table.seq_lens.clone()),
                                        **case.kwargs)
        torch.testing.assert_close(plan.run(qn, qp, ckv, kpe), want, atol=0, rtol=0)
    out, lse = torch.full((3, 2, 4, 512), float("nan")), torch.full((3, 2, 4), float("nan"))
    assert plan.run(qn, qp, ckv, kpe, out=out, lse=lse)[0] is out
    torch.testing.assert_close((out, lse), want, atol=0, rtol=0)
    wrong = {"q_nope": (qn[:, :1], qp), "q_pe": (qn, qp[:, :, :2])}
    for name, (a, b) in wrong.items():
        with pytest.raises(ksb.InvalidArgumentError, match=f"{name}="):
            plan.run(a, b, ckv, kpe)
    with pytest.raises(ksb.InvalidArgumentError, match="q_nope="):  # B and T do not merge without a copy
        plan.run(qn.transpose(0, 1).contiguous().transpose(0, 1), qp, ckv, kpe)
    with pytest.raises(ksb.InvalidArgumentError, match="out="):
        plan.run(qn, qp, ckv, kpe, out=out[:, :1])
    with pytest.raises(ksb.InvalidArgumentError, match="q_len"):
        _mla_plan(case, q_len=0)


def test_plan_mla_decode_wraps_a_kernel_without_plan() -> None:
    plugin = _RunOnlyBackend()
    ksb.registry.register(plugin)
    try:
        case = mla_case(F16, (5, 40), 4, 16, "cpu", lse=True, seed=4)
        plan = _mla_plan(case, backend="runonly")
        assert plan.kernel.id == "runonly:mla"
        before = _RunOnlyBackend.calls
        out, lse = plan.run(*case.args[:4])
        assert _RunOnlyBackend.calls == before + 1
        want = ksb.attention.mla_decode(*case.args, **case.kwargs, backend="reference")
        torch.testing.assert_close((out, lse), want, atol=0, rtol=0)
    finally:
        ksb.registry.unregister(plugin)


# -- merge_states ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [F32, F16])
def test_merging_two_halves_equals_the_whole(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(6, 4, 32, generator=g).to(dtype)
    k = torch.randn(21, 2, 32, generator=g).to(dtype)
    v = torch.randn(21, 2, 32, generator=g).to(dtype)
    qo = torch.tensor([0, 6], dtype=torch.int32)

    def part(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        kv = torch.tensor([0, hi - lo], dtype=torch.int32)
        out, lse = ksb.attention.prefill_ragged(q, k[lo:hi], v[lo:hi], qo, kv, causal=False, logits_soft_cap=7.0,
                                                return_lse=True)
        return out, lse

    out, lse = ksb.attention.merge_states(*part(0, 8), *part(8, 21))
    whole, whole_lse = part(0, 21)
    tol = 1e-5 if dtype == F32 else 2e-3
    torch.testing.assert_close(out, whole, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, whole_lse, atol=1e-5, rtol=1e-5)


def test_merge_with_empty_states() -> None:
    o_a, o_b = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    lse_a = torch.tensor([[1.0, float("-inf"), float("-inf")]] * 2)
    lse_b = torch.tensor([[float("-inf"), 2.0, float("-inf")]] * 2)
    out, lse = ksb.attention.merge_states(o_a, lse_a, o_b, lse_b)
    torch.testing.assert_close(out[:, 0], o_a[:, 0])
    torch.testing.assert_close(out[:, 1], o_b[:, 1])
    assert torch.all(out[:, 2] == 0)
    torch.testing.assert_close(lse, torch.tensor([[1.0, 2.0, float("-inf")]] * 2))


# -- cascade ------------------------------------------------------------------------------------------------------
def _shared_prefix(dtype: torch.dtype, layout: str, q_lens: list[int], suffix_lens: list[int]) -> tuple[Any, ...]:
    """A cache holding one shared 12-token prefix (3 pages of 4) and each request's own suffix pages."""
    g = torch.Generator().manual_seed(7)
    ps, prefix = 4, 12
    suffix_pages = [(n + ps - 1) // ps for n in suffix_lens]
    num_pages = 3 + sum(suffix_pages) + 2
    perm = torch.randperm(num_pages, generator=g).tolist()
    shared, rest = perm[:3], perm[3:]
    own, start = [], 0
    for n in suffix_pages:
        own.append(rest[start:start + n])
        start += n
    width = max(suffix_pages)
    k = random_pages(g, num_pages, ps, 2, 32, dtype)
    v = random_pages(g, num_pages, ps, 2, 32, dtype)
    if layout == "HND":
        k, v = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
    cache = ksb.PagedKVCache(k, v, layout)
    suffix_table = ksb.PageTable(torch.tensor([p + [0] * (width - len(p)) for p in own], dtype=torch.int32),
                                 torch.tensor(suffix_lens, dtype=torch.int32))
    prefix_table = ksb.PageTable(torch.tensor([shared], dtype=torch.int32), torch.tensor([prefix], dtype=torch.int32))
    full_table = ksb.PageTable(torch.tensor([shared + p + [0] * (width - len(p)) for p in own], dtype=torch.int32),
                               torch.tensor([prefix + n for n in suffix_lens], dtype=torch.int32))
    q = torch.randn(sum(q_lens), 4, 32, generator=g).to(dtype)
    return q, indptr(q_lens, "cpu"), cache, prefix_table, suffix_table, full_table


@pytest.mark.parametrize(("dtype", "layout", "q_lens", "suffix_lens", "cap"), [
    (F32, "NHD", [1, 1, 1], [5, 1, 9], None),  # decode with a shared system prompt
    (F32, "HND", [3, 1, 6], [3, 4, 9], 6.0),  # prefill / append
    (F16, "NHD", [2, 5], [7, 5], None),
])
def test_cascade_equals_plain_attention(dtype: torch.dtype, layout: str, q_lens: list[int], suffix_lens: list[int],
                                        cap: float | None) -> None:
    q, qo, cache, prefix_table, suffix_table, full_table = _shared_prefix(dtype, layout, q_lens, suffix_lens)
    out, lse = ksb.attention.cascade(q, qo, cache, prefix_table, suffix_table, logits_soft_cap=cap, return_lse=True)
    want, want_lse = ksb.attention.prefill(q, qo, cache, full_table, logits_soft_cap=cap, return_lse=True)
    tol = 1e-5 if dtype == F32 else 2e-3
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)
    only_out = ksb.attention.cascade(q, qo, cache, prefix_table, suffix_table, logits_soft_cap=cap)
    torch.testing.assert_close(only_out, out, atol=0, rtol=0)


def test_cascade_rejects_a_prefix_table_of_several_requests() -> None:
    q, qo, cache, _, suffix_table, full_table = _shared_prefix(F32, "NHD", [1, 1], [2, 3])
    with pytest.raises(ksb.InvalidArgumentError, match="prefix_table"):
        ksb.attention.cascade(q, qo, cache, full_table, suffix_table)


# -- GPU: capture -------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", None])
def test_decode_plan_is_captured_and_replays_with_new_inputs(backend: str | None) -> None:
    """The reference plan (and whatever a plain plan selects) captures into a CUDA graph and sees new
    q values and in-place seq_lens updates at replay."""
    spec = AttnSpec(torch.bfloat16, "HND", 16, 32, 8, 128, kv_lens=(300, 1, 77, 1024), lse=True)
    q, cache, table = decode_case(spec, "cuda").args
    plan = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, return_lse=True), backend=backend)
    assert "cuda_graph" in plan.problem.features
    static_q = q.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run(static_q, cache)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = plan.run(static_q, cache)
    static_q.copy_(torch.randn_like(q))
    write_positions(cache, table, 2, 77, 80)  # request 2 grows by three appended tokens
    table.seq_lens.copy_(torch.tensor([299, 0, 80, 512], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    new_table = ksb.PageTable(table.block_table, table.seq_lens.clone())
    want, want_lse = ksb.attention.decode(static_q, cache, new_table, return_lse=True, backend="reference")
    tol = 0 if backend == "reference" else 2e-2
    torch.testing.assert_close(out, want, atol=tol, rtol=tol)
    torch.testing.assert_close(lse, want_lse, atol=tol, rtol=tol)


@pytest.mark.gpu
@pytest.mark.parametrize(("backend", "q_len"), [("reference", 1), (None, 1), (None, 2)])
def test_mla_decode_plan_is_captured_and_replays_with_new_inputs(backend: str | None, q_len: int) -> None:
    """An MLA plan (what a plain plan selects: the Triton kernel on sm_90, several splits) captures into a CUDA
    graph with two layers' pages and sees new queries and in-place seq_lens updates at replay; with ``q_len=2``
    the rows table is rewritten inside the graph."""
    case = mla_case(torch.bfloat16, (300, 1, 77, 1024), 128, 64, "cuda", lse=True, seed=5)
    q_nope, q_pe, ckv, kpe, table = case.args
    if q_len > 1:
        q_nope, q_pe = (torch.stack([q, q.flip(1)], dim=1) for q in (q_nope, q_pe))
    ckv2, kpe2 = torch.randn_like(ckv), torch.randn_like(kpe)  # a second layer
    plan = _mla_plan(case, backend=backend, q_len=q_len)
    assert "cuda_graph" in plan.problem.features
    qn, qp = q_nope.clone(), q_pe.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        plan.run(qn, qp, ckv, kpe)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [plan.run(qn, qp, c, k) for c, k in ((ckv, kpe), (ckv2, kpe2))]
    qn.copy_(torch.randn_like(qn))
    qp.copy_(torch.randn_like(qp))
    table.seq_lens.copy_(torch.tensor([299, 0, 64, 1024], dtype=torch.int32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    new_table = ksb.PageTable(table.block_table, table.seq_lens.clone())
    tol = 0 if backend == "reference" else 2e-2
    for (out, lse), pages in zip(outs, ((ckv, kpe), (ckv2, kpe2))):
        want, want_lse = ksb.attention.mla_decode(qn, qp, *pages, new_table, **case.kwargs, backend="reference")
        torch.testing.assert_close(out, want, atol=tol, rtol=tol)
        torch.testing.assert_close(lse, want_lse, atol=tol, rtol=tol)


@pytest.mark.gpu
def test_eager_decode_under_capture_selects_a_capturable_kernel() -> None:
    spec = AttnSpec(torch.float16, "NHD", 16, 8, 2, 64, kv_lens=(33, 5))
    q, cache, table = decode_case(spec, "cuda").args
    ksb.attention.decode(q, cache, table)  # checks the table once, outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ksb.attention.decode(q, cache, table)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ksb.attention.decode(q, cache, table)
    graph.replay()
    torch.cuda.synchronize()
    want = ksb.attention.decode(q, cache, table, backend="reference")
    torch.testing.assert_close(out, want, atol=2e-3, rtol=2e-3)


def test_plan_kwargs_spec_roundtrip() -> None:
    """The plan's AttnParams mirror the arguments."""
    q, cache, table = decode_case(replace(AttnSpec(F32, kv_lens=(4, 9))), "cpu").args
    plan = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache, sm_scale=0.25, logits_soft_cap=3.0,
                                                           window_left=2, return_lse=True))
    p = plan.params
    assert (p.sm_scale, p.logits_soft_cap, p.window_left, p.return_lse, p.max_kv_len) == (0.25, 3.0, 2, True, 9)
