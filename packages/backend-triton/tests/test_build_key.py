"""Triton's key of its own build is hashed once per environment, not once per process: the switchboard stores it
beside its compiled kernels and hands it back to Triton while the installation is unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import triton.runtime.cache as triton_cache

from kernel_switchboard import artefacts

ENV = {"format": artefacts.FORMAT, "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "580.1",
       "cuda": "13.0", "python": "3.12", "machine": "x86_64", "torch": "2.11.0+cu130", "packages": {"triton": "3.9.0"}}


@pytest.fixture
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An artefact root in tmp_path for a GPU environment, Triton's own cache in tmp_path, and Triton's key function
    restored after the test."""
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path / "ksb"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: ENV)
    monkeypatch.setattr(triton_cache, "triton_key", triton_cache.triton_key)
    monkeypatch.setattr(artefacts, "_triton_key_done", False)
    return tmp_path


def _hashing_forbidden() -> str:
    raise AssertionError("Triton's build was hashed again")


def test_the_build_key_is_stored_then_reused(environment: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    true_key = triton_cache.triton_key()
    artefacts.prepare_triton()  # a first process: computes the key and stores it
    stored = artefacts.recorded(artefacts.TRITON_KEY_RECORD)
    assert stored is not None and stored["key"] == true_key

    monkeypatch.setattr(triton_cache, "triton_key", _hashing_forbidden)  # a later process, same installation
    assert artefacts.reuse_triton_build_key()
    assert triton_cache.triton_key() == true_key


def test_a_changed_installation_hashes_again(environment: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored key whose fingerprint differs (Triton reinstalled or edited) is not used, and is replaced."""
    true_key = triton_cache.triton_key()
    artefacts.record(artefacts.TRITON_KEY_RECORD, {"fingerprint": "another installation", "key": "stale"})
    assert not artefacts.reuse_triton_build_key()
    assert triton_cache.triton_key() == true_key
    stored = artefacts.recorded(artefacts.TRITON_KEY_RECORD)
    assert stored is not None and stored["key"] == true_key and stored["fingerprint"] != "another installation"


def test_the_fingerprint_follows_every_hashed_file(tmp_path: Path) -> None:
    """Size or modification time of any Python module under compiler/, backends/ or language/, the runtime cache
    module or the native library changes the fingerprint."""
    root = tmp_path / "triton"
    for rel in ("compiler/compiler.py", "backends/nvidia/compiler.py", "language/core.py", "runtime/cache.py",
                "_C/libtriton.so"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    before = artefacts._triton_build_fingerprint(root)
    assert artefacts._triton_build_fingerprint(root) == before
    for rel in ("backends/nvidia/compiler.py", "_C/libtriton.so", "runtime/cache.py"):
        (root / rel).write_text("xy")
        after = artefacts._triton_build_fingerprint(root)
        assert after != before
        before = after
    (root / "backends" / "nvidia" / "README.txt").write_text("not hashed by Triton")
    assert artefacts._triton_build_fingerprint(root) == before


def test_no_gpu_leaves_triton_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: None)
    monkeypatch.setattr(triton_cache, "triton_key", _hashing_forbidden)
    assert not artefacts.reuse_triton_build_key()
    assert not (tmp_path / "compiled").exists()
