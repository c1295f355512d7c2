"""The autotune cache survives concurrent writers, malformed entries and unusable locations."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import tuning

_WRITER = textwrap.dedent("""
    import sys
    from kernel_switchboard import tuning
    name, count = sys.argv[1], int(sys.argv[2])
    for i in range(count):
        tuning.store("op.x", f"{name}-{i}", {"k:a": 1e-3, "k:b": 2e-3})
""")


def test_processes_storing_at_once_lose_no_entry(cache_file: Path) -> None:
    """Each store reads the file again under its lock and merges into it (before: up to 1 in 8 lost)."""
    writers, count = 4, 25
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, f"w{n}", str(count)]) for n in range(writers)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    entries = json.loads(cache_file.read_text())["entries"]["op.x"]
    assert len(entries) == writers * count
    assert all(e["kernel"] == "k:a" for e in entries.values())


def test_a_store_keeps_the_entries_another_process_wrote_since_this_one_read(cache_file: Path) -> None:
    tuning.store("op.x", "mine-1", {"k:a": 1.0})  # this process has read (and written) the file
    subprocess.run([sys.executable, "-c", _WRITER, "other", "3"], check=True, timeout=300)
    tuning.store("op.x", "mine-2", {"k:a": 1.0})
    keys = set(json.loads(cache_file.read_text())["entries"]["op.x"])
    assert keys == {"'mine-1'", "'mine-2'", "'other-0'", "'other-1'", "'other-2'"}


def _write_cache(path: Path, entries: object) -> None:
    path.write_text(json.dumps({"format": tuning.FORMAT, "environment": tuning._env_id(), "entries": entries}))


@pytest.mark.parametrize("bad", [
    {"kernel": 3, "times": {}},
    {"kernel": "tt:b", "times": [1, 2]},
    {"kernel": "tt:b", "times": {"tt:b": "fast"}},
    {"kernel": "tt:b", "times": {"tt:b": None}},
    ["tt:b"],
    "tt:b",
    None,
])
def test_a_mistyped_entry_is_ignored_with_a_warning_and_never_breaks_a_call(cache_file: Path, bad: object) -> None:
    x, w = torch.randn(4, 64), torch.rand(64)
    key = tuning.problem_key(ksb.explain("norm.rms_norm", x, w).problem)
    good = {"kernel": "reference:layer_norm", "times": {"reference:layer_norm": 1e-3}}
    _write_cache(cache_file, {"norm.rms_norm": {key: bad}, "norm.layer_norm": {"k": good}})
    tuning._state["entries"] = None
    tuning._warned.clear()
    with pytest.warns(UserWarning, match=r"ignoring 1 malformed entry of the autotune cache .*norm.rms_norm"):
        torch.testing.assert_close(ksb.norm.rms_norm(x, w), ksb.norm.rms_norm(x, w, backend="reference"))
    assert tuning.lookup("norm.layer_norm", "k") is None  # key "k" is another problem's text; the entry is kept
    assert tuning.entries() == {"norm.layer_norm": {"k": good}}
    tuning.store("norm.rms_norm", "p", {"reference:rms_norm": 1e-3})  # rewritten without the bad entry
    assert "norm.layer_norm" in json.loads(cache_file.read_text())["entries"]


@pytest.mark.parametrize("text", ["[1, 2]", '"tune"', '{"format": 1, "environment": null, "entries": 3}'])
def test_a_cache_file_of_another_shape_is_ignored(cache_file: Path, text: str) -> None:
    cache_file.write_text(text)
    tuning._warned.clear()
    with pytest.warns(UserWarning, match="ignoring"):
        assert tuning.lookup("op.x", "p") is None


def test_a_cache_path_naming_a_directory_turns_the_cache_off_with_one_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_TUNE_CACHE", str(tmp_path))
    tuning._state["entries"] = None
    tuning._warned.clear()
    try:
        with pytest.warns(UserWarning, match=r"is a directory; expected a file path: the autotune cache is off"):
            assert tuning.lookup("op.x", "p") is None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert tuning.store("op.x", "p", {"k:a": 2.0, "k:b": 1.0}) == "k:b"
        assert list(tmp_path.iterdir()) == []
        assert tuning.unwritable() is not None
    finally:
        tuning._state["entries"] = None


def test_a_read_only_cache_location_keeps_winners_in_memory_with_one_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_TUNE_CACHE", "/proc/ksb-not-writable/tune.json")  # /proc: read-only even for root
    tuning._state["entries"] = None
    tuning._warned.clear()
    try:
        assert tuning.lookup("op.x", "p") is None
        with pytest.warns(UserWarning, match=r"cannot write the autotune cache .*kept for this process only"):
            assert tuning.store("op.x", "p", {"k:a": 2.0, "k:b": 1.0}) == "k:b"
        assert tuning.lookup("op.x", "p") == "k:b"
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            tuning.store("op.x", "q", {"k:a": 1.0})  # warned once
        assert "cannot write the autotune cache" in (tuning.unwritable() or "")
    finally:
        tuning._state["entries"] = None


def test_a_failed_write_leaves_no_temporary_file(cache_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(src: str, dst: str) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr("os.replace", fail)
    tuning._warned.clear()
    with pytest.warns(UserWarning, match="cannot write"):
        tuning.store("op.x", "p", {"k:a": 1.0})
    assert sorted(p.name for p in cache_file.parent.iterdir()) == ["tune.json.lock"]
