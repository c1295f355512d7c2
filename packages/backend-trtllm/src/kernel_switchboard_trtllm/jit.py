"""flashinfer compiles TensorRT-LLM's kernels on first use; this module says whether that already
happened (its JIT cache, or an AOT build) and builds ahead of time (``switchboard build``).

Importing flashinfer takes seconds, so ranking must not: while flashinfer is not imported, whether a
module is built is answered from what this environment recorded (:func:`kernel_switchboard.artefacts.record`:
the library path flashinfer reported after a build, a plan or a first run), and a module never recorded
counts as not built. Once flashinfer is imported, flashinfer itself answers (and the answer is recorded).

Every function that imports flashinfer is only reached on a machine where the backend is available
(a GPU and flashinfer installed).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from kernel_switchboard import artefacts


class XqaModule(NamedTuple):
    """The fields of a decode problem that name its XQA module (a problem itself serves too)."""

    dtype: torch.dtype
    kv_dtype: torch.dtype
    page_size: int
    head_dim: int
    group_size: int
    features: frozenset[str]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def xqa_record(problem: Any) -> str:
    """The record name of the XQA decode module ``problem`` runs."""
    window = int("sliding_window" in problem.features)
    return (f"flashinfer-xqa-{_dtype_name(problem.dtype)}-{_dtype_name(problem.kv_dtype)}-p{problem.page_size}"
            f"-d{problem.head_dim}-g{problem.group_size}-w{window}")


def xqa_mla_record(problem: Any) -> str:
    return (f"flashinfer-xqa-mla-{_dtype_name(problem.dtype)}-{_dtype_name(problem.kv_dtype)}-p{problem.page_size}"
            f"-d{problem.head_dim + problem.head_dim_pe}-h{problem.num_q_heads}")


def moe_record(cc: tuple[int, int]) -> str:
    return f"flashinfer-fused-moe-{moe_arch(cc)}"


def library_path(spec: Any) -> Path:
    """Where flashinfer keeps (or will keep) the compiled module of ``spec``: its AOT build, else its JIT cache."""
    get = getattr(spec, "get_library_path", None)
    return Path(get() if callable(get) else spec.jit_library_path)


def _remember(name: str, path: Path) -> None:
    if path.is_file():
        artefacts.record(name, {"path": str(path)})


def _recorded_built(name: str) -> bool:
    """Whether an earlier process recorded the module ``name`` built, and its library is still there."""
    found = artefacts.recorded(name)
    return found is not None and Path(str(found.get("path", ""))).is_file()


def xqa_spec(problem: Any) -> Any:
    """flashinfer's JitSpec of the XQA decode module this problem runs (nothing is compiled)."""
    from flashinfer.jit.xqa import gen_xqa_module

    return gen_xqa_module(problem.dtype, problem.kv_dtype, problem.page_size, problem.head_dim, problem.group_size,
                          "sliding_window" in problem.features, problem.dtype, 1, False)


def xqa_build(problem: Any) -> None:
    """Compile (or load from flashinfer's cache) the XQA module of ``problem``, and record it built."""
    from flashinfer.xqa import get_xqa_module

    get_xqa_module(problem.dtype, problem.kv_dtype, problem.page_size, problem.head_dim, problem.group_size,
                   "sliding_window" in problem.features, problem.dtype, 1)
    _remember(xqa_record(problem), library_path(xqa_spec(problem)))


_ran: set[tuple[Any, ...]] = set()
_ran_lock = threading.Lock()


def note_xqa_run(q: torch.Tensor, cache: Any, window_left: int) -> None:
    """After an XQA decode call: record its module built, once per configuration and process (the call compiled
    it if it was not)."""
    key = (q.dtype, cache.k_pages.dtype, cache.page_size, q.shape[-1], q.shape[1] // cache.num_kv_heads,
           window_left >= 0)
    if key in _ran:
        return
    with _ran_lock:
        _ran.add(key)
    module = XqaModule(key[0], key[1], key[2], key[3], key[4],
                       frozenset({"sliding_window"}) if key[5] else frozenset())
    try:
        _remember(xqa_record(module), library_path(xqa_spec(module)))
    except Exception:  # noqa: BLE001 - a record is an optimisation of the next process's ranking, never an error
        return


def xqa_mla_spec(problem: Any) -> Any:
    from flashinfer.jit.xqa import gen_xqa_module_mla

    return gen_xqa_module_mla(problem.dtype, problem.kv_dtype, problem.page_size,
                              problem.head_dim + problem.head_dim_pe, problem.num_q_heads, False)


def xqa_mla_build(problem: Any) -> None:
    from flashinfer.xqa import get_xqa_module_mla

    get_xqa_module_mla(problem.dtype, problem.kv_dtype, problem.page_size, problem.head_dim + problem.head_dim_pe,
                       problem.num_q_heads, False)
    _remember(xqa_mla_record(problem), library_path(xqa_mla_spec(problem)))


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
    note_moe_built(problem.cc)


def note_moe_built(cc: tuple[int, int]) -> None:
    """Record flashinfer's fused-MoE module for ``cc`` built, where it is on disk."""
    try:
        found = [p for p in moe_module_paths(cc) if p.is_file()]
    except Exception:  # noqa: BLE001 - see note_xqa_run
        return
    if found:
        _remember(moe_record(cc), found[0])


def compiled(spec_of: Callable[[Any], Any], record_of: Callable[[Any], str]) -> Callable[[Any], bool]:
    """``needs_build`` for a kernel whose module is described by ``spec_of(problem)`` and recorded as
    ``record_of(problem)`` (see the module docstring)."""

    def needs_build(problem: Any) -> bool:
        name = record_of(problem)
        if "flashinfer" not in sys.modules:
            return not _recorded_built(name)
        try:
            spec = spec_of(problem)
            built = bool(spec.is_compiled)
        except Exception:  # a problem the spec generator refuses: the kernel's own run will say why
            return True
        if built:
            _remember(name, library_path(spec))
        return not built

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
    if "flashinfer" not in sys.modules:
        return not _recorded_built(moe_record(problem.cc))
    try:
        built = _moe_module_on_disk(problem.cc)
    except Exception:
        return True
    if built:
        note_moe_built(problem.cc)
    return not built
