"""Tile sweeps of the Triton prefill, MLA decode and small-batch decode kernels on the GPU (issues 3 and 7);
rows printed as they finish and written to one JSON file.

    python3 tools/gpu_sweep.py OUT.json [prefill] [mla] [decode-small]

``decode-small``: split counts and tiles at batch 1 and 16 (page 16, NHD), each plan timed in a CUDA graph.
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
    if "decode-small" in parts:
        for batch, length in ((1, 1024), (1, 4096), (1, 8192), (16, 1024)):
            rows += bench._decode_point(batch, length, "NHD", dev, g, True, graph=True,
                                        tiles=((64, 4, 3), (32, 4, 4), (128, 4, 3)), splits=(4, 8, 16, 32, 64))
            out.write_text(json.dumps(rows, indent=1, default=str))
    if "prefill" in parts:
        for batch, length in ((1, 8192), (8, 2048)):
            rows += bench._prefill_point(batch, length, dev, g, True)
            out.write_text(json.dumps(rows, indent=1, default=str))
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
