"""Compiled kernels that outlive a process: where they live, and the environment they were built for.

The root is ``KSB_CACHE_DIR`` (default ``$XDG_CACHE_HOME/kernel-switchboard``, ``~/.cache/kernel-switchboard``);
``KSB_CACHE_DIR=off`` turns the switchboard's own placement off (each library then caches where it would anyway).
Under ``<root>/compiled/`` each environment gets a directory of its own, named by a hash of its
:func:`environment` (the GPU model and compute capability, the NVIDIA driver, CUDA, Python, torch, Triton and the
switchboard's and every vendor library's versions), with that environment written beside the artefacts::

    <root>/compiled/nvidia-h100-80gb-hbm3-3f9c0a.../
        environment.json    what the directory was built for; a directory whose file differs is never used
        triton/             TRITON_CACHE_DIR while the switchboard's Triton kernels compile and load
        flash_attn_cute/    FlashAttention-4's persistent CuTe DSL cache (``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``)
        records/            which FlashInfer JIT modules the trtllm kernels built, and where; the Triton build's key
    <root>/cutlass/         CUTLASS libraries (keyed by their source, nvcc and CUTLASS versions; sm_90a only)

A cache copied from another GPU, driver or version therefore sits in a directory this environment never opens.
``switchboard build`` fills the directory ahead of time; ``docs/cold-start.md`` shows how to bake it into an image.
A variable the user set (``TRITON_CACHE_DIR``, ``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``...) always wins.

Nothing here runs at import: :func:`prepare_triton` and :func:`prepare_flash_attn_cute` run just before the
first kernel of their library is imported (:class:`~kernel_switchboard.lazy.Launcher`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import re
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from .device import driver_version, package_version

#: format of ``environment.json``; bumped when the layout of a directory changes
FORMAT = 1
#: distributions whose versions change what a compiled artefact is or how it is loaded
DISTRIBUTIONS = (
    "kernel-switchboard", "kernel-switchboard-triton", "kernel-switchboard-cudnn", "kernel-switchboard-fa",
    "kernel-switchboard-cutlass", "kernel-switchboard-trtllm", "triton", "nvidia-cudnn-frontend", "flash-attn-4",
    "nvidia-cutlass-dsl", "nvidia-cutlass", "flashinfer-python", "tensorrt-llm",
)
ENVIRONMENT_FILE = "environment.json"
_lock = threading.Lock()


def root() -> Path | None:
    """The cache root, or None when ``KSB_CACHE_DIR=off``."""
    env = os.environ.get("KSB_CACHE_DIR")
    if env is not None and env.strip().lower() == "off":
        return None
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernel-switchboard"


@functools.lru_cache(maxsize=8)
def environment(device_index: int | None = None) -> dict[str, Any] | None:
    """What a compiled artefact depends on, for CUDA device ``device_index`` (default: the current one); None
    without a CUDA GPU (nothing is compiled then). Read once per device per process."""
    if not torch.cuda.is_available():
        return None
    index = torch.cuda.current_device() if device_index is None else device_index
    major, minor = torch.cuda.get_device_capability(index)
    return {
        "format": FORMAT,
        "gpu": torch.cuda.get_device_name(index),
        "compute_capability": f"{major}.{minor}",
        "driver": driver_version(),
        "cuda": torch.version.cuda,
        "python": ".".join(platform.python_version_tuple()[:2]),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "packages": {dist: package_version(dist) for dist in DISTRIBUTIONS},
    }


def key(env: dict[str, Any]) -> str:
    """The directory name of ``env``: its GPU model as a slug, then 16 hex digits of a hash of all of it."""
    digest = hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:16]
    slug = re.sub(r"[^a-z0-9]+", "-", str(env.get("gpu") or "gpu").lower()).strip("-")[:40] or "gpu"
    return f"{slug}-{digest}"


def matches(directory: Path, env: dict[str, Any]) -> bool:
    """Whether ``directory`` holds artefacts built for exactly ``env`` (its ``environment.json`` says so)."""
    try:
        return bool(json.loads((directory / ENVIRONMENT_FILE).read_text()) == env)
    except (OSError, ValueError):
        return False


def directory(env: dict[str, Any] | None = None, base: Path | None = None, create: bool = True) -> Path | None:
    """This environment's artefact directory (created with its ``environment.json`` when ``create``), or None:
    caching off, no GPU, a directory that exists but was built for another environment (never used), or one that
    cannot be created."""
    env = environment() if env is None else env
    base = root() if base is None else base
    if env is None or base is None:
        return None
    path = base / "compiled" / key(env)
    if (path / ENVIRONMENT_FILE).exists():
        return path if matches(path, env) else None
    if not create:
        return None
    with _lock:
        try:
            path.mkdir(parents=True, exist_ok=True)
            _write_atomic(path / ENVIRONMENT_FILE, json.dumps(env, indent=1, sort_keys=True) + "\n")
        except OSError:
            return None
    return path if matches(path, env) else None


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _point(variable: str, sub: str) -> Path | None:
    """Set ``variable`` to ``<this environment's directory>/<sub>`` unless the user set it; the path it names."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    path = directory()
    if path is None:
        return None
    target = path / sub
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only cache: the library keeps its own default
        return None
    os.environ[variable] = str(target)
    return target


