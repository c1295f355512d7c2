"""Core test configuration: small deterministic shapes on the CPU; fixtures for test plugins and the tune cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import tuning


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def register() -> Iterator[Any]:
    """``register(plugin)`` adds a backend plugin to the registry for this test (returned, for chaining); every
    plugin added is removed after it."""
    added: list[Any] = []

    def add(plugin: Any) -> Any:
        ksb.registry.register(plugin)
        added.append(plugin)
        return plugin

    yield add
    for plugin in added:
        ksb.registry.unregister(plugin)


@pytest.fixture
def cache_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh autotune cache file for this test (``KSB_TUNE_CACHE``), forgotten after it."""
    path = tmp_path / "tune.json"
    monkeypatch.setenv("KSB_TUNE_CACHE", str(path))
    tuning._state["entries"] = None
    yield path
    tuning._state["entries"] = None
    tuning._state["generation"] += 1
