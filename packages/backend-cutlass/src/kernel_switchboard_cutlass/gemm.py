"""CUTLASS kernels for ``gemm.mm``, ``gemm.mm_fp8`` and ``gemm.grouped_mm`` (see the core's ops/gemm.py).

Each call picks a :class:`~kernel_switchboard_cutlass.configs.GemmConfig` from the operands' layout
and size, loads its library (compiling it on a cache miss), and calls the C entry point with data
pointers, the device's SM count and the current CUDA stream. No host synchronisation.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from kernel_switchboard import Capability, Kernel
from kernel_switchboard.capability import bucket

from . import build, configs
from .emit import STATUS
from .operands import Operand, as_k_major_b, as_operand, elems, finish_output, padded_output, round_up

WORD = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float8_e4m3fn: "e4m3"}
HALF = frozenset({torch.float16, torch.bfloat16})
FP8_OUT = frozenset({torch.bfloat16, torch.float16, torch.float32})
LAYOUT_WORD = {"R": "row", "C": "col"}
#: rough sustained rates on an H100/H200 (flop/s) and HBM bandwidth; they only rank kernels. Each is near what the
#: kernel sustains on the H200 at 8192^3 (fp8 by scale mode, with the overlapped promotion; grouped: DeepSeek-V3's
#: experts)
RATE = {"mm": 650e12, "mm_fp8": 1130e12, "mm_fp8_tensor": 1150e12, "grouped_mm": 290e12}
BANDWIDTH = 3.3e12
#: host work per call: ctypes, CUTLASS initialize (TMA descriptors), launch
HOST_S = 12e-6
CC = (9, 0)  # sm_90a binaries run on compute capability 9.0 only


@functools.lru_cache(maxsize=16)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


#: rasterisation swizzle per GEMM kind where it is not 1. fp8 block-scaled 8192^3 on the H200 with the 2x1 cluster
#: runs fastest at swizzle 8, about 9% over swizzle 1 (the scheduler's raster order, along M or N, makes no
#: difference); bf16 mm's large tile gains no more than the timing spread at 8, so it keeps 1. fp8 per-tensor takes 8
#: too: the same 128x128x128 tile, cluster and problem as block scales (the benchmark has a swizzle 1 row beside it).
SWIZZLE = {"mm_fp8_block": 8, "mm_fp8_tensor": 8}


def swizzle(kind: str) -> int:
    """CTA rasterisation swizzle of the persistent tile scheduler (1, 2, 4 or 8) for a GEMM ``kind``:
    ``KSB_CUTLASS_SWIZZLE``, else :data:`SWIZZLE`, else 1."""
    return int(os.environ.get("KSB_CUTLASS_SWIZZLE") or SWIZZLE.get(kind, 1))


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


@functools.lru_cache(maxsize=256)
def _workspace_bytes(lib: Any, m: int, n: int, k: int, groups: int, swz: int, sm: int) -> int:
    """Workspace bytes of a call (a stream-K scheduler's grows with the swizzle); asked of the library once per shape."""
    return int(lib.ksb_workspace(m, n, k, groups, swz, sm))


def _workspace(nbytes: int, device: torch.device) -> torch.Tensor | None:
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None


def _call(cfg: configs.GemmConfig, fn: str, device: torch.device, *args: Any, m: int, n: int, k: int,
          groups: int = 0, swz: int = 1) -> None:
    """Load ``cfg`` and call ``fn(*args, sm_count, device, workspace, stream)``; raise on a nonzero status.

    An eager call is bound by this host work (the GPU finishes a small GEMM first), so it does no more than the
    call needs: the workspace size is cached per shape, the stream is read without a Stream object, and the
    device is switched only when the operands are not on the current one.
    """
    lib = build.load(cfg)
    current = torch.cuda.current_device()
    index = current if device.index is None else device.index
    sm = _sm_count(index)
    ws = _workspace(_workspace_bytes(lib, m, n, k, groups, swz, sm), device)
    stream = torch._C._cuda_getCurrentRawStream(index)
    if index == current:
        rc = getattr(lib, fn)(*args, sm, index, _ptr(ws), stream)
    else:
        with torch.cuda.device(index):
            rc = getattr(lib, fn)(*args, sm, index, _ptr(ws), stream)
    if rc != 0:
        raise RuntimeError(f"CUTLASS kernel {cfg.name}: {STATUS.get(rc, f'status {rc}')} "
                           f"(m={m}, n={n}, k={k}{f', groups={groups}' if groups else ''})")


# -- gemm.mm ----------------------------------------------------------------------------------------------
def mm_config_for(dtype: torch.dtype, layout_a: str, layout_b: str, m: int, n: int) -> configs.GemmConfig:
    """The mm configuration for operands of these layouts and (bucketed) output size."""
    return configs.mm_config(WORD[dtype], layout_a, layout_b, bucket(m), bucket(n))


class Launch(NamedTuple):
    """Everything one C call needs, prepared from torch operands (pure torch: testable on a CPU)."""

    cfg: configs.GemmConfig
    fn: str
    a: Operand
    b: Operand
    d: torch.Tensor  # row-major output buffer, possibly padded
    m: int
    n: int
    k: int
    extra: tuple[torch.Tensor | None, ...] = ()  # alpha (tensor mode) / sfa, sfb (block mode) / offsets (grouped)
    groups: int = 0

    def args(self, swz: int | None = None) -> tuple[Any, ...]:
        """The C arguments before (sm_count, device, workspace, stream); ``swz`` the swizzle (else :func:`swizzle`)."""
        a, b, d = _ptr(self.a.tensor), _ptr(self.b.tensor), _ptr(self.d)
        if self.fn == "ksb_grouped":
            return (a, b, d, _ptr(self.extra[0]), self.groups, self.n, self.k, self.a.ld, self.b.ld, self.d.stride(0),
                    self.b.tensor.stride(0))
        return (a, b, d, *(_ptr(t) for t in self.extra), self.m, self.n, self.k, self.a.ld, self.b.ld, self.d.stride(0),
                swizzle(self.cfg.kind) if swz is None else swz)


def launch(job: Launch) -> None:
    swz = swizzle(job.cfg.kind)
    _call(job.cfg, job.fn, job.d.device, *job.args(swz), m=job.m, n=job.n, k=job.k, groups=job.groups, swz=swz)


def prepare_mm(a: torch.Tensor, b: torch.Tensor) -> Launch:
    m, k = a.shape
    n = b.shape[1]
    e = elems(a.dtype)
    kp, np_ = round_up(k, e), round_up(n, e)
    op_a, op_b = as_operand(a, m, kp), as_operand(b, kp, np_)
    d, _ = padded_output(m, np_, a.dtype, a.device)
    cfg = mm_config_for(a.dtype, op_a.layout, op_b.layout, m, n)
    return Launch(cfg, "ksb_gemm", op_a, op_b, d, m, np_, kp, (None,))


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (K, N), fp16/bf16, float32 accumulation; (M, N) contiguous in a's dtype."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros(m, n, dtype=a.dtype, device=a.device)
    job = prepare_mm(a, b)
    launch(job)
    return finish_output(job.d, n)


def _mm_config_of_problem(problem: Any) -> configs.GemmConfig:
    lay = problem.layout
    return mm_config_for(problem.dtype, LAYOUT_WORD.get(lay[0], "row"), LAYOUT_WORD.get(lay[1], "row"), problem.m,
                         problem.n)


# -- gemm.mm_fp8 ------------------------------------------------------------------------------------------
def fp8_config_for(mode: str, out_dtype: torch.dtype, m: int, n: int) -> configs.GemmConfig:
    """The fp8 configuration for a call of this scale mode and (bucketed) output size."""
    word = WORD[out_dtype]
    if mode == "block":
        return configs.fp8_block_config(word, bucket(m), n=bucket(n))
    return configs.fp8_tensor_config(word, bucket(m), n=bucket(n))


def prepare_mm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, scale_mode: str,
                   out_dtype: torch.dtype) -> Launch:
    m, k = a.shape
    n = b.shape[1]
    kp, np_ = round_up(k, elems(a.dtype)), round_up(n, elems(out_dtype))
    # block mode loads A's scales with TMA along M: M padded to 4 floats (16 bytes)
    mr = round_up(m, 4) if scale_mode == "block" else m
    op_a, op_b = as_operand(a, mr, kp, allow_col=False), as_k_major_b(b, kp, np_)
    d, _ = padded_output(mr, np_, out_dtype, a.device)
    cfg = fp8_config_for(scale_mode, out_dtype, m, n)
    if scale_mode == "block":
        # CUTLASS layouts: SFA M-major (K/128, M), SFB K-major (N/128, K/128), each free where the scales already are
        sfa = scale_a.t().contiguous() if mr == m else None
        if sfa is None or sfa.data_ptr() % 16:  # TMA loads SFA: 16-byte rows (zero scales pad them), aligned base
            sfa = torch.zeros(scale_a.shape[1], mr, dtype=torch.float32, device=a.device)
            sfa[:, :m] = scale_a.t()
        sfb = scale_b.t().contiguous()  # (loaded with cp.async: 4-byte alignment)
        return Launch(cfg, "ksb_gemm_block", op_a, op_b, d, mr, np_, kp, (sfa, sfb))
    alpha = (scale_a.reshape(1) * scale_b.reshape(1)).contiguous()
    return Launch(cfg, "ksb_gemm", op_a, op_b, d, mr, np_, kp, (alpha,))


