"""Property-based sweep over every public op's argument space.

For each op, hypothesis draws a small valid call (the op's example builder at drawn sizes, dtypes, layouts and
flags) and then, most of the time, changes one argument. The property: the call either raises a
:class:`SwitchboardError` that names the changed argument, or returns a result equal to the reference kernel's
on the same arguments; a change that keeps the argument's meaning (int64 for int32 indices, padded rows, the
other cache layout, a CSR round trip of the page table, ...) must give the unchanged call's result. Any other
exception (TypeError, IndexError, a crash in a kernel) fails.

The example budget and the seed are fixed (``derandomize=True``), so the sweep is the same on every run and
the whole file stays well under a minute on a small CPU machine.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import re
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.errors import SwitchboardError
from kernel_switchboard.testing import Case, assert_close, clone_args, tolerance

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, reject, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: examples per op: fixed in CI (the sweep is part of the test suite, not a fuzzing campaign);
#: ``KSB_SWEEP_EXAMPLES=500`` searches deeper locally, with the same seed
BUDGET = int(os.environ.get("KSB_SWEEP_EXAMPLES", "60"))
SWEEP = settings(max_examples=BUDGET, derandomize=True, deadline=None, database=None, print_blob=True,
                 suppress_health_check=list(HealthCheck))

FLOATS = ("float32", "float16", "bfloat16")


# -- valid calls: the example builders at drawn small sizes ----------------------------------------------
def _attention(op: str, draw: Callable[..., Any]) -> dict[str, Any]:
    kv_heads = draw(st.sampled_from([1, 2]))
    p: dict[str, Any] = {"batch": draw(st.integers(1, 3)), "kv_len": draw(st.integers(1, 24)),
                         "dtype": draw(st.sampled_from(FLOATS)), "seed": draw(st.integers(0, 3))}
    if op == "attention.mla_decode":
        return p | {"q_heads": draw(st.sampled_from([1, 2, 4])), "head_dim": 16, "head_dim_pe": 8,
                    "page_size": draw(st.sampled_from([1, 4, 16]))}
    if op == "attention.merge_states":
        return p | {"tokens": draw(st.integers(1, 6)), "q_heads": draw(st.sampled_from([1, 3])),
                    "head_dim": draw(st.sampled_from([8, 16]))}
    p |= {"q_heads": kv_heads * draw(st.sampled_from([1, 2])), "kv_heads": kv_heads,
          "head_dim": draw(st.sampled_from([8, 16])), "q_len": draw(st.integers(1, 6))}
    if op == "attention.dense":
        return p | {"bias": draw(st.sampled_from(["none", "bool", "float"])), "causal": draw(st.booleans())}
    p |= {"page_size": draw(st.sampled_from([1, 4, 16])), "layout": draw(st.sampled_from(["NHD", "HND"])),
          "lse": draw(st.booleans()), "causal": draw(st.booleans())}
    if draw(st.booleans()):
        p["window"] = draw(st.integers(0, 8))
    if draw(st.booleans()):
        p["soft_cap"] = draw(st.sampled_from([5.0, 30.0]))
    if op == "attention.decode" and p["dtype"] != "float32" and draw(st.booleans()):
        p["kv_dtype"] = "fp8"
    return p


def _params(op: str, draw: Callable[..., Any]) -> dict[str, Any]:
    family = op.partition(".")[0]
    dtype = draw(st.sampled_from(FLOATS))
    if family == "attention":
        return _attention(op, draw)
    if family == "activation":
        return {"tokens": draw(st.integers(0, 5)), "hidden": draw(st.integers(1, 12)), "dtype": dtype}
    if family == "norm":
        return {"rows": draw(st.integers(0, 5)), "hidden": draw(st.integers(1, 24)), "dtype": dtype,
                "gemma": draw(st.booleans())}
    if family == "comm":
        return {"rows": draw(st.integers(1, 4)), "hidden": draw(st.integers(1, 24)), "dtype": dtype}
    if family == "rope":
        head_dim = draw(st.sampled_from([8, 16]))
        return {"tokens": draw(st.integers(1, 5)), "heads": draw(st.sampled_from([1, 4])),
                "kv_heads": draw(st.sampled_from([1, 2])), "head_dim": head_dim,
                "rotary_dim": draw(st.sampled_from([None, head_dim // 2])), "dtype": dtype,
                "interleaved": draw(st.booleans()), "inplace": draw(st.booleans()), "llama3": draw(st.booleans()),
                "max_position": 64}
    if family == "gemm":
        if op == "gemm.mm_fp8":
            return {"m": draw(st.integers(1, 16)), "n": 16 * draw(st.integers(1, 2)), "k": 16 * draw(st.integers(1, 2)),
                    "dtype": dtype, "scale_mode": draw(st.sampled_from(["tensor", "row_col", "block"])),
                    "layout": draw(st.sampled_from(["RC", "RR"]))}
        return {"m": draw(st.integers(1, 12)), "n": draw(st.integers(1, 12)), "k": draw(st.integers(1, 12)),
                "dtype": dtype, "layout": draw(st.sampled_from(["RR", "RC", "CR", "CC"])),
                "groups": draw(st.integers(1, 3))}
    if family == "kv_cache":
        return {"batch": draw(st.integers(1, 3)), "kv_len": draw(st.integers(1, 20)), "q_len": draw(st.integers(1, 4)),
                "kv_heads": draw(st.sampled_from([1, 2])), "head_dim": draw(st.sampled_from([8, 16])),
                "page_size": draw(st.sampled_from([1, 4, 16])), "dtype": dtype, "layout": draw(st.sampled_from(["NHD", "HND"]))}
    if family == "moe":
        experts = draw(st.sampled_from([8, 16]))
        return {"tokens": draw(st.integers(1, 6)), "hidden": 128, "inter": 64, "experts": experts,
                "top_k": draw(st.integers(1, 3)), "dtype": dtype, "fp8": draw(st.booleans()), "grouped": False}
    if family == "sampling":
        return {"batch": draw(st.integers(1, 4)), "vocab": draw(st.integers(1, 40)), "dtype": dtype,
                "top_k": draw(st.integers(0, 50)), "top_p": draw(st.sampled_from([0.5, 0.9, 1.0])),
                "min_p": draw(st.sampled_from([0.0, 0.1])), "logits": draw(st.booleans()),
                "draft": draw(st.integers(1, 3)), "seed": draw(st.integers(0, 3))}
    raise AssertionError(f"no parameter strategy for {op}")


def _extra_kwargs(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], draw: Callable[..., Any]) -> dict[str, Any]:
    """Optional arguments the example leaves at their defaults; random ops get a seeded generator."""
    extra: dict[str, Any] = {}
    if op in ("sampling.top_k_top_p", "sampling.chain_speculative"):
        extra["generator"] = torch.Generator().manual_seed(draw(st.integers(0, 9)))
    if op == "sampling.top_k_top_p" and kwargs.get("is_logits") and draw(st.booleans()):
        extra["temperature"] = draw(st.sampled_from([0.5, 1.0, 2.0, 1e-30]))
    if op == "sampling.top_k_top_p" and draw(st.booleans()):  # the caller's buffer and id for invalid rows
        extra["out"] = torch.empty(args[0].shape[0], dtype=draw(st.sampled_from([torch.int32, torch.int64])))
        extra["invalid_token"] = draw(st.sampled_from([-1, 0, 7]))
    if op in ("attention.decode", "attention.prefill", "attention.prefill_ragged") and draw(st.booleans()):
        extra["sm_scale"] = draw(st.sampled_from([0.1, 1.0]))
    if op in ("norm.rms_norm", "norm.fused_add_rms_norm", "norm.layer_norm", "comm.all_reduce_fused_rms_norm"):
        extra["eps"] = draw(st.sampled_from([1e-6, 1e-5, 0.5]))
    return extra


# -- argument changes -------------------------------------------------------------------------------
#: "bad": the result must be a SwitchboardError naming the argument or the reference's result on the same
#: arguments; "same": the argument keeps its meaning, so an accepted call must give the unchanged call's result
Change = tuple[str, str, Callable[[Any], Any]]

_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8)


def _padded(t: torch.Tensor) -> torch.Tensor:
    """The same values in rows padded by one element: unit stride in the last dim, not contiguous."""
    out = torch.full((*t.shape[:-1], t.shape[-1] + 1), 7, dtype=t.dtype)[..., : t.shape[-1]]
    return out.copy_(t)


def _tensor_changes(t: torch.Tensor) -> list[Change]:
    out: list[Change] = [("bad", "a list", lambda v: v.tolist()), ("bad", "None", lambda v: None),
                         ("bad", "a float", lambda v: 3.0)]
    out += [("bad", f"dtype {d}", lambda v, d=d: v.to(d)) for d in _DTYPES if d != t.dtype]
    out += [("bad", "one more dim", lambda v: v.unsqueeze(0)), ("bad", "0-d", lambda v: torch.zeros((), dtype=v.dtype))]
    if t.dim() >= 2:
        out.append(("bad", "one dim less", lambda v: v.flatten(0, 1)))
    for d in range(t.dim()):
        if t.shape[d] > 1:
            out.append(("bad", f"dim {d} one shorter", lambda v, d=d: v.narrow(d, 0, v.shape[d] - 1)))
        if t.shape[d] >= 1:
            out.append(("bad", f"dim {d} one longer", lambda v, d=d: torch.cat([v, v.narrow(d, 0, 1)], d)))
    if t.numel():
        if t.is_floating_point():
            for value in (math.nan, math.inf, -math.inf):
                out.append(("bad", f"a {value} entry", lambda v, x=value: _set_first(v, x)))
        elif t.dtype in (torch.int32, torch.int64):
            out += [("bad", "a -1 entry", lambda v: _set_first(v, -1)),
                    ("bad", "a 2**31-1 entry", lambda v: _set_first(v, 2**31 - 1))]
            if t.dtype == torch.int64:
                out.append(("bad", "a 2**32+3 entry", lambda v: _set_first(v, 2**32 + 3)))
    if t.dim() >= 1 and t.shape[-1] >= 1 and t.dtype != torch.bool and t.numel():
        out.append(("same", "padded rows", _padded))
        out.append(("bad", "last dim strided", lambda v: v.unsqueeze(-1).expand(*v.shape, 2)[..., 0]))
    if t.dtype == torch.int32:
        out.append(("same", "int64", lambda v: v.long()))
    if t.dtype == torch.int64 and (t.numel() == 0 or int(t.abs().max()) < 2**31):
        out.append(("same", "int32", lambda v: v.int()))
    return out


def _set_first(t: torch.Tensor, value: float) -> torch.Tensor:
    t = t.clone()
    t[(0,) * t.dim()] = value
    return t


def _scalar_changes(value: Any) -> list[Change]:
    bad = [None, math.nan, math.inf, -math.inf, -1, 0, 2**40, -(2**63), "x", (1,)]
    if isinstance(value, bool):
        return ([("bad", repr(b), lambda v, b=b: b) for b in (2, "yes", None)]
                + [("same", "as int", lambda v: int(v))])
    out: list[Change] = [("bad", repr(b), lambda v, b=b: b) for b in bad if b != value]
    out.append(("bad", "True", lambda v: True))
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**40:
        out.append(("same", "as int", lambda v: int(v)))
    if isinstance(value, int):
        out.append(("same", "as float", lambda v: float(v)))
    return out


def _cache_changes(cache: ksb.PagedKVCache, written: bool) -> list[Change]:
    """``written``: the op writes the cache (its pages are the outputs, so another layout gives other outputs)."""
    other = "HND" if cache.layout == "NHD" else "NHD"
    out: list[Change] = [("bad", "None", lambda v: None), ("bad", "its k_pages", lambda v: v.k_pages),
                         ("bad" if written else "same", f"layout {other}", lambda v: v.to_layout(other))]
    if cache.num_pages > 1:
        out.append(("bad", "fewer pages", lambda v: ksb.PagedKVCache(v.k_pages[:1], v.v_pages[:1], v.layout,
                                                                     v.k_scale if v.is_fp8 else None,
                                                                     v.v_scale if v.is_fp8 else None)))
    if cache.is_fp8:
        for s in (math.inf, math.nan, 0.0, -1.0):
            out.append(("bad", f"k_scale {s}", lambda v, s=s: ksb.PagedKVCache(v.k_pages, v.v_pages, v.layout, s,
                                                                             v.v_scale)))
    return out


def _table_changes(table: ksb.PageTable, page_size: int | None) -> list[Change]:
    out: list[Change] = [("bad", "None", lambda v: None), ("bad", "its block_table", lambda v: v.block_table),
                         ("same", "a larger max_seq_len bound",
                          lambda v: ksb.PageTable(v.block_table, v.seq_lens, (v.max_seq_len or 0) + 7)),
                         ("bad", "longer sequences",
                          lambda v: ksb.PageTable(v.block_table, v.seq_lens + v.block_table.shape[1] * 64))]
    if page_size is not None:
        out.append(("same", "a CSR round trip", lambda v: ksb.PageTable.from_csr(*v.to_csr(page_size), page_size)))
    return out


#: changes to a value with a known equivalent: (label, change, the equivalent call as a function of the bound
#: arguments); an accepted call must give the equivalent call's result
Equivalent = tuple[str, Callable[[Any], Any], Callable[[dict[str, Any]], dict[str, Any]]]


def _equivalents(name: str, value: Any, bound: dict[str, Any]) -> list[Equivalent]:
    rows = next((v.shape[0] for v in bound.values() if isinstance(v, torch.Tensor)), 0)
    out: list[Equivalent] = []
    if name == "top_k" and isinstance(value, int) and not isinstance(value, bool):
        out.append(("int64 rows of the same k", lambda v: torch.full((rows,), v, dtype=torch.int64), lambda b: b))
        out.append(("int64 rows of 2**32+2 (keeps all, as k >= V does)",
                    lambda v: torch.full((rows,), 2**32 + 2, dtype=torch.int64), lambda b: b | {"top_k": None}))
    if name == "temperature" and bound.get("is_logits") and isinstance(value, float):
        out.append(("1e-38 (the argmax)", lambda v: 1e-38,
                    lambda b: b | {"temperature": None, "top_k": 1, "top_p": None, "min_p": None}))
    return out


def _changes(op: str, name: str, value: Any, bound: dict[str, Any]) -> list[Change]:
    if isinstance(value, torch.Tensor):
        return _tensor_changes(value)
    if isinstance(value, ksb.PagedKVCache):
        return _cache_changes(value, op.startswith("kv_cache."))
    if isinstance(value, ksb.PageTable):
        cache = next((v for v in bound.values() if isinstance(v, ksb.PagedKVCache)), None)
        pages = next((v for k, v in bound.items() if k == "ckv_pages"), None)
        page_size = cache.page_size if cache is not None else (pages.shape[1] if pages is not None else None)
        return _table_changes(value, page_size)
    if isinstance(value, torch.Generator):
        return [("bad", "an int", lambda v: 3), ("bad", "a str", lambda v: "seed")]
    if isinstance(value, (bool, int, float)):
        return _scalar_changes(value)
    if isinstance(value, str):
        return [("bad", "bogus", lambda v: "bogus"), ("bad", "an int", lambda v: 3), ("bad", "None", lambda v: None),
                ("bad", "lower case", lambda v: v.lower())]
    if value is None:
        return []
    return [("bad", "None", lambda v: None)]


#: words an error may use for an argument it refers to through one of its parts
_ALIASES = {"cache": ("k_pages", "v_pages", "k_scale", "v_scale", "layout", "block_table", "page"),
            "table": ("block_table", "seq_lens", "max_seq_len", "page"),
            "prefix_table": ("block_table", "seq_lens")}


def _names(name: str) -> tuple[str, ...]:
    return (name, *_ALIASES.get(name, ()))


# -- running and comparing -----------------------------------------------------------------------
def _copy(obj: Any) -> Any:
    """Cloned tensors, caches and tables; generators copied with their state (both calls draw the same numbers)."""
    if isinstance(obj, torch.Generator):
        g = torch.Generator(obj.device)
        g.set_state(obj.get_state())
        return g
    if isinstance(obj, dict):
        return {k: _copy(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_copy(v) for v in obj)
    return clone_args(obj)


def _outputs(case: Case, args: tuple[Any, ...], result: Any) -> list[torch.Tensor]:
    return case._outputs(args, result)


def _run(case: Case, args: tuple[Any, ...], kwargs: dict[str, Any], backend: str | None = None
         ) -> list[torch.Tensor]:
    args, kwargs = _copy(args), _copy(kwargs)
    if backend is not None:
        kwargs["backend"] = backend
    return _outputs(case, args, case.function(*args, **kwargs))


def _close(got: list[torch.Tensor], want: list[torch.Tensor], case: Case, what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    atol, rtol = case.tol or tolerance(case.dtype)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, atol=atol, rtol=rtol, what=f"{what} output {i}")


@functools.cache
def _builder(family: str) -> Any:
    return importlib.import_module(f"kernel_switchboard.testing.cases.{family}").example


def _valid_call(op: str, data: Any) -> tuple[Case, tuple[Any, ...], dict[str, Any]]:
    params = _params(op, data.draw)
    try:
        case = _builder(op.partition(".")[0])(op, torch.device("cpu"), **params)
    except (ValueError, TypeError, SwitchboardError):
        reject()  # sizes the example builder does not make (not the op's concern)
    kwargs = dict(case.kwargs) | _extra_kwargs(op, case.args, case.kwargs, data.draw)
    return case, tuple(case.args), kwargs


def sweep(op: str, data: Any, skip: Callable[[str, str], bool] = lambda name, label: False) -> None:
    case, args, kwargs = _valid_call(op, data)
    base = _run(case, args, kwargs)  # a valid call must run
    signature = inspect.signature(case.function)
    bound = signature.bind(*args, **kwargs).arguments
    choices = [(name, (kind, label, change, None)) for name, value in bound.items()
               for kind, label, change in _changes(op, name, value, bound) if not skip(name, label)]
    choices += [(name, ("as", label, change, equivalent)) for name, value in bound.items()
                for label, change, equivalent in _equivalents(name, value, bound)]
    if not choices or data.draw(st.integers(0, 9)) == 0:
        return  # the unchanged call alone
    name, (kind, label, change, equivalent) = data.draw(st.sampled_from(choices))
    what = f"{op}: {name} changed to {label}"
    try:
        value = change(_copy(bound[name]))
        new_args, new_kwargs = _rebound(signature, bound | {name: value})
        got = _run(case, new_args, new_kwargs)
    except SwitchboardError as exc:
        words = _names(name)
        assert any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9])", str(exc)) for w in words), (
            f"{what}: the error does not name {name!r}: {type(exc).__name__}: {exc}")
        return
    except Exception as exc:  # noqa: BLE001 - the property: nothing but a named SwitchboardError
        raise AssertionError(f"{what}: raised {type(exc).__name__} instead of a SwitchboardError naming "
                             f"{name!r}: {exc}") from exc
    if kind == "same":
        if name == "out":  # the caller's buffer sets the result's dtype: the same tokens in another integer type
            got = [g.to(b.dtype) for g, b in zip(got, base)]
        _close(got, base, case, what)
    elif kind == "as":
        _close(got, _run(case, *_rebound(signature, equivalent(dict(bound)))), case, what)
    elif ksb.explain(op, *_copy(new_args), **_copy(new_kwargs)).kernel.backend != "reference":
        _close(got, _run(case, new_args, new_kwargs, "reference"), case, what)


def _rebound(signature: inspect.Signature, arguments: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """(args, kwargs) of a call from its arguments by name (positional-or-keyword ones passed positionally)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, param in signature.parameters.items():
        if name not in arguments:
            continue
        if param.kind is param.POSITIONAL_OR_KEYWORD and len(args) == list(signature.parameters).index(name):
            args.append(arguments[name])
        else:
            kwargs[name] = arguments[name]
    return tuple(args), kwargs


