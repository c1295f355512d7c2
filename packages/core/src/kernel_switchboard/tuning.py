"""The persistent autotune cache: which kernel won for a problem bucket, in this environment.

The cache is one JSON file (``KSB_TUNE_CACHE`` or ``<user cache dir>/kernel-switchboard/tune.json``)
holding the environment fingerprint it was measured in and, per op and problem signature, the
winning kernel id with its measured times. A file from another environment, or one that cannot
be read, is ignored with one warning and rewritten at the next store. Writes are atomic
(temporary file + rename) under an advisory lock.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from .device import fingerprint

FORMAT = 1
#: a challenger must beat the stored winner by this fraction to replace it (no flapping)
HYSTERESIS = 0.03

_lock = threading.Lock()
_state: dict[str, Any] = {"generation": 0, "entries": None, "path": None}


def cache_path() -> Path:
    """Where the cache file lives (``KSB_TUNE_CACHE`` overrides)."""
    env = os.environ.get("KSB_TUNE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kernel-switchboard" / "tune.json"


def generation() -> int:
    """Bumped whenever the cache changes; part of the dispatch cache key."""
    return _state["generation"]  # type: ignore[no-any-return]


def problem_key(problem: Any) -> str:
    """A stable text form of a problem signature, used as the JSON key."""
    if hasattr(problem, "_asdict"):
        parts = []
        for k, v in problem._asdict().items():
            if isinstance(v, frozenset):
                v = ",".join(sorted(v))
            parts.append(f"{k}={str(v).replace('torch.', '')}")
        return ";".join(parts)
    return repr(problem)


def _env_id() -> dict[str, Any]:
    fp = fingerprint()
    return {k: fp.get(k) for k in ("torch", "cuda", "gpu", "compute_capability", "kernel-switchboard", "triton")}


def _load() -> dict[str, Any]:
    path = cache_path()
    if _state["entries"] is not None and _state["path"] == path:
        return _state["entries"]  # type: ignore[no-any-return]
    entries: dict[str, Any] = {}
    if _state["path"] is not None and _state["path"] != path:
        _state["generation"] += 1  # another file: selections made from the old one are stale
    if path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("format") != FORMAT or data.get("environment") != _env_id():
                warnings.warn(
                    f"kernel-switchboard: ignoring autotune cache {path}: measured in another environment",
                    stacklevel=3,
                )
            else:
                entries = dict(data.get("entries", {}))
        except (OSError, ValueError, AttributeError) as exc:
            warnings.warn(f"kernel-switchboard: ignoring unreadable autotune cache {path}: {exc}", stacklevel=3)
    _state["entries"], _state["path"] = entries, path
    return entries


def lookup(op: str, problem: Any) -> str | None:
    """The cached winner's kernel id for ``problem``, or ``None``."""
    if os.environ.get("KSB_TUNE_CACHE") == "off":
        return None
    with _lock:
        entry = _load().get(op, {}).get(problem_key(problem))
    return entry["kernel"] if entry else None


def entries() -> dict[str, Any]:
    """A copy of every cache entry, by op then problem key."""
    with _lock:
        return json.loads(json.dumps(_load()))


def store(op: str, problem: Any, times: dict[str, float]) -> str:
    """Record measured ``times`` (kernel id -> seconds) and return the winner kept.

    The stored winner is replaced only when the new best beats it by :data:`HYSTERESIS`.
    """
    if not times:
        raise ValueError("store() needs at least one measured kernel")
    best = min(times, key=times.__getitem__)
    if os.environ.get("KSB_TUNE_CACHE") == "off":
        return best
    with _lock:
        data = _load()
        key = problem_key(problem)
        old = data.get(op, {}).get(key)
        winner = best
        if old and old["kernel"] in times and times[best] > times[old["kernel"]] * (1 - HYSTERESIS):
            winner = old["kernel"]
        data.setdefault(op, {})[key] = {"kernel": winner, "times": times}
        _write(data)
        _state["generation"] += 1
    return winner


def clear() -> None:
    """Delete the cache file and forget its entries."""
    with _lock:
        path = cache_path()
        if path.exists():
            path.unlink()
        _state["entries"], _state["path"] = {}, path
        _state["generation"] += 1


def _write(entries: dict[str, Any]) -> None:
    path = cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "environment": _env_id(), "entries": entries}
    lock_path = path.with_suffix(path.suffix + ".lock")
    with open(lock_path, "w") as lock_file:
        _flock(lock_file)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


def _flock(f: Any) -> None:
    try:
        import fcntl

        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    except ImportError:  # pragma: no cover - Windows: rename is still atomic
        pass
