"""The persistent autotune cache: which kernel won for a problem bucket, in this environment.

The cache is one JSON file (``KSB_TUNE_CACHE`` or ``<user cache dir>/kernel-switchboard/tune.json``)
holding the environment fingerprint it was measured in and, per op and problem signature, the
winning kernel id with its measured times. A file from another environment, or one that cannot
be read, is ignored with one warning and rewritten at the next store; an entry of the wrong form (a
hand edit, another version's format) is dropped with one warning, never used.

A store is one read-merge-write under an exclusive lock on ``<cache>.lock``: the file is read again
under the lock, the new entry merged into what it holds, and the result written atomically (temporary
file + rename), so processes tuning at once never lose each other's entries. ``KSB_TUNE_CACHE=off``
turns the cache off; a path that names a directory turns it off with one warning; a file that cannot be
written (a read-only place) is still read, and winners found here are kept for this process with one
warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .device import fingerprint

FORMAT = 1
#: a challenger must beat the stored winner by this fraction to replace it (no flapping)
HYSTERESIS = 0.03

_lock = threading.Lock()
_state: dict[str, Any] = {"generation": 0, "entries": None, "path": None}
#: (path, problem) pairs already warned about, so each is said once per process
_warned: set[tuple[str, str]] = set()


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


def _warn_once(path: Path, what: str, message: str) -> None:
    if (str(path), what) not in _warned:
        _warned.add((str(path), what))
        warnings.warn(f"kernel-switchboard: {message}", stacklevel=4)


def unusable(path: Path | None = None) -> str | None:
    """Why the cache file cannot be used at all (the path names a directory), else None."""
    path = cache_path() if path is None else path
    return f"KSB_TUNE_CACHE={str(path)!r} is a directory; expected a file path" if path.is_dir() else None


def unwritable(path: Path | None = None) -> str | None:
    """Why winners cannot be stored in the cache file (a directory, a read-only place), else None (also when the
    cache is off: nothing is to be written). Creates the file's folder and its lock file, as a store would."""
    if path is None and os.environ.get("KSB_TUNE_CACHE") == "off":
        return None
    path = cache_path() if path is None else path
    reason = unusable(path)
    if reason is not None:
        return reason
    try:
        with _file_lock(path):
            pass
        if path.exists() and not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is read-only")
    except OSError as exc:
        return f"cannot write the autotune cache {path}: {exc}"
    return None


def _valid_entry(entry: Any) -> str | None:
    """What is wrong with one cache entry (``{"kernel": id, "times": {id: seconds}}``), else None."""
    if not isinstance(entry, dict):
        return f"a {type(entry).__name__}, expected an object"
    if not isinstance(entry.get("kernel"), str) or not entry["kernel"]:
        return f"kernel={entry.get('kernel')!r}, expected a kernel id"
    times = entry.get("times")
    if not isinstance(times, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0  # NaN fails
            for k, v in times.items()):
        return f"times={times!r}, expected kernel id -> seconds"
    return None


def _valid_entries(path: Path, data: Any, warn: bool) -> dict[str, Any]:
    """The well-formed entries of a parsed file; the others dropped (with one warning when ``warn``)."""
    raw = data.get("entries", {})
    if not isinstance(raw, dict):
        raw = {"": raw}
    entries: dict[str, Any] = {}
    bad: list[str] = []
    for op, per_op in raw.items():
        if not isinstance(per_op, dict):
            bad.append(f"{op}: a {type(per_op).__name__}, expected an object")
            continue
        for key, entry in per_op.items():
            problem = _valid_entry(entry)
            if problem is None:
                entries.setdefault(op, {})[key] = entry
            else:
                bad.append(f"{op} [{key}]: {problem}")
    if bad and warn:
        _warn_once(path, "entries", f"ignoring {len(bad)} malformed entr{'y' if len(bad) == 1 else 'ies'} of the "
                   f"autotune cache {path} (first: {bad[0]})")
    return entries


def _read(path: Path, warn: bool) -> dict[str, Any]:
    """The valid entries of the file at ``path`` (empty when absent, unreadable or from another environment)."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"a JSON {type(data).__name__}, expected an object")
    except (OSError, ValueError) as exc:
        if warn:
            _warn_once(path, "unreadable", f"ignoring unreadable autotune cache {path}: {exc}")
        return {}
    if data.get("format") != FORMAT or data.get("environment") != _env_id():
        if warn:
            _warn_once(path, "environment", f"ignoring autotune cache {path}: measured in another environment")
        return {}
    return _valid_entries(path, data, warn)


def _load() -> dict[str, Any]:
    """This process's view of the cache (read once per path)."""
    path = cache_path()
    if _state["entries"] is not None and _state["path"] == path:
        return _state["entries"]  # type: ignore[no-any-return]
    if _state["path"] is not None and _state["path"] != path:
        _state["generation"] += 1  # another file: selections made from the old one are stale
    reason = unusable(path)
    if reason is not None:
        _warn_once(path, "unusable", f"{reason}: the autotune cache is off")
        entries: dict[str, Any] = {}
    else:
        entries = _read(path, warn=True)
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

    The stored winner is replaced only when the new best beats it by :data:`HYSTERESIS`. The file is read,
    merged and written under its lock (see the module docstring); when it cannot be written the winner is kept
    for this process, with one warning.
    """
    if not times:
        raise ValueError("store() needs at least one measured kernel")
    problem_text = _valid_entry({"kernel": "-", "times": times})
    if problem_text is not None:
        raise ValueError(f"store(): {problem_text}")
    best = min(times, key=times.__getitem__)
    if os.environ.get("KSB_TUNE_CACHE") == "off":
        return best
    key = problem_key(problem)
    with _lock:
        data = _load()  # warns once about a file it ignores
        path = cache_path()
        if unusable(path) is not None:
            return best
        try:
            with _file_lock(path):
                data = _read(path, warn=False)  # again, under the lock: other processes' entries since
                winner = _merge(data, op, key, best, times)
                _write(path, data)
        except OSError as exc:
            _warn_once(path, "unwritable", f"cannot write the autotune cache {path} ({exc}): winners are kept "
                       "for this process only")
            winner = _merge(data, op, key, best, times)
        _state["entries"], _state["path"] = data, path
        _state["generation"] += 1
    return winner


def _merge(data: dict[str, Any], op: str, key: str, best: str, times: dict[str, float]) -> str:
    old = data.get(op, {}).get(key)
    winner = best
    if old and old["kernel"] in times and times[best] > times[old["kernel"]] * (1 - HYSTERESIS):
        winner = old["kernel"]
    data.setdefault(op, {})[key] = {"kernel": winner, "times": dict(times)}
    return winner


def clear() -> None:
    """Delete the cache file and forget its entries."""
    with _lock:
        path = cache_path()
        if path.is_file():
            path.unlink()
        _state["entries"], _state["path"] = {}, path
        _state["generation"] += 1


def _write(path: Path, entries: dict[str, Any]) -> None:
    """Replace the file atomically (the caller holds the file lock)."""
    payload = {"format": FORMAT, "environment": _env_id(), "entries": entries}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``<path>.lock`` (created with the folder when missing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(path.suffix + ".lock"), "a") as lock_file:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: the rename is still atomic
            yield
            return
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
