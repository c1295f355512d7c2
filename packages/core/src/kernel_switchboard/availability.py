"""Availability checks a backend runs inside its ``ksb_backend`` hook (never at import time).

Each returns ``None`` when the requirement holds, else the reason as one sentence. They read package
metadata and the import system's finders only: nothing they check is imported, so discovering a
backend costs milliseconds however heavy its vendor library is. A library that is installed but
broken shows when one of its kernels is first chosen to run (:func:`import_vendor`,
:class:`~kernel_switchboard.lazy.Launcher`), as an error with the install command.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

import torch

from .device import package_version
from .errors import KernelUnavailableError


def _version_tuple(v: str) -> tuple[int, ...]:
    """Numeric release parts: "4.0.0b36" -> (4, 0, 0); "2.11.0+cu130" -> (2, 11, 0)."""
    out: list[int] = []
    for part in v.replace("+", ".").replace("-", ".").split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def version_in_window(version: str, minimum: str | None = None, below: str | None = None) -> bool:
    """``minimum <= version < below`` by numeric release parts (pre-release tags ignored)."""
    v = _version_tuple(version)
    if minimum is not None and v < _version_tuple(minimum):
        return False
    return not (below is not None and v >= _version_tuple(below))


def module_installed(module: str) -> bool:
    """Whether ``module`` (dotted names too) can be found, without importing it or its parent packages."""
    if module in sys.modules:
        return sys.modules[module] is not None
    head, *rest = module.split(".")
    if head in sys.modules:
        found = sys.modules[head]
        locations = getattr(found, "__path__", None) if found is not None else None
        if found is None or (rest and locations is None):
            return False
    else:
        try:
            spec = importlib.util.find_spec(head)
        except (ImportError, ValueError):
            return False
        if spec is None:
            return False
        locations = spec.submodule_search_locations
    name = head
    for part in rest:
        if locations is None:
            return False
        name = f"{name}.{part}"
        sub = importlib.machinery.PathFinder.find_spec(name, list(locations))
        if sub is None:
            return False
        locations = sub.submodule_search_locations
    return True


def missing_module(module: str, distribution: str | None = None, minimum: str | None = None,
                   below: str | None = None) -> str | None:
    """Reason ``module`` cannot be used: not installed, or its distribution outside [minimum, below).

    Nothing is imported (see the module docstring)."""
    if not module_installed(module):
        return f"python module {module!r} is not installed"
    if distribution is not None:
        version = package_version(distribution)
        if version is None:
            return None if minimum is None and below is None else f"distribution {distribution!r} not found"
        if not version_in_window(version, minimum, below):
            window = f">={minimum}" if minimum else ""
            window += ("," if window and below else "") + (f"<{below}" if below else "")
            return f"{distribution} {version} is outside the supported window {window}"
    return None


def import_vendor(module: str, install: str | None = None) -> ModuleType:
    """Import a vendor module for a kernel about to run; a failure raises
    :class:`~kernel_switchboard.errors.KernelUnavailableError` with the error and the install command."""
    try:
        return importlib.import_module(module)
    except Exception as exc:
        hint = f"; install: {install}" if install else ""
        raise KernelUnavailableError(f"import of {module!r} failed: {type(exc).__name__}: {str(exc)[:300]}{hint}") from exc


def missing_cuda(min_cc: tuple[int, int] | None = None, max_cc: tuple[int, int] | None = None) -> str | None:
    """Reason no suitable CUDA GPU is here (torch without CUDA, no device, or compute capability out of range)."""
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (torch.cuda.is_available() is False)"
    cc = torch.cuda.get_device_capability()
    if min_cc is not None and cc < min_cc:
        return f"GPU compute capability {cc[0]}.{cc[1]} is below the required {min_cc[0]}.{min_cc[1]}"
    if max_cc is not None and cc > max_cc:
        return f"GPU compute capability {cc[0]}.{cc[1]} is above the supported {max_cc[0]}.{max_cc[1]}"
    return None


def triton_interpreting() -> bool:
    """True when ``TRITON_INTERPRET=1``: Triton kernels then run on the CPU in numpy (tests only)."""
    import os

    return os.environ.get("TRITON_INTERPRET", "0") == "1"
