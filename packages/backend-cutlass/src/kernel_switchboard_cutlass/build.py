"""Compile emitted kernels with nvcc into an on-disk cache and load them with ctypes.

Cache layout (``toolchain.cache_dir()``): ``<name>-<key>.so`` plus ``.cu`` (the source) and
``.json`` (what built it). ``key`` hashes the emitted source, the nvcc flags, the target
architecture, nvcc's build string and the CUTLASS version, so a new toolchain or template never
reuses a stale binary. Writes go to a temporary file renamed into place, so concurrent builders
(threads or processes) at worst compile twice and never leave half a library.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import json
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from . import toolchain
from .configs import GemmConfig
from .emit import emit

#: the only architecture these kernels are written for (wgmma + TMA, "a" = arch-specific features)
ARCH = "sm_90a"
#: -DNDEBUG matters: without it CUTLASS's device asserts become calls that serialise wgmma (ptxas C7510)
#: -Xptxas=-v: ptxas reports each kernel's registers and spills into the build log (``spill_bytes`` in the .json)
NVCC_FLAGS = ("-gencode=arch=compute_90a,code=sm_90a", "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-DNDEBUG",
              "-Xptxas=-v", "-shared", "-Xcompiler", "-fPIC")
#: ptxas says this when a kernel lost its wgmma pipelining; recorded in the .json, reported by tests
SERIALIZED_WGMMA = "wgmma.mma_async instructions are serialized"
BUILD_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Artifact:
    """Where one configuration's library lives (whether or not it is built yet)."""

    config: GemmConfig
    so: Path
    key: str

    @property
    def built(self) -> bool:
        return self.so.is_file()

    @property
    def meta(self) -> Path:
        return self.so.with_suffix(".json")


def cache_key(source: str) -> str:
    """Hash of everything that determines the binary."""
    nv, hd = toolchain.nvcc(), toolchain.headers()
    h = hashlib.sha256()
    for part in (source, " ".join(NVCC_FLAGS), ARCH, nv.release, hd.version):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


_artifacts: dict[GemmConfig, Artifact] = {}
_lock = threading.Lock()


def artifact(cfg: GemmConfig) -> Artifact:
    """The cache entry of ``cfg`` (needs nvcc and the CUTLASS headers; raises RuntimeError otherwise)."""
    art = _artifacts.get(cfg)
    if art is None:
        key = cache_key(emit(cfg))
        art = Artifact(cfg, toolchain.cache_dir() / f"{cfg.name}-{key}.so", key)
        _artifacts[cfg] = art
    return art


def is_built(cfg: GemmConfig) -> bool:
    """True when ``cfg`` is in the disk cache (or already loaded in this process)."""
    return cfg in _loaded or artifact(cfg).built


def nvcc_command(source: Path, out: Path) -> list[str]:
    nv, hd = toolchain.nvcc(), toolchain.headers()
    inc = [f"-I{d}" for d in hd.include_dirs]
    return [nv.path, *NVCC_FLAGS, *inc, str(source), "-o", str(out)]


def compile_config(cfg: GemmConfig) -> Artifact:
    """Build ``cfg`` into the cache unless it is there; returns its artifact. Raises RuntimeError on failure."""
    art = artifact(cfg)
    if art.built:
        return art
    source = emit(cfg)
    art.so.parent.mkdir(parents=True, exist_ok=True)
    cu = art.so.with_suffix(".cu")
    if not cu.is_file():
        _atomic_write(cu, source.encode())
    fd, tmp = tempfile.mkstemp(prefix=art.so.stem + ".", suffix=".so.tmp", dir=art.so.parent)
    os.close(fd)
    cmd = nvcc_command(cu, Path(tmp))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.unlink(tmp)
        raise RuntimeError(f"nvcc did not finish {cfg.name} within {BUILD_TIMEOUT_S} s") from None
    seconds = time.perf_counter() - t0
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"nvcc failed to build CUTLASS kernel {cfg.name} (exit {proc.returncode}):\n"
                           f"{' '.join(cmd)}\n{log[-4000:]}")
    meta = {"config": cfg.name, "key": art.key, "arch": ARCH, "nvcc": toolchain.nvcc().release,
            "cutlass": toolchain.headers().version, "flags": list(NVCC_FLAGS), "build_seconds": round(seconds, 1),
            "serialized_wgmma": SERIALIZED_WGMMA in log, "spill_bytes": spill_bytes(log), "log_tail": log[-2000:]}
    _atomic_write(art.meta, json.dumps(meta, indent=1).encode())
    os.replace(tmp, art.so)
    return art


def spill_bytes(log: str) -> int:
    """Bytes of register spills (stores + loads) over every kernel of a ``-Xptxas=-v`` build log."""
    return sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))


def compile_many(cfgs: Iterable[GemmConfig], jobs: int | None = None) -> list[Artifact]:
    """Build several configurations at once (``KSB_CUTLASS_JOBS`` or the CPU count nvcc processes).

    Each nvcc of a CUTLASS 3 kernel takes ~1-2 GB of memory and one core for 30-60 s.
    """
    todo = list(dict.fromkeys(cfgs))
    if jobs is None:
        jobs = int(os.environ.get("KSB_CUTLASS_JOBS", "0")) or (os.cpu_count() or 1)
    jobs = max(1, min(jobs, len(todo) or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(compile_config, todo))


def read_meta(cfg: GemmConfig) -> dict[str, object] | None:
    """The build record of ``cfg`` (None when not built)."""
    try:
        return json.loads(artifact(cfg).meta.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


# -- loading --------------------------------------------------------------------------------------------
_loaded: dict[GemmConfig, ctypes.CDLL] = {}

_P, _I, _L, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_size_t
_SIGNATURES: dict[str, list[type]] = {
    "ksb_gemm": [_P, _P, _P, _P, _I, _I, _I, _L, _L, _L, _I, _I, _I, _P, _P],
    "ksb_gemm_block": [_P, _P, _P, _P, _P, _I, _I, _I, _L, _L, _L, _I, _I, _I, _P, _P],
    "ksb_grouped": [_P, _P, _P, _P, _I, _I, _I, _L, _L, _L, _L, _I, _I, _P, _P],
}
#: ``ksb_workspace(m, n, k, groups, swizzle, sm_count)``
_WORKSPACE_SIGNATURE: list[type] = [_I, _I, _I, _I, _I, _I]


def load(cfg: GemmConfig) -> ctypes.CDLL:
    """The loaded library of ``cfg``, compiling it first when the cache lacks it."""
    lib = _loaded.get(cfg)
    if lib is not None:
        return lib
    with _lock:
        lib = _loaded.get(cfg)
        if lib is None:
            art = compile_config(cfg)
            lib = ctypes.CDLL(str(art.so))
            for fn, argtypes in _SIGNATURES.items():
                if hasattr(lib, fn):
                    getattr(lib, fn).argtypes = argtypes
                    getattr(lib, fn).restype = ctypes.c_int
            lib.ksb_workspace.argtypes = _WORKSPACE_SIGNATURE
            lib.ksb_workspace.restype = _S
            _loaded[cfg] = lib
    return lib


def forget() -> None:
    """Forget cache paths computed in this process (tests that change KSB_CUTLASS_CACHE)."""
    _artifacts.clear()


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