# -- the tests -------------------------------------------------------------------------------------
def _skip(op: str) -> Callable[[str, str], bool]:
    """Changes the sweep leaves out of ``op`` (none today: each hole it found is fixed and pinned below)."""
    return lambda name, label: False


@pytest.mark.parametrize("op", ksb.registry.ops())
@SWEEP
@given(data=st.data())
def test_sweep(op: str, data: Any) -> None:
    sweep(op, data, _skip(op))


def _planned_decode(data: Any) -> tuple[Case, Any, tuple[Any, ...], dict[str, Any]]:
    case, (q, cache, table), kwargs = _valid_call("attention.decode", data)
    plan = ksb.attention.plan_decode(
        table, num_q_heads=q.shape[1], num_kv_heads=cache.num_kv_heads, head_dim=cache.head_dim,
        head_dim_v=cache.head_dim_v, dtype=q.dtype, kv_dtype=cache.dtype, layout=cache.layout,
        page_size=cache.page_size, return_lse=bool(kwargs.get("return_lse")), window_left=kwargs.get("window_left"),
        logits_soft_cap=kwargs.get("logits_soft_cap"), sm_scale=kwargs.get("sm_scale"))
    return case, plan, (q, cache, table), kwargs


@SWEEP
@given(data=st.data())
def test_sweep_decode_plan(data: Any) -> None:
    """``plan_decode(...).run(q, cache)``: the same property for the arguments of ``run``."""
    case, plan, (q, cache, table), kwargs = _planned_decode(data)
    want = _outputs(case, (q, cache, table), ksb.attention.decode(q, cache, table, **kwargs))
    _close(_outputs(case, (q, cache, table), plan.run(q, cache)), want, case, "plan_decode: unchanged")
    skip = _skip("attention.plan_decode")
    choices = [(name, c) for name, v in (("q", q), ("cache", cache)) for c in _changes("attention.decode", name, v, {})
               if not skip(name, c[1])]
    name, (_, label, change) = data.draw(st.sampled_from(choices))
    what = f"plan_decode run: {name} changed to {label}"
    try:
        new_q, new_cache = (change(_copy(q)), cache) if name == "q" else (q, change(_copy(cache)))
        got = _outputs(case, (new_q, new_cache, table), plan.run(new_q, new_cache))
    except SwitchboardError as exc:
        assert any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(w)}(?![A-Za-z0-9])", str(exc)) for w in _names(name)), (
            f"{what}: the error does not name {name!r}: {exc}")
        return
    except Exception as exc:  # noqa: BLE001
        raise AssertionError(f"{what}: raised {type(exc).__name__} instead of a SwitchboardError: {exc}") from exc
    _close(got, _outputs(case, (new_q, new_cache, table),
                         ksb.attention.decode(new_q, new_cache, table, backend="reference", **kwargs)), case, what)


