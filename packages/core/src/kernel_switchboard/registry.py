"""Kernel records, backends, and discovery through pluggy entry points.

One broken backend never stops the others: whatever a plugin does wrong stays with that plugin. A plugin
that fails to import or whose hook raises (any exception, ``SystemExit`` included; ``KeyboardInterrupt``
still stops the process), or that returns something other than a well-formed :class:`Backend`, is listed as
unavailable with the error as its reason; a kernel record with a bad field (its capability not a
:class:`Capability`, ``run`` not callable, a duplicate id) is listed as unavailable with the reason.

Backend names are unique. The built-in backends (``reference`` and the ``kernel-switchboard-*`` packages) keep
their names; a third-party plugin that claims a taken name is listed, under ``"<name> (<its source>)"``, as
unavailable with a reason naming both sources, and its kernels are never dispatched to. Between third-party
plugins the first in source-name order keeps the name. Environment variables:

- ``KSB_BACKENDS``: comma-separated allow-list of backend names (``reference`` is always kept).
- ``KSB_DISABLE_BACKENDS``: comma-separated deny-list.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from . import hookspecs
from .capability import Capability


@dataclass(frozen=True, eq=False)
class Kernel:
    """One implementation of one op by one backend.

    ``run`` takes the op's canonical kernel arguments (see the op's module docstring).
    ``plan`` (optional) takes ``(problem, **plan_args)`` and returns an object with ``run``.
    ``cost`` (optional) estimates seconds for a problem; lower ranks first. A problem with the feature
    ``cuda_graph`` runs as a CUDA-graph replay (a capturable plan, or a call inside capture): its cost is GPU
    time alone, without the host time an eager call may be bound by (:func:`eager_host_floor`).
    ``priority`` breaks ties; higher ranks first.
    """

    op: str
    name: str
    backend: str
    capability: Capability
    #: the kernel; for an unavailable kernel anything (it is never called)
    run: Callable[..., Any]
    version: str = ""
    plan: Callable[..., Any] | None = None
    cost: Callable[[Any], float] | None = None
    priority: int = 0
    #: reason the kernel cannot run here at all (missing library, no GPU...); None = available
    unavailable: str | None = None
    #: the command that makes it available
    install: str | None = None
    #: True when the first call pays a compile (JIT) that has not happened yet
    needs_build: Callable[[Any], bool] | None = None
    #: builds it ahead of time for a problem (``switchboard build``)
    build: Callable[[Any], None] | None = None
    doc: str = ""
    #: the dtype the kernel computes in for a problem, where lower than the inputs' (XQA on an fp8 cache
    #: quantises Q and P to fp8); conformance tests then allow that dtype's tolerance
    math_dtype: Callable[[Any], Any] | None = None
    #: True when the kernel multiplies the KV slots past a request's length (the rest of its last page) by a
    #: zero weight instead of skipping them: those slots must then hold finite values (0 x NaN = NaN).
    #: Conformance tests fill them with large finite values for such a kernel, with NaN for the others.
    reads_stale_slots: bool = False
    #: True when the kernel writes the log-sum-exp in base 2 under a plan made with ``lse_base2=True`` (attention
    #: plans; a kernel without it writes the natural log and the plan converts it after the run, one more launch)
    writes_lse_base2: bool = False

    @property
    def id(self) -> str:
        """``backend:name``, unique across the registry."""
        return f"{self.backend}:{self.name}"

    def reasons(self, problem: Any) -> list[str]:
        """Why this kernel cannot run ``problem`` (empty when it can)."""
        if self.unavailable is not None:
            hint = f"; install: {self.install}" if self.install else ""
            return [f"unavailable: {self.unavailable}{hint}"]
        return self.capability.reasons(problem)


def eager_host_floor(problem: Any, seconds: float) -> float:
    """A cost's host-time floor: ``seconds`` for an eager call, 0 for a problem with the feature ``cuda_graph``
    (a CUDA-graph replay pays no host time; see :class:`Kernel` ``cost``)."""
    return 0.0 if "cuda_graph" in problem.features else seconds


@dataclass(eq=False)
class Backend:
    """A set of kernels from one package, with its availability."""

    name: str
    version: str = ""
    kernels: list[Kernel] = field(default_factory=list)
    unavailable: str | None = None
    install: str | None = None
    #: provider name -> version (or None when not installed), e.g. {"flash_attn.cute": "4.0.0b36"}
    providers: dict[str, str | None] = field(default_factory=dict)
    source: str = ""
    #: set by the registry (never by a plugin): whether this backend ships with the switchboard. Dispatch checks
    #: the shape, dtype and device of what a third-party kernel returns (see :mod:`kernel_switchboard.contracts`)
    builtin: bool = field(default=False, init=False)
    #: set by the registry: where the plugin came from (its entry point's distribution and module, or the object
    #: given to :meth:`Registry.register`), for messages that must tell two plugins apart
    origin: str = field(default="", init=False)

    @property
    def available(self) -> bool:
        return self.unavailable is None


#: the backends that ship with the switchboard: name -> the distribution that provides it (the core for reference)
BUILTIN_BACKENDS: dict[str, str] = {
    "reference": "kernel-switchboard",
    "triton": "kernel-switchboard-triton",
    "cudnn": "kernel-switchboard-cudnn",
    "fa": "kernel-switchboard-fa",
    "cutlass": "kernel-switchboard-cutlass",
    "trtllm": "kernel-switchboard-trtllm",
}


def install_command(backend: str) -> str | None:
    """The command that installs a built-in backend (None for any other name)."""
    if backend not in BUILTIN_BACKENDS or backend == "reference":
        return None
    return f'pip install "kernel-switchboard[{backend}]"'


def _env_list(name: str) -> set[str]:
    return {s.strip() for s in os.environ.get(name, "").split(",") if s.strip()}


class Registry:
    """All backends and their kernels, loaded lazily on first use."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._loaded = False
        self._extra: list[Any] = []
        self.backends: dict[str, Backend] = {}
        self._by_op: dict[str, list[Kernel]] = {}
        #: bumped at every change; part of the dispatch cache key
        self.generation = 0

    # -- loading -----------------------------------------------------------------------------
    def register(self, plugin: Any) -> None:
        """Register a plugin object or module implementing ``ksb_backend`` (third parties, tests)."""
        with self._lock:
            self._extra.append(plugin)
            self._loaded = False
            self.generation += 1

    def unregister(self, plugin: Any) -> None:
        with self._lock:
            self._extra.remove(plugin)
            self._loaded = False
            self.generation += 1

    def reload(self) -> None:
        """Forget everything and discover again (picks up changed environment variables)."""
        with self._lock:
            self._loaded = False
            self.generation += 1

    def _plugins(self) -> Iterable[tuple[str, Any, bool, str]]:
        """(source, plugin, built-in, origin) of every plugin: the reference, the entry points, then registered ones."""
        from .reference import plugin as reference_plugin

        yield "reference", reference_plugin, True, "kernel-switchboard (kernel_switchboard.reference.plugin)"
        for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            dist = _distribution(ep)
            builtin = dist == BUILTIN_BACKENDS.get(ep.name)
            origin = f"{dist or 'an unknown distribution'} ({ep.value})"
            try:
                yield ep.name, ep.load(), builtin, origin
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # noqa: BLE001 - SystemExit from a plugin's import too: contained
                yield ep.name, _BrokenPlugin(ep.name, f"import of {ep.value} failed: {_error(exc)}"), builtin, origin
        for plugin in self._extra:
            name = getattr(plugin, "__name__", type(plugin).__name__)
            yield name, plugin, False, f"registered object {name}"

    def _load(self) -> None:
        allow, deny = _env_list("KSB_BACKENDS"), _env_list("KSB_DISABLE_BACKENDS")
        loaded = []
        for source, plugin, builtin, origin in self._plugins():
            backend = _call_plugin(source, plugin)
            backend.builtin, backend.origin = builtin, origin
            loaded.append(backend)
        # who keeps a name: a built-in backend, else the first third-party one in source order (stable sort)
        holders: dict[str, Backend] = {}
        for backend in sorted(loaded, key=lambda b: (not b.builtin, b.source)):
            holders.setdefault(backend.name, backend)
        backends: dict[str, Backend] = {}
        for backend in loaded:  # in discovery order
            holder = holders[backend.name]
            if holder is not backend:
                key = f"{backend.name} ({backend.source})"
                while key in backends:  # the same plugin registered twice: still listed, once per registration
                    key += "'"
                backends[key] = _clash(backend, holder)
                continue
            if backend.name != "reference":
                if (allow and backend.name not in allow) or backend.name in deny:
                    backend.unavailable = "disabled by KSB_BACKENDS / KSB_DISABLE_BACKENDS"
                    backend.kernels = [_disabled(k, backend.unavailable) for k in backend.kernels]
            backends[backend.name] = backend
        by_op: dict[str, list[Kernel]] = {}
        for name, backend in backends.items():
            if name != backend.name:
                continue  # a name clash's loser: listed, never dispatched to
            for kernel in backend.kernels:
                by_op.setdefault(kernel.op, []).append(kernel)
        self.backends, self._by_op = backends, by_op
        self._loaded = True

    def ensure_loaded(self) -> None:
        if not self._loaded:
            with self._lock:
                if not self._loaded:
                    self._load()

    # -- queries -------------------------------------------------------------------------------
    def kernels(self, op: str) -> list[Kernel]:
        """Every kernel registered for ``op``, available or not."""
        self.ensure_loaded()
        return self._by_op.get(op, [])

    def all_backends(self) -> dict[str, Backend]:
        self.ensure_loaded()
        return self.backends

    def ops(self) -> list[str]:
        self.ensure_loaded()
        return sorted(self._by_op)


