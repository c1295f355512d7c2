"""The untuned choice (each kernel's cost model) against a bench run's measured attention rows, on any machine.

    python3 tools/cost_check.py BENCH.json [graph|plan|eager]

For every decode / ragged-prefill point of the run (Llama-3-8B heads, bf16) it builds the problem the
dispatcher would see on an H200 (feature ``cuda_graph`` for plan and graph rows), ranks the measured kernels
by their ``cost``, and prints the regret of that pick (its measured time over the best) and each cost's
ratio to its measured time. Kernel ids are compared without versions (the host may lack the vendor libraries).
"""

from __future__ import annotations

import collections
import json
import re
import sys
from typing import Any

import torch

from kernel_switchboard.capability import bucket
from kernel_switchboard.ops.attention import DecodeProblem, RaggedPrefillProblem
from kernel_switchboard.registry import registry


def _unversioned(kernel_id: str) -> str:
    return re.sub(r"@[^:]*", "", kernel_id)


def measured(rows: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], dict[str, float]]:
    """{(op, label): {kernel id without version: ms}} of the non-auto kernel rows of one call kind."""
    points: dict[tuple[str, str], dict[str, float]] = collections.defaultdict(dict)
    for r in rows:
        name = r["kernel"]
        if r.get("error") or r["auto"] or name.startswith("[ext]") or not r["ms"]:
            continue
        row_kind = "graph" if name.endswith("[graph]") else "plan" if name.endswith("[plan]") else "eager"
        if row_kind == kind and r["op"] in ("attention.decode", "attention.prefill_ragged"):
            points[(r["op"], r["label"])][_unversioned(name.split(" [")[0])] = r["ms"]
    return points


def problem(op: str, label: str, kind: str) -> Any:
    """The H200 problem of a bench label (``B=16 L=2048 p16 HND`` or ``8x2048 causal``)."""
    graph = {"cuda_graph"} if kind != "eager" else set()
    if op == "attention.decode":
        b, n, page, layout = re.match(r"B=(\d+) L=(\d+) p(\d+) (\w+)", label).groups()  # type: ignore[union-attr]
        return DecodeProblem("cuda", (9, 0), torch.bfloat16, torch.bfloat16, 128, 128, int(page), layout, 32, 8, 4,
                             bucket(int(b)), bucket(int(n)), frozenset({"paged"} | graph))
    b, n = re.match(r"(\d+)x(\d+)", label).groups()  # type: ignore[union-attr]
    return RaggedPrefillProblem("cuda", (9, 0), torch.bfloat16, torch.bfloat16, 128, 128, None, None, 32, 8, 4,
                                bucket(int(b)), bucket(int(n)), bucket(int(n)), frozenset({"ragged", "causal"} | graph))


def main(argv: list[str]) -> int:
    kind = argv[1] if len(argv) > 1 else "graph"
    regrets = []
    for (op, label), times in sorted(measured(json.load(open(argv[0]))["rows"], kind).items()):
        kernels = {_unversioned(k.id): k for k in registry.kernels(op)}
        pr = problem(op, label, kind)
        costs = {kid: kernels[kid].cost(pr) for kid in times if kid in kernels and kernels[kid].cost}
        if not costs:
            continue
        pick, best = min(costs, key=costs.__getitem__), min(times, key=times.__getitem__)
        regrets.append(times[pick] / times[best])
        ratios = " ".join(f"{kid}={costs[kid] * 1e3 / times[kid]:.2f}" for kid in costs)
        print(f"{op} {label}: pick {pick}, best {best}, regret {regrets[-1]:.3f}; cost/measured {ratios}")
    print(f"{kind} rows: untuned pick within 10% on {sum(r <= 1.10 for r in regrets)} of {len(regrets)}, "
          f"within 3% on {sum(r <= 1.03 for r in regrets)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
