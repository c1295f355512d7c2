"""The way of one attention call through the core: how many core functions a warm eager decode enters, the runner
contract (eager = plan + run, run-only kernels wrapped), and what a plan checks of the cache it is given."""

from __future__ import annotations

import os
import sys
from typing import Any, ClassVar

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.capability import FEATURES, Capability
from kernel_switchboard.ops.attention_runner import RunOnly, buffers
from kernel_switchboard.reference import attention as ref_attention
from kernel_switchboard.spec import cache_of, table_of
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, mla_case

F32 = torch.float32
PACKAGE = os.path.dirname(ksb.__file__) + os.sep
KERNEL = os.path.join(PACKAGE, "reference") + os.sep


def _core_functions(call: Any) -> list[str]:
    """The core functions ``call()`` enters, in order: Python frames of kernel_switchboard's package, not counting
    the kernel (the reference backend's code and everything it calls)."""
    entered: list[str] = []
    in_kernel = 0

    def profile(frame: Any, event: str, _: Any) -> None:
        nonlocal in_kernel
        path = frame.f_code.co_filename
        if event == "call":
            if in_kernel:
                in_kernel += 1
            elif path.startswith(KERNEL):
                in_kernel = 1
            elif path.startswith(PACKAGE):
                entered.append(f"{path[len(PACKAGE):]}:{frame.f_code.co_qualname}")
        elif event == "return" and in_kernel:
            in_kernel -= 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered


def test_warm_eager_decode_passes_through_at_most_four_core_functions() -> None:
    """From ``ksb.attention.decode`` to the kernel's launch: the public function, the call's validation, the table's
    check and the selection; nothing else (cached builders are C-level lookups)."""
    q, cache, table = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(9, 23)), "cpu").args
    ksb.attention.decode(q, cache, table)  # the cold path: selection, parameters and problem cached
    entered = _core_functions(lambda: ksb.attention.decode(q, cache, table))
    assert entered == ["ops/attention.py:decode", "ops/attention_problems.py:decode_call",
                       "paged.py:PageTable.checked_max_seq_len", "dispatch.py:select"], entered


def test_run_only_runner_returns_the_kernels_outputs_or_copies_into_buffers() -> None:
    calls: list[int] = []
    result = (torch.ones(2, 3), torch.zeros(2))

    def call(*inputs: Any) -> Any:
        calls.append(len(inputs))
        return result

    runner = RunOnly(call)
    assert runner.run("q", "cache", None, None) == result  # nothing given: no copy
    out, lse = torch.empty(2, 3), torch.empty(2)
    got = runner.run("q", "cache", out, lse)
    assert got[0] is out and got[1] is lse and bool((out == 1).all()) and bool((lse == 0).all())
    got = runner.run("q", "cache", out, None)  # only out given: lse is the kernel's
    assert got[0] is out and got[1] is result[1]
    assert calls == [2, 2, 2]


def test_buffers_keeps_what_is_given_and_makes_the_rest() -> None:
    q = torch.randn(3, 4, 8, dtype=torch.float16)
    out, lse = buffers(None, None, q, (3, 4), 16, True)
    assert out.shape == (3, 4, 16) and out.dtype == torch.float16 and lse is not None and lse.dtype == F32
    given = torch.empty(3, 4, 16, dtype=torch.float16)
    assert buffers(given, None, q, (3, 4), 16, False) == (given, None)


# -- what a plan checks of the cache it is given ------------------------------------------------------------
def _plan_kwargs(q: torch.Tensor, cache: ksb.PagedKVCache) -> dict[str, Any]:
    return dict(num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=cache.head_dim, dtype=q.dtype,
                layout=cache.layout, page_size=cache.page_size)


class _NoSync:
    """Inside the block, reading a tensor back to the host fails: what runs there does no host synchronisation."""

    names = ("item", "tolist", "__bool__", "__int__", "__float__")

    def __enter__(self) -> None:
        self.saved = {n: getattr(torch.Tensor, n) for n in self.names}

        def refuse(*_: Any, **__: Any) -> Any:
            raise AssertionError("a host read inside plan.run")

        for n in self.names:
            setattr(torch.Tensor, n, refuse)

    def __exit__(self, *_: Any) -> None:
        for n, f in self.saved.items():
            setattr(torch.Tensor, n, f)


def test_plan_run_checks_the_cache_it_is_given_without_a_host_read() -> None:
    """Shape, dtype, device and page count (at least the pages the table used at plan time), each refused naming the
    argument, before any kernel runs and without reading the device."""
    q, cache, table = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(9, 23)), "cpu").args
    plan = ksb.attention.plan_decode(table, **_plan_kwargs(q, cache))
    used = int(table.block_table[table.seq_lens[:, None] > torch.arange(table.max_pages) * 4].max()) + 1
    assert cache.num_pages >= used
    few = ksb.PagedKVCache(cache.k_pages[: used - 1], cache.v_pages[: used - 1])
    elsewhere = ksb.PagedKVCache(cache.k_pages.to("meta"), cache.v_pages.to("meta"))
    other_dtype = ksb.PagedKVCache(cache.k_pages.half(), cache.v_pages.half())
    with _NoSync():
        with pytest.raises(ksb.InvalidArgumentError, match=rf"cache.num_pages=.*at least {used} pages"):
            plan.run(q, few)
        with pytest.raises(ksb.InvalidArgumentError, match=r"cache\.device="):
            plan.run(q, elsewhere)
        with pytest.raises(ksb.InvalidArgumentError, match="cache="):
            plan.run(q, other_dtype)
        with pytest.raises(ksb.InvalidArgumentError, match="cache="):
            plan.run(q, table)  # type: ignore[arg-type]
    just_enough = ksb.PagedKVCache(cache.k_pages[:used], cache.v_pages[:used])
    torch.testing.assert_close(plan.run(q, just_enough), ksb.attention.decode(q, cache, table))


