"""Benchmarking beside the switchboard: ``switchboard bench`` (measured ranking of the kernels on workload presets,
with external baselines), ``switchboard tune`` (measured winners into the autotune cache) and the helpers that
``switchboard build`` and the backends' benchmark scripts share.

Nothing here is imported by ``import kernel_switchboard``: the mechanism does not depend on its measurement.
"""

from .cli import main, tune_main
from .measure import run_point
from .points import Point, Row, RunPoint
from .presets import PRESETS
from .timing import fastest_of_rounds, median_ms, time_ms

__all__ = ["PRESETS", "Point", "Row", "RunPoint", "fastest_of_rounds", "main", "median_ms", "run_point", "time_ms",
           "tune_main"]
