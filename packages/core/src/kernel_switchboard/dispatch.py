"""Selection of the kernel that runs a problem, with the record of why.

Ranking of the eligible kernels (those whose ``reasons`` are empty), first key first:

1. explicit choice: ``backend=`` on the call, else :func:`use` scopes, else ``KSB_PREFER``;
   an explicit choice that cannot run raises :class:`KernelUnavailableError` with the reasons of every
   preferred backend (one not installed included, with its install command), never falls back; a name that
   is no known backend or kernel raises :class:`UnknownBackendError` listing the known backends;
2. the persistent autotune cache entry for this problem (``tuning``);
3. kernels that need no first-call compile before those that do;
4. the kernels' cost estimates (lower first), then their static priority (higher first).

Automatic tuning (opt-in: ``KSB_AUTOTUNE=1`` or ``with ksb.autotune():``): the first call of an untuned
GPU problem with several eligible kernels times the shortlisted kernels on the call's own arguments,
stores the winner in the persistent cache and returns the winner's result. It never happens for an
explicit choice, for in-place ops, for sampling ops (timing runs would consume the caller's random
stream), for collectives (``comm.*``: every rank must pick the same kernel, and one rank's timings may differ
from another's), inside CUDA-graph capture, or with ``KSB_TUNE_CACHE=off``.

Inside a :func:`~kernel_switchboard.batch_invariant` scope the problem carries the feature ``batch_invariant`` and
the eligible kernels are ranked by explicit choice, then priority alone (keys 2-4 change with the batch size bucket
or over time; see :mod:`.invariance`), and nothing is autotuned.

Selections are cached by ``(op, problem, preferences, registry generation, tuning generation)``.

A kernel that fails while being ranked (its capability check or its cost or build estimate raises) is
rejected with the error as its reason; the other kernels are unaffected. The results of third-party kernels
are checked against their op's contract (shape, dtype, device; :mod:`kernel_switchboard.contracts`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from . import invariance, tuning
from .contracts import check_result
from .errors import (
    InvalidArgumentError,
    KernelResultError,
    KernelUnavailableError,
    NoEligibleKernelError,
    UnknownBackendError,
)
from .registry import BUILTIN_BACKENDS, Kernel, install_command, registry

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
    #: the dtype the kernel computes in where it is narrower than the query's (XQA on an fp8 cache quantises Q and P)
    lower_math: Any = None

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
                if c.lower_math is not None:
                    bits.append(f"computes in {str(c.lower_math).removeprefix('torch.')}, narrower than the query: "
                                "ranked after full-precision kernels (choose it by name to use it)")
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
    implements, a problem none of them can run raises instead of falling back. A name that is no known
    backend (installed or built-in) nor kernel id raises :class:`UnknownBackendError` here.
    """
    prefs = _pref_tuple(backends, "ksb.use")
    check_preferences(prefs, "ksb.use")
    token = _scoped.set(prefs + _scoped.get())
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


def _pref_tuple(backend: Any, name: str) -> tuple[str, ...]:
    """A preference argument as a tuple of names: one str, or an iterable of str; anything else is refused."""
    if isinstance(backend, str):
        return (backend,)
    try:
        prefs = tuple(backend)
    except TypeError:
        prefs = None
    if prefs is None or not all(isinstance(p, str) and p for p in prefs):
        raise InvalidArgumentError(f"{name}={backend!r} is invalid: expected a backend name, a backend:kernel id, "
                                   f"or a sequence of them; known backends: {', '.join(known_backends())}")
    return prefs


def check_backend(backend: Any, name: str = "backend") -> None:
    """Raise naming ``name`` unless ``backend`` is None or a valid preference (known names, right types): for an op
    with a second backend argument (``moe.fused_moe``'s ``route_backend``), whose errors would otherwise say
    ``backend``."""
    if backend is not None:
        check_preferences(_pref_tuple(backend, name), name)


def known_backends() -> list[str]:
    """Every backend name a preference may use: the registered ones and the built-in ones (installed or not)."""
    return sorted({b.name for b in registry.all_backends().values()} | set(BUILTIN_BACKENDS))


_checked_prefs: dict[tuple[tuple[str, ...], int], None] = {}


