"""On a GPU with the CUTLASS backend available, compile every kernel the GPU tests and the
conformance cases need once, in parallel, before the tests run (nvcc per first call would be serial)."""

from __future__ import annotations

import pytest
import torch


def _runs_a_gemm(item: pytest.Item) -> bool:
    """Whether a selected test calls a CUTLASS GEMM (the GPU tests, and the GEMM conformance cases)."""
    kernel = getattr(getattr(item, "callspec", None), "params", {}).get("kernel")
    return "test_cutlass_gpu" in item.nodeid or (kernel is not None and kernel.op.startswith("gemm."))


@pytest.fixture(scope="session", autouse=True)
def _prebuild_cutlass_kernels(request: pytest.FixtureRequest) -> None:
    # only when a selected test needs them: -k dense runs in seconds, not after ~145 s of nvcc
    if not torch.cuda.is_available() or not any(_runs_a_gemm(item) for item in request.session.items):
        return
    from kernel_switchboard.registry import registry
    from kernel_switchboard.testing.conformance import op_cases
    from kernel_switchboard_cutlass import build, configs
    from kernel_switchboard_cutlass.prebuild import prebuild

    if not registry.all_backends()["cutlass"].available:
        return
    device = torch.device("cuda")
    calls = [(c.op, c.args, c.kwargs) for op in ("gemm.mm", "gemm.mm_fp8", "gemm.grouped_mm")
             for c in op_cases(op, device, "large")]
    from test_cutlass_gpu import FORCED_FP8_TILES, gpu_calls

    prebuild(calls + gpu_calls(device))
    forced = [configs.fp8_block_config("bf16", 4096, role) for role in FORCED_FP8_TILES["block"]]
    forced += [configs.fp8_tensor_config("bf16", 4096, role) for role in FORCED_FP8_TILES["tensor"]]
    build.compile_many(forced)
