"""The ``switchboard`` command: doctor | explain | demo | bench | tune | build."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from typing import Any


def _gpus() -> dict[str, Any]:
    """The GPUs here and the pairs that cannot map each other's memory (the one-shot all-reduce needs none)."""
    import torch

    from .device import pairs_without_peer_access

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"count": count, "peer_access_missing": pairs_without_peer_access(count)}


def _doctor(args: argparse.Namespace) -> int:
    from .device import fingerprint
    from .registry import registry

    backends = registry.all_backends()
    report: dict[str, Any] = {"environment": fingerprint(), "gpus": _gpus(), "backends": {}}
    for name, b in backends.items():
        report["backends"][name] = {
            "version": b.version,
            "available": b.available,
            "reason": b.unavailable,
            "install": b.install,
            "providers": b.providers,
            "kernels": [
                {"id": k.id, "op": k.op, "available": k.unavailable is None, "reason": k.unavailable,
                 "install": k.install}
                for k in b.kernels
            ],
        }
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    env = report["environment"]
    print("environment")
    for key, value in env.items():
        print(f"  {key:<20} {value}")
    gpus = report["gpus"]
    if gpus["count"] > 1:
        missing = gpus["peer_access_missing"]
        peers = f"no peer access {', '.join(missing)}" if missing else "peer access between every pair"
        print(f"  {'gpus':<20} {gpus['count']} ({peers})")
    print("backends")
    for name, b in report["backends"].items():
        state = "available" if b["available"] else "unavailable"
        print(f"  {name:<10} {b['version']:<8} {state}: {len(b['kernels'])} kernels")
        if b["reason"]:
            print(f"      reason:  {b['reason']}")
        if b["install"] and not b["available"]:
            print(f"      install: {b['install']}")
        for prov, ver in b["providers"].items():
            print(f"      provider {prov}: {ver or 'not installed'}")
        if args.verbose:
            for k in b["kernels"]:
                mark = "ok " if k["available"] else "-- "
                print(f"      {mark}{k['id']:<45} {k['op']}{'' if k['available'] else '  (' + str(k['reason']) + ')'}")
    return 0


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


#: the package that serves ``switchboard demo`` (installed separately: the core holds no engine)
ENGINE_PACKAGE = "kernel_switchboard_engine"
ENGINE_INSTALL = "pip install kernel-switchboard-engine (from a checkout: pip install -e packages/engine)"

#: sub-commands whose options their own parsers handle: name -> (module, function, help)
PASSTHROUGH = {
    "demo": ("kernel_switchboard_engine.demo", "main", "run a tiny random-weight model end to end through the switchboard"),
    "bench": ("kernel_switchboard.bench", "main", "benchmark kernels on workload presets (--help for options)"),
    "tune": ("kernel_switchboard.bench", "tune_main", "measure eligible kernels and store winners in the autotune cache"),
    "build": ("kernel_switchboard.build", "main", "compile JIT kernels ahead of time into the persistent caches"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in PASSTHROUGH:
        module, fn, _ = PASSTHROUGH[argv[0]]
        try:
            entry = getattr(importlib.import_module(module), fn)
        except ModuleNotFoundError as exc:
            if exc.name != ENGINE_PACKAGE:
                raise
            print(f"switchboard {argv[0]}: needs the engine package: {ENGINE_INSTALL}", file=sys.stderr)
            return 2
        return int(entry(argv[1:]))
    parser = argparse.ArgumentParser(prog="switchboard", description="Kernel Switchboard: which kernel runs, and why.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="device, versions, every backend and kernel with availability and reasons")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true", help="list every kernel")
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
