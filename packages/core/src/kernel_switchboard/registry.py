"""Kernel records, backends, and discovery through pluggy entry points.

One broken backend never stops the others: a plugin that fails to import or whose hook raises
is listed as unavailable with the error as its reason. Environment variables:

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

    @property
    def available(self) -> bool:
        return self.unavailable is None


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

    def _plugins(self) -> Iterable[tuple[str, Any]]:
        from .reference import plugin as reference_plugin

        yield "reference", reference_plugin
        for ep in metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP):
            try:
                yield ep.name, ep.load()
            except Exception as exc:
                yield ep.name, _BrokenPlugin(ep.name, f"import of {ep.value} failed: {type(exc).__name__}: {exc}")
        for plugin in self._extra:
            yield getattr(plugin, "__name__", type(plugin).__name__), plugin

    def _load(self) -> None:
        allow, deny = _env_list("KSB_BACKENDS"), _env_list("KSB_DISABLE_BACKENDS")
        backends: dict[str, Backend] = {}
        for source, plugin in self._plugins():
            backend = _call_plugin(source, plugin)
            if backend.name in backends:
                continue  # the first registration of a name wins
            if backend.name != "reference":
                if (allow and backend.name not in allow) or backend.name in deny:
                    backend.unavailable = "disabled by KSB_BACKENDS / KSB_DISABLE_BACKENDS"
                    backend.kernels = [_disabled(k, backend.unavailable) for k in backend.kernels]
            backends[backend.name] = backend
        by_op: dict[str, list[Kernel]] = {}
        for backend in backends.values():
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
    if isinstance(plugin, _BrokenPlugin):
        return Backend(name=plugin.name, unavailable=plugin.reason, source=source)
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    try:
        pm.register(plugin)
        results = pm.hook.ksb_backend()
        if not results or not isinstance(results[0], Backend):
            raise TypeError(f"ksb_backend() returned {results!r}, expected a Backend")
        backend: Backend = results[0]
    except Exception as exc:
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return Backend(name=source, unavailable=f"plugin {source} failed: {tb}", source=source)
    backend.source = source
    if backend.unavailable is not None:
        backend.kernels = [
            k if k.unavailable else _unavailable(k, backend.unavailable, backend.install) for k in backend.kernels
        ]
    return backend


def _unavailable(kernel: Kernel, reason: str, install: str | None) -> Kernel:
    from dataclasses import replace

    return replace(kernel, unavailable=reason, install=install)


#: the process-wide registry
registry = Registry()
