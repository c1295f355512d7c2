"""Benchmark: Triton fused MoE at the Mixtral and DeepSeek-V3 shapes, 4096 tokens, in TFLOP/s.

    python packages/backend-triton/benchmarks/moe.py          # on a GPU

``bench_moe(device) -> list[dict]``: Mixtral 8x7B (8 experts, top-2, 4096 -> 14336, bf16) and DeepSeek-V3
(256 experts, top-8, 7168 -> 2048, fp8 128x128 block-scaled weights, bf16 activations quantized to fp8 per
row and 128 columns by the kernel, grouped sigmoid routing). The experts call (routing done once beforehand)
is timed; FLOPs = 2 * T * k * 3 * H * I. Each row is first checked against the reference (float32
per-expert GEMMs) by relative Frobenius error (fp8: the conformance bound for quantized activations).
Sweep rows force other tiles (``SWEEP`` per shape).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from kernel_switchboard.bench import median_ms
from kernel_switchboard.testing.cases.moe import FP8_REL

TOKENS = 4096
#: name, experts, top_k, hidden, inter, fp8, routing
SHAPES: tuple[tuple[str, int, int, int, int, bool, dict[str, Any]], ...] = (
    ("mixtral 8x7B bf16", 8, 2, 4096, 14336, False, {}),
    ("deepseek-v3 fp8-block", 256, 8, 7168, 2048, True,
     {"scoring": "sigmoid", "num_expert_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}),
)

#: tiles tried besides the default, by shape name: (block_m, block_n, block_k, warps, stages[, down block_n]).
#: Left out after timing on the H200, all slower than the defaults: fp8 weights converted to bf16 tile by tile (as
#: the MMA's first operand or second, and with each expert's rest in 32- / 64-row blocks through a second launch);
#: on fp8 MMAs, 128 gate/up columns (they spill), 4 stages on 128-row blocks, 8 warps on 64-row blocks and a
#: 64-column down GEMM.
SWEEP: dict[str, tuple[tuple[int, ...], ...]] = {
    "mixtral 8x7B bf16": ((128, 128, 64, 8, 4),),
    "deepseek-v3 fp8-block": ((128, 64, 128, 8, 3, 128), (64, 64, 128, 4, 4, 128)),
}


@contextmanager
def _tiles(tiles: tuple[int, ...] | None) -> Iterator[None]:
    """Every fused-MoE launch on ``tiles`` (None: the shape's default)."""
    from kernel_switchboard_triton import moe

    saved = moe.moe_tiles
    if tiles is not None:
        moe.moe_tiles = lambda *args, **kw: moe.MoeTiles(*tiles)
    try:
        yield
    finally:
        moe.moe_tiles = saved


def _weights(experts: int, hidden: int, inter: int, fp8: bool, g: torch.Generator,
             dev: torch.device) -> tuple[torch.Tensor, ...]:
    from kernel_switchboard.testing.cases.moe import expert_weights

    return expert_weights(experts, hidden, inter, torch.bfloat16, fp8, g, dev)


def _shape_rows(name: str, experts: int, top_k: int, hidden: int, inter: int, fp8: bool, routing: dict[str, Any],
                dev: torch.device) -> list[dict[str, Any]]:
    """The default launch and each ``SWEEP`` tile of one shape, on inputs made once."""
    import kernel_switchboard as ksb

    workload = f"fused MoE {name}, {TOKENS} tokens, E={experts} k={top_k} H={hidden} I={inter}"
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(TOKENS, hidden, generator=g, device=dev).bfloat16()
    logits = torch.randn(TOKENS, experts, generator=g, device=dev)
    bias = torch.rand(experts, generator=g, device=dev) * 0.1 if routing else None
    w, ids = ksb.moe.route(logits, top_k, correction_bias=bias, **routing)
    w13, w2, s13, s2 = _weights(experts, hidden, inter, fp8, g, dev)

    def run(backend: str = "triton") -> torch.Tensor:
        return ksb.moe.experts(x, w, ids, w13, w2, w13_scale=s13, w2_scale=s2, check_ids=False, backend=backend)

    want = run("reference").float()
    bound = FP8_REL if fp8 else 3e-2
    flops = 2.0 * TOKENS * top_k * 3 * hidden * inter
    rows = []
    for tiles in (None, *SWEEP.get(name, ())):
        row: dict[str, Any] = {"workload": workload, "impl": "triton" + (f" tiles {tiles} (sweep)" if tiles else "")}
        try:
            with _tiles(tiles):
                got = run().float()
                row["rel_err"] = round(float((got - want).norm() / want.norm()), 5)
                del got
                if not row["rel_err"] < bound:
                    raise AssertionError(f"relative error {row['rel_err']} too large")
                ms = median_ms(run, rep_ms=100, warmup=5)
            row.update(ms=round(ms, 3), tflops=round(flops / (ms * 1e-3) / 1e12, 1))
        except Exception as exc:  # a benchmark row reports, never aborts the run
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(row, flush=True)
        rows.append(row)
    return rows


def bench_moe(device: str | torch.device = "cuda") -> list[dict[str, Any]]:
    dev = torch.device(device)
    out = [row for shape in SHAPES for row in _shape_rows(*shape, dev=dev)]
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    bench_moe("cuda")
