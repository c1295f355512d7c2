"""The Triton MLA prefill kernel (absorbed MLA over paged latent KV, several query tokens per request) against the
reference: under the interpreter on tiny shapes (CPU), at DeepSeek's shapes and in a CUDA graph on a GPU (``gpu``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import mla_prefill_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
F16, BF16 = torch.float16, torch.bfloat16


def _compare(case: Any) -> None:
    got = ksb.attention.mla_prefill(*case.args, **case.kwargs, backend="triton")
    want = ksb.attention.mla_prefill(*case.args, **case.kwargs, backend="reference")
    atol, rtol = tolerance(case.dtype)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert_close(g, w, atol=atol, rtol=rtol, what=case.id)


@pytest.mark.skipif(DEVICE != "cpu", reason="interpreter shapes")
@pytest.mark.parametrize(("dtype", "heads", "page_size", "kv_lens", "q_lens", "causal"), [
    (F16, 32, 16, (20, 3), (5, 3), True),  # 32 heads: two 16-row tiles per token
    (BF16, 3, 1, (30, 1, 11), (30, 1, 4), True),  # 3 heads: tiles straddle tokens; decode row; page size 1
    (F16, 4, 16, (9, 0), (13, 2), False),  # non-causal: more queries than keys, and no keys at all
], ids=str)
def test_mla_prefill_matches_reference_interpreted(dtype: torch.dtype, heads: int, page_size: int,
                                                   kv_lens: tuple[int, ...], q_lens: tuple[int, ...],
                                                   causal: bool) -> None:
    _compare(mla_prefill_case(dtype, kv_lens, q_lens, heads, page_size, DEVICE, lse=True, causal=causal, seed=7))


def test_mla_prefill_plan_serves_two_layers() -> None:
    case = mla_prefill_case(F16, (21, 4), (7, 1), 4, 16, DEVICE, lse=True, seed=3)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    plan = ksb.attention.plan_mla_prefill(table, qo, num_heads=4, head_dim_ckv=512, head_dim_kpe=64, dtype=F16,
                                         page_size=16, sm_scale=case.kwargs["sm_scale"], return_lse=True,
                                         capturable=False, backend="triton")
    assert plan.kernel.id == "triton:mla_prefill"
    for layer in range(2):
        pages = (ckv * (0.5 + layer), kpe)
        got = plan.run(q_nope, q_pe, *pages)
        want = ksb.attention.mla_prefill(q_nope, q_pe, qo, *pages, table, **case.kwargs, backend="reference")
        for g, w in zip(got, want):
            assert_close(g, w, atol=2e-3, rtol=2e-3, what=f"layer {layer}")


def test_mla_prefill_capability_refuses_what_the_kernel_does_not_do() -> None:
    case = mla_prefill_case(torch.float32, (9,), (3,), 2, 4, DEVICE)
    with pytest.raises(ksb.KernelUnavailableError, match="dtype=float32"):
        ksb.attention.mla_prefill(*case.args, **case.kwargs, backend="triton")
    case = mla_prefill_case(F16, (9,), (3,), 2, 4, DEVICE, dc=256)
    with pytest.raises(ksb.KernelUnavailableError, match="head_dim=256"):
        ksb.attention.mla_prefill(*case.args, **case.kwargs, backend="triton")


@pytest.mark.gpu
@pytest.mark.parametrize(("heads", "page_size", "dtype"), [(128, 64, BF16), (16, 64, BF16), (128, 1, F16),
                                                           (128, 16, BF16)], ids=str)
def test_mla_prefill_deepseek_shapes(heads: int, page_size: int, dtype: torch.dtype) -> None:
    """DeepSeek-V3's latent (512 + 64) at 128 heads and at 16 (8-way tensor parallelism): a chunk of a long prompt, an
    append, decode rows and a short prefill in one batch; outputs poisoned first, so a skipped row cannot pass."""
    case = mla_prefill_case(dtype, (3000, 700, 1, 257), (512, 300, 1, 257), heads, page_size, "cuda", lse=True,
                            seed=11)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    plan = ksb.attention.plan_mla_prefill(table, qo, num_heads=heads, head_dim_ckv=512, head_dim_kpe=64, dtype=dtype,
                                         page_size=page_size, sm_scale=case.kwargs["sm_scale"], return_lse=True,
                                         backend="triton")
    out = torch.full_like(q_nope, float("nan"))
    lse = torch.full(q_nope.shape[:2], float("nan"), device="cuda")
    plan.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    want = ksb.attention.mla_prefill(*case.args, **case.kwargs, backend="reference")
    atol, rtol = tolerance(dtype)
    assert_close(out, want[0], atol=atol, rtol=rtol, what="out")
    assert_close(lse, want[1], atol=atol, rtol=rtol, what="lse")


@pytest.mark.gpu
def test_mla_prefill_plan_cuda_graph_capture_and_replay() -> None:
    case = mla_prefill_case(BF16, (1500, 64, 1), (256, 64, 1), 128, 64, "cuda", lse=True, seed=13)
    q_nope, q_pe, qo, ckv, kpe, table = case.args
    plan = ksb.attention.plan_mla_prefill(table, qo, num_heads=128, head_dim_ckv=512, head_dim_kpe=64, dtype=BF16,
                                         page_size=64, sm_scale=case.kwargs["sm_scale"], return_lse=True,
                                         backend="triton")
    out, lse = plan.run(q_nope, q_pe, ckv, kpe)  # warm-up compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q_nope, q_pe, ckv, kpe, out=out, lse=lse)
    for step in range(2):
        q_nope.copy_(torch.randn_like(q_nope, dtype=torch.float32).to(BF16))
        ckv[int(table.block_table[0, step])].mul_(0.5)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = ksb.attention.mla_prefill(*case.args, **case.kwargs, backend="reference")
        assert_close(out, want[0], atol=2e-2, rtol=2e-2, what=f"replay {step}")
        assert_close(lse, want[1], atol=2e-2, rtol=2e-2, what=f"replay {step} lse")
