"""Generation of conformance tests from the registry and the case families."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch

from ..dispatch import explain
from ..errors import KernelUnavailableError
from ..registry import Kernel, registry
from ..spec import spec_of
from .case import Case


def op_cases(op: str, device: torch.device, size: str = "small") -> list[Case]:
    """Every case of ``op`` (fixed seeds) at ``size`` ("small" for CPU/interpreter, "large" for GPU), from the
    module its spec names (``kernel_switchboard.testing.cases.<module>``, with ``cases(op, device, size)``)."""
    module = importlib.import_module(f"{__package__}.cases.{spec_of(op).cases}")
    return list(module.cases(op, device, size))


def declares(kernel: Kernel, case: Case) -> bool:
    """Whether ``case`` lies inside ``kernel``'s declared capability (dispatch with ``backend=kernel.id`` accepts it)."""
    try:
        explain(case.op, *case.args, backend=kernel.id, **case.kwargs)
    except KernelUnavailableError:
        return False
    return True


def kernel_cases(kernel: Kernel, device: torch.device, size: str = "small") -> list[Case]:
    """The cases of ``kernel.op`` that lie inside ``kernel``'s declared capability."""
    return [c for c in op_cases(kernel.op, device, size) if declares(kernel, c)]


def _default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def conformance_test(backend: str, device: str | None = None, size: str | None = None,
                     ops: tuple[str, ...] | None = None) -> Callable[..., None]:
    """A pytest test function parametrized over every (kernel of ``backend``, eligible case).

    ``device`` defaults to ``KSB_TEST_DEVICE`` or the GPU when there is one; ``size`` to
    ``KSB_TEST_SIZE`` or "small" on the CPU and "large" on a GPU.
    """
    import os

    dev = torch.device(device or os.environ.get("KSB_TEST_DEVICE") or _default_device())
    size = size or os.environ.get("KSB_TEST_SIZE") or ("small" if dev.type == "cpu" else "large")
    params: list[Any] = []
    marks = [pytest.mark.gpu] if dev.type == "cuda" else []
    backends = registry.all_backends()
    if backend not in backends:
        raise LookupError(f"backend {backend!r} is not registered; registered: {sorted(backends)}")
    for kernel in backends[backend].kernels:
        if ops is not None and kernel.op not in ops:
            continue
        if kernel.unavailable is not None:
            params.append(pytest.param(kernel, None, id=f"{kernel.id}-unavailable",
                                       marks=[pytest.mark.skip(reason=f"{kernel.id}: {kernel.unavailable}")]))
            continue
        cases = kernel_cases(kernel, dev, size)
        if not cases:
            params.append(pytest.param(kernel, None, id=f"{kernel.id}-nocase", marks=marks))
        for case in cases:
            params.append(pytest.param(kernel, case, id=f"{kernel.id}-{case.id}", marks=marks))

    @pytest.mark.parametrize(("kernel", "case"), params)
    def test_conformance(kernel: Kernel, case: Case | None) -> None:
        if case is None:
            pytest.fail(f"{kernel.id}: no conformance case of {kernel.op} on {dev} lies inside its declared "
                        f"capability, so the declaration is untested")
        computes_in = None
        if kernel.math_dtype is not None and case.check is None:
            from ..dispatch import explain

            computes_in = kernel.math_dtype(explain(case.op, *case.args, **case.kwargs).problem)
        case.compare(kernel.id, computes_in=computes_in, finite_stale_slots=kernel.reads_stale_slots)

    return test_conformance