def prepare_triton() -> Path | None:
    """Point Triton's cache (``TRITON_CACHE_DIR``, read by Triton at each compile) at this environment's directory
    before the switchboard's first Triton kernel compiles or loads, and reuse the stored key of this Triton build
    (:func:`reuse_triton_build_key`). The variable is process-wide: other Triton kernels of the process cache there
    too, keyed by Triton as always."""
    global _triton_key_done
    path = _point("TRITON_CACHE_DIR", "triton")
    if not _triton_key_done:  # once per process (each Triton kernel's launcher prepares)
        _triton_key_done = True
        try:
            reuse_triton_build_key()
        except (ImportError, AttributeError, OSError, ValueError, TypeError):  # a Triton laid out otherwise
            pass
    return path


_triton_key_done = False


#: the record that holds this Triton build's key and the fingerprint of the files it was hashed from
TRITON_KEY_RECORD = "triton-build-key"


def _triton_build_fingerprint(triton_root: Path) -> str:
    """A hash of the path, size and modification time of every file Triton hashes into its build key (its Python
    compiler, backends and language modules, its runtime cache module and its native library): any reinstall or
    edit changes it."""
    entries = []
    for sub in ("compiler", "backends", "language"):
        for folder, _dirs, names in os.walk(triton_root / sub):
            entries += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    entries += [str(p) for p in (triton_root / "_C").glob("libtriton.*")]
    entries.append(str(triton_root / "runtime" / "cache.py"))
    digest = hashlib.sha256()
    for entry in sorted(entries):
        st = os.stat(entry)
        digest.update(f"{os.path.relpath(entry, triton_root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def reuse_triton_build_key() -> bool:
    """Spare the process Triton's hash of its own build when this environment's directory holds it.

    Triton keys every cached kernel by a hash of its own installation, which it computes once per process at the
    first compile or cache lookup by reading its native library (about 500 MB for Triton 3.9: 0.3 s, the larger
    part of a warm first Triton call). The key is stored in this environment's directory with a fingerprint of the
    files it was hashed from (:func:`_triton_build_fingerprint`); a later process whose fingerprint matches gives
    Triton the stored key, as Triton's own compile worker pools hand theirs to their workers. Any other process
    computes the key (Triton would at its first compile anyway) and stores it. True when the stored key is used."""
    import triton.runtime.cache as triton_cache

    compute = triton_cache.triton_key
    if directory() is None or not callable(getattr(triton_cache, "get_cache_key", None)):
        return False  # nothing to keep it in (no GPU, caching off), or a Triton that keys its cache otherwise
    fingerprint = _triton_build_fingerprint(Path(triton_cache.__file__).resolve().parent.parent)
    stored = recorded(TRITON_KEY_RECORD)
    if stored is not None and stored.get("fingerprint") == fingerprint and isinstance(stored.get("key"), str):
        build_key: str = stored["key"]
        triton_cache.triton_key = lambda: build_key
        return True
    record(TRITON_KEY_RECORD, {"fingerprint": fingerprint, "key": compute()})
    return False


def prepare_flash_attn_cute() -> Path | None:
    """Give FlashAttention-4 a persistent cache of its compiled CuTe DSL kernels in this environment's directory
    (``FLASH_ATTENTION_CUTE_DSL_CACHE_DIR``, and ``..._ENABLED=1`` unless set), before ``flash_attn.cute`` is first
    imported (it reads both then). Releases without that cache ignore the variables."""
    path = _point("FLASH_ATTENTION_CUTE_DSL_CACHE_DIR", "flash_attn_cute")
    if path is not None:
        os.environ.setdefault("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED", "1")
    return path


def record(name: str, value: dict[str, Any]) -> None:
    """Remember ``value`` under ``name`` in this environment's directory (``<dir>/records/<name>.json``): what a
    backend learned about an artefact another library keeps (FlashInfer's built modules, by path)."""
    path = directory()
    if path is None:
        return
    target = path / "records" / f"{_safe(name)}.json"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, json.dumps(value, sort_keys=True))
    except OSError:
        return


def recorded(name: str) -> dict[str, Any] | None:
    """What :func:`record` stored under ``name`` in this environment's directory, or None."""
    path = directory(create=False)
    if path is None:
        return None
    try:
        value = json.loads((path / "records" / f"{_safe(name)}.json").read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:200]
