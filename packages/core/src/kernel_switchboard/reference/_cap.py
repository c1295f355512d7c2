"""The reference kernels' capability: every device, dtype and feature, last in the ranking."""

from __future__ import annotations

from typing import Any

from ..capability import FEATURES, Capability
from ..invariance import FEATURE as INVARIANT

#: runs anything anywhere, except inside CUDA-graph capture (it may sync with the host) and inside the batch-invariant
#: scope (``ksb.batch_invariant()``: kernels that keep a request's bits whatever its batch use the capabilities below)
REFERENCE = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES - {"cuda_graph", INVARIANT})
#: for reference kernels whose run does no host sync or data-dependent Python
REFERENCE_CAPTURABLE = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES - {INVARIANT})
#: :data:`REFERENCE` for kernels that are batch invariant (as they are, or row by row in the scope: ``_rows.rowwise``)
INVARIANT_REFERENCE = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES - {"cuda_graph"})
#: :data:`REFERENCE_CAPTURABLE` for batch-invariant kernels
INVARIANT_CAPTURABLE = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES)


def _not_captured_when_invariant(problem: Any) -> list[str]:
    features: frozenset[str] = getattr(problem, "features", frozenset())
    if INVARIANT in features and "cuda_graph" in features:
        return ["in the batch-invariant scope the reference reads each request's lengths on the host to attend it "
                "alone, which a CUDA graph capture cannot do"]
    return []


#: capturable, and batch invariant by attending each request alone (lengths read on the host: not both at once)
PER_REQUEST = Capability(devices=frozenset({"cpu", "cuda"}), features=FEATURES, check=_not_captured_when_invariant)
#: rank after every other kernel: the reference is the oracle, not the fast path
PRIORITY = -100
