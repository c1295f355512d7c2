"""Norm reference kernels against independent formulations, and the norm public API."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test

test_reference_conformance = conformance_test("reference", device="cpu", size="small",
                                              ops=("norm.rms_norm", "norm.fused_add_rms_norm", "norm.layer_norm"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rms_norm_matches_naive_loop(dtype: torch.dtype) -> None:
    x = torch.randn(3, 5, 16, dtype=torch.float32)
    w = torch.randn(16)
    y = ksb.norm.rms_norm(x, w, 1e-6)
    for idx in torch.cartesian_prod(torch.arange(3), torch.arange(5)):
        row = x[idx[0], idx[1]].double()
        rms = (sum(v * v for v in row.tolist()) / 16 + 1e-6) ** 0.5
        torch.testing.assert_close(y[idx[0], idx[1]].double(), row / rms * w.double(), rtol=1e-5, atol=1e-6)


def test_rms_norm_matches_torch() -> None:
    x, w = torch.randn(7, 64), torch.randn(64)
    torch.testing.assert_close(ksb.norm.rms_norm(x, w, 1e-5), torch.nn.functional.rms_norm(x, (64,), w, 1e-5))
    torch.testing.assert_close(ksb.norm.rms_norm(x, w, 1e-5, gemma=True),
                               torch.nn.functional.rms_norm(x, (64,), 1 + w, 1e-5))


def test_layer_norm_matches_torch() -> None:
    x, w, b = torch.randn(7, 64), torch.randn(64), torch.randn(64)
    torch.testing.assert_close(ksb.norm.layer_norm(x, w, b, 1e-5),
                               torch.nn.functional.layer_norm(x, (64,), w, b, 1e-5))


def test_fused_add_rms_norm_in_place() -> None:
    x, r, w = torch.randn(4, 32), torch.randn(4, 32), torch.randn(32)
    x0, r0 = x.clone(), r.clone()
    ksb.norm.fused_add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(r, x0 + r0)
    torch.testing.assert_close(x, torch.nn.functional.rms_norm(x0 + r0, (32,), w, 1e-6))


def test_bad_inputs_name_the_argument() -> None:
    x, w = torch.randn(4, 32), torch.randn(32)
    with pytest.raises(ksb.InvalidArgumentError, match=r"weight\.shape"):
        ksb.norm.rms_norm(x, torch.randn(31))
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.dtype"):
        ksb.norm.rms_norm(x.to(torch.int32), w)
    with pytest.raises(ksb.InvalidArgumentError, match=r"eps"):
        ksb.norm.rms_norm(x, w, eps=-1.0)
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.stride"):
        ksb.norm.rms_norm(torch.randn(32, 4).t(), w)
    with pytest.raises(ksb.InvalidArgumentError, match=r"residual"):
        ksb.norm.fused_add_rms_norm(x, torch.randn(4, 32).t().contiguous().t(), w)


def test_torch_compile_fullgraph_traces_norm_ops() -> None:
    x, w = torch.randn(4, 32), torch.randn(32)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return ksb.norm.rms_norm(x, w) * 2

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, w), f(x, w))


def test_opcheck_norm_ops() -> None:
    x, w, r = torch.randn(4, 32), torch.randn(32), torch.randn(4, 32)
    torch.library.opcheck(torch.ops.ksb.rms_norm.default, (x, w, 1e-6, False, None))
    torch.library.opcheck(torch.ops.ksb.layer_norm.default, (x, w, None, 1e-5, None))
    torch.library.opcheck(torch.ops.ksb.fused_add_rms_norm.default, (x.clone(), r.clone(), w, 1e-6, False, None))
