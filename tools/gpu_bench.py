"""Run every backend's benchmark functions (``packages/backend-*/benchmarks/*.py: bench_*(device)``)
in one process and write their rows to one JSON file. Each function is isolated: a failure is
recorded and the next one runs.

    python3 tools/gpu_bench.py OUT.json [name-filter ...]
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    out_path = Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-bench.json")
    filters = sys.argv[2:]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results: list[dict] = []
    for path in sorted(ROOT.glob("packages/backend-*/benchmarks/*.py")):
        if path.name.startswith("_"):
            continue
        name = f"{path.parent.parent.name}/{path.stem}"
        if filters and not any(f in name for f in filters):
            continue
        spec = importlib.util.spec_from_file_location(f"bench_{path.parent.parent.name}_{path.stem}", path)
        assert spec and spec.loader
        try:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - record and continue
            results.append({"bench": name, "error": traceback.format_exc()[-1500:]})
            continue
        for fname, fn in inspect.getmembers(module, inspect.isfunction):
            if not fname.startswith("bench_") or fn.__module__ != module.__name__:
                continue
            t0 = time.time()
            print(f"=== {name}.{fname}", flush=True)
            try:
                rows = fn(device)
                results.append({"bench": f"{name}.{fname}", "rows": rows, "seconds": time.time() - t0})
            except Exception:  # noqa: BLE001 - record and continue
                results.append({"bench": f"{name}.{fname}", "error": traceback.format_exc()[-1500:]})
                print(results[-1]["error"], flush=True)
            torch.cuda.empty_cache() if device.type == "cuda" else None
            out_path.write_text(json.dumps(results, indent=1, default=str))
    out_path.write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
