"""The ``switchboard`` command: doctor | explain | demo | bench | tune | build."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any


def _doctor(args: argparse.Namespace) -> int:
    from .doctor import failures, render, report, requested

    rep = report()
    names = requested(rep, args.strict, [n.strip() for n in (args.require or "").split(",") if n.strip()])
    failed = failures(rep, names)
    if args.json:
        rep["check"] = {"requested": names, "failed": [{"backend": n, "cause": c, "fix": f} for n, c, f in failed]}
        print(json.dumps(rep, indent=2, default=str))
    else:
        print(render(rep, args.verbose))
    grouped: dict[tuple[str, str | None], list[str]] = {}
    for name, cause, fix in failed:
        grouped.setdefault((cause, fix), []).append(name)
    for (cause, fix), group in grouped.items():
        print(f"switchboard doctor: {', '.join(group)} {cause}" + (f"\n  fix: {fix}" if fix else ""), file=sys.stderr)
    if names and not failed:
        print(f"switchboard doctor: {len(names)} requested backend(s) usable: {', '.join(names)}", file=sys.stderr)
    return 1 if failed else 0


def _parse_params(items: list[str]) -> dict[str, Any]:
    """``key=value`` pairs; values parsed as int, float, bool or left as text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"switchboard: expected key=value, got {item!r}")
        out[key.replace("-", "_")] = _parse_value(value)
    return out


def _parse_value(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "none":
        return None
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def unknown_op(prog: str, op: str | None) -> bool:
    """Whether ``op`` (when given) names no registered op; if so, says so on stderr with the known ones."""
    from .registry import registry

    if op is None or op in registry.ops():
        return False
    print(f"{prog}: unknown op {op!r}; known ops: {', '.join(registry.ops())}", file=sys.stderr)
    return True


def _explain(args: argparse.Namespace) -> int:
    import torch

    from .dispatch import explain
    from .errors import SwitchboardError

    if unknown_op("switchboard explain", args.op):
        return 2
    family = args.op.partition(".")[0]
    module = f"kernel_switchboard.testing.cases.{family}"
    try:
        cases = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        print(f"switchboard: unknown op family {family!r}", file=sys.stderr)
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    params = _parse_params(args.params)
    if not hasattr(cases, "example"):
        print(f"switchboard: no example builder for {args.op} yet", file=sys.stderr)
        return 2
    try:
        case = cases.example(args.op, device, **params)
        kwargs = dict(case.kwargs)
        if args.backend:
            kwargs["backend"] = args.backend
        sel = explain(args.op, *case.args, **kwargs)
    except (SwitchboardError, TypeError, ValueError) as exc:  # ValueError: a shape option the example rejects
        print(f"switchboard explain {' '.join([args.op, *args.params])}: {exc}", file=sys.stderr)
        return 1
    print(sel)
    return 0


#: sub-commands whose options their own parsers handle: name -> (module, function, help)
PASSTHROUGH = {
    "demo": ("kernel_switchboard.engine.demo", "main", "run a tiny random-weight model end to end through the switchboard"),
    "bench": ("kernel_switchboard.bench", "main", "benchmark kernels on workload presets (--help for options)"),
    "tune": ("kernel_switchboard.bench", "tune_main", "measure eligible kernels and store winners in the autotune cache"),
    "build": ("kernel_switchboard.bench", "build_main", "compile JIT kernels ahead of time for workload presets"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        module, fn, _ = PASSTHROUGH[argv[0]]
        return int(getattr(importlib.import_module(module), fn)(argv[1:]))
    parser = argparse.ArgumentParser(prog="switchboard", description="Kernel Switchboard: which kernel runs, and why.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="device, versions, every backend and kernel with availability and reasons")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true", help="list every kernel")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every installed backend package is usable here")
    p.add_argument("--require", metavar="NAMES", help="exit 1 unless these backends (comma-separated) are usable here")
    p.set_defaults(fn=_doctor)

    p = sub.add_parser("explain", help="rank the candidates for one op and shape, with reasons",
                       description="Example: switchboard explain attention.decode batch=16 kv_len=2048 page_size=16")
    p.add_argument("op", help="op name, e.g. attention.decode")
    p.add_argument("params", nargs="*", help="shape options as key=value (batch, kv_len, dtype=bfloat16, ...)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when present)")
    p.add_argument("--backend", help="explicit choice to check (backend or backend:kernel)")
    p.set_defaults(fn=_explain)

    for name, (_, _, text) in PASSTHROUGH.items():
        sub.add_parser(name, help=text)

    args = parser.parse_args(argv)
    return int(args.fn(args))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
