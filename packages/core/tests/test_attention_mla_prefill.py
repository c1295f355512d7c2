"""``attention.mla_prefill`` (absorbed MLA over paged latent KV, several query tokens per request) and its plan.

The oracle shares no code with the reference: it reads each request's latents token by token with Python indexing
and writes the masked softmax out in float64, one query token at a time.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases.attention import indptr, latent_pages, mla_prefill_case

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

test_reference_conformance = conformance_test("reference", device="cpu", size="small", ops=("attention.mla_prefill",))


def _latents(ckv: torch.Tensor, kpe: torch.Tensor, table: ksb.PageTable, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Request b's keys [ckv, kpe] (L, Dc + Dr) and values ckv (L, Dc) in float64, token by token."""
    ps, n = ckv.shape[1], int(table.seq_lens[b])
    pages = table.block_table[b].tolist()
    keys = [torch.cat((ckv[pages[i // ps], i % ps], kpe[pages[i // ps], i % ps])).double() for i in range(n)]
    values = [ckv[pages[i // ps], i % ps].double() for i in range(n)]
    k = torch.stack(keys) if keys else torch.zeros(0, ckv.shape[2] + kpe.shape[2], dtype=torch.float64)
    v = torch.stack(values) if values else torch.zeros(0, ckv.shape[2], dtype=torch.float64)
    return k, v


def _oracle(case: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """out (Tq, H, Dc), lse (Tq, H) float64 of an ``attention.mla_prefill`` case."""
    q_nope, q_pe, qo_indptr, ckv, kpe, table = case.args
    scale, causal = case.kwargs["sm_scale"], case.kwargs["causal"]
    out = torch.zeros(q_nope.shape, dtype=torch.float64)
    lse = torch.full(q_nope.shape[:2], float("-inf"), dtype=torch.float64)
    bounds = qo_indptr.tolist()
    for b in range(table.batch_size):
        k, v = _latents(ckv, kpe, table, b)
        n, qo_len = k.shape[0], bounds[b + 1] - bounds[b]
        for i in range(qo_len):
            t = bounds[b] + i
            seen = n - qo_len + i + 1 if causal else n
            if seen <= 0:
                continue
            q = torch.cat((q_nope[t], q_pe[t]), dim=-1).double()  # (H, Dc + Dr)
            s = q @ k[:seen].T * scale
            lse[t] = torch.logsumexp(s, dim=-1)
            out[t] = torch.softmax(s, dim=-1) @ v[:seen]
    return out, lse


def _assert_matches(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), f"{what}: non-finite entries differ"
    torch.testing.assert_close(got.double()[finite], want[finite], atol=tol, rtol=tol, msg=what)


CASES = [
    mla_prefill_case(F32, (0, 9, 21), (0, 9, 5), 4, 4, "cpu", lse=True, dc=32, dr=8),
    mla_prefill_case(F32, (7, 1, 30), (1, 1, 30), 2, 1, "cpu", lse=True, seed=1, dc=32, dr=8),  # mixed batch
    mla_prefill_case(F32, (12, 3), (4, 3), 3, 8, "cpu", lse=True, causal=False, seed=2, dc=16, dr=8),
    mla_prefill_case(F32, (5, 8), (5, 8), 2, 4, "cpu", lse=True, causal=False, seed=3, dc=16, dr=8),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_mla_prefill_matches_the_token_by_token_oracle(case: Any) -> None:
    out, lse = ksb.attention.mla_prefill(*case.args, **case.kwargs)
    want_out, want_lse = _oracle(case)
    _assert_matches(out, want_out, 1e-5, "out")
    _assert_matches(lse, want_lse, 1e-5, "lse")


def test_mla_prefill_of_one_token_per_request_is_mla_decode() -> None:
    case = mla_prefill_case(F32, (3, 9, 21), (1, 1, 1), 4, 4, "cpu", lse=True, dc=32, dr=8)
    q_nope, q_pe, _, ckv, kpe, table = case.args
    want = ksb.attention.mla_decode(q_nope, q_pe, ckv, kpe, table, sm_scale=case.kwargs["sm_scale"], return_lse=True)
    got = ksb.attention.mla_prefill(*case.args, **case.kwargs)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    problem = ksb.explain("attention.mla_prefill", *case.args, **case.kwargs).problem
    assert problem.max_q_len == 1 and "mixed_batch" not in problem.features


def test_mla_prefill_of_t_new_tokens_is_mla_decode_of_t_rows() -> None:
    """T new tokens per request: mla_prefill over qo_indptr = T * arange equals mla_decode's (B, T, H, D) form."""
    g = torch.Generator().manual_seed(5)
    ckv, kpe, table = latent_pages(g, (9, 4, 17), 4, F32, "cpu", dc=16, dr=8)
    t, h = 3, 2
    q_nope, q_pe = torch.randn(3, t, h, 16, generator=g), torch.randn(3, t, h, 8, generator=g)
    want = ksb.attention.mla_decode(q_nope, q_pe, ckv, kpe, table, sm_scale=0.3, return_lse=True)
    got = ksb.attention.mla_prefill(q_nope.flatten(0, 1), q_pe.flatten(0, 1), indptr([t] * 3, "cpu"), ckv, kpe, table,
                                    sm_scale=0.3, return_lse=True)
    torch.testing.assert_close(got[0].view(3, t, h, 16), want[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[1].view(3, t, h), want[1], atol=1e-6, rtol=1e-6)


def test_mla_prefill_explain_names_the_problem() -> None:
    case = mla_prefill_case(F16, (7, 1, 30), (7, 1, 30), 4, 16, "cpu", lse=True, dc=32, dr=8)
    sel = ksb.explain("attention.mla_prefill", *case.args, **case.kwargs)
    p = sel.problem
    assert (p.head_dim, p.head_dim_pe, p.num_q_heads, p.num_kv_heads, p.page_size) == (32, 8, 4, 1, 16)
    assert {"paged", "causal", "return_lse", "mixed_batch"} <= p.features
    assert "attention.mla_prefill" in str(sel) and "reference:mla_prefill" in str(sel)


def test_mla_prefill_bad_inputs_name_the_argument() -> None:
    case = mla_prefill_case(F32, (6, 9), (2, 9), 2, 4, "cpu", dc=16, dr=8)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    bad: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
        (r"q_pe\.dtype", (q_nope, q_pe.half(), qo, ckv, kpe, table), {}),
        (r"q_pe\.shape", (q_nope, q_pe[:, :1], qo, ckv, kpe, table), {}),
        (r"ckv_pages\.shape", (q_nope, q_pe, qo, ckv[..., :8], kpe, table), {}),
        (r"kpe_pages\.shape", (q_nope, q_pe, qo, ckv, kpe[:, :2], table), {}),
        (r"ckv_pages\.dtype", (q_nope, q_pe, qo, ckv.half(), kpe, table), {}),
        (r"qo_indptr\.shape", (q_nope, q_pe, qo[:2], ckv, kpe, table), {}),
        (r"qo_indptr\.dtype", (q_nope, q_pe, qo.long(), ckv, kpe, table), {}),
        ("qo_indptr", (q_nope, q_pe, torch.tensor([0, 2, 10], dtype=torch.int32), ckv, kpe, table), {}),
        ("qo_indptr", (q_nope, q_pe, torch.tensor([0, 7, 11], dtype=torch.int32), ckv, kpe, table), {}),
        ("table", (q_nope, q_pe, qo, ckv, kpe, "pages"), {}),
        ("sm_scale", (q_nope, q_pe, qo, ckv, kpe, table), {"sm_scale": -1.0}),
    ]
    for match, args, kwargs in bad:
        with pytest.raises(ksb.InvalidArgumentError, match=match):
            ksb.attention.mla_prefill(*args, **kwargs)
    # non-causal queries may outnumber the keys
    ksb.attention.mla_prefill(q_nope, q_pe, torch.tensor([0, 7, 11], dtype=torch.int32), ckv, kpe, table, causal=False)


def _plan(case: Any, **kw: Any) -> Any:
    q_nope, q_pe, qo, ckv, _, table = case.args
    return ksb.attention.plan_mla_prefill(table, qo, num_heads=q_nope.shape[1], head_dim_ckv=ckv.shape[2],
                                         head_dim_kpe=q_pe.shape[2], dtype=q_nope.dtype, page_size=ckv.shape[1],
                                         **{**case.kwargs, **kw})


def test_plan_mla_prefill_runs_every_layer_like_mla_prefill() -> None:
    case = mla_prefill_case(F32, (7, 1, 30), (3, 1, 30), 2, 4, "cpu", lse=True, dc=16, dr=8)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    plan = _plan(case)
    assert plan.kernel.id == "reference:mla_prefill" and "MLAPrefillPlan" in repr(plan)
    for layer in range(2):  # another layer: other pages, the same plan
        pages = (ckv * (layer + 1), kpe - layer)
        got = plan.run(q_nope, q_pe, *pages)
        want = ksb.attention.mla_prefill(q_nope, q_pe, qo, *pages, table, **case.kwargs)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    out, lse = torch.empty_like(q_nope), torch.empty(q_nope.shape[:2])
    got_out, got_lse = plan.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    assert got_out is out and got_lse is lse
    with pytest.raises(ksb.InvalidArgumentError, match="q_nope"):
        plan.run(q_nope[:5], q_pe[:5], ckv, kpe)
    with pytest.raises(ksb.InvalidArgumentError, match="ckv_pages"):
        plan.run(q_nope, q_pe, ckv[:2], kpe[:2])
    with pytest.raises(ksb.InvalidArgumentError, match="out"):
        plan.run(q_nope, q_pe, ckv, kpe, out=out[:1])


def test_plan_mla_prefill_validates_its_arguments() -> None:
    case = mla_prefill_case(F32, (7, 1), (3, 1), 2, 4, "cpu", dc=16, dr=8)
    qo, table = case.args[2], case.args[5]
    kw = dict(num_heads=2, head_dim_ckv=16, head_dim_kpe=8, dtype=F32, page_size=4)
    with pytest.raises(ksb.InvalidArgumentError, match="num_heads"):
        ksb.attention.plan_mla_prefill(table, qo, **{**kw, "num_heads": 0})
    with pytest.raises(ksb.InvalidArgumentError, match=r"qo_indptr\.shape"):
        ksb.attention.plan_mla_prefill(table, qo[:2], **kw)
    with pytest.raises(ksb.InvalidArgumentError, match="dtype"):
        ksb.attention.plan_mla_prefill(table, qo, **{**kw, "dtype": torch.int8})
    with pytest.raises(ksb.InvalidArgumentError, match="qo_indptr"):
        ksb.attention.plan_mla_prefill(table, torch.tensor([0, 9, 10], dtype=torch.int32), **kw)


def test_torch_compile_fullgraph_traces_mla_prefill_and_opcheck() -> None:
    case = mla_prefill_case(F32, (6, 9), (2, 9), 2, 4, "cpu", lse=True, dc=16, dr=8)
    q_nope, q_pe, qo, ckv, kpe, table = case.args

    def step(qn: torch.Tensor, qp: torch.Tensor) -> Any:
        return ksb.attention.mla_prefill(qn, qp, qo, ckv, kpe, table, sm_scale=0.25, return_lse=True)

    got = torch.compile(step, fullgraph=True, backend="eager")(q_nope, q_pe)
    torch.testing.assert_close(got, step(q_nope, q_pe), atol=0, rtol=0)
    torch.library.opcheck(torch.ops.ksb.attention_mla_prefill.default,
                          (q_nope, q_pe, qo, ckv, kpe, table.block_table, table.seq_lens, None, True, 0.25, True, None))


def test_example_builds_an_mla_prefill_case() -> None:
    from kernel_switchboard.testing.cases.attention import example

    case = example("attention.mla_prefill", "cpu", batch=2, kv_len=9, q_len=4, num_heads=2, head_dim=32,
                   head_dim_pe=8, page_size=4, lse=True)
    assert case.op == "attention.mla_prefill" and case.args[0].shape == (8, 2, 32)
    case.compare("reference")
    assert math.isclose(case.kwargs["sm_scale"], 1 / math.sqrt(192))
