"""gemm.mm with a bias against float64 formulations: every dtype and layout, the compiled path, bad biases."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout", ["RR", "CR", "RC", "strided"])
def test_mm_with_bias_matches_float64(dtype: torch.dtype, layout: str) -> None:
    m, n, k = 23, 41, 35
    a = torch.randn(k, m).t() if layout[0] == "C" else torch.randn(m, k)
    b = torch.randn(n, k).t() if layout[1] == "C" else torch.randn(k, n)
    if layout == "strided":
        a, b = torch.randn(2 * m, k + 3)[::2, :k], torch.randn(k, 3 * n)[:, ::3]
    a, b = a.to(dtype), (b * k**-0.5).to(dtype)
    bias = (3.0 * torch.randn(n)).to(dtype)  # a bias as large as the product: a dropped bias fails at once
    want = a.double() @ b.double() + bias.double()
    got = ksb.gemm.mm(a, b, bias=bias)
    assert got.shape == (m, n) and got.dtype == dtype
    err = float((got.double() - want).abs().max() / want.abs().max())
    assert err < TOL[dtype], err
    plain = ksb.gemm.mm(a, b, backend="reference")
    torch.testing.assert_close(got, (plain.float() + bias.float()).to(dtype), rtol=0, atol=0)


def test_mm_with_bias_compiles_to_the_same_result() -> None:
    a, b, bias = torch.randn(9, 16), torch.randn(16, 12), torch.randn(12)

    def f(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return ksb.gemm.mm(a, b, bias=bias)

    got = torch.compile(f, fullgraph=True, backend="eager")(a, b, bias)
    torch.testing.assert_close(got, a @ b + bias, rtol=1e-5, atol=1e-5)


def test_explain_sees_the_biased_call() -> None:
    a, b, bias = torch.randn(4, 8), torch.randn(8, 6), torch.randn(6)
    sel = ksb.explain("gemm.mm", a, b, bias=bias)
    assert sel.kernel.op == "gemm.mm"


@pytest.mark.parametrize(("bias", "pattern"), [
    (torch.randn(7), r"bias\.shape.*\(7,\).*\(6,\)"),
    (torch.randn(6, 1), r"bias\.shape.*1-d"),
    (torch.randn(6, dtype=torch.float64), r"bias\.dtype.*float64.*float32"),
    ([0.0] * 6, r"bias.*list.*torch\.Tensor"),
])
def test_bad_bias_is_named(bias: object, pattern: str) -> None:
    with pytest.raises(ksb.InvalidArgumentError, match=pattern):
        ksb.gemm.mm(torch.randn(4, 8), torch.randn(8, 6), bias=bias)  # type: ignore[arg-type]
