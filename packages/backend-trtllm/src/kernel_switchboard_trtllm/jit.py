"""flashinfer compiles TensorRT-LLM's kernels on first use; this module says whether that already
happened (its JIT cache, or an AOT build) and builds ahead of time (``switchboard build``).

Every function imports flashinfer lazily and is only reached on a machine where the backend is
available (a GPU and flashinfer installed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def xqa_spec(problem: Any) -> Any:
    """flashinfer's JitSpec of the XQA decode module this problem runs (nothing is compiled)."""
    from flashinfer.jit.xqa import gen_xqa_module

    return gen_xqa_module(problem.dtype, problem.kv_dtype, problem.page_size, problem.head_dim, problem.group_size,
                          "sliding_window" in problem.features, problem.dtype, 1, False)


def xqa_build(problem: Any) -> None:
    """Compile (or load from flashinfer's cache) the XQA module of ``problem``."""
    from flashinfer.xqa import get_xqa_module

    get_xqa_module(problem.dtype, problem.kv_dtype, problem.page_size, problem.head_dim, problem.group_size,
                   "sliding_window" in problem.features, problem.dtype, 1)


def xqa_mla_spec(problem: Any) -> Any:
    from flashinfer.jit.xqa import gen_xqa_module_mla

    return gen_xqa_module_mla(problem.dtype, problem.kv_dtype, problem.page_size,
                              problem.head_dim + problem.head_dim_pe, problem.num_q_heads, False)


def xqa_mla_build(problem: Any) -> None:
    from flashinfer.xqa import get_xqa_module_mla

    get_xqa_module_mla(problem.dtype, problem.kv_dtype, problem.page_size, problem.head_dim + problem.head_dim_pe,
                       problem.num_q_heads, False)


def moe_arch(cc: tuple[int, int]) -> str:
    """flashinfer's fused-MoE module suffix for a compute capability ("90", "100", "103", "120", ...)."""
    return f"{cc[0] * 10 + cc[1]}"


def moe_module_paths(cc: tuple[int, int]) -> list[Path]:
    """Where flashinfer keeps the compiled fused-MoE module for ``cc`` (JIT cache, then AOT)."""
    from flashinfer.jit import env

    name = f"fused_moe_{moe_arch(cc)}"
    return [env.FLASHINFER_JIT_DIR / name / f"{name}.so", env.FLASHINFER_AOT_DIR / name / f"{name}.so"]


def moe_build(problem: Any) -> None:
    from flashinfer.fused_moe.core import get_cutlass_fused_moe_module

    get_cutlass_fused_moe_module(moe_arch(problem.cc))


def compiled(spec_of: Any) -> Any:
    """``needs_build`` for a kernel whose module is described by ``spec_of(problem)``."""

    def needs_build(problem: Any) -> bool:
        try:
            return not spec_of(problem).is_compiled
        except Exception:  # a problem the spec generator refuses: the kernel's own run will say why
            return True

    return needs_build


#: why the fused-MoE GPU tests wait for a built module
MOE_NOT_BUILT = ("flashinfer's fused-MoE module is not built for this GPU; it compiles for longer than a test may run: "
                 "build it first with `switchboard build --preset moe` (or tools/gpu_check.sh moe-build)")


def _moe_module_on_disk(cc: tuple[int, int]) -> bool:
    """Whether flashinfer's compiled fused-MoE module for ``cc`` is on disk (raises when flashinfer is missing)."""
    return any(p.is_file() for p in moe_module_paths(cc))


def moe_module_missing() -> bool:
    """Whether a CUDA GPU is here but flashinfer's fused-MoE module for it is not on disk (False without a GPU)."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        return not _moe_module_on_disk(torch.cuda.get_device_capability())
    except Exception:  # flashinfer missing or unimportable: its kernels are unavailable and say why
        return False


def moe_needs_build(problem: Any) -> bool:
    try:
        return not _moe_module_on_disk(problem.cc)
    except Exception:
        return True
