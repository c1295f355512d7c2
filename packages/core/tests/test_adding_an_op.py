"""The op added in docs/adding-an-op.md, ``activation.swiglu_oai_and_mul``, checked step by step: its spec (problem,
custom op, explain), its reference kernel (against gpt-oss's formula), its conformance cases, its compiled form.
Its Triton kernel is checked in packages/backend-triton/tests/test_activation.py."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.ops.activation import ActivationProblem
from kernel_switchboard.spec import spec_of
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.conformance import op_cases

OP = "activation.swiglu_oai_and_mul"

test_reference_conformance = conformance_test("reference", device="cpu", size="small", ops=(OP,))


def _gpt_oss(x: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU as its reference model writes it, in float64."""
    gate, up = x.double()[..., ::2], x.double()[..., 1::2]
    gate, up = gate.clamp(max=limit), up.clamp(min=-limit, max=limit)
    return (gate * torch.sigmoid(alpha * gate) * (up + 1)).to(x.dtype)


def test_step_1_the_spec_describes_the_op() -> None:
    spec = spec_of(OP)
    assert spec.problem is ActivationProblem and spec.reference == "swiglu_oai_and_mul" and spec.cases == "activation"
    assert spec.schema == "(Tensor x, float alpha, float limit, str? backend) -> Tensor"
    x = torch.randn(6, 4, 2 * 40)
    sel = ksb.explain(OP, x, alpha=1.0)
    assert sel.problem.hidden == 40 and sel.problem.rows == 32 and sel.kernel.id == "reference:swiglu_oai_and_mul"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_step_2_the_reference_is_gpt_oss_formula(dtype: torch.dtype) -> None:
    x = (5 * torch.randn(3, 2, 2 * 24, generator=torch.Generator().manual_seed(0))).to(dtype)
    got = ksb.activation.swiglu_oai_and_mul(x, backend="reference")
    assert got.shape == (3, 2, 24) and got.dtype == dtype
    torch.testing.assert_close(got, _gpt_oss(x))
    torch.testing.assert_close(ksb.activation.swiglu_oai_and_mul(x, alpha=0.5, limit=2.0), _gpt_oss(x, 0.5, 2.0))


def test_step_2_bad_arguments_name_the_argument() -> None:
    x = torch.randn(2, 8)
    for kwargs, name in (({"alpha": 0.0}, "alpha"), ({"limit": float("inf")}, "limit"), ({"limit": True}, "limit")):
        with pytest.raises(ksb.InvalidArgumentError, match=f"{name}="):
            ksb.activation.swiglu_oai_and_mul(x, **kwargs)
    with pytest.raises(ksb.InvalidArgumentError, match=r"x\.shape"):
        ksb.activation.swiglu_oai_and_mul(torch.randn(2, 7))


def test_step_3_the_cases_cover_both_clamps() -> None:
    cases = op_cases(OP, torch.device("cpu"))
    assert {c.kwargs["limit"] for c in cases} == {7.0, 3.0}
    assert any(bool((c.args[0][..., 0::2] > c.kwargs["limit"]).any()) for c in cases)
    assert any(bool((c.args[0][..., 1::2] < -c.kwargs["limit"]).any()) for c in cases)


def test_step_4_torch_compile_traces_its_custom_op() -> None:
    x = 4 * torch.randn(5, 2 * 16)
    fn = torch.compile(lambda x: ksb.activation.swiglu_oai_and_mul(x, alpha=1.5, limit=3.0) + 1, fullgraph=True,
                       backend="aot_eager")
    torch.testing.assert_close(fn(x), _gpt_oss(x, 1.5, 3.0) + 1)
    torch.library.opcheck(torch.ops.ksb.swiglu_oai_and_mul.default, (x, 1.702, 7.0, None))
