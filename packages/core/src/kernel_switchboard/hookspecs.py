"""The pluggy hook a backend implements.

A backend package exposes a module (named in the ``kernel_switchboard.backends`` entry-point
group) that implements :func:`ksb_backend`::

    from kernel_switchboard import hookimpl, Backend

    @hookimpl
    def ksb_backend() -> Backend:
        return Backend(name="mine", version="1.0", kernels=[...])

The hook is called once, lazily, at the first dispatch (never at import). It must not raise
when its vendor library or GPU is missing: it returns the backend with ``unavailable`` set
(reason) and ``install`` (the command that fixes it); its kernels stay listed.
"""

from __future__ import annotations

import pluggy

PROJECT = "kernel_switchboard"
ENTRY_POINT_GROUP = "kernel_switchboard.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def ksb_backend():  # type: ignore[no-untyped-def]
    """Return this plugin's :class:`kernel_switchboard.registry.Backend` (kernels and availability)."""
