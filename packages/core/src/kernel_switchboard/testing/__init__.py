"""Conformance testing: every kernel against the reference kernel, across its declared capability.

A backend's test suite needs two lines::

    # tests/test_conformance.py
    from kernel_switchboard.testing import conformance_test
    test_conformance = conformance_test("mybackend")

Cases come from :mod:`kernel_switchboard.testing.cases` (one module per op family). Each case is a
call of the op's *public* function; it runs once with ``backend=<kernel id>`` and once with
``backend="reference"`` on cloned inputs, and the outputs are compared with dtype-aware
tolerances. A kernel with no case inside its declared capability fails (its declaration is then
untested); an unavailable kernel (no GPU, no vendor library) is skipped with its reason.
"""

from __future__ import annotations

from typing import Any

from .case import Case, assert_close, clone_args, finite_stale, tolerance

__all__ = ["Case", "assert_close", "clone_args", "conformance_test", "declares", "finite_stale", "kernel_cases",
           "tolerance"]


def __getattr__(name: str) -> Any:
    """``conformance_test``, ``declares`` and ``kernel_cases`` on first use: they need pytest, which the case
    builders that ``switchboard explain`` / ``bench`` / ``tune`` use do not (a user's install has no pytest)."""
    if name in ("conformance_test", "declares", "kernel_cases"):
        from . import conformance

        return getattr(conformance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
