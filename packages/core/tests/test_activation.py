"""Gated-activation reference kernels against torch.nn.functional, and the activation public API."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test

test_reference_conformance = conformance_test(
    "reference", device="cpu", size="small",
    ops=("activation.silu_and_mul", "activation.gelu_and_mul", "activation.gelu_tanh_and_mul"))

#: public function, torch formulation of act(a) * b
PAIRS: list[tuple[Callable[..., torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = [
    (ksb.activation.silu_and_mul, lambda a, b: F.silu(a) * b),
    (ksb.activation.gelu_and_mul, lambda a, b: F.gelu(a) * b),
    (ksb.activation.gelu_tanh_and_mul, lambda a, b: F.gelu(a, approximate="tanh") * b),
]
IDS = ["silu", "gelu", "gelu_tanh"]


@pytest.mark.parametrize(("fn", "torch_fn"), PAIRS, ids=IDS)
@pytest.mark.parametrize("shape", [(7, 2 * 48), (2, 3, 2 * 17), (2 * 5,)])
def test_matches_torch_functional_in_float64(fn: Callable[..., torch.Tensor], torch_fn: Callable[..., torch.Tensor],
                                             shape: tuple[int, ...]) -> None:
    x = 3 * torch.randn(shape)
    d = shape[-1] // 2
    want = torch_fn(x[..., :d].double(), x[..., d:].double())
    got = fn(x)
    assert got.shape == (*shape[:-1], d) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(("fn", "torch_fn"), PAIRS, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_rounds_the_float32_result(fn: Callable[..., torch.Tensor], torch_fn: Callable[..., torch.Tensor],
                                                  dtype: torch.dtype) -> None:
    x = (3 * torch.randn(33, 2 * 40)).to(dtype)
    want = torch_fn(x[:, :40].float(), x[:, 40:].float()).to(dtype)
    got = fn(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, want, rtol=torch.finfo(dtype).eps, atol=1e-5)


def test_row_strided_input() -> None:
    buf = torch.randn(6, 2 * 32 + 5)
    x = buf[:, : 2 * 32]
    torch.testing.assert_close(ksb.activation.silu_and_mul(x), F.silu(x[:, :32]) * x[:, 32:])


def test_bad_inputs_name_the_argument() -> None:
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.shape"):
        ksb.activation.silu_and_mul(torch.randn(4, 31))
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.shape"):
        ksb.activation.gelu_and_mul(torch.randn(4, 0))
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.dtype"):
        ksb.activation.gelu_tanh_and_mul(torch.randn(4, 32).double())
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.stride"):
        ksb.activation.silu_and_mul(torch.randn(32, 4).t())
    with pytest.raises(ksb.InvalidArgumentError, match=r"x"):
        ksb.activation.silu_and_mul([1.0, 2.0])  # type: ignore[arg-type]


def test_problem_fields() -> None:
    sel = ksb.explain("activation.gelu_and_mul", torch.randn(2, 3, 2 * 100, dtype=torch.bfloat16))
    assert (sel.problem.hidden, sel.problem.rows, sel.problem.dtype) == (100, 8, torch.bfloat16)


def test_torch_compile_fullgraph_traces_activation_ops() -> None:
    x = torch.randn(4, 3, 64)

    def f(x: torch.Tensor) -> torch.Tensor:
        return (ksb.activation.silu_and_mul(x) + ksb.activation.gelu_and_mul(x)
                + ksb.activation.gelu_tanh_and_mul(x)) * 2

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x))


def test_opcheck_activation_ops() -> None:
    x = torch.randn(4, 64)
    for op in (torch.ops.ksb.silu_and_mul, torch.ops.ksb.gelu_and_mul, torch.ops.ksb.gelu_tanh_and_mul):
        torch.library.opcheck(op.default, (x, None))
        torch.library.opcheck(op.default, (x.view(2, 2, 64), "reference"))
