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



#: the oldest Linux driver each CUDA major release runs on (NVIDIA's minor-version compatibility table)
MIN_DRIVER = {11: (450, 80), 12: (525, 60), 13: (580, 65)}
TORCH_INSTALL = "https://pytorch.org/get-started/locally/"


def cuda_problem() -> tuple[str, str] | None:
    """(reason, fix) this torch cannot use a CUDA GPU here, or None when it can.

    Names the first cause that holds: a CPU-only torch build, GPUs hidden by ``CUDA_VISIBLE_DEVICES``, no
    NVIDIA driver, a driver older than the CUDA release torch was built for, or CUDA's own initialisation
    error. Reads the driver through NVML and may initialise CUDA: call it on demand, never at import time.
    """
    import os

    from .device import driver_version

    if torch.version.cuda is None:
        release = torch.__version__.split("+")[0]
        return (f"this torch build ({torch.__version__}) has no CUDA support: it is a CPU-only build",
                f'install a CUDA build of torch: pip install --force-reinstall "torch=={release}" from PyPI (its Linux '
                f"x86_64 wheels are CUDA builds) or from the index for your CUDA release ({TORCH_INSTALL})")
    if torch.cuda.is_available():
        return _arch_problem()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1", "none", "NoDevFiles"):
        return (f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU", "unset CUDA_VISIBLE_DEVICES or list GPU indices in it")
    driver = driver_version()
    cuda_major = int(torch.version.cuda.split(".")[0])
    if driver is None:
        return (f"no NVIDIA driver answers (libnvidia-ml.so.1 cannot be loaded or initialised); torch is built for "
                f"CUDA {torch.version.cuda}",
                "on a machine with an NVIDIA GPU, install the NVIDIA driver "
                + (f">= {'.'.join(map(str, MIN_DRIVER[cuda_major]))} " if cuda_major in MIN_DRIVER else "")
                + "(https://www.nvidia.com/drivers); in a container, start it with the GPUs (--gpus all)")
    needed = MIN_DRIVER.get(cuda_major)
    if needed is not None and _version_tuple(driver)[:2] < needed:
        return (f"the NVIDIA driver {driver} is older than CUDA {torch.version.cuda} (torch {torch.__version__}) needs: "
                f">= {needed[0]}.{needed[1]}",
                f"upgrade the driver to >= {needed[0]}.{needed[1]}, or install a torch built for an older CUDA ({TORCH_INSTALL})")
    try:
        torch.cuda.init()
    except Exception as exc:
        return (f"CUDA initialisation failed: {type(exc).__name__}: {str(exc)[:300]}",
                f"check the driver ({driver}) against torch's CUDA {torch.version.cuda}: `nvidia-smi` must list the GPU")
    return ("no CUDA GPU is visible (torch.cuda.is_available() is False)", "check `nvidia-smi` lists a GPU")


def _arch_problem() -> tuple[str, str] | None:
    """(reason, fix) when this torch build carries no kernels the GPU can run (too new a GPU for its CUDA release)."""
    major, minor = torch.cuda.get_device_capability()
    archs = torch.cuda.get_arch_list()
    runs = any(a.startswith("sm_") and a[3:].isdigit() and int(a[3:]) // 10 == major and int(a[3:]) % 10 <= minor
               for a in archs)
    runs = runs or any(a.startswith("compute_") and a[8:].isdigit() and int(a[8:]) <= major * 10 + minor for a in archs)
    if runs or not archs:
        return None
    return (f"this torch build ({torch.__version__}, CUDA {torch.version.cuda}) has no kernels for this GPU "
            f"(sm_{major}{minor}); it carries {', '.join(archs)}",
            f"install a torch built for a CUDA release that supports sm_{major}{minor} ({TORCH_INSTALL})")


def missing_cuda(min_cc: tuple[int, int] | None = None, max_cc: tuple[int, int] | None = None) -> str | None:
    """Reason no suitable CUDA GPU is here (see :func:`cuda_problem`), or the compute capability is out of range."""
    problem = cuda_problem()
    if problem is not None:
        return problem[0]
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
