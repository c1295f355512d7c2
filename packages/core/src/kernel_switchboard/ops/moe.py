"""Mixture-of-experts ops: ``moe.route`` and ``moe.fused_moe`` (the experts).

Kernel ``run`` signatures (validated, canonical arguments):

- ``moe.route``: ``run(router_logits, top_k, scoring, renormalize, num_expert_group, topk_group,
  correction_bias, routed_scaling_factor) -> (weights (T, k) float32, ids (T, k) int32)``.
- ``moe.fused_moe``: ``run(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale) -> y (T, H)`` in x's dtype;
  x (T, H) contiguous; topk_weights (T, k) float32, topk_ids (T, k) int32 in [0, E), both contiguous.

Routing (scores in float32): ``scores = softmax(logits)`` or ``sigmoid(logits)``; selection uses
``scores + correction_bias`` (when given). Grouped top-k (DeepSeek, ``num_expert_group`` set): the E
experts form ``num_expert_group`` equal groups; a group's score is the sum of its top-2 selection
scores when ``correction_bias`` is given (DeepSeek-V3), else its best score (DeepSeek-V2); only the
``topk_group`` best groups stay eligible. The top_k experts by selection score (ids ordered by
that score, best first) get weights from the *un-biased* scores, renormalised to sum 1 when
``renormalize``, then multiplied by ``routed_scaling_factor``.

Experts: ``y[t] = Σ_j w[t, j] · (silu(x[t] G_e^T) * (x[t] U_e^T)) D_e^T`` with e = ids[t, j],
``w13[e] = [G_e; U_e]`` (E, 2I, H) (gate rows, then up rows), ``w2[e] = D_e`` (E, H, I). Weights
have x's dtype, or float8_e4m3fn with float32 128×128 block scales ``w13_scale`` (E, ⌈2I/128⌉, ⌈H/128⌉)
and ``w2_scale`` (E, ⌈H/128⌉, ⌈I/128⌉) (DeepSeek's layout: a weight is ``w_fp8 * scale[block]``).
The reference computes that math exactly in float32; kernels may quantize activations (fp8) or
round the intermediate to x's dtype, within the conformance tolerances.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..dispatch import check_backend, select
from ..errors import fail
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features

#: the fp8 block size of quantized expert weights (both dims)
BLOCK = 128
FP8_DTYPES = frozenset({torch.float8_e4m3fn})
SCORINGS = ("softmax", "sigmoid")


class RouteProblem(NamedTuple):
    """Signature of a routing (top-k expert selection) call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    num_experts: int
    top_k: int
    scoring: str
    grouped: bool
    biased: bool
    tokens: int  # bucketed
    features: frozenset[str]


class MoeProblem(NamedTuple):
    """Signature of an experts (fused MoE) call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype  # activations
    w_dtype: torch.dtype  # expert weights
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    quant: str  # "none" | "fp8_block"
    tokens: int  # bucketed
    features: frozenset[str]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# -- route ---------------------------------------------------------------------------------------
def _validate_route(router_logits: Any, top_k: Any, scoring: Any, num_expert_group: Any, topk_group: Any,
                    correction_bias: Any, routed_scaling_factor: Any) -> tuple[int | None, int | None, float]:
    check_tensor(router_logits, "router_logits", dims=2, dtypes=FLOAT_DTYPES | {torch.float64})
    e = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= e:
        raise fail("top_k", top_k, f"an int in [1, {e}] (the number of experts)")
    if scoring not in SCORINGS:
        raise fail("scoring", scoring, f"one of {SCORINGS}")
    if correction_bias is not None:
        check_tensor(correction_bias, "correction_bias", dims=1, dtypes=FLOAT_DTYPES | {torch.float64})
        if correction_bias.shape[0] != e:
            raise fail("correction_bias.shape", tuple(correction_bias.shape), f"({e},): one value per expert")
        check_same_device("correction_bias", correction_bias, "router_logits", router_logits)
    groups, kept = num_expert_group or None, topk_group or None
    if groups is None:
        if kept is not None:
            raise fail("topk_group", topk_group, "None unless num_expert_group is set")
    else:
        if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1 or e % groups:
            raise fail("num_expert_group", num_expert_group, f"an int >= 1 that divides the {e} experts")
        size = e // groups
        if correction_bias is not None and size < 2:
            raise fail("num_expert_group", num_expert_group, "groups of >= 2 experts (group score = sum of top-2)")
        if isinstance(kept, bool) or not isinstance(kept, int) or not 1 <= kept <= groups:
            raise fail("topk_group", topk_group, f"an int in [1, {groups}] (num_expert_group)")
        if top_k > kept * size:
            raise fail("top_k", top_k, f"<= topk_group * experts per group = {kept * size}")
    if isinstance(routed_scaling_factor, bool) or not isinstance(routed_scaling_factor, (int, float)) \
            or not 0 < routed_scaling_factor < float("inf"):
        raise fail("routed_scaling_factor", routed_scaling_factor, "a finite float > 0")
    return groups, kept, float(routed_scaling_factor)


def route(router_logits: torch.Tensor, top_k: int, *, scoring: str = "softmax", renormalize: bool = True,
          num_expert_group: int | None = None, topk_group: int | None = None,
          correction_bias: torch.Tensor | None = None, routed_scaling_factor: float = 1.0,
          backend: BackendArg = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k expert selection. router_logits (T, E) -> (weights (T, k) float32, ids (T, k) int32).

    scoring "softmax" | "sigmoid"; DeepSeek grouped top-k with ``num_expert_group`` / ``topk_group``;
    ``correction_bias`` (E,) shifts selection only (DeepSeek-V3); see the module docstring.
    """
    if torch.compiler.is_compiling():
        return ROUTE.compiled(router_logits, top_k, scoring, bool(renormalize), num_expert_group,  # type: ignore[no-any-return]
                              topk_group, correction_bias, float(routed_scaling_factor), backend)
    return _route_eager(router_logits, top_k, scoring, renormalize, num_expert_group, topk_group, correction_bias,
                        routed_scaling_factor, backend)


