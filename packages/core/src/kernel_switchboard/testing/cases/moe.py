"""Conformance cases for the moe family: routing and experts against the reference.

Router logits are distinct and exactly representable in every float dtype (a scaled permutation
per token), so top-k choices have no ties. ``moe.fused_moe`` cases route with the reference
(``route_backend="reference"``) so that they test the experts kernel alone. Route outputs are
compared as sets: each row sorted by expert id. Inputs are scaled so outputs are O(1); bf16 gets a
looser tolerance (intermediate rounding), fp8 weights a norm-based check (activation quantization).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..case import Case

#: (atol, rtol) of the experts output by activation dtype (unquantized weights)
TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (5e-3, 5e-3), torch.bfloat16: (3e-2, 3e-2)}
#: fp8 weights: kernels quantize activations per 1x128 group (DeepSeek w8a8), which the reference does
#: not: max relative Frobenius error, and per element |err| <= FP8_ELEM[0] * rms(ref) + FP8_ELEM[1] * |ref|.
#: A simulated w8a8 kernel at DeepSeek-V3's shape measured 0.031 and max |err| 0.31 at rms(ref) 0.8.
FP8_REL = 0.06
FP8_ELEM = (0.5, 0.1)
FP8_MAX = 448.0
BLOCK = 128


def _gen(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def distinct_logits(tokens: int, experts: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """(T, E) float32 router logits: per token a permutation of equally spaced values, exact in bf16."""
    spacing = 2.0 ** (int(torch.tensor(8.0 / experts).log2().floor()))
    ranks = torch.argsort(torch.rand(tokens, experts, generator=g, device=device), dim=-1)
    return (ranks.float() - experts / 2) * spacing


def quantize_fp8_block(w: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """(..., N, K) float -> (float8_e4m3fn weights, float32 (..., ceil(N/b), ceil(K/b)) scales), DeepSeek style."""
    *lead, n, k = w.shape
    nb, kb = -(-n // block), -(-k // block)
    pad = torch.nn.functional.pad(w.float(), (0, kb * block - k, 0, nb * block - n))
    tiles = pad.view(*lead, nb, block, kb, block)
    scale = (tiles.abs().amax(dim=(-3, -1)) / FP8_MAX).clamp_min(1e-12)  # (..., nb, kb)
    q = (tiles / scale[..., :, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(*lead, nb * block, kb * block)[..., :n, :k].contiguous(), scale


def expert_weights(experts: int, hidden: int, inter: int, dtype: torch.dtype, fp8: bool, g: torch.Generator,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """w13 (E, 2I, H), w2 (E, H, I) with unit-variance outputs; fp8: quantized one expert at a time."""
    if not fp8:
        w13 = (torch.randn(experts, 2 * inter, hidden, generator=g, device=device) / hidden ** 0.5).to(dtype)
        w2 = (torch.randn(experts, hidden, inter, generator=g, device=device) / inter ** 0.5).to(dtype)
        return w13, w2, None, None
    parts: list[list[torch.Tensor]] = [[], [], [], []]
    for _ in range(experts):
        a, sa = quantize_fp8_block(torch.randn(2 * inter, hidden, generator=g, device=device) / hidden ** 0.5)
        b, sb = quantize_fp8_block(torch.randn(hidden, inter, generator=g, device=device) / inter ** 0.5)
        for lst, t in zip(parts, (a, b, sa, sb)):
            lst.append(t)
    w13, w2, s13, s2 = (torch.stack(p) for p in parts)
    return w13, w2, s13, s2


def fp8_check(run: Callable[..., Any]) -> None:
    """Case.check of fp8-weight experts: relative Frobenius error and a loose elementwise bound."""
    got, want = run(), run("reference")
    assert got.shape == want.shape and got.dtype == want.dtype, f"{got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    g, w = got.double().cpu(), want.double().cpu()
    assert bool(torch.isfinite(g).all()), "non-finite outputs"
    rel = float((g - w).norm() / w.norm().clamp_min(1e-30))
    assert rel <= FP8_REL, f"relative Frobenius error {rel:.3g} above {FP8_REL}"
    bound = FP8_ELEM[0] * w.pow(2).mean().sqrt() + FP8_ELEM[1] * w.abs()
    bad = (g - w).abs() > bound
    assert not bad.any(), f"{int(bad.sum())} entries beyond 0.5 rms + 0.1 |ref|; first at {bad.nonzero()[0].tolist()}"


def _sorted_route(_args: Any, result: Any) -> list[torch.Tensor]:
    weights, ids = result
    order = torch.argsort(ids.long(), dim=-1, stable=True)
    return [weights.gather(1, order), ids.gather(1, order)]


# name, tokens, experts, top_k, scoring, renormalize, groups, topk_group, bias, scaling
ROUTES_SMALL: list[tuple[Any, ...]] = [
    ("mixtral-like", 5, 8, 2, "softmax", True, None, None, False, 1.0),
    ("softmax-norenorm", 7, 16, 4, "softmax", False, None, None, False, 1.0),
    ("sigmoid-bias", 6, 16, 3, "sigmoid", True, None, None, True, 1.0),
    ("deepseek-v3-grouped", 6, 32, 4, "sigmoid", True, 8, 4, True, 2.5),
    ("deepseek-v2-grouped", 5, 16, 3, "softmax", False, 4, 2, False, 1.0),
]
ROUTES_LARGE: list[tuple[Any, ...]] = [
    ("mixtral", 256, 8, 2, "softmax", True, None, None, False, 1.0),
    ("qwen3-moe", 256, 128, 8, "softmax", True, None, None, False, 1.0),
    ("deepseek-v3", 256, 256, 8, "sigmoid", True, 8, 4, True, 2.5),
    ("deepseek-v2", 4096, 160, 6, "softmax", False, 8, 3, False, 16.0),
]

# name, tokens, hidden, inter, experts, top_k, dtype, fp8, routing kwargs
EXPERTS_SMALL: list[tuple[Any, ...]] = [
    ("fp32", 5, 64, 32, 4, 2, torch.float32, False, {}),
    ("fp16", 5, 64, 32, 4, 2, torch.float16, False, {}),
    ("bf16", 4, 64, 32, 4, 2, torch.bfloat16, False, {}),
    ("fp32-topk1-norenorm", 3, 32, 16, 3, 1, torch.float32, False, {"renormalize": False}),
    ("bf16-fp8-block", 5, 256, 192, 4, 2, torch.bfloat16, True, {}),
    ("fp32-fp8-grouped", 4, 256, 128, 8, 3, torch.float32, True,
     {"scoring": "sigmoid", "num_expert_group": 4, "topk_group": 2, "bias": True, "routed_scaling_factor": 2.5}),
]
EXPERTS_LARGE: list[tuple[Any, ...]] = [
    ("mixtral-8x7b-bf16", 256, 4096, 14336, 8, 2, torch.bfloat16, False, {}),
    ("mixtral-decode-fp16", 8, 4096, 14336, 8, 2, torch.float16, False, {}),
    ("qwen3-30b-a3b-bf16", 512, 2048, 768, 128, 8, torch.bfloat16, False, {}),
    ("deepseek-v3-fp8", 256, 7168, 2048, 256, 8, torch.bfloat16, True,
     {"scoring": "sigmoid", "num_expert_group": 8, "topk_group": 4, "bias": True, "routed_scaling_factor": 2.5}),
]


def _route_kwargs(spec: dict[str, Any], experts: int, g: torch.Generator, device: torch.device) -> dict[str, Any]:
    kw = {k: v for k, v in spec.items() if k != "bias"}
    if spec.get("bias"):
        kw["correction_bias"] = torch.rand(experts, generator=g, device=device) * 0.1
    return kw


def route_case(name: str, tokens: int, experts: int, top_k: int, scoring: str, renormalize: bool,
               groups: int | None, topk_group: int | None, bias: bool, scaling: float, dtype: torch.dtype,
               device: torch.device, seed: int = 0) -> Case:
    g = _gen(device, seed)
    logits = distinct_logits(tokens, experts, g, device).to(dtype)
    spec = {"scoring": scoring, "renormalize": renormalize, "num_expert_group": groups, "topk_group": topk_group,
            "bias": bias, "routed_scaling_factor": scaling}
    kw = _route_kwargs(spec, experts, g, device)
    return Case("moe.route", f"{name}-{str(dtype)[6:]}-T{tokens}-E{experts}-k{top_k}", (logits, top_k), kw,
                torch.float32, outputs=_sorted_route)


def experts_case(name: str, tokens: int, hidden: int, inter: int, experts: int, top_k: int, dtype: torch.dtype,
                 fp8: bool, routing: dict[str, Any], device: torch.device, seed: int = 0) -> Case:
    g = _gen(device, seed)
    x = torch.randn(tokens, hidden, generator=g, device=device).to(dtype)
    logits = distinct_logits(tokens, experts, g, device).to(dtype)
    w13, w2, s13, s2 = expert_weights(experts, hidden, inter, dtype, fp8, g, device)
    kw = _route_kwargs(routing, experts, g, device)
    kw.update(route_backend="reference")
    if fp8:
        kw.update(w13_scale=s13, w2_scale=s2)
    tag = f"{name}-T{tokens}-H{hidden}-I{inter}-E{experts}-k{top_k}"
    if fp8:
        return Case("moe.fused_moe", tag, (x, logits, w13, w2, top_k), kw, dtype, check=fp8_check)
    return Case("moe.fused_moe", tag, (x, logits, w13, w2, top_k), kw, dtype, tol=TOL[dtype])


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    out: list[Case] = []
    if op == "moe.route":
        for i, spec in enumerate(ROUTES_SMALL if size == "small" else ROUTES_LARGE):
            for dtype in (torch.float32, torch.bfloat16):
                out.append(route_case(*spec, dtype=dtype, device=device, seed=i))
    elif op == "moe.fused_moe":
        for i, spec in enumerate(EXPERTS_SMALL if size == "small" else EXPERTS_LARGE):
            out.append(experts_case(*spec, device=device, seed=100 + i))
    return out


#: the parameters :func:`example` reads, with their types (``switchboard explain`` / ``bench`` / ``tune`` check them)
EXAMPLE_PARAMS: dict[str, type] = {
    "tokens": int, "hidden": int, "inter": int, "experts": int, "top_k": int, "dtype": str, "fp8": bool, "grouped": bool,
}


def example(op: str, device: torch.device, **shape: Any) -> Case:
    """One case from CLI-style parameters (strings accepted), for benchmarks and demos.

    moe.fused_moe: tokens (256), hidden (4096), inter (14336), experts (8), top_k (2), dtype ("bfloat16"),
    fp8 (0), grouped (0: DeepSeek-V3 routing with 8 groups, 4 kept, sigmoid, bias). moe.route: tokens,
    experts, top_k, grouped, dtype.
    """
    from .sampling import _dtype

    dtype = _dtype(str(shape.get("dtype", "bfloat16")))
    tokens, experts, top_k = int(shape.get("tokens", 256)), int(shape.get("experts", 8)), int(shape.get("top_k", 2))
    grouped = bool(int(shape.get("grouped", 0)))
    routing: dict[str, Any] = ({"scoring": "sigmoid", "num_expert_group": 8, "topk_group": 4, "bias": True,
                                "routed_scaling_factor": 2.5} if grouped else {})
    if op == "moe.route":
        return route_case("example", tokens, experts, top_k, routing.get("scoring", "softmax"), True,
                          routing.get("num_expert_group"), routing.get("topk_group"), grouped,
                          routing.get("routed_scaling_factor", 1.0), dtype, device)
    hidden, inter = int(shape.get("hidden", 4096)), int(shape.get("inter", 14336))
    fp8 = bool(int(shape.get("fp8", 0)))
    return experts_case("example", tokens, hidden, inter, experts, top_k, dtype, fp8, routing, device)
