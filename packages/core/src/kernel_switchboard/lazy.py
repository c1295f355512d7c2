"""Kernel entry points whose module is imported on the first call, not at discovery.

A backend declares its kernels (capabilities, costs, checks) in modules that import no vendor
library; the launchers live in modules that do (Triton, cuDNN, FlashInfer...). A record's ``run``
or ``plan`` is then a :class:`Launcher` naming where the function lives::

    Kernel("norm.rms_norm", "rms_norm", "mine", CAP, Launcher("my_backend.norm:rms_norm"), ...)

so discovering the backend, ranking its kernels and running another backend's kernel import
nothing of it. The first call imports the module and binds the function into every registered
record that holds this launcher, so later calls go to the function directly (no extra frame on the
hot path). A module that fails to import raises :class:`~kernel_switchboard.errors.KernelUnavailableError`
with the error and the install command.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from typing import Any

from .errors import KernelUnavailableError

_lock = threading.Lock()


class Launcher:
    """A callable that stands for ``module:attribute`` until its first call imports the module."""

    __slots__ = ("_fn", "install", "prepare", "target")

    def __init__(self, target: str, install: str | None = None, prepare: Callable[[], object] | None = None) -> None:
        """``install``: the command that makes the module importable (in the error when it is not); ``prepare``:
        called once before the import (e.g. :func:`kernel_switchboard.artefacts.prepare_triton`, which points the
        library's compile cache at the switchboard's)."""
        module, sep, attr = target.partition(":")
        if not sep or not module or not attr:
            raise ValueError(f"Launcher target {target!r} is invalid: expected 'package.module:attribute'")
        self.target = target
        self.install = install
        self.prepare = prepare
        self._fn: Callable[..., Any] | None = None

    @property
    def loaded(self) -> bool:
        """Whether the module has been imported and the function found."""
        return self._fn is not None

    def resolve(self) -> Callable[..., Any]:
        """The function (importing its module the first time)."""
        fn = self._fn
        if fn is None:
            with _lock:
                fn = self._fn
                if fn is None:
                    if self.prepare is not None:
                        self.prepare()
                    fn = self._fn = _load(self.target, self.install)
            _bind(self, fn)
        return fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Launcher({self.target!r}{', loaded' if self.loaded else ''})"


def _load(target: str, install: str | None) -> Callable[..., Any]:
    module, _, attr = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        hint = f"; install: {install}" if install else ""
        raise KernelUnavailableError(f"the kernel entry point {target} could not be loaded: "
                                     f"{type(exc).__name__}: {exc}{hint}") from exc
    if not callable(fn):
        raise KernelUnavailableError(f"the kernel entry point {target} is a {type(fn).__name__}, not a callable")
    return fn  # type: ignore[no-any-return]


def _bind(launcher: Launcher, fn: Callable[..., Any]) -> None:
    """Put ``fn`` in place of ``launcher`` in every registered kernel record (``run`` and ``plan``), so the next
    call of those records skips the launcher. Records are frozen to users; the registry owns them, and this is the
    one field change it allows: the same function, found."""
    from .registry import registry

    for backend in list(registry.backends.values()):
        for kernel in backend.kernels:
            if kernel.run is launcher:
                object.__setattr__(kernel, "run", fn)
            if kernel.plan is launcher:
                object.__setattr__(kernel, "plan", fn)


def resolve(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself, or the function a :class:`Launcher` stands for (imported now)."""
    return fn.resolve() if isinstance(fn, Launcher) else fn