def route_call(router_logits: torch.Tensor, top_k: int, scoring: str = "softmax", renormalize: bool = True,
               num_expert_group: int | None = None, topk_group: int | None = None,
               correction_bias: torch.Tensor | None = None, routed_scaling_factor: float = 1.0
               ) -> tuple[RouteProblem, int | None, int | None, float]:
    """Validate a :func:`route` call: its problem, expert groups, groups kept and scaling factor."""
    groups, kept, factor = _validate_route(router_logits, top_k, scoring, num_expert_group, topk_group,
                                           correction_bias, routed_scaling_factor)
    dev, cc = device_key(router_logits)
    problem = RouteProblem(dev, cc, router_logits.dtype, router_logits.shape[1], top_k, scoring, groups is not None,
                           correction_bias is not None, bucket(router_logits.shape[0]), graph_features(dev))
    return problem, groups, kept, factor


def _route_eager(router_logits: torch.Tensor, top_k: int, scoring: str, renormalize: bool,
                 num_expert_group: int | None, topk_group: int | None, correction_bias: torch.Tensor | None,
                 routed_scaling_factor: float, backend: BackendArg) -> tuple[torch.Tensor, torch.Tensor]:
    problem, groups, kept, factor = route_call(router_logits, top_k, scoring, renormalize, num_expert_group,
                                               topk_group, correction_bias, routed_scaling_factor)
    kernel = select("moe.route", problem, backend).kernel
    return kernel.run(router_logits, top_k, scoring, bool(renormalize), groups, kept,  # type: ignore[no-any-return]
                      correction_bias, factor)


# -- experts -------------------------------------------------------------------------------------
def _validate_weights(x: Any, w13: Any, w2: Any, w13_scale: Any, w2_scale: Any) -> str:
    """Check x (T, H) against the expert weights and scales; returns the quantization ("none" | "fp8_block")."""
    check_tensor(x, "x", dims=2, dtypes=FLOAT_DTYPES)
    h = x.shape[1]
    check_tensor(w13, "w13", dims=3, dtypes=FLOAT_DTYPES | FP8_DTYPES)
    check_tensor(w2, "w2", dims=3, dtypes=FLOAT_DTYPES | FP8_DTYPES)
    e, two_i, h13 = w13.shape
    if h13 != h or two_i % 2 or two_i == 0:
        raise fail("w13.shape", tuple(w13.shape), f"(E, 2I, H) with H = {h} (x's hidden size) and 2I even, > 0")
    i = two_i // 2
    if tuple(w2.shape) != (e, h, i):
        raise fail("w2.shape", tuple(w2.shape), f"(E, H, I) = {(e, h, i)} (from w13 {tuple(w13.shape)})")
    fp8 = w13.dtype in FP8_DTYPES
    if fp8:
        if w2.dtype != w13.dtype:
            raise fail("w2.dtype", w2.dtype, f"w13's dtype ({w13.dtype})")
        for name, s, shape in (("w13_scale", w13_scale, (e, _cdiv(two_i, BLOCK), _cdiv(h, BLOCK))),
                               ("w2_scale", w2_scale, (e, _cdiv(h, BLOCK), _cdiv(i, BLOCK)))):
            if s is None:
                raise fail(name, None, f"a float32 {shape} tensor of 128x128 block scales (fp8 weights)")
            check_tensor(s, name, dims=3, dtypes={torch.float32})
            if tuple(s.shape) != shape:
                raise fail(f"{name}.shape", tuple(s.shape), f"{shape}: one scale per 128x128 block")
            check_same_device(name, s, "x", x)
    else:
        for name, wt in (("w13", w13), ("w2", w2)):
            if wt.dtype != x.dtype:
                raise fail(f"{name}.dtype", wt.dtype, f"x's dtype ({x.dtype}) or float8_e4m3fn with block scales")
        for name, s in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
            if s is not None:
                raise fail(name, "a tensor", "None for unquantized weights (scales go with float8_e4m3fn weights)")
    check_same_device("w13", w13, "x", x)
    check_same_device("w2", w2, "x", x)
    return "fp8_block" if fp8 else "none"