def test_plan_mla_decode_checks_the_page_count_it_is_given() -> None:
    case = mla_case(F32, (17, 9, 23), 4, 16, "cpu", seed=3)
    q_nope, q_pe, ckv, kpe, table = case.args
    plan = ksb.attention.plan_mla_decode(table, num_heads=4, head_dim_ckv=512, head_dim_kpe=64, dtype=F32,
                                         page_size=16, **case.kwargs)
    used = table.pages_used(16)
    assert used is not None and ckv.shape[0] >= used
    with _NoSync(), pytest.raises(ksb.InvalidArgumentError, match=rf"ckv_pages.shape\[0\]=.*at least {used} pages"):
        plan.run(q_nope, q_pe, ckv[: used - 1], kpe[: used - 1])


def test_eager_decode_refuses_a_table_that_reads_past_the_cache() -> None:
    """The eager check of the same rule (reads the device once per table and cache size)."""
    q, cache, table = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(9, 23)), "cpu").args
    used = table.pages_used(4) or int(table.block_table.max()) + 1
    few = ksb.PagedKVCache(cache.k_pages[: used - 1], cache.v_pages[: used - 1])
    with pytest.raises(ksb.InvalidArgumentError, match="block_table"):
        ksb.attention.decode(q, few, table)


# -- the compiled path's records -----------------------------------------------------------------------------
def test_custom_op_reuses_the_cache_record_until_its_tensors_change() -> None:
    _, cache, _ = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(9,)), "cpu").args
    a = cache_of(cache.k_pages, cache.v_pages, "NHD", None, None)
    assert cache_of(cache.k_pages, cache.v_pages, "NHD", None, None) is a
    assert cache_of(cache.k_pages, cache.v_pages, "HND", None, None) is not a
    cache.k_pages.add_(0)  # an in-place write: a new record
    assert cache_of(cache.k_pages, cache.v_pages, "NHD", None, None) is not a


def test_compiled_decode_checks_its_table_once() -> None:
    """Under torch.compile the public function runs inside the custom op on records rebuilt from the tensors; the
    table's device check runs once, not at every compiled call."""
    q, cache, table = decode_case(AttnSpec(F32, "NHD", 4, 4, 2, kv_lens=(9, 23)), "cpu").args
    fn = torch.compile(lambda q, c, t: ksb.attention.decode(q, c, t) * 1, fullgraph=True, backend="aot_eager")
    want = ksb.attention.decode(q, cache, table)
    torch.testing.assert_close(fn(q, cache, table), want)
    rebuilt = table_of(table.block_table, table.seq_lens, table.max_seq_len)
    checks = len(rebuilt._checked)
    torch.testing.assert_close(fn(q, cache, table), want)
    assert table_of(table.block_table, table.seq_lens, table.max_seq_len) is rebuilt
    assert len(rebuilt._checked) == checks == 1


class _PlanningBackend:
    """A decode kernel with a plan that records its runners; its ``run`` refuses (an eager call must plan)."""

    runners: ClassVar[list[Any]] = []

    class Runner(ref_attention.DecodePlanRunner):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            _PlanningBackend.runners.append(self)

        def run(self, q: torch.Tensor, cache: Any, out: Any, lse: Any) -> Any:
            assert out is None and lse is None  # an eager call takes the runner's own outputs: no copy
            return super().run(q, cache, out, lse)

    @ksb.hookimpl
    def ksb_backend(self) -> ksb.Backend:
        def run(*_: Any) -> Any:
            raise AssertionError("an eager call of a kernel with a plan runs its plan")

        cap = Capability(devices=frozenset({"cpu"}), features=FEATURES)
        return ksb.Backend("planning", kernels=[ksb.Kernel("attention.decode", "decode", "planning", cap, run,
                                                           plan=_PlanningBackend.Runner)])


def test_eager_decode_is_the_kernels_plan_then_run() -> None:
    plugin = _PlanningBackend()
    ksb.registry.register(plugin)
    try:
        q, cache, table = decode_case(AttnSpec(F32, "HND", 4, 4, 2, kv_lens=(9, 23), lse=True), "cpu").args
        out, lse = ksb.attention.decode(q, cache, table, return_lse=True, backend="planning")
        assert len(_PlanningBackend.runners) == 1
        want = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference")
        torch.testing.assert_close((out, lse), want, atol=0, rtol=0)
    finally:
        ksb.registry.unregister(plugin)
