"""What building a CUTLASS kernel needs here: nvcc, the CUTLASS C++ headers, a cache directory.

Nothing runs at import time. Every probe is cached for the process; :func:`reset` forgets them
(tests). Environment variables:

- ``KSB_NVCC``: the nvcc to use (else ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on ``PATH``, ``/usr/local/cuda/bin/nvcc``).
- ``KSB_CUTLASS_DIR``: a CUTLASS source tree (with ``include/cutlass/cutlass.h``) instead of the
  headers shipped in the ``nvidia-cutlass`` wheel (``cutlass_library/source``).
- ``KSB_CUTLASS_CACHE``: where compiled kernels live (else ``cutlass/`` under the switchboard's cache root,
  ``KSB_CACHE_DIR``, default ``<user cache>/kernel-switchboard``: see :mod:`kernel_switchboard.artefacts`).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

#: nvcc releases before this lack what CUTLASS 3.x Hopper kernels need (wgmma / TMA / sm_90a)
MIN_NVCC = (12, 3)
#: the CUTLASS C++ headers ship in the nvidia-cutlass wheel; its own dependencies (cuda-python, scipy, ...) serve
#: its Python kernel generator, which this backend does not use, hence --no-deps
INSTALL = 'pip install --no-deps "nvidia-cutlass>=4.2,<5"'
NVCC_INSTALL = "install the CUDA toolkit >= 12.3 (nvcc) and put it on PATH, or set KSB_NVCC / CUDA_HOME"
#: where nvcc is looked for last
DEFAULT_NVCC = "/usr/local/cuda/bin/nvcc"


@dataclass(frozen=True)
class Nvcc:
    path: str
    version: tuple[int, int]
    release: str  # the full "V13.0.88" build string, part of the cache key


@dataclass(frozen=True)
class CutlassHeaders:
    root: Path  # holds include/ and tools/util/include/
    version: str  # "4.2.0"

    @property
    def include_dirs(self) -> tuple[Path, Path]:
        return self.root / "include", self.root / "tools" / "util" / "include"


def _nvcc_candidates() -> list[str]:
    out = []
    if os.environ.get("KSB_NVCC"):
        out.append(os.environ["KSB_NVCC"])
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append(os.path.join(os.environ[var], "bin", "nvcc"))
    which = shutil.which("nvcc")
    if which:
        out.append(which)
    out.append(DEFAULT_NVCC)
    return out


def parse_nvcc_version(text: str) -> tuple[tuple[int, int], str] | None:
    """(major, minor) and the build string from ``nvcc --version`` output, or None."""
    m = re.search(r"release (\d+)\.(\d+), (V[\w.]+)", text)
    if m is None:
        return None
    return (int(m.group(1)), int(m.group(2))), m.group(3)


@functools.lru_cache(maxsize=1)
def _find_nvcc() -> Nvcc | str:
    tried = []
    for cand in _nvcc_candidates():
        if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
            tried.append(cand)
            continue
        try:
            text = subprocess.run([cand, "--version"], capture_output=True, text=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"{cand} --version failed: {exc}"
        parsed = parse_nvcc_version(text)
        if parsed is None:
            return f"could not read the CUDA release from `{cand} --version`"
        version, release = parsed
        if version < MIN_NVCC:
            return (f"nvcc {version[0]}.{version[1]} at {cand} is too old: CUTLASS Hopper kernels need "
                    f">= {MIN_NVCC[0]}.{MIN_NVCC[1]}")
        return Nvcc(cand, version, release)
    return f"nvcc not found (looked at {', '.join(dict.fromkeys(tried))})"


def nvcc() -> Nvcc:
    """The nvcc to build with; raises RuntimeError with the reason when there is none."""
    found = _find_nvcc()
    if isinstance(found, str):
        raise RuntimeError(f"{found}; {NVCC_INSTALL}")
    return found


def missing_nvcc() -> str | None:
    """Reason no usable nvcc is here, or None."""
    found = _find_nvcc()
    return found if isinstance(found, str) else None


def read_cutlass_version(root: Path) -> str | None:
    """``major.minor.patch`` from ``include/cutlass/version.h``, or None."""
    try:
        text = (root / "include" / "cutlass" / "version.h").read_text()
    except OSError:
        return None
    parts = [re.search(rf"#define CUTLASS_{p}\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    if any(p is None for p in parts):
        return None
    return ".".join(p.group(1) for p in parts if p is not None)


@functools.lru_cache(maxsize=1)
def _find_headers() -> CutlassHeaders | str:
    env = os.environ.get("KSB_CUTLASS_DIR")
    if env:
        root = Path(env)
        source = "KSB_CUTLASS_DIR"
    else:
        # find_spec locates the package without importing it (its __init__ pulls in the generator)
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            return "the CUTLASS C++ headers are not installed (python package 'nvidia-cutlass' not found)"
        root = Path(next(iter(spec.submodule_search_locations))) / "source"
        source = "nvidia-cutlass"
    if not (root / "include" / "cutlass" / "cutlass.h").is_file():
        return f"no CUTLASS headers under {root} (from {source}): include/cutlass/cutlass.h is missing"
    version = read_cutlass_version(root)
    if version is None:
        return f"could not read the CUTLASS version from {root}/include/cutlass/version.h"
    if int(version.split(".")[0]) < 3:
        return f"CUTLASS {version} under {root} is too old: Hopper warp-specialised kernels need CUTLASS >= 3.5"
    return CutlassHeaders(root, version)


def headers() -> CutlassHeaders:
    """The CUTLASS headers to build with; raises RuntimeError with the reason when there are none."""
    found = _find_headers()
    if isinstance(found, str):
        raise RuntimeError(f"{found}; install: {INSTALL}")
    return found


def missing_headers() -> str | None:
    """Reason no CUTLASS headers are here, or None."""
    found = _find_headers()
    return found if isinstance(found, str) else None


def cache_dir() -> Path:
    """Where compiled kernels live (``KSB_CUTLASS_CACHE`` overrides); created on demand by the builder. Not keyed
    by GPU or driver like the switchboard's other artefacts: a library's name carries the hash of its source, nvcc
    and CUTLASS, and it is an sm_90a binary, which loads on any driver of its CUDA major version."""
    env = os.environ.get("KSB_CUTLASS_CACHE")
    if env:
        return Path(env)
    from kernel_switchboard.artefacts import root

    base = root()
    if base is None:  # KSB_CACHE_DIR=off: the user cache as before
        base = Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "kernel-switchboard"
    return base / "cutlass"


def reset() -> None:
    """Forget the cached probes (after changing KSB_NVCC / KSB_CUTLASS_DIR)."""
    _find_nvcc.cache_clear()
    _find_headers.cache_clear()
