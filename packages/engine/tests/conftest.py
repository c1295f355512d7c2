"""Engine test configuration: small deterministic shapes on the CPU."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> object:
    """One intra-op thread per test module: the tiny models' matrices only make threads contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
