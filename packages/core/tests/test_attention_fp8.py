"""fp8 attention: KV caches whose scales are device tensors (one for the cache or one per KV head) — validation, the
reference's dequantisation, the ``kv_scale_tensor`` feature that keeps float-only kernels out, plans, appends and
torch.compile — and prefill on float8_e4m3fn queries (``q_scale``, feature ``fp8_q``, bfloat16 out)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, hookimpl
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, prefill_case

E4M3, F32, BF16 = torch.float8_e4m3fn, torch.float32, torch.bfloat16
SPEC = AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(13, 30), q_lens=(5, 30), kv_dtype=E4M3, lse=True)


def _per_head(cache: ksb.PagedKVCache, k_scale: torch.Tensor, v_scale: torch.Tensor) -> ksb.PagedKVCache:
    return ksb.PagedKVCache(cache.k_pages, cache.v_pages, cache.layout, k_scale, v_scale)


def _dequantised(cache: ksb.PagedKVCache) -> ksb.PagedKVCache:
    """The same K/V in float32 pages: stored value x its head's scale."""
    def scale(s: Any) -> Any:
        return s.reshape(-1, 1) if isinstance(s, torch.Tensor) else s

    k, v = cache.k_pages.float() * scale(cache.k_scale), cache.v_pages.float() * scale(cache.v_scale)
    return ksb.PagedKVCache(k, v, cache.layout)


def test_scale_tensors_are_validated() -> None:
    cache = decode_case(SPEC, "cpu").args[1]
    k, v = cache.k_pages, cache.v_pages
    ksb.PagedKVCache(k, v, "NHD", torch.tensor([0.5, 2.0]), torch.tensor(1.0))
    for match, kw in [("k_scale.dtype", dict(k_scale=torch.tensor([1.0, 2.0], dtype=torch.float64))),
                      ("k_scale.shape", dict(k_scale=torch.ones(3))),
                      ("v_scale.shape", dict(v_scale=torch.ones(2, 1))),
                      ("k_scale", dict(k_scale=-1.0)),
                      ("k_scale", dict(k_scale=torch.ones(4)[::2]))]:
        with pytest.raises(ksb.InvalidArgumentError, match=match):
            ksb.PagedKVCache(k, v, "NHD", **kw)
    with pytest.raises(ksb.InvalidArgumentError, match="unless pages are fp8"):
        ksb.PagedKVCache(k.float(), v.float(), "NHD", torch.ones(2), None)