def mm_fp8(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor, scale_mode: str,
           out_dtype: torch.dtype) -> torch.Tensor:
    """Scaled e4m3 GEMM, "tensor" (0-d scales) or "block" (1x128 / 128x128 float32 scales) mode."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return torch.zeros(m, n, dtype=out_dtype, device=a.device)
    job = prepare_mm_fp8(a, b, scale_a, scale_b, scale_mode, out_dtype)
    launch(job)
    return finish_output(job.d if job.m == m else job.d[:m], n)


def _fp8_config_of_problem(problem: Any) -> configs.GemmConfig:
    return fp8_config_for(problem.scale_mode or "tensor", problem.out_dtype, problem.m, problem.n)


# -- gemm.grouped_mm --------------------------------------------------------------------------------------
def _grouped_b(b: torch.Tensor, kp: int, np_: int) -> Operand:
    """b (G, K, N) with the layout word of its (K, N) slices and their leading dim; a zero-padded copy if needed."""
    g, k, n = b.shape
    e = elems(b.dtype)
    gs, rs, cs = b.stride()
    aligned = b.data_ptr() % 16 == 0 and gs % e == 0 and (k, n) == (kp, np_)
    if aligned and cs == 1 and rs % e == 0 and rs >= n:
        return Operand(b, "row", rs)
    if aligned and rs == 1 and cs % e == 0 and cs >= k:
        return Operand(b, "col", cs)
    buf = torch.zeros(g, kp, np_, dtype=b.dtype, device=b.device)
    buf[:, :k, :n] = b
    return Operand(buf, "row", np_)


def grouped_config_for(dtype: torch.dtype, layout_b: str) -> configs.GemmConfig:
    return configs.grouped_config(WORD[dtype], layout_b)


def prepare_grouped(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> Launch:
    t, k = a.shape
    groups, _, n = b.shape
    e = elems(a.dtype)
    kp, np_ = round_up(k, e), round_up(n, e)
    op_a = as_operand(a, t, kp, allow_col=False)
    op_b = _grouped_b(b, kp, np_)
    d, _ = padded_output(t, np_, a.dtype, a.device)
    cfg = grouped_config_for(a.dtype, op_b.layout)
    return Launch(cfg, "ksb_grouped", op_a, op_b, d, t, np_, kp, (offsets.contiguous(),), groups)


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Rows offsets[g]:offsets[g+1] of a (T, K) times b[g] (K, N); (T, N) in a's dtype."""
    t, k = a.shape
    groups, _, n = b.shape
    if t == 0 or n == 0 or k == 0 or groups == 0:
        return torch.zeros(t, n, dtype=a.dtype, device=a.device)
    job = prepare_grouped(a, b, offsets)
    launch(job)
    return finish_output(job.d, n)


