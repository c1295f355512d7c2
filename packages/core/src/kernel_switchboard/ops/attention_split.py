"""A POD batch as two plans where that is estimated faster than one POD launch.

One launch over a batch's prefill and decode requests (:func:`~kernel_switchboard.ops.attention.pod`) saves a launch
and fills the GPU with both parts at once; but when the prefill part dominates, the fastest prefill kernel installed
followed by the fastest decode kernel can finish first (an H100 with FA4: 4096 prefill tokens beside 64 decodes at
L=4096 took 0.600 ms as two plans, 0.867 ms as Triton's one POD launch). :func:`plan_pod` and the eager
:func:`pod` ask both sides for their cost estimates and run the cheaper; a plan's ``selection`` says which, with
both estimates.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

from ..capability import Capability
from ..dispatch import Selection
from ..errors import KernelUnavailableError, NoEligibleKernelError
from ..registry import Kernel

#: selections whose choice is the user's or the autotuner's, or is fixed by the batch-invariant scope, stay one launch
_KEPT = frozenset({"explicit", "tuned", "only"})


def two_plans_if_faster(selection: Selection, plan_prefill: Callable[[], Any], plan_decode: Callable[[], Any]
                        ) -> tuple[Selection, Any] | None:
    """(the selection that says so, a runner over both plans) when the estimates of the plans ``plan_prefill()`` and
    ``plan_decode()`` make add up to less than the POD kernel's; None otherwise: an estimate is missing (a CPU), a
    part has no eligible kernel, or the POD kernel was chosen by name, by the autotuner or by the batch-invariant
    scope. The plans are made only when the POD kernel has an estimate to compare with (a GPU); making them reads the
    prefill part's qo_indptr back once more, at plan time (once per step, never per layer)."""
    one = _estimate(selection)
    if selection.source in _KEPT or selection.notes or not math.isfinite(one):
        return None
    try:
        prefill_plan, decode_plan = plan_prefill(), plan_decode()
    except (NoEligibleKernelError, KernelUnavailableError):
        return None
    two = _estimate(prefill_plan.selection) + _estimate(decode_plan.selection)
    if not two < one:  # also where a part has no estimate (inf, nan)
        return None
    parts = f"{prefill_plan.kernel.id} then {decode_plan.kernel.id}"
    kernel = Kernel("attention.pod", f"two-plans({parts})", "switchboard", Capability(devices=None), _never,
                    doc="the prefill plan's kernel, then the decode plan's")
    note = (f"two plans, {parts}: est. {two * 1e6:.1f} us, below one launch of {selection.kernel.id} "
            f"(est. {one * 1e6:.1f} us); backend= keeps one launch")
    return dataclasses.replace(selection, kernel=kernel, notes=[note]), _TwoPlans(prefill_plan, decode_plan)


def _estimate(selection: Selection) -> float:
    best = selection.candidates[0] if selection.candidates else None
    return best.cost if best is not None and best.cost is not None else math.inf


def _never(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a two-plan POD selection runs through its plan (plan_pod), not as a kernel")


class _TwoPlans:
    """The POD runner contract (``run(q_prefill, q_decode, cache, out_p, out_d, lse_p, lse_d)``) over a prefill
    plan and a decode plan; both read their tables on the device at every run (CUDA-graph capturable when both
    are)."""

    __slots__ = ("decode", "prefill")

    def __init__(self, prefill: Any, decode: Any) -> None:
        self.prefill, self.decode = prefill, decode

    def run(self, q_prefill: Any, q_decode: Any, cache: Any, out_prefill: Any, out_decode: Any, lse_prefill: Any,
            lse_decode: Any) -> tuple[Any, Any, Any, Any]:
        got_p = self.prefill.run(q_prefill, cache, out=out_prefill, lse=lse_prefill)
        got_d = self.decode.run(q_decode, cache, out=out_decode, lse=lse_decode)
        if self.prefill.params.return_lse:
            return got_p[0], got_d[0], got_p[1], got_d[1]
        return got_p, got_d, None, None
