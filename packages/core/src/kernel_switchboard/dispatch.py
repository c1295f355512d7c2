"""Selection of the kernel that runs a problem, with the record of why.

Ranking of the eligible kernels (those whose ``reasons`` are empty), first key first:

1. explicit choice: ``backend=`` on the call, else :func:`use` scopes, else ``KSB_PREFER``;
   an explicit choice that cannot run raises :class:`KernelUnavailableError`, never falls back;
2. the persistent autotune cache entry for this problem (``tuning``);
3. kernels that need no first-call compile before those that do;
4. the kernels' cost estimates (lower first), then their static priority (higher first).

Automatic tuning (opt-in: ``KSB_AUTOTUNE=1`` or ``with ksb.autotune():``): the first call of an untuned
GPU problem with several eligible kernels times the shortlisted kernels on the call's own arguments,
stores the winner in the persistent cache and returns the winner's result. It never happens for an
explicit choice, for in-place ops, for sampling ops (timing runs would consume the caller's random
stream), for collectives (``comm.*``: every rank must pick the same kernel, and one rank's timings may differ
from another's), inside CUDA-graph capture, or with ``KSB_TUNE_CACHE=off``.

Selections are cached by ``(op, problem, preferences, registry generation, tuning generation)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import tuning
from .errors import KernelUnavailableError, NoEligibleKernelError
from .registry import Kernel, registry

_scoped: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("ksb_use", default=())
_autotune: contextvars.ContextVar[bool] = contextvars.ContextVar("ksb_autotune", default=False)
AUTOTUNE_SHORTLIST = 4
_CACHE_MAX = 4096
_cache: dict[tuple[Any, ...], Selection] = {}


@dataclass(eq=False)
class Candidate:
    """One kernel considered for a problem: its reasons (if ineligible) or its rank data."""

    kernel: Kernel
    reasons: list[str]
    cost: float | None = None
    needs_build: bool = False
    tuned: bool = False
    preferred: int | None = None  # position in the explicit preference list

    @property
    def eligible(self) -> bool:
        return not self.reasons


@dataclass(eq=False)
class Selection:
    """The outcome of ranking: the chosen kernel and every candidate with its reasons or score."""

    op: str
    problem: Any
    kernel: Kernel
    candidates: list[Candidate]
    source: str  # "explicit", "tuned", "cost", "priority", "only"
    preferences: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"op {self.op}", f"problem {_fmt_problem(self.problem)}",
                 "        (sizes such as batch and lengths are the problem's size bucket: rounded up to a power of two)"]
        if self.preferences:
            lines.append(f"preferences {', '.join(self.preferences)}")
        lines.append(f"chosen {self.kernel.id} ({_SOURCE_TEXT[self.source]})")
        lines.extend(f"note: {n}" for n in self.notes)
        if self.kernel.reads_stale_slots:
            lines.append("note: it weights page slots past each request's length by zero: they must hold finite "
                         "values (a torch.zeros cache qualifies)")
        rank = 0
        for c in self.candidates:
            if c.eligible:
                rank += 1
                bits = []
                if c.preferred is not None:
                    bits.append(f"preferred #{c.preferred + 1}")
                if c.tuned:
                    bits.append("autotune cache winner")
                if c.needs_build:
                    bits.append("not compiled yet: ranked after compiled kernels (run `switchboard build`)")
                bits.append(f"est. {c.cost * 1e6:.1f} us" if c.cost is not None else "no cost estimate")
                bits.append(f"priority {c.kernel.priority}")
                lines.append(f"  {rank:>2}. {c.kernel.id:<40} eligible: {'; '.join(bits)}")
            else:
                lines.append(f"   -  {c.kernel.id:<40} rejected: {'; '.join(c.reasons)}")
        return "\n".join(lines)


_SOURCE_TEXT = {
    "explicit": "explicit choice",
    "tuned": "autotune cache",
    "cost": "lowest cost estimate",
    "priority": "highest priority",
    "only": "the only eligible kernel",
}


def _fmt_problem(problem: Any) -> str:
    if hasattr(problem, "_asdict"):
        items = []
        for k, v in problem._asdict().items():
            if isinstance(v, frozenset):
                v = "{" + ",".join(sorted(v)) + "}"
            items.append(f"{k}={str(v).replace('torch.', '')}")
        return " ".join(items)
    return repr(problem)


@contextlib.contextmanager
def use(*backends: str) -> Iterator[None]:
    """Prefer these backends (or ``backend:kernel`` ids), in order, inside the ``with`` block.

    Ops that none of them implements keep automatic selection. For an op that one of them
    implements, a problem none of them can run raises instead of falling back.
    """
    token = _scoped.set(tuple(backends) + _scoped.get())
    try:
        yield
    finally:
        _scoped.reset(token)


@contextlib.contextmanager
def autotune(enabled: bool = True) -> Iterator[None]:
    """Tune untuned GPU problems on first use inside the ``with`` block (see the module docstring)."""
    token = _autotune.set(enabled)
    try:
        yield
    finally:
        _autotune.reset(token)


def _env_autotune() -> bool:
    return os.environ.get("KSB_AUTOTUNE", "0") == "1" and os.environ.get("KSB_TUNE_CACHE") != "off"


def _autotune_on() -> bool:
    """Automatic tuning is on in this context (``ksb.autotune()``) or process-wide (``KSB_AUTOTUNE=1``)."""
    return _AUTOTUNE_ENV or (_autotune.get() and os.environ.get("KSB_TUNE_CACHE") != "off")


def _env_prefer() -> tuple[str, ...]:
    return tuple(s.strip() for s in os.environ.get("KSB_PREFER", "").split(",") if s.strip())


_ENV_PREFER = _env_prefer()
_AUTOTUNE_ENV = _env_autotune()


def _matches(kernel: Kernel, pref: str) -> bool:
    return kernel.backend == pref or kernel.id == pref or kernel.name == pref


def select(op: str, problem: Any, backend: str | Sequence[str] | None = None) -> Selection:
    """Rank every kernel of ``op`` for ``problem``; cached. Raises when nothing can run it.

    Preferences: a per-call ``backend`` (strict), else the innermost :func:`use` scope, else ``KSB_PREFER``.
    """
    if backend is None:
        prefs, strict = _scoped.get() or _ENV_PREFER, False
    else:
        prefs, strict = ((backend,) if isinstance(backend, str) else tuple(backend)), True
    key = (op, problem, prefs, strict, registry.generation, tuning._state["generation"],
           _AUTOTUNE_ENV or _autotune.get())
    sel = _cache.get(key)
    if sel is None:
        sel = _select_cold(op, problem, prefs, strict)
        if len(_cache) >= _CACHE_MAX:
            _cache.clear()
        _cache[key] = sel
    return sel


def select_kernel(op: str, problem: Any, backend: str | Sequence[str] | None = None) -> Kernel:
    """The chosen kernel for ``problem`` (the hot path of every public op)."""
    return select(op, problem, backend).kernel


def clear_cache() -> None:
    """Forget every cached selection (the registry and tuning generations also invalidate it)."""
    global _ENV_PREFER, _AUTOTUNE_ENV
    _cache.clear()
    _ENV_PREFER, _AUTOTUNE_ENV = _env_prefer(), _env_autotune()


def _select_cold(op: str, problem: Any, prefs: tuple[str, ...], strict: bool) -> Selection:
    kernels = registry.kernels(op)
    if not kernels:
        raise NoEligibleKernelError(f"no kernel is registered for op {op!r}; known ops: {', '.join(registry.ops())}")
    tuned_id = tuning.lookup(op, problem)
    cands: list[Candidate] = []
    for k in kernels:
        reasons = k.reasons(problem)
        cand = Candidate(k, reasons)
        if not reasons:
            cand.cost = _safe_cost(k, problem)
            cand.needs_build = bool(k.needs_build and k.needs_build(problem))
            cand.tuned = tuned_id == k.id
        cand.preferred = next((i for i, p in enumerate(prefs) if _matches(k, p)), None)
        cands.append(cand)

    applies = any(c.preferred is not None for c in cands)
    if prefs and (strict or applies):
        chosen = [c for c in cands if c.preferred is not None]
        if strict and not chosen:
            raise KernelUnavailableError(
                f"{op}: backend={','.join(prefs)!s} matches no registered kernel; registered: "
                + ", ".join(c.kernel.id for c in cands)
            )
        if not any(c.eligible for c in chosen):
            lines = "\n".join(f"  {c.kernel.id}: {'; '.join(c.reasons)}" for c in chosen)
            raise KernelUnavailableError(
                f"{op}: the explicitly chosen backend ({', '.join(prefs)}) cannot run this problem "
                f"and is never silently replaced:\n{lines}\nproblem: {_fmt_problem(problem)}"
            )
    eligible = [c for c in cands if c.eligible]
    if not eligible:
        lines = "\n".join(f"  {c.kernel.id}: {'; '.join(c.reasons)}" for c in cands)
        raise NoEligibleKernelError(f"{op}: no kernel can run this problem:\n{lines}\nproblem: {_fmt_problem(problem)}")

    def rank(c: Candidate) -> tuple[Any, ...]:
        pref = c.preferred if c.preferred is not None else math.inf
        return (pref, not c.tuned, c.needs_build, c.cost if c.cost is not None else math.inf, -c.kernel.priority)

    eligible.sort(key=rank)
    ineligible = [c for c in cands if not c.eligible]
    best = eligible[0]
    if best.preferred is not None:
        source = "explicit"
    elif best.tuned:
        source = "tuned"
    elif len(eligible) == 1:
        source = "only"
    elif best.cost is not None:
        source = "cost"
    else:
        source = "priority"
    sel = Selection(op, problem, best.kernel, eligible + ineligible, source, prefs)
    features: frozenset[str] = getattr(problem, "features", frozenset())
    # never for random ops (timing runs would consume the caller's generator), collectives (ranks timing apart
    # could pick different kernels, which would not meet) or in-place ops
    if (source in ("cost", "priority") and len(eligible) > 1 and getattr(problem, "device", None) == "cuda"
            and not op.startswith(("sampling.", "comm.")) and not features & {"cuda_graph", "in_place", "generator"}
            and _autotune_on()):
        shortlist = [c.kernel for c in eligible if not c.needs_build][:AUTOTUNE_SHORTLIST]
        if len(shortlist) > 1:
            sel.kernel = _AutotuneKernel(op, problem, shortlist)  # type: ignore[assignment]
            sel.notes.append(f"autotuning on first call among {', '.join(k.id for k in shortlist)}")
    return sel


class _AutotuneKernel:
    """Stands in for the chosen kernel once: times the shortlist on real arguments, stores the winner."""

    def __init__(self, op: str, problem: Any, shortlist: list[Kernel]) -> None:
        self.op, self.problem, self.shortlist = op, problem, shortlist
        self.id = f"autotune({', '.join(k.id for k in shortlist)})"
        self.plan = None

    def run(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        from .device import is_capturing

        if is_capturing():
            return self.shortlist[0].run(*args, **kwargs)  # type: ignore[misc]
        times: dict[str, float] = {}
        results: dict[str, Any] = {}
        for k in self.shortlist:
            try:
                results[k.id] = k.run(*args, **kwargs)  # type: ignore[misc]  # warm-up (and first compile)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(5):
                    k.run(*args, **kwargs)  # type: ignore[misc]
                end.record()
                end.synchronize()
                times[k.id] = start.elapsed_time(end) / 5 * 1e-3
            except Exception:  # noqa: BLE001 - a failing candidate simply does not win
                continue
        if not times:
            return self.shortlist[0].run(*args, **kwargs)  # type: ignore[misc]
        winner = tuning.store(self.op, self.problem, times)
        return results[winner]


def _safe_cost(kernel: Kernel, problem: Any) -> float | None:
    if kernel.cost is None:
        return None
    try:
        return float(kernel.cost(problem))
    except Exception:
        return None


def explain(op: str, *args: Any, backend: str | Sequence[str] | None = None, **kwargs: Any) -> Selection:
    """The :class:`Selection` the public function of ``op`` makes for these arguments; runs nothing.

    ``ksb.explain("attention.decode", q, cache, table)`` takes exactly the op's public arguments: the op's spec
    validates them and builds the problem (as the call would), and the ranking is the call's own (cached).
    """
    from .spec import spec_of

    spec = spec_of(op)
    return select(spec.kernel_op, spec.prepare(*args, **kwargs)[0], backend)