class _BrokenPlugin:
    def __init__(self, name: str, reason: str) -> None:
        self.name, self.reason = name, reason


def _disabled(kernel: Kernel, reason: str) -> Kernel:
    from dataclasses import replace

    return replace(kernel, unavailable=reason, install=None)


def _call_plugin(source: str, plugin: Any) -> Backend:
    """The plugin's :class:`Backend`, validated; whatever goes wrong becomes an unavailable backend with the error."""
    if isinstance(plugin, _BrokenPlugin):
        return Backend(name=plugin.name, unavailable=plugin.reason, source=source)
    results: Any = None
    try:
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        pm.register(plugin)
        results = pm.hook.ksb_backend()
        if not results or not isinstance(results[0], Backend):
            raise TypeError(f"ksb_backend() returned {_short(results)}, expected a Backend")
        backend: Backend = results[0]
        problems = _backend_problems(backend)
        if problems:
            raise TypeError("; ".join(problems))
        backend.kernels = _checked_kernels(backend)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of a plugin, SystemExit included, stays with it
        reason = f"plugin {source} failed: {_error(exc)}"
        return Backend(name=_claimed_name(results, source), unavailable=reason, source=source,
                       kernels=[_unavailable(k, reason, None) for k in _valid_kernels(results)])
    backend.source = source
    if backend.unavailable is not None:
        backend.kernels = [
            k if k.unavailable else _unavailable(k, backend.unavailable, backend.install) for k in backend.kernels
        ]
    return backend


