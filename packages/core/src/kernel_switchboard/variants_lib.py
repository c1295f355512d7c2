"""Shipped attention variants, each a few lines on :class:`kernel_switchboard.Variant` (needs triton).

Each name below is a :class:`~kernel_switchboard.variants.Variant`; pass it with its parameters:
``ksb.attention.decode(q, cache, table, variant=ALIBI, variant_args=(slopes,))``.

- ``ALIBI``: ``s + slopes[head] * (kv_pos - q_pos)``; slopes (Hq,) float32 (:func:`alibi_slopes`); the
  distance is exact below 2^22 tokens (farther keys keep a bias of at least 2^22 * |slope|).
- ``SOFT_CAP``: ``cap * tanh(s / cap)``; cap a float (tanh by :func:`tanh`, the GPU's approximate one).
- ``SLIDING_WINDOW``: keeps ``q_pos - window <= kv_pos``; window an int.
- ``SINKS``: a learnable logit per head added to the softmax denominator (gpt-oss):
  ``out = acc / (l + exp(sinks[head] - m))``; sinks (Hq,) float32.
- ``SIGMOID``: FlashSigmoid, ``out = sum_j sigmoid(s_j + bias) v_j`` (no softmax); bias a float.
- ``PREFIX_LM``: bidirectional within the first ``prefix_lens[batch]`` positions, causal after
  (call with ``causal=False``); prefix_lens (B,) int32.
- ``REL_POS_BIAS``: ``s + table[head, clamp(q_pos - kv_pos, 0, max_distance)]``; table
  (Hq, max_distance + 1) float32 contiguous, max_distance an int.

Helpers for writing hooks: :func:`tanh` (the GPU's one-instruction tanh, exact in the interpreter);
:data:`COMPILED`, a constexpr that is false under Triton's interpreter.
Hooks run on every score, on the same units as the softmax's exp2: an int-to-float conversion per
score costs as much as that exp2 (see ``_alibi_score`` for a way around it).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .availability import triton_interpreting
from .variants import Variant

#: the kernels run compiled for a GPU, not in Triton's interpreter (which has no inline PTX): a constexpr for
#: ``if COMPILED:`` branches in jit code; read as Triton does, at import
COMPILED: tl.constexpr = tl.constexpr(not triton_interpreting())


@triton.jit
def tanh(x):
    """tanh of float32 ``x`` for hooks: the SFU's ``tanh.approx.f32`` when compiled (one instruction, relative
    error <= 2^-10.7: right for the fp16/bf16 attention the Triton kernels run), exact via exp2 in the interpreter."""
    if COMPILED:
        return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True,
                                         pack=1)
    else:
        return 1.0 - 2.0 / (tl.exp2(x * 2.8853900817779268) + 1.0)


# -- ALiBi ---------------------------------------------------------------------------------------
@triton.jit
def _alibi_score(s, q_pos, kv_pos, head, batch, args):
    # kv_pos - q_pos as a float without an int-to-float conversion per score (as slow as an exp2): the bits
    # 0x4B400000 + d are the float 12582912 + d for |d| < 2^22 (beyond, still monotone and >= 2^22 in size)
    dist = (kv_pos + (0x4B400000 - q_pos)).to(tl.float32, bitcast=True) - 12582912.0
    return s + tl.load(args[0] + head) * dist


def _alibi_score_torch(s, q_pos, kv_pos, head, batch, args):  # type: ignore[no-untyped-def]
    return s + args[0][head] * (kv_pos - q_pos)


ALIBI = Variant("alibi", score_mod=_alibi_score, torch_score_mod=_alibi_score_torch, params=("slopes",))


def alibi_slopes(num_heads: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ALiBi paper's per-head slopes, (num_heads,) float32 (negative: farther keys score lower)."""
    n = 2 ** math.floor(math.log2(num_heads))
    base = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    extra = [2.0 ** (-4.0 * (2 * i + 1) / n) for i in range(num_heads - n)]
    return -torch.tensor(base + extra, dtype=torch.float32, device=device)


