"""Tile sweeps of the Triton prefill, MLA decode and small-batch decode kernels on the GPU (issues 3 and 7);
rows printed as they finish and written to one JSON file.

    python3 tools/gpu_sweep.py OUT.json [prefill] [mla] [mla-tp8] [mla-small] [decode-small] [same-plan]

``decode-small``: split counts and tiles at batch 1 and 16 (page 16, NHD), each plan timed in a CUDA graph.
``same-plan``: the grid's B=1 L=1024 p16 NHD decode, where the automatic plan and the explicit Triton plan
(the same kernel and launch) timed 4% apart in runs 12 and 15: three explicit plans and the automatic one,
each in its own CUDA graph, timed in turn for five rounds, then in reverse order.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages/backend-triton/benchmarks"))
import attention as bench  # noqa: E402


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "sweep.json")
    parts = sys.argv[2:] or ["prefill", "mla"]
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    if "mla" in parts:
        rows += bench._mla_point(dev, g, True)
        out.write_text(json.dumps(rows, indent=1, default=str))
    if "mla-tp8" in parts:  # 16 heads (DeepSeek-V3 over eight-way tensor parallelism): Triton tiles against padded Gluon
        rows += bench._mla_point(dev, g, True, heads=16)
        out.write_text(json.dumps(rows, indent=1, default=str))
    if "mla-small" in parts:  # the deepseek-v3-mla preset's small point, eager and in CUDA graphs, split counts
        for graph in (False, True):
            rows += bench._mla_point(dev, g, True, batch=16, length=4096, graph=graph, splits=(2, 4, 8, 16))
            out.write_text(json.dumps(rows, indent=1, default=str))
    if "decode-small" in parts:
        for batch, length in ((1, 1024), (1, 4096), (1, 8192), (16, 1024)):
            rows += bench._decode_point(batch, length, "NHD", dev, g, True, graph=True,
                                        tiles=((64, 4, 3), (32, 4, 4), (128, 4, 3)), splits=(4, 8, 16, 32, 64))
            out.write_text(json.dumps(rows, indent=1, default=str))
    if "same-plan" in parts:
        rows += _same_plan(dev)
        out.write_text(json.dumps(rows, indent=1, default=str))
    if "prefill" in parts:
        for batch, length in ((1, 8192), (8, 2048)):
            rows += bench._prefill_point(batch, length, dev, g, True)
            out.write_text(json.dumps(rows, indent=1, default=str))
            torch.cuda.empty_cache()
    return 0


def _same_plan(dev: torch.device) -> list[dict[str, object]]:
    from kernel_switchboard import bench as kb

    params = {"batch": 1, "kv_len": 1024, "page_size": 16, "num_q_heads": 32, "num_kv_heads": 8, "head_dim": 128,
              "dtype": "bfloat16", "layout": "NHD"}
    case = kb._example("attention.decode", dev, params)
    graphs = {}
    for name, kernel in (("triton a", "triton"), ("auto", None), ("triton b", "triton"), ("triton c", "triton")):
        plan, call = kb._decode_plan(kernel, case.args, case.kwargs)
        call()
        graphs[f"{name} ({plan.kernel.id})"] = kb._captured(call).replay
    rows: list[dict[str, object]] = []
    for order in ("forward", "reverse"):
        calls = dict(graphs.items() if order == "forward" else reversed(graphs.items()))
        for name, ms in kb.fastest_of_rounds(calls, dev, 100.0, rounds=5).items():
            rows.append({"workload": "B=1 L=1024 p16 NHD decode graph", "order": order, "plan": name,
                         "us": round(ms * 1e3, 2)})
            print(rows[-1], flush=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
