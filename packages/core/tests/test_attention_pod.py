"""``attention.pod`` (prefill and decode requests in one launch) and ``plan_pod``: the definition (prefill of the
prefill part and decode of the decode part over one cache), validation, plans and explain."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import KernelResultError
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases.attention import AttnSpec, pod_case

F16, F32 = torch.float16, torch.float32
test_reference_conformance = conformance_test("reference", device="cpu", size="small", ops=("attention.pod",))

SPEC = AttnSpec(F32, "HND", 4, 4, 2, kv_lens=(20, 7), q_lens=(6, 7), lse=True)


def _case(spec: AttnSpec = SPEC, decode: tuple[int, ...] = (9, 0, 33), seed: int = 0) -> Any:
    return pod_case(spec, decode, "cpu", seed)


@pytest.mark.parametrize("kw", [dict(causal=True), dict(causal=False), dict(logits_soft_cap=5.0, window_left=4)],
                         ids=str)
def test_pod_is_prefill_of_the_prefill_part_and_decode_of_the_decode_part(kw: dict[str, Any]) -> None:
    q, qo, q_decode, cache, prefill_table, decode_table = _case().args
    out_p, out_d, lse_p, lse_d = ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, return_lse=True,
                                                   **kw)
    want_p = ksb.attention.prefill(q, qo, cache, prefill_table, return_lse=True, **kw)
    decode_kw = {k: v for k, v in kw.items() if k != "causal"}
    want_d = ksb.attention.decode(q_decode, cache, decode_table, return_lse=True, **decode_kw)
    for got, want in ((out_p, want_p[0]), (lse_p, want_p[1]), (out_d, want_d[0]), (lse_d, want_d[1])):
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    plain = ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, **kw)
    assert len(plain) == 2 and torch.equal(plain[0], out_p) and torch.equal(plain[1], out_d)


def test_pod_explain_names_both_parts() -> None:
    case = _case(replace(SPEC, dtype=F16, kv_dtype=torch.float8_e4m3fn))
    problem = ksb.explain("attention.pod", *case.args, **case.kwargs).problem
    assert (problem.batch, problem.decode_batch, problem.max_q_len, problem.max_kv_len) == (2, 4, 8, 64)
    assert {"paged", "causal", "fp8_kv", "return_lse"} <= problem.features


def test_pod_bad_inputs_name_the_argument() -> None:
    q, qo, q_decode, cache, prefill_table, decode_table = _case().args
    bad: list[tuple[str, tuple[Any, ...]]] = [
        ("q_decode", (q, qo, q_decode[:, :2], cache, prefill_table, decode_table)),
        ("q_decode", (q, qo, q_decode.half(), cache, prefill_table, decode_table)),
        (r"decode_table\.batch_size", (q, qo, q_decode[:2], cache, prefill_table, decode_table)),
        ("decode_table", (q, qo, q_decode, cache, prefill_table, "table")),
        (r"qo_indptr\.shape", (q, qo[:2], q_decode, cache, prefill_table, decode_table)),
        ("qo_indptr", (q[:5], qo, q_decode, cache, prefill_table, decode_table)),
        ("cache", (q, qo, q_decode, "cache", prefill_table, decode_table)),
        (r"q\.shape", (q[..., :32], qo, q_decode[..., :32], cache, prefill_table, decode_table)),
    ]
    for match, args in bad:
        with pytest.raises(ksb.InvalidArgumentError, match=match):
            ksb.attention.pod(*args)


def _plan(case: Any, **kw: Any) -> Any:
    q, qo, _, cache, prefill_table, decode_table = case.args
    return ksb.attention.plan_pod(prefill_table, qo, decode_table, num_q_heads=q.shape[1],
                                  num_kv_heads=cache.num_kv_heads, head_dim=q.shape[2], dtype=q.dtype,
                                  kv_dtype=cache.dtype, layout=cache.layout, page_size=cache.page_size,
                                  **{**case.kwargs, **kw})


def test_plan_pod_runs_every_layer_like_pod_and_sees_table_updates() -> None:
    case = _case()
    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    plan = _plan(case)
    assert plan.kernel.id == "reference:pod" and "PODPlan" in repr(plan)
    for layer in range(2):
        layer_cache = ksb.PagedKVCache(cache.k_pages * (layer + 1), cache.v_pages, cache.layout)
        got = plan.run(q, q_decode, layer_cache)
        want = ksb.attention.pod(q, qo, q_decode, layer_cache, prefill_table, decode_table, **case.kwargs)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    decode_table.seq_lens[0] -= 3  # a shorter decode request, written in place: the plan reads the table each run
    want = ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, **case.kwargs)
    got = plan.run(q, q_decode, cache)
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)
    bufs = dict(out_prefill=torch.empty_like(q), out_decode=torch.empty_like(q_decode),
                lse_prefill=torch.empty(q.shape[:2]), lse_decode=torch.empty(q_decode.shape[:2]))
    got = plan.run(q, q_decode, cache, **bufs)
    assert all(a is b for a, b in zip(got, bufs.values()))
    with pytest.raises(ksb.InvalidArgumentError, match="q_decode"):
        plan.run(q, q_decode[:2], cache)
    with pytest.raises(ksb.InvalidArgumentError, match="out_decode"):
        plan.run(q, q_decode, cache, out_decode=q_decode[:1])
    with pytest.raises(ksb.InvalidArgumentError, match="cache"):
        plan.run(q, q_decode, cache.to_layout("NHD"))


def test_plan_pod_validates_its_arguments() -> None:
    _, qo, _, _, prefill_table, decode_table = _case().args
    with pytest.raises(ksb.InvalidArgumentError, match="decode_table"):
        ksb.attention.plan_pod(prefill_table, qo, "table", num_q_heads=4, num_kv_heads=2, head_dim=64, dtype=F32,  # type: ignore[arg-type]
                               page_size=4)
    with pytest.raises(ksb.InvalidArgumentError, match=r"qo_indptr\.shape"):
        ksb.attention.plan_pod(prefill_table, qo[:2], decode_table, num_q_heads=4, num_kv_heads=2, head_dim=64,
                               dtype=F32, page_size=4)
    with pytest.raises(ksb.InvalidArgumentError, match="num_q_heads"):
        ksb.attention.plan_pod(prefill_table, qo, decode_table, num_q_heads=3, num_kv_heads=2, head_dim=64, dtype=F32,
                               page_size=4)


def test_torch_compile_fullgraph_traces_pod_and_opcheck() -> None:
    case = _case(replace(SPEC, kv_dtype=torch.float8_e4m3fn))
    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    tensors = ksb.PagedKVCache(cache.k_pages, cache.v_pages, cache.layout, torch.tensor([0.5, 2.0]), torch.tensor(1.5))

    def step(qp: torch.Tensor, qd: torch.Tensor, return_lse: bool) -> Any:
        return ksb.attention.pod(qp, qo, qd, tensors, prefill_table, decode_table, sm_scale=0.25,
                                 return_lse=return_lse)

    for return_lse in (True, False):
        got = torch.compile(step, fullgraph=True, backend="eager")(q, q_decode, return_lse)
        want = step(q, q_decode, return_lse)
        assert len(got) == len(want) == (4 if return_lse else 2)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    # opcheck's schema test compares tensors with ops that CPU fp8 lacks: the float cache here, every test
    q, qo, q_decode, cache, prefill_table, decode_table = _case().args
    flat = (q, qo, q_decode, cache.k_pages, cache.v_pages, cache.layout, None, None, None, None,
            prefill_table.block_table, prefill_table.seq_lens, None, decode_table.block_table, decode_table.seq_lens,
            None, True, 0.25, None, None, True, None)
    torch.library.opcheck(torch.ops.ksb.attention_pod.default, flat)


class _WrongDecodeRows:
    """A third-party POD kernel (run only) whose decode output has one request too many."""

    @ksb.hookimpl
    def ksb_backend(self) -> ksb.Backend:
        from kernel_switchboard.capability import FEATURES
        from kernel_switchboard.reference.attention import pod as ref_pod

        def run(*args: Any) -> Any:
            out_p, out_d, lse_p, lse_d = ref_pod(*args)
            return out_p, torch.cat((out_d, out_d[:1])), lse_p, lse_d

        cap = ksb.Capability(devices=frozenset({"cpu"}), features=FEATURES)
        return ksb.Backend("wrongpod", kernels=[ksb.Kernel("attention.pod", "k", "wrongpod", cap, run)])


def test_a_third_party_pod_kernel_is_held_to_the_contract() -> None:
    plugin = _WrongDecodeRows()
    ksb.registry.register(plugin)
    try:
        q, qo, q_decode, cache, prefill_table, decode_table = _case().args
        with pytest.raises(KernelResultError, match=r"wrongpod:k \(attention\.pod\) returned output 1 with shape"):
            ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, backend="wrongpod")
    finally:
        ksb.registry.unregister(plugin)


@pytest.fixture
def costed_kernels():
    """The reference kernels of attention.pod, .prefill and .decode again, as backend "costed" with the cost
    estimates the test sets (reference kernels have none on a CPU, so plans never split without this)."""
    from kernel_switchboard import Backend, Kernel, hookimpl
    from kernel_switchboard.dispatch import clear_cache
    from kernel_switchboard.reference._cap import PER_REQUEST
    from kernel_switchboard.reference.attention import KERNELS

    costs = {"attention.pod": 1e-3, "attention.prefill": 1e-4, "attention.decode": 1e-4}
    kernels = [replace(k, backend="costed", priority=0, cost=lambda p, op=k.op: costs[op])
               for k in KERNELS if k.op in costs and k.op != "attention.pod"]

    def one_launch(*args: Any) -> Any:  # the POD kernel must not run where two plans are estimated faster
        if costs["attention.pod"] > costs["attention.prefill"] + costs["attention.decode"]:
            raise AssertionError("the POD kernel ran although two plans were estimated faster")
        return next(k for k in KERNELS if k.op == "attention.pod").run(*args)

    kernels.append(Kernel("attention.pod", "pod", "costed", PER_REQUEST, one_launch, cost=lambda p: costs["attention.pod"]))

    class Plugin:
        __name__ = "test_costed"

        @hookimpl
        def ksb_backend(self) -> Backend:
            return Backend("costed", "1.0", kernels)

    plugin = Plugin()
    ksb.registry.register(plugin)
    yield costs
    ksb.registry.unregister(plugin)
    clear_cache()


def test_plan_pod_runs_as_two_plans_where_their_estimates_add_up_to_less(costed_kernels: dict[str, float]) -> None:
    from kernel_switchboard.dispatch import clear_cache

    case = _case()
    q, qo, q_decode, cache, prefill_table, decode_table = case.args
    want = ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, return_lse=True, backend="reference")
    plan = _plan(case, return_lse=True)
    assert plan.kernel.id == "switchboard:two-plans(costed:prefill then costed:decode)"
    assert "est. 200.0 us, below one launch of costed:pod (est. 1000.0 us)" in str(plan.selection)
    for got, expected in zip(plan.run(q, q_decode, cache), want):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    out_p, out_d = torch.empty_like(want[0]), torch.empty_like(want[1])
    plan.run(q, q_decode, cache, out_prefill=out_p, out_decode=out_d)  # into given buffers
    assert torch.equal(out_p, want[0]) and torch.equal(out_d, want[1])

    plain = _plan(case, return_lse=False)
    assert plain.kernel.id.startswith("switchboard:two-plans")
    got = plain.run(q, q_decode, cache)
    assert len(got) == 2 and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    eager = ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, return_lse=True)  # the same choice
    for got, expected in zip(eager, want):
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    with pytest.raises(AssertionError, match="POD kernel ran"):
        ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, backend="costed")

    assert _plan(case, backend="costed").kernel.id == "costed:pod"  # a named backend keeps one launch
    costed_kernels["attention.pod"] = 1e-4
    clear_cache()
    assert _plan(case).kernel.id == "costed:pod"  # one launch where it is estimated cheaper
    got = ksb.attention.pod(q, qo, q_decode, cache, prefill_table, decode_table, return_lse=True)
    for got_part, expected in zip(got, want):
        torch.testing.assert_close(got_part, expected, atol=0, rtol=0)
    with pytest.raises(RuntimeError, match="runs through its plan"):
        plan.kernel.run()