def _validate_experts(x: Any, topk_weights: Any, topk_ids: Any, w13: Any, w2: Any, w13_scale: Any,
                      w2_scale: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    quant = _validate_weights(x, w13, w2, w13_scale, w2_scale)
    t = x.shape[0]
    check_tensor(topk_weights, "topk_weights", dims=2, dtypes=FLOAT_DTYPES)
    if topk_weights.shape[0] != t or topk_weights.shape[1] < 1:
        raise fail("topk_weights.shape", tuple(topk_weights.shape), f"(T, k) with T = {t} (x's tokens), k >= 1")
    check_tensor(topk_ids, "topk_ids", dims=2, dtypes={torch.int32, torch.int64})
    if topk_ids.shape != topk_weights.shape:
        raise fail("topk_ids.shape", tuple(topk_ids.shape), f"topk_weights' shape {tuple(topk_weights.shape)}")
    check_same_device("topk_weights", topk_weights, "x", x)
    check_same_device("topk_ids", topk_ids, "x", x)
    weights = topk_weights.to(torch.float32).contiguous()
    ids = topk_ids.to(torch.int32).contiguous()
    return x.contiguous(), weights, ids, quant


def _experts_problem(x: torch.Tensor, k: int, w13: torch.Tensor, w2: torch.Tensor, quant: str) -> MoeProblem:
    dev, cc = device_key(x)
    return MoeProblem(dev, cc, x.dtype, w13.dtype, x.shape[1], w2.shape[2], w13.shape[0], k, quant, bucket(x.shape[0]),
                      graph_features(dev))


def experts(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
            *, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None, check_ids: bool = True,
            backend: BackendArg = None) -> torch.Tensor:
    """The expert computation of a routed MoE layer (for engines that route themselves).

    x (T, H) fp32/fp16/bf16; topk_weights (T, k) float (cast to float32); topk_ids (T, k) int32/int64;
    w13 (E, 2I, H), w2 (E, H, I) in x's dtype or float8_e4m3fn with block scales. Returns (T, H), x's dtype.
    ``check_ids`` checks that every id is in [0, E) with one host sync (skipped during CUDA-graph capture).
    """
    if torch.compiler.is_compiling():
        return EXPERTS.compiled(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale,  # type: ignore[no-any-return]
                                bool(check_ids), backend)
    problem, x2, weights, ids = experts_call(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale, check_ids)
    kernel = select("moe.fused_moe", problem, backend).kernel
    return kernel.run(x2, weights, ids, w13, w2, w13_scale, w2_scale)  # type: ignore[no-any-return]


def experts_call(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
                 w2: torch.Tensor, w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                 check_ids: bool = True) -> tuple[MoeProblem, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate an :func:`experts` call (``check_ids``: one host read, none in a capture): its problem and x,
    the weights (float32) and ids (int32) as the kernels take them."""
    x2, weights, ids, quant = _validate_experts(x, topk_weights, topk_ids, w13, w2, w13_scale, w2_scale)
    problem = _experts_problem(x2, ids.shape[1], w13, w2, quant)
    e = w13.shape[0]
    if check_ids and ids.numel() and "cuda_graph" not in problem.features and bool(((ids < 0) | (ids >= e)).any()):
        raise fail("topk_ids", "ids outside the experts", f"ids in [0, {e})")
    return problem, x2, weights, ids


# -- fused_moe -----------------------------------------------------------------------------------
def fused_moe(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int, *,
              renormalize: bool = True, scoring: str = "softmax", num_expert_group: int | None = None,
              topk_group: int | None = None, correction_bias: torch.Tensor | None = None,
              routed_scaling_factor: float = 1.0, w13_scale: torch.Tensor | None = None,
              w2_scale: torch.Tensor | None = None, backend: BackendArg = None,
              route_backend: BackendArg = None) -> torch.Tensor:
    """A routed MoE layer: :func:`route` then the experts. x (..., H); router_logits (..., E).

    Returns x's shape and dtype. ``backend`` chooses the experts kernel, ``route_backend`` the routing
    kernel (both automatic by default); ``ksb.explain("moe.fused_moe", ...)`` explains the experts choice.
    """
    if torch.compiler.is_compiling():
        shape = x.shape
        w, ids = ROUTE.compiled(router_logits.reshape(-1, router_logits.shape[-1]), top_k, scoring, bool(renormalize),
                                num_expert_group, topk_group, correction_bias, float(routed_scaling_factor),
                                route_backend)
        y = EXPERTS.compiled(x.reshape(-1, shape[-1]), w, ids, w13, w2, w13_scale, w2_scale, False, backend)
        return y.view(shape)  # type: ignore[no-any-return]
    problem, x2, logits2 = fused_moe_call(x, router_logits, w13, w2, top_k, w13_scale=w13_scale, w2_scale=w2_scale,
                                          route_backend=route_backend)
    kernel = select("moe.fused_moe", problem, backend).kernel  # first, so that a kernel that cannot run routes nothing
    w, ids = _route_eager(logits2, top_k, scoring, renormalize, num_expert_group, topk_group, correction_bias,
                          routed_scaling_factor, route_backend)
    y = kernel.run(x2, w, ids, w13, w2, w13_scale, w2_scale)
    return y if y.shape == x.shape else y.view(x.shape)  # type: ignore[no-any-return]


def fused_moe_call(x: torch.Tensor, router_logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, top_k: int,
                   renormalize: bool = True, scoring: str = "softmax", num_expert_group: int | None = None,
                   topk_group: int | None = None, correction_bias: torch.Tensor | None = None,
                   routed_scaling_factor: float = 1.0, w13_scale: torch.Tensor | None = None,
                   w2_scale: torch.Tensor | None = None, route_backend: BackendArg = None
                   ) -> tuple[MoeProblem, torch.Tensor, torch.Tensor]:
    """Validate a :func:`fused_moe` call's input and experts: the experts' problem, x as (T, H) and the router logits
    as (T, E) (the routing arguments are checked by :func:`route`)."""
    check_backend(route_backend, "route_backend")
    check_tensor(x, "x", dtypes=FLOAT_DTYPES)
    check_tensor(router_logits, "router_logits")
    if x.dim() < 1 or router_logits.dim() != x.dim() or router_logits.shape[:-1] != x.shape[:-1]:
        raise fail("router_logits.shape", tuple(router_logits.shape), f"x's leading dims {tuple(x.shape[:-1])} + (E,)")
    x2 = x.reshape(-1, x.shape[-1])
    logits2 = router_logits.reshape(-1, router_logits.shape[-1])
    if isinstance(w13, torch.Tensor) and w13.dim() == 3 and logits2.shape[1] != w13.shape[0]:
        raise fail("router_logits.shape", tuple(router_logits.shape), f"(..., E) with E = {w13.shape[0]} (w13's experts)")
    quant = _validate_weights(x2, w13, w2, w13_scale, w2_scale)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= w13.shape[0]:
        raise fail("top_k", top_k, f"an int in [1, {w13.shape[0]}] (the number of experts)")
    x2 = x2.contiguous()
    return _experts_problem(x2, top_k, w13, w2, quant), x2, logits2


# -- specs ---------------------------------------------------------------------------------------
def _own(result: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """A custom op's outputs must not be views (of its inputs or of each other): views are copied."""
    return tuple(t.clone() if t._base is not None else t for t in result)


_BACKEND = Arg("backend", "backend")
ROUTE = define(OpSpec(
    "moe.route", route, RouteProblem, route_call, reference="route", cases="moe", op="moe_route",
    args=(Arg("router_logits"), Arg("top_k", "int"), Arg("scoring", "str"), Arg("renormalize", "bool"),
          Arg("num_expert_group", "int?"), Arg("topk_group", "int?"), Arg("correction_bias", "Tensor?"),
          Arg("routed_scaling_factor", "float"), _BACKEND),
    returns="(Tensor, Tensor)", outputs=_own,
    fake=lambda logits, top_k, *rest: (torch.empty(logits.shape[0], top_k, dtype=torch.float32, device=logits.device),
                                       torch.empty(logits.shape[0], top_k, dtype=torch.int32, device=logits.device)),
))
EXPERTS = define(OpSpec(
    "moe.experts", experts, MoeProblem, experts_call, reference="fused_moe", cases="moe", op="moe_experts",
    kernels="moe.fused_moe",
    args=(Arg("x"), Arg("topk_weights"), Arg("topk_ids"), Arg("w13"), Arg("w2"), Arg("w13_scale", "Tensor?"),
          Arg("w2_scale", "Tensor?"), Arg("check_ids", "bool"), _BACKEND),
    fake=lambda x, *rest: torch.empty_like(x),
))
FUSED_MOE = define(OpSpec(
    "moe.fused_moe", fused_moe, MoeProblem, fused_moe_call, reference="fused_moe", cases="moe",
))
