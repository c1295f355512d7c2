"""The reference kernels' capability: every device, dtype and feature, last in the ranking."""

from __future__ import annotations

from ..capability import FEATURES, Capability

#: runs anything anywhere, except inside CUDA-graph capture (it may sync with the host)
REFERENCE = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES - {"cuda_graph"})
#: for reference kernels whose run does no host sync or data-dependent Python
REFERENCE_CAPTURABLE = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES)
#: rank after every other kernel: the reference is the oracle, not the fast path
PRIORITY = -100