# -- logits soft cap -----------------------------------------------------------------------------
@triton.jit
def _soft_cap_score(s, q_pos, kv_pos, head, batch, args):
    cap = args[0]
    return cap * tanh(s * (1.0 / cap))


def _soft_cap_score_torch(s, q_pos, kv_pos, head, batch, args):  # type: ignore[no-untyped-def]
    return args[0] * torch.tanh(s / args[0])


SOFT_CAP = Variant("soft_cap", score_mod=_soft_cap_score, torch_score_mod=_soft_cap_score_torch, params=("cap",))


# -- sliding window --------------------------------------------------------------------------------
@triton.jit
def _window_mask(q_pos, kv_pos, head, batch, args):
    return kv_pos >= q_pos - args[0]


def _window_mask_torch(q_pos, kv_pos, head, batch, args):  # type: ignore[no-untyped-def]
    return kv_pos >= q_pos - args[0]


SLIDING_WINDOW = Variant("sliding_window", mask_mod=_window_mask, torch_mask_mod=_window_mask_torch, params=("window",))


# -- attention sinks ---------------------------------------------------------------------------------
@triton.jit
def _sinks_output(acc, denom, row_max, head, batch, args):
    return acc / (denom + tl.exp(tl.load(args[0] + head) - row_max))


def _sinks_output_torch(acc, denom, row_max, head, batch, args):  # type: ignore[no-untyped-def]
    return acc / (denom + torch.exp(args[0][head] - row_max))


SINKS = Variant("sinks", output_mod=_sinks_output, torch_output_mod=_sinks_output_torch, params=("sinks",))


# -- sigmoid attention ---------------------------------------------------------------------------------
@triton.jit
def _sigmoid_score(s, q_pos, kv_pos, head, batch, args):
    return tl.sigmoid(s + args[0])


def _sigmoid_score_torch(s, q_pos, kv_pos, head, batch, args):  # type: ignore[no-untyped-def]
    return torch.sigmoid(s + args[0])


SIGMOID = Variant("sigmoid", score_mod=_sigmoid_score, torch_score_mod=_sigmoid_score_torch, softmax=False,
                  params=("bias",))


# -- prefix-LM / document mask ---------------------------------------------------------------------------
@triton.jit
def _prefix_mask(q_pos, kv_pos, head, batch, args):
    return (kv_pos <= q_pos) | (kv_pos < tl.load(args[0] + batch))


def _prefix_mask_torch(q_pos, kv_pos, head, batch, args):  # type: ignore[no-untyped-def]
    return (kv_pos <= q_pos) | (kv_pos < args[0][batch].long())


PREFIX_LM = Variant("prefix_lm", mask_mod=_prefix_mask, torch_mask_mod=_prefix_mask_torch, params=("prefix_lens",))


# -- relative position bias from a table ---------------------------------------------------------------
@triton.jit
def _rel_bias_score(s, q_pos, kv_pos, head, batch, args):
    max_distance = args[1]
    dist = tl.minimum(tl.maximum(q_pos - kv_pos, 0), max_distance)
    return s + tl.load(args[0] + head * (max_distance + 1) + dist)


def _rel_bias_score_torch(s, q_pos, kv_pos, head, batch, args):  # type: ignore[no-untyped-def]
    table, max_distance = args
    return s + table[head, torch.clamp(q_pos - kv_pos, 0, max_distance)]


REL_POS_BIAS = Variant("rel_pos_bias", score_mod=_rel_bias_score, torch_score_mod=_rel_bias_score_torch,
                       params=("table", "max_distance"))

#: every shipped variant, by name
VARIANTS = {v.name: v for v in (ALIBI, SOFT_CAP, SLIDING_WINDOW, SINKS, SIGMOID, PREFIX_LM, REL_POS_BIAS)}