def _claimed_name(results: Any, source: str) -> str:
    """The backend name a failed plugin's result claims, else its source."""
    name = getattr(results[0], "name", None) if isinstance(results, list) and results else None
    return name if isinstance(name, str) and name and ":" not in name else source


def _backend_problems(backend: Backend) -> list[str]:
    """What is wrong with a plugin's Backend record itself (its kernels are checked one by one after)."""
    out = []
    if not isinstance(backend.name, str) or not backend.name or ":" in backend.name:
        out.append(f"Backend.name={backend.name!r} is not a non-empty name without ':'")
    if not isinstance(backend.kernels, (list, tuple)):
        out.append(f"Backend.kernels is a {type(backend.kernels).__name__}, expected a list of Kernel")
    else:
        bad = [f"kernels[{i}] is a {type(k).__name__}" for i, k in enumerate(backend.kernels) if not isinstance(k, Kernel)]
        if bad:
            out.append(", ".join(bad) + ", expected Kernel records")
    for attr in ("unavailable", "install"):
        if getattr(backend, attr) is not None and not isinstance(getattr(backend, attr), str):
            out.append(f"Backend.{attr}={getattr(backend, attr)!r} is not a str or None")
    if not isinstance(backend.providers, dict):
        out.append(f"Backend.providers is a {type(backend.providers).__name__}, expected a dict")
    return out


