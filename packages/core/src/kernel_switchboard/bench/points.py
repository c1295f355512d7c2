"""What a benchmark measures and what it reports: a :class:`Point` (an op and the parameters of its example
builder), a :class:`RunPoint` (a point that runs its own comparison) and a :class:`Row` (one timed call)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Point:
    """One workload point: an op and the params of its example builder."""

    op: str
    params: dict[str, Any]
    label: str


@dataclass
class RunPoint(Point):
    """A point that runs itself: ``runner(point, preset, device, reps_ms)`` gives its rows (a comparison of its
    own, as the ``beyond`` and ``flashinfer-compat`` presets make, instead of the generic one of
    :func:`~kernel_switchboard.bench.measure.run_point`).
    A runner that raises gives one row with the error; the preset goes on."""

    runner: Callable[[RunPoint, str, torch.device, float], list[Row]]

    def run(self, preset: str, device: torch.device, reps_ms: float) -> list[Row]:
        try:
            return self.runner(self, preset, device, reps_ms)
        except Exception as exc:  # noqa: BLE001 - one failing point does not stop the preset
            return [Row(preset, self.op, self.label, "-", None, error=f"{type(exc).__name__}: {exc}"[:300])]


@dataclass
class Row:
    """One timed call at a point: its median ms and rate, for the automatic choice its regret, or the error that
    stopped it; ``extra`` holds what a point reports beside (ratios, checks, first times before a retime)."""

    preset: str
    op: str
    label: str
    kernel: str
    ms: float | None
    metric: float | None = None
    unit: str = ""
    auto: bool = False
    regret: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