# -- holes the sweep once found, each pinned by its own call ---------------------------------------
def _dense_q_length() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g) for _ in range(3))
    bias = torch.ones(1, 2, 4, 4, dtype=torch.bool)
    ksb.attention.dense(q[:, :, :3], k, v, bias)


def _plan_q_not_a_tensor() -> None:
    q, cache, table = _builder("attention")("attention.decode", torch.device("cpu"), batch=2, kv_len=20,
                                            q_heads=2, kv_heads=1, head_dim=8, page_size=4, dtype="float32").args
    plan = ksb.attention.plan_decode(table, num_q_heads=2, num_kv_heads=1, head_dim=8, dtype=torch.float32,
                                     layout=cache.layout, page_size=4)
    plan.run(q.tolist(), cache)


def _mla_page_counts() -> None:
    q_nope, q_pe, ckv, kpe, table = _builder("attention")("attention.mla_decode", torch.device("cpu"), batch=2,
                                                          kv_len=9, q_heads=2, head_dim=16, head_dim_pe=8,
                                                          page_size=4).args
    ksb.attention.mla_decode(q_nope, q_pe, ckv[:-1], kpe, table)


def _plan_fewer_pages() -> None:
    q, cache, table = _builder("attention")("attention.decode", torch.device("cpu"), batch=2, kv_len=20,
                                            q_heads=2, kv_heads=1, head_dim=8, page_size=4, dtype="float32").args
    plan = ksb.attention.plan_decode(table, num_q_heads=2, num_kv_heads=1, head_dim=8, dtype=torch.float32,
                                     layout=cache.layout, page_size=4)
    plan.run(q, ksb.PagedKVCache(cache.k_pages[:1], cache.v_pages[:1], cache.layout))


@pytest.mark.parametrize(("call", "name"), [
    pytest.param(_dense_q_length, "q", id="dense-q-length"),
    pytest.param(_plan_q_not_a_tensor, "q", id="plan-run-q-type"),
    pytest.param(_mla_page_counts, "ckv_pages", id="mla-page-counts"),
    pytest.param(_plan_fewer_pages, "cache", id="plan-run-cache-pages"),
])
def test_former_hole_raises_naming_the_argument(call: Callable[[], None], name: str) -> None:
    with pytest.raises(SwitchboardError) as info:
        call()
    assert re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9])", str(info.value)), str(info.value)
