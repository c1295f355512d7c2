"""Launch a Triton kernel again, with new tensors in a few argument places, without Triton's per-call work.

``kernel[grid](*args, **kwargs)`` binds every argument, specialises each (dtype and 16-byte alignment of pointers,
integers equal to 1 or divisible by 16), looks the compiled kernel up and launches it. A plan launches the same
kernels at every run with the same arguments but a few tensors (the queries, the cache pages, the outputs), and an
engine's KV-cache append does at every layer of a step. A :class:`Relaunch` makes the first launch through
``kernel[grid]`` and keeps the compiled kernel Triton returned with the whole argument list; a later launch puts its
own tensors in their places and calls the compiled kernel's launcher directly, with the arguments Triton's own launch
passes it. On an H100 host (Triton 3.6) the decode split kernel's launch (28 arguments and 25 keywords) takes 11 us
of host time that way against 46 through ``kernel[grid]`` (docs/benchmarks.md).

The kept arguments include the first tensors' strides, and the compiled kernel assumed their dtypes and alignment,
so a later tensor is taken only with the dtype, strides and 16-byte alignment of the one it replaces; otherwise
:meth:`Relaunch.bind` returns None and the caller builds the launch anew. Launches go through ``kernel[grid]``
(with the same arguments) when there is no compiled kernel to call: interpreted Triton (``TRITON_INTERPRET=1``), a
launch hook set (profilers read launches through it), another current device.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from triton import knobs
from triton.runtime import driver

#: what Triton's launch passes its compiled kernel's launcher between the kernel handle and the arguments
_LAUNCHER_FIELDS = ("run", "function", "packed_metadata")


@functools.cache
def _params(fn: Any) -> tuple[tuple[str, Any], ...]:
    """(name, default) of each parameter of a ``triton.jit`` function, in order."""
    return tuple((p.name, p.default) for p in inspect.signature(fn.fn).parameters.values())


def _launch_hooks_set() -> bool:
    """Whether a launch hook is set (Triton keeps them in a chain, empty when none is; older Tritons: None)."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _spec(t: torch.Tensor) -> tuple[torch.dtype, tuple[int, ...], bool]:
    return t.dtype, t.stride(), t.data_ptr() % 16 == 0


class Relaunch:
    """``Relaunch(kernel, grid, args, kwargs, slots)`` launches ``kernel[grid](*args, **kwargs)`` and keeps it;
    ``launch(bind(*tensors))`` launches it again with one tensor per position in ``slots`` (indices into ``args``,
    each a tensor there) in those places. It keeps the other arguments, never the tensors in ``slots``."""

    __slots__ = ("_args", "_compiled", "_current_device", "_device", "_fn", "_grid", "_options", "_slots", "_specs",
                 "_stream")

    def __init__(self, kernel: Any, grid: tuple[int, ...], args: Sequence[Any], kwargs: dict[str, Any],
                 slots: Sequence[int]) -> None:
        params = _params(kernel)
        # every parameter positionally (constexprs too, as Triton's launcher takes them); launch options apart
        self._args = [*args, *(kwargs.get(name, default) for name, default in params[len(args):])]
        names = {name for name, _ in params}
        self._options = {key: value for key, value in kwargs.items() if key not in names}
        self._fn, self._grid, self._slots = kernel, (*grid, 1, 1)[:3], tuple(slots)
        self._specs = tuple(_spec(self._args[i]) for i in self._slots)
        for i in self._slots:  # every launch fills them: the kept launch holds no run's tensors alive
            self._args[i] = None
        compiled = kernel[grid](*args, **kwargs)
        self._compiled = compiled if all(hasattr(compiled, f) for f in _LAUNCHER_FIELDS) else None
        if self._compiled is not None:  # the device and stream functions Triton's own launch uses
            active = driver.active
            self._current_device, self._stream = active.get_current_device, active.get_current_stream
            self._device = self._current_device()

    def bind(self, *tensors: torch.Tensor) -> list[Any] | None:
        """The launch's arguments with ``tensors`` in the ``slots`` positions, or None when one differs from the
        tensor it replaces in dtype, strides or 16-byte alignment (the kept launch cannot take it)."""
        args = self._args.copy()
        for i, t, (dtype, strides, aligned) in zip(self._slots, tensors, self._specs):
            if t.dtype is not dtype or t.stride() != strides or (aligned and t.data_ptr() % 16):
                return None
            args[i] = t
        return args

    def launch(self, args: list[Any]) -> None:
        """Launch with ``args`` from :meth:`bind`: straight to the compiled kernel's launcher when it can."""
        compiled = self._compiled
        if compiled is not None and not _launch_hooks_set():
            device = self._current_device()
            if device == self._device:
                g = self._grid
                # the launcher's arguments as Triton's own launch passes them (with no hook: no launch metadata)
                compiled.run(g[0], g[1], g[2], self._stream(device), compiled.function, compiled.packed_metadata,
                             None, None, None, *args)
                return
        self._fn[self._grid](*args, **self._options)
