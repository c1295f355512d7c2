"""What the installed cuDNN can run, as a tested table keyed by the backend version and the GPU.

cuDNN tells a graph it cannot run only when the graph is built (0.4-2 s), so capabilities come
from this table, whose rows are the limits cudnn-frontend itself enforces (its SDPA validation
messages, e.g. "paged caches are not supported for cuDNN below 9.5.0") and the support matrix
of ``docs/operations/Attention.md``. Versions are cuDNN's integers: 9.10.2 -> 91002.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kernel_switchboard.device import package_version

#: paged K/V caches (PagedCacheLoad node)
MIN_PAGED = 90500
#: paged caches combined with ragged (packed) queries, and bottom-right diagonal alignment
MIN_PREFILL = 90700
#: sliding windows with bottom-right alignment on Hopper, decode with a diagonal band, paged d > 128
MIN_WINDOW = 91002
#: head dims above 128 (Hopper) through paged caches
MIN_LARGE_HEAD = 91002
#: ragged (THD) tensors on sm_80 / sm_12x (Hopper and Blackwell have them from 9.5)
MIN_THD_PRE_HOPPER = 91801
#: SDPA fp16/bf16 forward is refused by the frontend on these (known bugs)
BROKEN = frozenset({91000, 91001})

FRONTEND_MIN, FRONTEND_BELOW = "1.14", "2"
FRONTEND = "nvidia-cudnn-frontend"
INSTALL = 'pip install "kernel-switchboard[cudnn]"'


#: the pip wheels of the cuDNN library, newest CUDA first
LIBRARY_DISTRIBUTIONS = ("nvidia-cudnn-cu13", "nvidia-cudnn-cu12")


def version_text(v: int) -> str:
    """91002 -> '9.10.2'."""
    return f"{v // 10000}.{(v // 100) % 100}.{v % 100}"


def library_version() -> int | None:
    """The cuDNN library's version (9.10.2 -> 91002) without importing cudnn-frontend: the library torch loaded
    (the one the frontend then binds to, by its soname), else the version of its pip wheel; None when neither
    says. The frontend's own ``cudnn.backend_version()`` is compared with it when a graph is first built
    (:func:`.graphs.versions`)."""
    try:
        version = torch.backends.cudnn.version()
    except RuntimeError:  # torch found a cuDNN it cannot use
        version = None
    if version:
        return int(version)
    for dist in LIBRARY_DISTRIBUTIONS:
        text = package_version(dist)
        if text:
            parts = [int(p) for p in text.split(".")[:3] if p.isdigit()]
            if len(parts) == 3:
                return parts[0] * 10000 + parts[1] * 100 + parts[2]
    return None


@dataclass(frozen=True)
class Support:
    """What cuDNN ``version`` runs on a GPU of compute capability ``cc``."""

    version: int
    cc: tuple[int, int]

    def unavailable(self) -> str | None:
        """Why no attention kernel of this backend can run here, or None."""
        if self.version < MIN_PAGED:
            return f"cuDNN {version_text(self.version)} is below {version_text(MIN_PAGED)} (paged attention)"
        if self.version in BROKEN:
            return f"cuDNN {version_text(self.version)} SDPA forward has known bugs (refused by cudnn-frontend); use 9.10.2+"
        if self.cc < (8, 0):
            return f"GPU compute capability {self.cc[0]}.{self.cc[1]} is below 8.0 (cuDNN SDPA needs Ampere or newer)"
        return None

    def prefill_unavailable(self) -> str | None:
        """Why paged prefill (ragged queries over a paged cache) cannot run, or None."""
        if self.version < MIN_PREFILL:
            return f"cuDNN {version_text(self.version)} is below {version_text(MIN_PREFILL)} (paged caches with packed queries)"
        return None

    def ragged_unavailable(self) -> str | None:
        """Why ragged (THD) K/V cannot be used, or None."""
        if self.version < MIN_PREFILL:
            return f"cuDNN {version_text(self.version)} is below {version_text(MIN_PREFILL)} (bottom-right causal masks)"
        if self.cc[0] not in (9, 10, 11) and self.version < MIN_THD_PRE_HOPPER:
            return (f"cuDNN {version_text(self.version)} has ragged (THD) tensors only on Hopper/Blackwell before "
                    f"{version_text(MIN_THD_PRE_HOPPER)}")
        return None

    @property
    def sliding_window(self) -> bool:
        """Sliding windows (left diagonal bound, bottom-right aligned; cuDNN needs the causal band too)."""
        return self.version >= MIN_WINDOW

    def head_dims(self, decode: bool) -> frozenset[int]:
        """Head dims (multiples of 8) for Q/K and V when they are equal."""
        top = 128
        if self.version >= MIN_LARGE_HEAD and (self.cc[0] == 9 or (not decode and self.cc[0] in (10, 12))):
            top = 256
        return frozenset(range(8, top + 1, 8))

    @property
    def split_head_dims(self) -> frozenset[tuple[int, int]]:
        """(head_dim, head_dim_v) pairs with different dims (DeepSeek's 192/128 on Hopper and Blackwell)."""
        if self.cc[0] >= 9 and self.version >= MIN_LARGE_HEAD:
            return frozenset({(192, 128)})
        return frozenset()

    def declarations(self) -> tuple[Any, ...]:
        """Everything the kernels' capabilities are built from: two rows with equal declarations declare the
        same kernels."""
        return (self.unavailable(), self.prefill_unavailable(), self.ragged_unavailable(), self.sliding_window,
                self.head_dims(True), self.head_dims(False), self.split_head_dims, self.layouts)

    #: page layouts cuDNN's paged loader is declared for: HND (num_pages, kv_heads, page_size, dim).
    #: NHD pools are passed by strides in graphs.py; declare them here once a GPU run shows cuDNN
    #: accepts and computes them right (benchmarks/attention.py probes it).
    layouts: frozenset[str] = frozenset({"HND"})


#: the table used for the declarations when cuDNN or the GPU is missing (the newest tested row)
REFERENCE_SUPPORT = Support(91300, (9, 0))
