"""Tile sweeps of the Triton prefill and MLA decode kernels on the GPU (issue 3 tuning); rows printed as
they finish and written to one JSON file.

    python3 tools/gpu_sweep.py OUT.json [prefill] [mla]
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
    if "prefill" in parts:
        for batch, length in ((1, 8192), (8, 2048)):
            rows += bench._prefill_point(batch, length, dev, g, True)
            out.write_text(json.dumps(rows, indent=1, default=str))
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
