"""Benchmark: Triton fused MoE at the Mixtral and DeepSeek-V3 shapes, 4096 tokens, in TFLOP/s.

    python packages/backend-triton/benchmarks/moe.py          # on a GPU

``bench_moe(device) -> list[dict]``: Mixtral 8x7B (8 experts, top-2, 4096 -> 14336, bf16) and DeepSeek-V3
(256 experts, top-8, 7168 -> 2048, fp8 128x128 block-scaled weights, bf16 activations, grouped sigmoid
routing). The experts call (routing done once beforehand) is timed; FLOPs = 2 * T * k * 3 * H * I.
Each row is first checked against the reference (float32 per-expert GEMMs) by relative Frobenius error.
"""

from __future__ import annotations

from typing import Any

import torch

from kernel_switchboard.bench import median_ms

TOKENS = 4096
#: name, experts, top_k, hidden, inter, fp8, routing
SHAPES: tuple[tuple[str, int, int, int, int, bool, dict[str, Any]], ...] = (
    ("mixtral 8x7B bf16", 8, 2, 4096, 14336, False, {}),
    ("deepseek-v3 fp8-block", 256, 8, 7168, 2048, True,
     {"scoring": "sigmoid", "num_expert_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}),
)


def _weights(experts: int, hidden: int, inter: int, fp8: bool, g: torch.Generator,
             dev: torch.device) -> tuple[torch.Tensor, ...]:
    from kernel_switchboard.testing.cases.moe import expert_weights

    return expert_weights(experts, hidden, inter, torch.bfloat16, fp8, g, dev)


def _one(name: str, experts: int, top_k: int, hidden: int, inter: int, fp8: bool, routing: dict[str, Any],
         dev: torch.device) -> dict[str, Any]:
    import kernel_switchboard as ksb

    row: dict[str, Any] = {"workload": f"fused MoE {name}, {TOKENS} tokens, E={experts} k={top_k} "
                                       f"H={hidden} I={inter}", "impl": "triton"}
    try:
        g = torch.Generator(device=dev).manual_seed(0)
        x = torch.randn(TOKENS, hidden, generator=g, device=dev).bfloat16()
        logits = torch.randn(TOKENS, experts, generator=g, device=dev)
        bias = torch.rand(experts, generator=g, device=dev) * 0.1 if routing else None
        w, ids = ksb.moe.route(logits, top_k, correction_bias=bias, **routing)
        w13, w2, s13, s2 = _weights(experts, hidden, inter, fp8, g, dev)

        def run(backend: str = "triton") -> torch.Tensor:
            return ksb.moe.experts(x, w, ids, w13, w2, w13_scale=s13, w2_scale=s2, check_ids=False, backend=backend)

        got, want = run().float(), run("reference").float()
        row["rel_err"] = round(float((got - want).norm() / want.norm()), 5)
        if not row["rel_err"] < 3e-2:
            raise AssertionError(f"relative error {row['rel_err']} too large")
        del got, want
        ms = median_ms(run, rep_ms=100, warmup=5)
        flops = 2.0 * TOKENS * top_k * 3 * hidden * inter
        row.update(ms=round(ms, 3), tflops=round(flops / (ms * 1e-3) / 1e12, 1))
    except Exception as exc:  # a benchmark row reports, never aborts the run
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(row, flush=True)
    return row


def bench_moe(device: str | torch.device = "cuda") -> list[dict[str, Any]]:
    dev = torch.device(device)
    out = [_one(*shape, dev=dev) for shape in SHAPES]
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    bench_moe("cuda")