def _grouped_config_of_problem(problem: Any) -> configs.GemmConfig:
    return grouped_config_for(problem.dtype, LAYOUT_WORD.get(problem.layout[1], "row"))


# -- registration -----------------------------------------------------------------------------------------
def _tma_aligned(problem: Any) -> list[str]:
    if getattr(problem, "align_bytes", 16) < 16:
        return [f"align_bytes={problem.align_bytes}: TMA needs 16-byte aligned operand addresses and strides"]
    return []


def _grouped_check(problem: Any) -> list[str]:
    out = _tma_aligned(problem)
    if problem.layout[0] != "R":
        out.append(f"layout={problem.layout}: a must be row-major (the per-group row slices are TMA-loaded)")
    return out


def _cost(kind: str):  # type: ignore[no-untyped-def]
    def cost(problem: Any) -> float:
        if problem.device != "cuda":
            return math.inf
        item = 1 if kind == "mm_fp8" else 2
        flops = 2.0 * problem.m * problem.n * problem.k
        nbytes = item * (problem.m * problem.k + problem.k * problem.n * (problem.groups or 1)) + 2 * problem.m * problem.n
        rate = RATE["mm_fp8_tensor" if kind == "mm_fp8" and problem.scale_mode == "tensor" else kind]
        return HOST_S + max(flops / rate, nbytes / BANDWIDTH)

    return cost


