"""The workload presets of ``switchboard bench | tune | build``: a name and a builder of its points. The presets
whose points run their own comparison (``beyond``, ``flashinfer-compat``, ``flashinfer-ops``, ``first-call``) import
their modules only when built."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from .points import Point


def _decode_points(batches: tuple[int, ...], lens: tuple[int, ...], pages: tuple[int, ...], q: int = 32,
                   kv: int = 8, d: int = 128, layouts: tuple[str, ...] = ("NHD", "HND")) -> list[Point]:
    """Decode points; both page layouts, since some kernels take only one (cuDNN: HND)."""
    return [Point("attention.decode", {"batch": b, "kv_len": n, "page_size": p, "num_q_heads": q, "num_kv_heads": kv,
                                       "head_dim": d, "dtype": "bfloat16", "layout": lay},
                  f"B={b} L={n} p{p} {lay}") for p in pages for b in batches for n in lens for lay in layouts]


def _prefill_points(shapes: tuple[tuple[int, int], ...], q: int = 32, kv: int = 8, d: int = 128) -> list[Point]:
    return [Point("attention.prefill_ragged", {"batch": b, "q_len": n, "kv_len": n, "num_q_heads": q,
                                               "num_kv_heads": kv, "head_dim": d, "dtype": "bfloat16", "causal": True},
                  f"{b}x{n} causal") for b, n in shapes]


PRESETS: dict[str, Callable[[], list[Point]]] = {
    "attention": lambda: _decode_points((1, 16, 64, 128, 256), (1024, 4096, 8192), (16, 128))
    + _prefill_points(((1, 8192), (8, 2048), (4, 4096))),
    "variants": lambda: [
        Point(op, {**params, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", **extra},
              f"{label} {tag}")
        for op, params, label in (("attention.decode", {"batch": 128, "kv_len": 8192, "page_size": 16}, "B=128 L=8192"),
                                  ("attention.prefill_ragged", {"batch": 1, "q_len": 8192, "kv_len": 8192}, "1x8192"))
        for tag, extra in (("plain", {}), ("soft_cap=30", {"soft_cap": 30.0}), ("variant soft_cap", {"variant": "soft_cap"}),
                           ("variant alibi", {"variant": "alibi"}))]
    + [Point("attention.prefill_ragged", {"batch": 8, "q_len": 2048, "kv_len": 2048, "num_q_heads": 32, "num_kv_heads": 8,
                                          "head_dim": 128, "dtype": "bfloat16", "soft_cap": 30.0}, "8x2048 soft_cap=30")],
    "llama3-8b": lambda: _decode_points((16, 128), (2048, 8192), (16,)) + _prefill_points(((1, 8192), (8, 2048))),
    "llama3-70b": lambda: _decode_points((16, 128), (2048, 8192), (16,), q=64, kv=8)
    + _prefill_points(((1, 8192),), q=64, kv=8),
    # all 128 heads on one GPU (data-parallel attention), and the 16 of eight-way tensor parallelism
    "deepseek-v3-mla": lambda: [Point("attention.mla_decode", {"batch": b, "kv_len": n, "num_heads": h,
                                                                "page_size": 64, "dtype": "bfloat16"},
                                      f"B={b} L={n} p64" + ("" if h == 128 else f" H={h} (TP8)"))
                                for b, n, h in ((16, 4096, 128), (128, 8192, 128), (128, 8192, 16))],
    "moe": lambda: [
        Point("moe.fused_moe", {"tokens": 4096, "experts": 8, "top_k": 2, "hidden": 4096, "inter": 14336,
                                "dtype": "bfloat16"}, "mixtral 4096 tok"),
        Point("moe.fused_moe", {"tokens": 4096, "experts": 256, "top_k": 8, "hidden": 7168, "inter": 2048,
                                "dtype": "bfloat16"}, "deepseek-v3 4096 tok"),
    ],
    # from probabilities, no data check (one host sync): the shapes FlashInfer's sampling is usually compared on
    "sampling": lambda: [Point("sampling.top_k_top_p", {"batch": 128, "vocab": v, "top_p": 0.9, "top_k": k, "logits": 0,
                                                        "check_nan": 0}, f"vocab {v} {tag}")
                         for v in (128256, 152064) for tag, k in (("top-p", 0), ("top-k+top-p", 50))],
    "norm": lambda: [Point("norm.rms_norm", {"rows": 8192, "hidden": 8192, "dtype": "bfloat16"}, "8192x8192"),
                     Point("norm.fused_add_rms_norm", {"rows": 8192, "hidden": 8192, "dtype": "bfloat16"}, "8192x8192")],
    "dense": lambda: [
        Point("attention.dense", {"batch": b, "q_len": lq, "kv_len": lk, "num_q_heads": 16, "num_kv_heads": 16,
                                  "head_dim": 64, "dtype": "bfloat16", "bias": bias, "causal": causal}, label)
        for b, lq, lk, bias, causal, label in ((8, 1024, 1024, "bool", False, "encoder 8x1024 mask"),
                                               (8, 1024, 1024, "float", False, "encoder 8x1024 bias"),
                                               (1, 4096, 4096, "float", True, "1x4096 causal + bias"),
                                               (16, 77, 1024, "none", False, "cross-attention 77x1024"))],
    "beyond": lambda: importlib.import_module(".beyond", __package__).points(),  # POD, invariance, fp8, MLA
    "flashinfer-compat": lambda: importlib.import_module(".flashinfer", __package__).points(),
    "flashinfer-ops": lambda: importlib.import_module(".flashinfer", __package__).op_points(),  # norm ... sampling
    # one op per family, each in a fresh process (first_call.py); here for `switchboard build --preset first-call`
    "first-call": lambda: importlib.import_module("kernel_switchboard.bench.first_call").points(),
    "gemm": lambda: [Point("gemm.mm", {"m": 8192, "n": 8192, "k": 8192, "dtype": "bfloat16"}, "8192^3 bf16"),
                     Point("gemm.mm_fp8", {"m": 8192, "n": 8192, "k": 8192, "scale_mode": "block"}, "8192^3 fp8 block")],
}
