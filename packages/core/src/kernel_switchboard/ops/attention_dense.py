"""``attention.dense``: attention over dense (B, H, L, D) tensors with an additive bias or a boolean mask.

For what the paged and ragged kernels do not take: encoders and cross-attention with arbitrary masks,
relative-position biases (T5, ALiBi as a tensor), multimodal prefix masks. Public as ``ksb.attention.dense``.

Kernel ``run(q, k, v, attn_bias, p) -> out`` with validated arguments: q (B, Hq, Lq, D), k (B, Hkv, Lk, D),
v (B, Hkv, Lk, Dv), Hq a multiple of Hkv (q head h reads kv head h // (Hq // Hkv)); ``attn_bias`` None, or
bool (True = attend) or q's float dtype (added to the scaled logits), broadcastable to (B, Hq, Lq, Lk);
``p`` a :class:`DenseParams`. ``causal``: query i sits at KV position Lk - Lq + i (bottom-right, as in
prefill) and attends positions up to it. A query with nothing to attend (all masked) gets out 0.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features

_Tensor = torch.Tensor


class DenseParams(NamedTuple):
    """Scalar parameters of one dense attention call."""

    sm_scale: float
    causal: bool


class DenseProblem(NamedTuple):
    """Signature of a dense attention call (``bias``: "none", "bool" or "float")."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    head_dim: int
    head_dim_v: int
    num_q_heads: int
    num_kv_heads: int
    group_size: int
    batch: int  # bucketed
    q_len: int  # bucketed
    kv_len: int  # bucketed
    bias: str
    features: frozenset[str]


def dense(q: _Tensor, k: _Tensor, v: _Tensor, attn_bias: _Tensor | None = None, *, causal: bool = False,
          sm_scale: float | None = None, backend: BackendArg = None) -> _Tensor:
    """Softmax attention of q (B, Hq, Lq, D) over k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, Hq, Lq, Dv).

    ``attn_bias``: None; a bool mask (True = attend) or a float bias in q's dtype added to the scaled
    logits, broadcastable to (B, Hq, Lq, Lk). ``causal``: bottom-right aligned (query i at KV position
    Lk - Lq + i). ``sm_scale`` defaults to 1/sqrt(D). A query with nothing to attend gets out 0.
    """
    if torch.compiler.is_compiling():
        return DENSE.compiled(q, k, v, attn_bias, causal, sm_scale, backend)  # type: ignore[no-any-return]
    problem, p = dense_call(q, k, v, attn_bias, causal, sm_scale)
    b, hq, lq, _ = q.shape
    if 0 in (b, hq, lq, k.shape[2]):  # nothing to compute, or nothing to attend: out 0
        return q.new_zeros(b, hq, lq, v.shape[-1])
    return select("attention.dense", problem, backend).kernel.run(q, k, v, attn_bias, p)  # type: ignore[no-any-return]


def _check_inputs(q: Any, k: Any, v: Any, attn_bias: Any) -> str:
    """Validate the tensors against each other; returns the bias kind."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, dims=4, dtypes=FLOAT_DTYPES)
        if t.stride(-1) != 1:
            raise fail(f"{name}.stride", t.stride(), "unit stride in the last (head_dim) dim")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise fail(f"{name}.dtype", t.dtype, f"q's dtype ({q.dtype})")
        check_same_device(name, t, "q", q)
    b, hq, _, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise fail("k.shape", tuple(k.shape), f"(B, Hkv, Lk, D) with B = {b} and D = {d} as in q")
    if k.shape[1] == 0 or hq % k.shape[1]:
        raise fail("k.shape[1]", k.shape[1], f"a divisor of q's {hq} heads (GQA)")
    if v.shape[:3] != k.shape[:3]:
        raise fail("v.shape", tuple(v.shape), f"(B, Hkv, Lk, Dv) with (B, Hkv, Lk) = {tuple(k.shape[:3])} as in k")
    if attn_bias is None:
        return "none"
    check_tensor(attn_bias, "attn_bias", dtypes=frozenset({torch.bool, q.dtype}))
    check_same_device("attn_bias", attn_bias, "q", q)
    want = (b, hq, q.shape[2], k.shape[2])
    try:
        ok = attn_bias.dim() <= 4 and torch.broadcast_shapes(attn_bias.shape, want) == want
    except RuntimeError:  # not broadcastable at all
        ok = False
    if not ok:
        raise fail("attn_bias.shape", tuple(attn_bias.shape), f"broadcastable to (B, Hq, Lq, Lk) = {want}: B, Hq and Lq "
                   f"from q.shape {tuple(q.shape)}, Lk from k.shape / v.shape {tuple(k.shape)}")
    return "bool" if attn_bias.dtype == torch.bool else "float"


def dense_call(q: Any, k: Any, v: Any, attn_bias: Any = None, causal: bool = False,
               sm_scale: Any = None) -> tuple[DenseProblem, DenseParams]:
    """Validate a :func:`dense` call; its problem and parameters."""
    bias = _check_inputs(q, k, v, attn_bias)
    scale = q.shape[-1] ** -0.5 if sm_scale is None else float(sm_scale)
    if not scale > 0 or scale == float("inf"):
        raise fail("sm_scale", sm_scale, "a positive finite float")
    dev, cc = device_key(q)
    features = graph_features(dev) | ({"causal"} if causal else set()) | ({"attn_bias"} if bias != "none" else set())
    if v.shape[-1] != q.shape[-1]:
        features |= {"qk_v_dims_differ"}
    b, hq, lq, d = q.shape
    hkv, lk = k.shape[1], k.shape[2]
    problem = DenseProblem(dev, cc, q.dtype, d, v.shape[-1], hq, hkv, hq // hkv, bucket(b), bucket(lq), bucket(lk),
                           bias, frozenset(features))
    return problem, DenseParams(scale, bool(causal))


DENSE = define(OpSpec(
    "attention.dense", dense, DenseProblem, dense_call, reference="dense", cases="attention", op="attention_dense",
    args=(Arg("q"), Arg("k"), Arg("v"), Arg("attn_bias", "Tensor?"), Arg("causal", "bool"), Arg("sm_scale", "float?"),
          Arg("backend", "backend")),
    fake=lambda q, k, v, *rest: q.new_empty(q.shape[0], q.shape[1], q.shape[2], v.shape[-1]),
))
