"""pytest plugin: ``pytest_plugins = ["kernel_switchboard.testing.plugin"]`` in a conftest.

Registers the ``gpu`` marker and skips ``gpu``-marked tests cleanly when no CUDA device is here.
"""

from __future__ import annotations

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped cleanly without one")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
