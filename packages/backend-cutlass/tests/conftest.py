"""On a GPU with the CUTLASS backend available, compile every kernel the GPU tests and the
conformance cases need once, in parallel, before the tests run (nvcc per first call would be serial)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _prebuild_cutlass_kernels() -> None:
    if not torch.cuda.is_available():
        return
    from kernel_switchboard.registry import registry
    from kernel_switchboard.testing.conformance import op_cases
    from kernel_switchboard_cutlass.prebuild import prebuild

    if not registry.all_backends()["cutlass"].available:
        return
    device = torch.device("cuda")
    calls = [(c.op, c.args, c.kwargs) for op in ("gemm.mm", "gemm.mm_fp8", "gemm.grouped_mm")
             for c in op_cases(op, device, "large")]
    from test_cutlass_gpu import gpu_calls

    prebuild(calls + gpu_calls(device))