def check_preferences(prefs: tuple[str, ...], name: str) -> None:
    """Raise :class:`UnknownBackendError` naming ``name`` unless every preference is a known backend, a registered
    kernel's id (``backend:kernel``) or name, or ``<built-in backend>:<kernel>`` of a built-in backend not installed
    here. Cached per registry generation (the cold path of dispatch and ``use`` call it)."""
    key = (prefs, registry.generation)
    if key in _checked_prefs:
        return
    registered = registry.all_backends()
    names = {b.name for b in registered.values()}
    kernels = {(k.backend, k.name) for b in registered.values() for k in b.kernels}
    for pref in prefs:
        backend, sep, kernel = pref.partition(":")
        if sep:
            ok = (backend, kernel) in kernels or (backend in BUILTIN_BACKENDS and backend not in names)
        else:
            ok = pref in names or pref in BUILTIN_BACKENDS or any(k == pref for _, k in kernels)
        if not ok:
            what = "backend:kernel id" if sep else "backend or kernel name"
            raise UnknownBackendError(f"{name}={pref!r} is invalid: it is no known {what} (it matches no registered "
                                      f"kernel); known backends: {', '.join(known_backends())}")
    if len(_checked_prefs) >= _CACHE_MAX:
        _checked_prefs.clear()
    _checked_prefs[key] = None


def select(op: str, problem: Any, backend: str | Sequence[str] | None = None) -> Selection:
    """Rank every kernel of ``op`` for ``problem``; cached. Raises when nothing can run it.

    Preferences: a per-call ``backend`` (strict), else the innermost :func:`use` scope, else ``KSB_PREFER``.
    """
    if invariance.SCOPE.get():
        problem = invariance.mark(problem)
    if backend is None:
        prefs, strict = _scoped.get() or _ENV_PREFER, False
    else:
        prefs, strict = ((backend,) if isinstance(backend, str) else _pref_tuple(backend, "backend")), True
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
    if prefs:
        check_preferences(prefs, "backend" if strict else ("ksb.use" if _scoped.get() else "KSB_PREFER"))
    features: frozenset[str] = getattr(problem, "features", frozenset())
    invariant = invariance.FEATURE in features
    tuned_id = None if invariant else tuning.lookup(op, problem)
    cands: list[Candidate] = []
    for k in kernels:
        cand = _candidate(k, problem)
        if invariant:  # whether a kernel is compiled yet changes over time: it does not rank in the scope
            cand.needs_build = False
        cand.tuned = cand.eligible and tuned_id == k.id
        cand.preferred = next((i for i, p in enumerate(prefs) if _matches(k, p)), None)
        cands.append(cand)

    applies = any(c.preferred is not None for c in cands)
    if prefs and (strict or applies):
        chosen = [c for c in cands if c.preferred is not None]
        missing = _missing_preferences(op, prefs, chosen)
        if strict and not chosen:
            raise KernelUnavailableError(
                f"{op}: backend={','.join(prefs)!s} matches no registered kernel of this op:\n"
                + "".join(f"  {line}\n" for line in missing) + "registered: " + ", ".join(c.kernel.id for c in cands)
            )
        if not any(c.eligible for c in chosen):
            lines = "\n".join([f"  {c.kernel.id}: {'; '.join(c.reasons)}" for c in chosen]
                              + [f"  {line}" for line in missing])
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
        if invariant:  # the same kernel for every batch: nothing that varies with the size bucket or over time
            return (pref, c.cost == math.inf, -c.kernel.priority)
        return (pref, c.lower_math is not None, not c.tuned, c.needs_build, c.cost if c.cost is not None else math.inf,
                -c.kernel.priority)

    eligible.sort(key=rank)
    ineligible = [c for c in cands if not c.eligible]
    best = eligible[0]
    if best.preferred is not None:
        source = "explicit"
    elif invariant:
        source = "only" if len(eligible) == 1 else "priority"
    elif best.tuned:
        source = "tuned"
    elif len(eligible) == 1:
        source = "only"
    elif best.cost is not None:
        source = "cost"
    else:
        source = "priority"
    sel = Selection(op, problem, _checked(best.kernel), eligible + ineligible, source, prefs)
    if invariant:
        sel.notes.append("batch-invariant scope: only kernels declaring batch_invariant, ranked by priority (cost "
                         "estimates and the autotune cache vary with the batch size)")
        return sel
    # never for random ops (timing runs would consume the caller's generator), collectives (ranks timing apart
    # could pick different kernels, which would not meet) or in-place ops
    if (source in ("cost", "priority") and len(eligible) > 1 and getattr(problem, "device", None) == "cuda"
            and not op.startswith(("sampling.", "comm.")) and not features & {"cuda_graph", "in_place", "generator"}
            and _autotune_on()):
        shortlist = [_checked(c.kernel) for c in eligible
                     if not c.needs_build and c.lower_math is None][:AUTOTUNE_SHORTLIST]
        if len(shortlist) > 1:
            sel.kernel = _AutotuneKernel(op, problem, shortlist)  # type: ignore[assignment]
            sel.notes.append(f"autotuning on first call among {', '.join(k.id for k in shortlist)}")
    return sel


