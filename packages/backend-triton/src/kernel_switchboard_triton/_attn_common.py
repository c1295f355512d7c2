"""Helpers shared by the attention and KV-cache launchers: launch configuration, SM counts.

Nothing here touches the GPU at import time; SM counts are read once per device on first use.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import triton
import triton.language as tl

from kernel_switchboard.availability import triton_interpreting

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: Triton dtypes the fp8 KV paths read
FP8_KV = frozenset({torch.float8_e4m3fn})


def interpreting() -> bool:
    """True under TRITON_INTERPRET=1: tiles are kept tiny and dots run in float32 (the
    interpreter's bf16 ``tl.dot`` is wrong)."""
    return triton_interpreting()


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of ``device`` (2 on the CPU, where the interpreter runs)."""
    if device.type != "cuda":
        return 2
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


@functools.lru_cache(maxsize=16)
def cc_major(device: torch.device) -> int:
    """Compute-capability major of ``device`` (0 on the CPU)."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.get_device_capability(index)[0])


def split_dim(d: int) -> tuple[int, int]:
    """A head dim as a power-of-two main part plus a power-of-two tail (0 if none): 192 -> (128, 64)."""
    main = 1 << (d.bit_length() - 1)
    return main, d - main


def soft_cap_args(sm_scale: float, soft_cap: float | None, k_scale: float) -> tuple[float, float]:
    """(qk_scale, cap_log2) for the kernels. Without a cap the kernel computes ``s * qk_scale`` in log2
    units; with a cap ``cap_log2 * tanh(s * qk_scale)``."""
    if soft_cap is None:
        return sm_scale * k_scale * LOG2E, 0.0
    return sm_scale * k_scale / soft_cap, soft_cap * LOG2E


#: the largest soft cap the prefill kernels subtract instead of a running maximum (``fixed_max``): a score s >= -cap
#: gives the weight 2^((s - cap) log2 e) >= 2^-120, still a normal float32 / bfloat16
FIXED_MAX_CAP = 60.0 / LOG2E


def fixed_max(soft_cap: float | None, q_dtype: torch.dtype, f16_math: bool, hooks: dict[str, Any],
              exp2_fma: bool = False) -> int:
    """``FIXED_MAX`` constexpr of the prefill kernels: 0 a running row maximum; 1 the cap instead, with the
    exponentials on the SFU; 2 the cap, with half the exponentials on the FMA pipe (``exp2_fma``, :func:`_exp2_fma`).

    A soft cap bounds every score by the cap, so the softmax can subtract the cap rather than a running row maximum,
    with no maximum to reduce and no rescale of the accumulator per tile. Only where each weight stays a normal
    number in the PV dot's operands: bfloat16 queries computed in bfloat16 (float16 or fp8 operands flush the weights
    of a row whose scores all lie far below the cap), caps up to ``FIXED_MAX_CAP``, softmax weights and no score hook
    (which may move scores past the cap)."""
    if (soft_cap is None or soft_cap > FIXED_MAX_CAP or q_dtype != torch.bfloat16 or f16_math
            or not hooks["SOFTMAX"] or hooks["HAS_SCORE_MOD"]):
        return 0
    return 2 if exp2_fma else 1


def scale_args(scale: Any, like: torch.Tensor) -> tuple[float, torch.Tensor, int]:
    """A cache scale as kernel arguments: (the float factor, the scale tensor or ``like`` as an unused pointer, the
    tensor's stride over KV heads: 0 for shape (), 1 for (Hkv,), -1 for a float). None (not fp8) is 1.0."""
    if isinstance(scale, torch.Tensor):
        return 1.0, scale, 1 if scale.dim() else 0
    return (1.0 if scale is None else float(scale)), like, -1


@triton.jit
def fp16_range_factor(q_max):
    """The factor that brings queries whose largest magnitude is ``q_max`` into fp16's range (1.0 when they fit);
    the fp16-math kernels multiply the queries by it and divide their score scale by it."""
    return tl.where(q_max > 32768.0, 32768.0 / q_max, 1.0)


@triton.jit
def _tanh(x, FAST: tl.constexpr = False):
    """tanh: the SFU's ``tanh.approx.f32`` when FAST (relative error <= 2^-10.7: fine for 16-bit inputs,
    not for float32; no interpreter support), else through exp2, valid for every float32 x."""
    if FAST:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)


@triton.jit
def _exp2_fma(x):
    """2^x for x in [-127, 0] on the FMA and integer pipes rather than the SFU, which the soft cap's tanh also
    occupies: x = j + f with j an integer (rounded by adding 1.5 x 2^23, whose low bits then hold j) and |f| <= 1/2;
    2^f by a cubic fitted for relative error (<= 1.02e-4, a fortieth of a bfloat16 rounding), and j added to its
    exponent bits. -127 gives exactly 0 (the masked keys' value); (-127, -126) denormals; nothing below -127 is
    valid (no clamp: it would cost an instruction per score)."""
    t = x + 12582912.0
    f = x - (t - 12582912.0)
    p = ((0.05500836670398712 * f + 0.24220985174179077) * f + 0.6932828426361084) * f + 1.0
    bits = p.to(tl.int32, bitcast=True) + (t.to(tl.int32, bitcast=True) << 23)
    return bits.to(tl.float32, bitcast=True)


def soft_cap_mode(soft_cap: float | None, dtype: torch.dtype) -> int:
    """``SOFT_CAP`` constexpr of the prefill kernel: 0 none, 1 exact tanh, 2 the SFU's approximate tanh
    (16-bit inputs on a GPU; the H200 prefill with soft cap 30 ran at 293 TFLOP/s with the exact tanh)."""
    if soft_cap is None:
        return 0
    return 2 if dtype in (torch.float16, torch.bfloat16) and not interpreting() else 1


def resident_ctas(device: torch.device, smem_bytes: int, num_warps: int, regs_per_thread: int = 128) -> int:
    """Rough programs resident per SM: bounded by shared memory (228 KB on Hopper, 164 KB on Ampere)
    and by the 64 K registers of an SM. Use the figures ptxas reports for the kernel (see tuning notes)."""
    smem = 227 * 1024 if cc_major(device) >= 9 else 163 * 1024
    by_smem = smem // max(smem_bytes + 1024, 1)
    by_regs = 65536 // (num_warps * 32 * regs_per_thread)
    return max(1, min(by_smem, by_regs, 8))


def choose_splits(programs: int, kv_len: int, block_n: int, slots: int, max_splits: int = 64) -> int:
    """Split count for split-KV: minimise waves x tokens per program (+ a fixed cost of two tiles).

    ``programs``: independent KV streams without splitting; ``slots``: programs resident at once.
    Each split keeps at least two tiles; more splits also cost a merge, so ties keep fewer.
    """
    best, best_cost = 1, math.inf
    limit = max(1, min(max_splits, kv_len // (2 * block_n)))
    for s in range(1, limit + 1):
        tokens = triton.cdiv(triton.cdiv(kv_len, s), block_n) * block_n
        cost = triton.cdiv(programs * s, slots) * (tokens + 2 * block_n)
        if cost < best_cost * 0.97:
            best, best_cost = s, cost
    return best