@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_per_head_scales_dequantise_each_head_by_its_own(op: str) -> None:
    case = (decode_case if op == "decode" else prefill_case)(SPEC, "cpu")
    args = list(case.args)
    i = 1 if op == "decode" else 2
    cache = _per_head(args[i], torch.tensor([0.5, 0.125]), torch.tensor([2.0, 0.25]))
    fn = getattr(ksb.attention, op)
    got = fn(*args[:i], cache, *args[i + 1:], **case.kwargs)
    want = fn(*args[:i], _dequantised(cache), *args[i + 1:], **case.kwargs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    one = _per_head(args[i], torch.tensor(0.5), torch.tensor(2.0))  # a () tensor: the float's result
    floats = fn(*args, **case.kwargs)
    for a, b in zip(fn(*args[:i], one, *args[i + 1:], **case.kwargs), floats):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_kernels_that_take_a_float_scale_are_refused_with_the_reason() -> None:
    q, cache, table = decode_case(SPEC, "cpu").args
    tensors = _per_head(cache, torch.ones(2), torch.ones(2))
    cap = Capability(devices=frozenset({"cpu"}), features=frozenset({"paged", "fp8_kv", "return_lse"}))

    @hookimpl
    def ksb_backend() -> Backend:
        from kernel_switchboard.reference.attention import decode

        return Backend("floatscale", "1", [Kernel("attention.decode", "d", "floatscale", cap, decode, priority=10)])

    plugin = types.SimpleNamespace(__name__="test_floatscale", ksb_backend=ksb_backend)
    ksb.registry.register(plugin)
    try:
        assert ksb.explain("attention.decode", q, cache, table).kernel.id == "floatscale:d"
        sel = ksb.explain("attention.decode", q, tensors, table)
        assert sel.kernel.id == "reference:decode" and "kv_scale_tensor" in sel.problem.features
        assert "features {kv_scale_tensor} not supported" in str(sel)
    finally:
        ksb.registry.unregister(plugin)


def test_plans_take_the_scale_form_they_were_made_for_and_read_the_scales_at_every_run() -> None:
    q, cache, table = decode_case(SPEC, "cpu").args
    k_scale, v_scale = torch.tensor([0.5, 0.25]), torch.tensor([2.0, 1.0])
    tensors = _per_head(cache, k_scale, v_scale)
    kw = dict(num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=F32, kv_dtype=E4M3, page_size=4, return_lse=True)
    plan = ksb.attention.plan_decode(table, kv_scale_tensor=True, **kw)
    assert "kv_scale_tensor" in plan.problem.features
    for a, b in zip(plan.run(q, tensors), ksb.attention.decode(q, tensors, table, return_lse=True)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    k_scale.mul_(2.0)  # a calibration writes the scales in place: the plan reads them at its next run
    for a, b in zip(plan.run(q, tensors), ksb.attention.decode(q, _dequantised(tensors), table, return_lse=True)):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    with pytest.raises(ksb.InvalidArgumentError, match="k_scale/v_scale"):
        plan.run(q, cache)
    with pytest.raises(ksb.InvalidArgumentError, match="kv_scale_tensor=False"):
        ksb.attention.plan_decode(table, **kw).run(q, tensors)


def test_append_quantises_each_head_by_its_scale() -> None:
    pages = torch.zeros(2, 4, 2, 8, dtype=E4M3)
    cache = ksb.PagedKVCache(pages, pages.clone(), "NHD", torch.tensor([0.5, 4.0]), torch.tensor(2.0))
    table = ksb.PageTable(torch.tensor([[0], [1]], dtype=torch.int32), torch.tensor([3, 3], dtype=torch.int32))
    k = torch.randn(2, 2, 8) * 8
    v = torch.randn(2, 2, 8)
    ksb.kv_cache.append(k, v, cache, table, torch.tensor([2, 2], dtype=torch.int32))
    want_k = (k * torch.tensor([2.0, 0.25]).reshape(-1, 1)).clamp(-448, 448).to(E4M3)
    assert torch.equal(cache.k_pages[:, 2].view(torch.uint8), want_k.view(torch.uint8))
    assert torch.equal(cache.v_pages[:, 2].view(torch.uint8), (v * 0.5).to(E4M3).view(torch.uint8))


def test_torch_compile_passes_scale_tensors_through_the_custom_op() -> None:
    q, cache, table = decode_case(SPEC, "cpu").args
    tensors = _per_head(cache, torch.tensor([0.5, 0.25]), torch.tensor(2.0))

    def step(x: torch.Tensor) -> Any:
        return ksb.attention.decode(x, tensors, table, return_lse=True)

    got = torch.compile(step, fullgraph=True, backend="eager")(q)
    for a, b in zip(got, step(q)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def _tensor_scale_append_case() -> tuple[ksb.PagedKVCache, ksb.PageTable, torch.Tensor, torch.Tensor, torch.Tensor]:
    pages = torch.zeros(3, 4, 2, 8, dtype=E4M3)
    cache = ksb.PagedKVCache(pages, pages.clone(), "NHD", torch.tensor([0.5, 4.0]), torch.tensor(2.0))
    table = ksb.PageTable(torch.tensor([[0, 2], [1, 0]], dtype=torch.int32), torch.tensor([6, 3], dtype=torch.int32))
    gen = torch.Generator().manual_seed(0)
    return cache, table, torch.randn(2, 2, 8, generator=gen) * 8, torch.randn(2, 2, 8, generator=gen), \
        torch.tensor([5, 2], dtype=torch.int32)


def _fresh(cache: ksb.PagedKVCache) -> ksb.PagedKVCache:
    return ksb.PagedKVCache(torch.zeros_like(cache.k_pages), torch.zeros_like(cache.v_pages), cache.layout,
                            cache.k_scale, cache.v_scale)


@pytest.mark.parametrize("op", ["append", "append_slots"])
def test_torch_compile_appends_into_a_cache_with_scale_tensors(op: str) -> None:
    cache, table, k, v, positions = _tensor_scale_append_case()
    slots = (table.block_table[torch.arange(2), positions.long() // 4] * 4 + positions % 4).to(torch.int32)

    def step(k: torch.Tensor, v: torch.Tensor, c: ksb.PagedKVCache) -> None:
        if op == "append":
            ksb.kv_cache.append(k, v, c, table, positions)
        else:
            ksb.kv_cache.append_slots(k, v, c, slots)

    compiled, eager = _fresh(cache), _fresh(cache)
    torch.compile(step, fullgraph=True, backend="aot_eager")(k, v, compiled)
    step(k, v, eager)
    assert torch.equal(compiled.k_pages.view(torch.uint8), eager.k_pages.view(torch.uint8))
    assert torch.equal(compiled.v_pages.view(torch.uint8), eager.v_pages.view(torch.uint8))
    want_k = (k * torch.tensor([2.0, 0.25]).reshape(-1, 1)).clamp(-448, 448).to(E4M3)  # each head by its own scale
    assert torch.equal(eager.k_pages[2, 1].view(torch.uint8), want_k[0].view(torch.uint8))
    assert torch.equal(eager.k_pages[1, 2].view(torch.uint8), want_k[1].view(torch.uint8))


def test_opcheck_appends_with_scale_tensors() -> None:
    """The fake, autograd registration and AOT dispatch of both appends with scale tensors (opcheck's schema test
    compares the fp8 pages with ops that CPU fp8 lacks; test_append_slots runs it on float pages)."""
    cache, table, k, v, positions = _tensor_scale_append_case()
    c = _fresh(cache)
    scales = (c.k_pages, c.v_pages, "NHD", None, None, c.k_scale, c.v_scale)
    tests = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(torch.ops.ksb.kv_cache_append.default,
                          (k, v, *scales, table.block_table, table.seq_lens, None, positions, None, True, None),
                          test_utils=tests)
    slots = torch.tensor([9, -1], dtype=torch.int32)
    torch.library.opcheck(torch.ops.ksb.kv_cache_append_slots.default, (k, v, *scales, slots, True, None),
                          test_utils=tests)


# -- fp8 queries ------------------------------------------------------------------------------------------------
FP8_Q = AttnSpec(BF16, "NHD", 4, 4, 2, kv_lens=(13, 30), q_lens=(5, 30), kv_dtype=E4M3, lse=True, q_fp8=True)


def test_fp8_queries_are_dequantised_by_q_scale_and_give_bfloat16() -> None:
    case = prefill_case(FP8_Q, "cpu")
    q8, qo, cache, table = case.args
    assert q8.dtype == E4M3 and case.kwargs["q_scale"] == 0.25
    out, lse = ksb.attention.prefill(*case.args, **case.kwargs)
    assert out.dtype == BF16
    want_out, want_lse = ksb.attention.prefill(q8.float() * 0.25, qo, cache, table, return_lse=True)
    torch.testing.assert_close(out, want_out.to(BF16), atol=0, rtol=0)
    torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=1e-6)
    problem = ksb.explain("attention.prefill", *case.args, **case.kwargs).problem
    assert problem.dtype == E4M3 and "fp8_q" in problem.features


def test_fp8_queries_are_validated() -> None:
    q8, qo, cache, table = prefill_case(FP8_Q, "cpu").args
    with pytest.raises(ksb.InvalidArgumentError, match="q_scale"):
        ksb.attention.prefill(q8, qo, cache, table)
    with pytest.raises(ksb.InvalidArgumentError, match="q_scale"):
        ksb.attention.prefill(q8, qo, cache, table, q_scale=-1.0)
    with pytest.raises(ksb.InvalidArgumentError, match="q_scale"):
        ksb.attention.prefill(q8.float(), qo, cache, table, q_scale=0.5)
    bf16_cache = ksb.PagedKVCache(cache.k_pages.to(BF16), cache.v_pages.to(BF16), "NHD")
    with pytest.raises(ksb.InvalidArgumentError, match="cache"):
        ksb.attention.prefill(q8, qo, bf16_cache, table, q_scale=0.5)
    with pytest.raises(ksb.InvalidArgumentError, match="dtype"):
        ksb.attention.decode(q8[:2], cache, ksb.PageTable(table.block_table, table.seq_lens))


def test_plan_prefill_on_fp8_queries_writes_bfloat16() -> None:
    case = prefill_case(FP8_Q, "cpu")
    q8, qo, cache, table = case.args
    plan = ksb.attention.plan_prefill(table, qo, num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=E4M3, kv_dtype=E4M3,
                                      page_size=4, q_scale=0.25, return_lse=True)
    assert "fp8_q" in plan.problem.features
    out = torch.empty(q8.shape, dtype=BF16)
    got = plan.run(q8, cache, out=out)
    assert got[0] is out
    for a, b in zip(got, ksb.attention.prefill(*case.args, **case.kwargs)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    with pytest.raises(ksb.InvalidArgumentError, match="out"):
        plan.run(q8, cache, out=torch.empty(q8.shape, dtype=F32))
    with pytest.raises(ksb.InvalidArgumentError, match="q_scale"):
        ksb.attention.plan_prefill(table, qo, num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=E4M3, kv_dtype=E4M3,
                                   page_size=4)


def test_torch_compile_traces_prefill_on_fp8_queries() -> None:
    case = prefill_case(FP8_Q, "cpu")
    q8, qo, cache, table = case.args

    def step(q: torch.Tensor) -> Any:
        return ksb.attention.prefill(q, qo, cache, table, q_scale=0.25, return_lse=True)

    got = torch.compile(step, fullgraph=True, backend="eager")(q8)
    assert got[0].dtype == BF16
    for a, b in zip(got, step(q8)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