def _checked_kernels(backend: Backend) -> list[Kernel]:
    """The backend's kernels, each with a bad field made unavailable with the reason (never dispatched to)."""
    out: list[Kernel] = []
    seen: set[str] = set()
    for k in backend.kernels:
        reason = _kernel_problem(k, backend.name, seen)
        seen.add(f"{k.op}/{k.id}")
        out.append(k if reason is None else _unavailable(k, f"invalid kernel record: {reason}", None))
    return out


def _kernel_problem(k: Kernel, backend: str, seen: set[str]) -> str | None:
    if not isinstance(k.op, str) or not isinstance(k.name, str) or not k.name:
        return f"op={k.op!r} / name={k.name!r} are not names"
    if k.backend != backend:
        return f"backend={k.backend!r} differs from its Backend's name {backend!r}"
    if f"{k.op}/{k.id}" in seen:
        return f"a second kernel with id {k.id!r} for {k.op}"
    if not isinstance(k.capability, Capability):
        return f"capability is a {type(k.capability).__name__}, expected a Capability"
    if k.unavailable is None and not callable(k.run):
        return f"run is a {type(k.run).__name__}, not callable"
    for attr in ("plan", "cost", "needs_build", "build", "math_dtype"):
        if getattr(k, attr) is not None and not callable(getattr(k, attr)):
            return f"{attr} is a {type(getattr(k, attr)).__name__}, not callable"
    if k.unavailable is not None and not isinstance(k.unavailable, str):
        return f"unavailable={k.unavailable!r} is not a str or None"
    return None


def _valid_kernels(results: Any) -> list[Kernel]:
    """The kernel records of a failed plugin's result (to list as unavailable, for doctor), else none."""
    kernels = getattr(results[0], "kernels", None) if isinstance(results, list) and results else None
    if not isinstance(kernels, (list, tuple)):
        return []
    return [k for k in kernels if isinstance(k, Kernel) and isinstance(k.op, str) and isinstance(k.name, str)
            and isinstance(k.backend, str)]


def _clash(backend: Backend, holder: Backend) -> Backend:
    """``backend`` listed as unavailable: ``holder`` has its name."""
    kind = "the built-in backend" if holder.builtin else "the backend"
    reason = (f"backend name {backend.name!r} clash: {kind} from {holder.source!r}, {holder.origin}, has it; this "
              f"one from {backend.source!r}, {backend.origin}, is ignored (rename it)")
    out = Backend(name=backend.name, version=backend.version, unavailable=reason, source=backend.source,
                  kernels=[_unavailable(k, reason, None) for k in backend.kernels], providers=backend.providers)
    out.origin = backend.origin
    return out


def _distribution(ep: Any) -> str | None:
    """The normalised name of the distribution an entry point comes from (None when unknown)."""
    dist = getattr(ep, "dist", None)
    name = getattr(dist, "name", None) or getattr(getattr(dist, "metadata", None) or {}, "get", lambda _: None)("Name")
    return name.lower().replace("_", "-") if isinstance(name, str) else None


def _error(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _unavailable(kernel: Kernel, reason: str, install: str | None) -> Kernel:
    from dataclasses import replace

    return replace(kernel, unavailable=reason, install=install)


#: the process-wide registry
registry = Registry()
