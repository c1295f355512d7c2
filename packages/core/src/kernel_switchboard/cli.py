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


def _parse_params(items: list[str], op: str | None = None) -> dict[str, Any]:
    """``key=value`` pairs. With ``op``, checked against the parameters its example builder declares (unknown
    keys, values of the wrong type, negative ints are refused by name); otherwise parsed as int, float, bool, None
    or left as text. Raises :class:`~kernel_switchboard.errors.InvalidArgumentError`."""
    from .errors import fail

    declared = example_params(op) if op is not None else None
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail("parameter", item, "key=value")
        key = key.replace("-", "_")
        if declared is None:
            out[key] = _parse_value(value)
            continue
        if key not in declared:
            raise fail(key, value, f"one of the parameters of {op}: {', '.join(sorted(declared))}")
        out[key] = _typed_value(key, value, declared[key])
    return out


def example_params(op: str) -> dict[str, type] | None:
    """The parameters (name -> int / float / bool / str) the example builder of ``op`` takes; None when unknown."""
    import inspect

    try:
        module = importlib.import_module(f"kernel_switchboard.testing.cases.{op.partition('.')[0]}")
    except ImportError:
        return None
    if isinstance(getattr(module, "EXAMPLE_PARAMS", None), dict):
        return dict(module.EXAMPLE_PARAMS)
    builder = getattr(module, "example", None)
    if builder is None:
        return None
    out: dict[str, type] = {}
    for param in list(inspect.signature(builder).parameters.values())[2:]:  # after (op, device)
        if param.kind is param.VAR_KEYWORD:
            return None
        default, note = param.default, str(param.annotation)
        kind = type(default) if isinstance(default, (bool, int, float, str)) else next(
            (t for t in (bool, int, float, str) if t.__name__ in note), str)
        out[param.name] = kind
    return out


#: the dtype names example builders take (each family accepts a subset; every op computes in a float dtype)
DTYPE_NAMES = ("float32", "fp32", "float", "float16", "fp16", "half", "bfloat16", "bf16", "float8_e4m3fn", "e4m3",
               "fp8", "float8_e5m2", "e5m2")


def _typed_value(key: str, value: str, kind: type) -> Any:
    """``value`` as ``kind``; ``none`` gives None (the builder's default). Sizes and counts are ints >= 0; a
    ``dtype`` is one of :data:`DTYPE_NAMES`."""
    import math

    from .errors import fail

    low = value.strip().lower()
    if low == "none":
        return None
    if key.endswith("dtype") and low.removeprefix("torch.") not in DTYPE_NAMES:
        raise fail(key, value, f"a float dtype: one of {', '.join(DTYPE_NAMES)}")
    if kind is bool:
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise fail(key, value, "a boolean: 1 / 0 / true / false")
    if kind is int:
        try:
            number = int(low)
        except ValueError:
            number = -1
        if number < 0:
            raise fail(key, value, "an int >= 0")
        return number
    if kind is float:
        try:
            real = float(low)
        except ValueError:
            real = math.nan
        if not math.isfinite(real):
            raise fail(key, value, "a finite number")
        return real
    return value


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
    """Exit status 2 for a bad shape option (one line on stderr), 1 when the op cannot run the shape as asked."""
    import torch

    from .dispatch import explain
    from .errors import InvalidArgumentError, KernelUnavailableError, NoEligibleKernelError, SwitchboardError

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
    if not hasattr(cases, "example"):
        print(f"switchboard: no example builder for {args.op} yet", file=sys.stderr)
        return 2
    where = f"switchboard explain {' '.join([args.op, *args.params])}"
    try:
        device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        params = _parse_params(args.params, args.op)
        case = cases.example(args.op, device, **params)
    except (SwitchboardError, TypeError, ValueError, RuntimeError) as exc:  # the options do not make a case
        print(f"{where}: {_one_line(exc)}", file=sys.stderr)
        return 2
    kwargs = dict(case.kwargs)
    if args.backend:
        kwargs["backend"] = args.backend
    try:
        sel = explain(args.op, *case.args, **kwargs)
    except (KernelUnavailableError, NoEligibleKernelError) as exc:  # nothing (chosen) can run it: the answer
        print(f"{where}: {exc}", file=sys.stderr)
        return 1
    except (InvalidArgumentError, TypeError, ValueError) as exc:  # the options make a call the op refuses
        print(f"{where}: {_one_line(exc)}", file=sys.stderr)
        return 2
    print(sel)
    return 0


def _one_line(exc: BaseException) -> str:
    """The first line of an error (a switchboard error's message names the argument; others get their type)."""
    from .errors import SwitchboardError

    first = (str(exc).strip().splitlines() or [""])[0]
    return first if isinstance(exc, SwitchboardError) else f"{type(exc).__name__}: {first}"


#: the package that serves ``switchboard demo`` (installed separately: the core holds no engine)
ENGINE_PACKAGE = "kernel_switchboard_engine"
ENGINE_INSTALL = "pip install kernel-switchboard-engine (from a checkout: pip install -e packages/engine)"

#: sub-commands whose options their own parsers handle: name -> (module, function, help)
PASSTHROUGH = {
    "demo": ("kernel_switchboard_engine.demo", "main", "run a tiny random-weight model end to end through the switchboard"),
    "bench": ("kernel_switchboard.bench.cli", "main", "benchmark kernels on workload presets (--help for options)"),
    "tune": ("kernel_switchboard.bench.cli", "tune_main", "measure eligible kernels and store winners in the autotune cache"),
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
