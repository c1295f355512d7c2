"""The whole backend: one kernel for ``norm.rms_norm`` with its capability and a cost estimate.

Kernel ``run`` signatures are the contract in the switchboard's docs/ops.md; for rms_norm it is
``run(x (rows, hidden), weight (hidden,), eps, gemma) -> y``.
"""

from __future__ import annotations

import torch

from kernel_switchboard import Backend, Capability, Kernel, hookimpl


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """y = x / rms(x) * weight, through torch's fused implementation."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


CAPABILITY = Capability(
    devices=frozenset({"cpu", "cuda"}),
    dtypes=frozenset({torch.float32, torch.float16, torch.bfloat16}),
    allowed={"gemma": frozenset({False})},  # no Gemma (1 + w) scaling
)


def cost(problem) -> float:
    """Seconds: read x, write y, at ~1 TB/s on a GPU and ~10 GB/s on a CPU."""
    nbytes = 2 * problem.rows * problem.hidden * problem.dtype.itemsize
    return nbytes / (1e12 if problem.device == "cuda" else 1e10)


@hookimpl
def ksb_backend() -> Backend:
    if not hasattr(torch.nn.functional, "rms_norm"):  # torch < 2.4
        return Backend("example", "0.1.0", unavailable="torch.nn.functional.rms_norm needs torch>=2.4",
                       install='pip install "torch>=2.4"')
    return Backend("example", "0.1.0", [Kernel("norm.rms_norm", "torch_rms_norm", "example", CAPABILITY, rms_norm,
                                               version=torch.__version__, cost=cost)])