def _candidate(k: Kernel, problem: Any) -> Candidate:
    """``k``'s reasons and rank data for ``problem``; a kernel whose own code raises here is rejected with the error
    (any exception, SystemExit included: a plugin's failure stays with its kernel)."""
    step = "capability check"
    try:
        reasons = k.reasons(problem)
        if not isinstance(reasons, list) or not all(isinstance(r, str) for r in reasons):
            raise TypeError(f"it returned {reasons!r}, expected a list of str")
        cand = Candidate(k, reasons)
        if not reasons:
            step = "needs_build check"
            cand.needs_build = bool(k.needs_build and k.needs_build(problem))
            step = "math_dtype"
            cand.lower_math = _lower_math(k, problem)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - contained: the kernel is rejected with the error
        return Candidate(k, [f"its {step} failed: {type(exc).__name__}: {exc}"])
    if not reasons:
        cand.cost = _safe_cost(k, problem)
    return cand


def _lower_math(k: Kernel, problem: Any) -> Any:
    """The dtype ``k`` computes ``problem`` in when narrower than the query's dtype, else None. Automatic choice never
    trades precision for speed on its own: such a kernel ranks after every full-precision one."""
    if k.math_dtype is None:
        return None
    math_dtype, query = k.math_dtype(problem), getattr(problem, "dtype", None)
    if math_dtype is None or not isinstance(query, torch.dtype) or not isinstance(math_dtype, torch.dtype):
        return None
    return math_dtype if math_dtype.itemsize < query.itemsize else None


def _missing_preferences(op: str, prefs: tuple[str, ...], chosen: list[Candidate]) -> list[str]:
    """One line per preferred backend that has no kernel of ``op`` here: not installed (with the command that
    installs it), or installed without one."""
    backends = registry.all_backends()
    out = []
    for pref in prefs:
        if any(_matches(c.kernel, pref) for c in chosen):
            continue
        name = pref.partition(":")[0]
        backend = backends.get(name)
        if backend is None and name in BUILTIN_BACKENDS:
            out.append(f"{pref}: not installed; install: {install_command(name)}")
        elif backend is not None and backend.unavailable is not None:
            hint = f"; install: {backend.install}" if backend.install else ""
            out.append(f"{pref}: unavailable: {backend.unavailable}{hint}")
        elif backend is not None:
            out.append(f"{pref}: has no kernel of {op}" if name == pref else f"{pref}: no such kernel of {op}")
    return out


def _checked(kernel: Kernel) -> Kernel:
    """``kernel`` itself when it is built in; for a third-party kernel, a copy whose ``run`` checks the result's
    shape, dtype and device against the op's contract (metadata only: no host synchronisation)."""
    backend = registry.all_backends().get(kernel.backend)
    if backend is not None and backend.builtin:
        return kernel
    run, op, kid = kernel.run, kernel.op, kernel.id

    def checked_run(*args: Any) -> Any:
        try:
            result = run(*args)
        except SystemExit as exc:  # a plugin never ends the caller's process
            raise KernelResultError(f"kernel {kid} ({op}) raised SystemExit({exc.code!r}) instead of returning") from exc
        check_result(kid, op, args, result)
        return result

    return replace(kernel, run=checked_run)


class _AutotuneKernel:
    """Stands in for the chosen kernel once: times the shortlist on real arguments, stores the winner."""

    def __init__(self, op: str, problem: Any, shortlist: list[Kernel]) -> None:
        self.op, self.problem, self.shortlist = op, problem, shortlist
        self.id = f"autotune({', '.join(k.id for k in shortlist)})"
        self.name, self.backend = self.id, "autotune"
        self.plan = None
        self.unavailable: str | None = None
        # any of the shortlist may run: the stale-slot warning holds if it holds for one
        self.reads_stale_slots = any(k.reads_stale_slots for k in shortlist)

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
    except KeyboardInterrupt:
        raise
    except BaseException:  # noqa: BLE001 - a failing estimate ranks the kernel as having none
        return None


def explain(op: str, *args: Any, backend: str | Sequence[str] | None = None, **kwargs: Any) -> Selection:
    """The :class:`Selection` the public function of ``op`` makes for these arguments; runs nothing.

    ``ksb.explain("attention.decode", q, cache, table)`` takes exactly the op's public arguments: the op's spec
    validates them and builds the problem (as the call would), and the ranking is the call's own (cached).
    """
    from .spec import spec_of

    spec = spec_of(op)
    return select(spec.kernel_op, spec.prepare(*args, **kwargs)[0], backend)
