"""Reporting measured rows: the terminal table, ``bench.json`` and ``bench.csv`` with the environment, and a PNG plot
per op (when matplotlib is installed)."""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .points import Row


def print_table(rows: list[Row], ceil: dict[str, float]) -> None:
    header = f"{'op':<26} {'point':<22} {'kernel':<52} {'ms':>9} {'rate':>14} {'%ceil':>6} {'regret':>7}"
    print(header)
    print("-" * len(header))
    for r in rows:
        if r.error:
            print(f"{r.op:<26} {r.label:<22} {r.kernel:<52} {'error':>9}  {r.error[:80]}")
            continue
        rate = f"{r.metric:.3g} {r.unit}" if r.metric is not None else ""
        ref = ceil.get({"TB/s": "copy_tbs", "TFLOP/s": "mm_tflops"}.get(r.unit, ""))  # ratios and times: none
        pct = f"{100 * r.metric / ref:.0f}%" if ref and r.metric else ""
        regret = f"{r.regret:.3f}" if r.regret is not None else ""
        ms = f"{r.ms:.4f}" if r.ms is not None else ""  # none on a ratio row
        print(f"{r.op:<26} {r.label:<22} {r.kernel:<52} {ms:>9} {rate:>14} {pct:>6} {regret:>7}")


def write_plots(rows: list[Row], out: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("bench: matplotlib is not installed: no plots (pip install matplotlib)", file=sys.stderr)
        return []
    made = []
    for op in sorted({r.op for r in rows}):
        ok = [r for r in rows if r.op == op and r.metric is not None and not r.auto]
        if not ok:
            continue
        labels = list(dict.fromkeys(r.label for r in ok))
        kernels = list(dict.fromkeys(r.kernel for r in ok))
        fig, ax = plt.subplots(figsize=(max(6, len(labels) * 0.6), 4))
        for k in kernels:
            ys = [next((r.metric for r in ok if r.kernel == k and r.label == lab), math.nan) for lab in labels]
            ax.plot(range(len(labels)), ys, marker="o", label=k)
        ax.set_xticks(range(len(labels)), labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel(ok[0].unit)
        ax.set_title(op)
        ax.legend(fontsize=6)
        fig.tight_layout()
        path = out / f"{op.replace('.', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def write_tables(out: Path, rows: list[Row], ceil: dict[str, float], environment: dict[str, Any]) -> None:
    """bench.json (rows, ceilings, environment) and bench.csv (rows without their extras) under ``out``."""
    payload = {"environment": environment, "ceilings": ceil, "rows": [asdict(r) for r in rows]}
    (out / "bench.json").write_text(json.dumps(payload, indent=1, default=str))
    with open(out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in asdict(rows[0]) if k != "extra"] if rows else ["op"])
        writer.writeheader()
        for r in rows:
            d = asdict(r)
            d.pop("extra")
            writer.writerow(d)