def _needs_build(of_problem):  # type: ignore[no-untyped-def]
    def needs(problem: Any) -> bool:
        try:
            return not build.is_built(of_problem(problem))
        except (RuntimeError, KeyError, ValueError):
            return True

    return needs


def _build(of_problem):  # type: ignore[no-untyped-def]
    def run_build(problem: Any) -> None:
        build.compile_config(of_problem(problem))

    return run_build


#: every call is stream-ordered with no host synchronisation (group pointers are filled on the device), so a
#: call captures in a CUDA graph once its library is loaded (tests/test_cutlass_gpu.py replays each kind)
_FEATURES = frozenset({"cuda_graph"})
CAP_MM = Capability(devices=frozenset({"cuda"}), min_cc=CC, max_cc=CC, dtypes=HALF, features=_FEATURES,
                    allowed={"layout": frozenset({"RR", "RC", "CR", "CC"})}, check=_tma_aligned)
CAP_FP8 = Capability(devices=frozenset({"cuda"}), min_cc=CC, max_cc=CC, dtypes=frozenset({torch.float8_e4m3fn}),
                     out_dtypes=FP8_OUT, features=_FEATURES,
                     allowed={"layout": frozenset({"RC"}), "scale_mode": frozenset({"tensor", "block"})},
                     check=_tma_aligned)
CAP_GROUPED = Capability(devices=frozenset({"cuda"}), min_cc=CC, max_cc=CC, dtypes=HALF, features=_FEATURES,
                         check=_grouped_check)


def kernels(version: str) -> list[Kernel]:
    """The three GEMM kernels, each with its compile-ahead hooks."""
    spec: list[tuple[str, str, Capability, Callable[..., Any], Callable[[Any], Any], str]] = [
        ("gemm.mm", "mm", CAP_MM, mm, _mm_config_of_problem,
         "CUTLASS 3 sm_90a warp-specialised TMA GEMM (cooperative / ping-pong tiles chosen by shape)"),
        ("gemm.mm_fp8", "mm_fp8", CAP_FP8, mm_fp8, _fp8_config_of_problem,
         "CUTLASS 3 sm_90a fp8 GEMM: per-tensor scales in the epilogue, or 1x128/128x128 blockwise scales "
         "applied per K block (FP8 blockwise-scaled mainloop)"),
        ("gemm.grouped_mm", "grouped_mm", CAP_GROUPED, grouped_mm, _grouped_config_of_problem,
         "CUTLASS 3 sm_90a ptr-array grouped GEMM; per-group pointers filled on the device"),
    ]
    return [
        Kernel(op, name, "cutlass", cap, run, version=version, cost=_cost(name), needs_build=_needs_build(of),
               build=_build(of), doc=doc)
        for op, name, cap, run, of, doc in spec
    ]
