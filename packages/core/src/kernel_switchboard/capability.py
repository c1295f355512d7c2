"""Declarative kernel capabilities and the generic matcher that explains every mismatch.

A problem is a hashable record (a ``NamedTuple``) describing one call: its device, compute
capability, dtypes, sizes (bucketed) and the set of features it uses. A :class:`Capability`
states what a kernel accepts. :meth:`Capability.reasons` returns an empty list when the kernel
can run the problem, else one sentence per mismatch with the actual and the allowed values.
A field the problem does not have (or that is ``None``) is not applicable and never rejects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

#: Capability set-fields and the problem attribute each one constrains.
SET_FIELDS: dict[str, str] = {
    "devices": "device",
    "dtypes": "dtype",
    "kv_dtypes": "kv_dtype",
    "out_dtypes": "out_dtype",
    "head_dims": "head_dim",
    "head_dims_v": "head_dim_v",
    "page_sizes": "page_size",
    "layouts": "layout",
}

#: Every feature name a problem may use. Kernels declare the subset they support.
FEATURES = frozenset(
    {
        "causal",  # causal mask (attention)
        "sliding_window",  # window_left >= 0 (attention)
        "soft_cap",  # logits soft-cap (attention)
        "return_lse",  # log-sum-exp output (attention)
        "fp8_kv",  # fp8 KV cache with scales (attention)
        "kv_scale_tensor",  # the fp8 cache's scales are device tensors, () or per KV head (attention)
        "fp8_q",  # queries in float8_e4m3fn with a q_scale, QK on fp8 tensor cores (attention.prefill)
        "custom_variant",  # user attention variant (attention)
        "attn_bias",  # an additive bias or a boolean mask (attention.dense)
        "paged",  # paged KV cache (attention)
        "ragged",  # contiguous variable-length KV (attention)
        "mixed_batch",  # prefill and decode requests in one batch
        "qk_v_dims_differ",  # head_dim != head_dim_v
        "cuda_graph",  # the call is being captured in a CUDA graph
        "deterministic",  # bitwise reproducible results requested
        "batch_invariant",  # a request's results must not depend on its batch (ksb.batch_invariant())
        "generator",  # a torch.Generator was passed (sampling)
        "per_row_params",  # per-request sampling parameters given as tensors
        "in_place",  # the op writes into its inputs
    }
)


def _fmt(values: Iterable[Any]) -> str:
    items = sorted(values, key=str)
    return "{" + ", ".join(str(v).replace("torch.", "") for v in items) + "}"


@dataclass(frozen=True, eq=False)
class Capability:
    """What one kernel accepts. ``None`` for a set means "any value"."""

    devices: frozenset[str] | None = frozenset({"cuda"})
    min_cc: tuple[int, int] | None = None
    max_cc: tuple[int, int] | None = None
    dtypes: frozenset[torch.dtype] | None = None
    kv_dtypes: frozenset[torch.dtype] | None = None
    out_dtypes: frozenset[torch.dtype] | None = None
    head_dims: frozenset[int] | None = None
    head_dims_v: frozenset[int] | None = None
    page_sizes: frozenset[int] | None = None
    layouts: frozenset[str] | None = None
    #: features the kernel supports; a problem using any other feature is rejected
    features: frozenset[str] = frozenset()
    #: upper bounds on problem fields, e.g. ``{"group_size": 16}``
    limits: Mapping[str, int] = field(default_factory=dict)
    #: allowed values for any other problem field, e.g. ``{"top_k_mode": {"softmax"}}``
    allowed: Mapping[str, frozenset[Any]] = field(default_factory=dict)
    #: a kernel's own check for what the fields cannot express; returns reasons
    check: Callable[[Any], list[str]] | None = None

    def __post_init__(self) -> None:
        unknown = set(self.features) - FEATURES
        if unknown:
            raise ValueError(f"Capability.features has unknown names {_fmt(unknown)}; known: {_fmt(FEATURES)}")

    def reasons(self, problem: Any) -> list[str]:
        """Every reason this capability rejects ``problem``; empty when it is eligible."""
        out: list[str] = []
        for cap_field, attr in SET_FIELDS.items():
            allowed = getattr(self, cap_field)
            value = getattr(problem, attr, None)
            if allowed is not None and value is not None and value not in allowed:
                out.append(f"{attr}={_fmt([value])[1:-1]} not supported (supported: {_fmt(allowed)})")
        cc = getattr(problem, "cc", None)
        if cc is not None:
            if self.min_cc is not None and cc < self.min_cc:
                out.append(f"compute capability {cc[0]}.{cc[1]} below minimum {self.min_cc[0]}.{self.min_cc[1]}")
            if self.max_cc is not None and cc > self.max_cc:
                out.append(f"compute capability {cc[0]}.{cc[1]} above maximum {self.max_cc[0]}.{self.max_cc[1]}")
        used: frozenset[str] = getattr(problem, "features", frozenset())
        missing = used - self.features
        if missing:
            out.append(f"features {_fmt(missing)} not supported (supported: {_fmt(self.features) if self.features else 'none'})")
        for name, limit in self.limits.items():
            value = getattr(problem, name, None)
            if value is not None and value > limit:
                out.append(f"{name}={value} above limit {limit}")
        for name, allowed_values in self.allowed.items():
            value = getattr(problem, name, None)
            if value is not None and value not in allowed_values:
                out.append(f"{name}={value} not supported (supported: {_fmt(allowed_values)})")
        if self.check is not None and not out:
            out.extend(self.check(problem))
        return out


def bucket(n: int) -> int:
    """Round a size up to a power of two (0 stays 0): the size part of a problem signature."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()
