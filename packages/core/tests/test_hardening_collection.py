"""Collecting the conformance tests keeps no tensor: the cases are built when their tests run, one op's list at a
time (on a GPU, every module's model-sized cases used to sit in GPU memory from import to exit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kernel_switchboard.testing import Case
from kernel_switchboard.testing import conformance as conf


def _params(test: object) -> list[object]:
    (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]  # type: ignore[attr-defined]
    return list(mark.args[1])


def test_collected_conformance_params_hold_no_tensor() -> None:
    conf._built.clear()
    test = conf.conformance_test("reference", device="cpu", size="small", ops=("norm.rms_norm", "rope.apply"))
    params = _params(test)
    lazy = [p.values[1] for p in params]  # type: ignore[attr-defined]
    assert lazy and all(isinstance(c, conf.LazyCase) for c in lazy)
    assert not conf._built  # nothing built survives collection
    for c in lazy:
        assert not any(isinstance(v, torch.Tensor) for v in vars(c).values())


def test_lazy_cases_are_built_once_per_op_and_one_op_at_a_time() -> None:
    conf._built.clear()
    test = conf.conformance_test("reference", device="cpu", size="small", ops=("norm.rms_norm", "rope.apply"))
    lazy = [p.values[1] for p in _params(test)]  # type: ignore[attr-defined]
    ops = [c.key[0] for c in lazy]
    assert ops == sorted(ops, key=ops.index)  # grouped by op: each list is built once while its tests run
    first, second = lazy[0], lazy[1]
    case = first.load()
    assert isinstance(case, Case) and case.id == first.id and case.op == first.key[0]
    assert second.load() is conf._built[first.key][second.index]  # the same list, not built again
    other = next(c for c in lazy if c.key != first.key)
    other.load()
    assert list(conf._built) == [other.key]  # the previous op's list (its tensors) is dropped


def test_a_conformance_case_runs_from_its_lazy_form() -> None:
    test = conf.conformance_test("reference", device="cpu", size="small", ops=("activation.silu_and_mul",))
    for p in _params(test)[:2]:
        test(*p.values)  # type: ignore[attr-defined, operator]


def test_processes_build_gpu_cases_one_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, collection builds each op's (large) cases to check which kernels declare them; pytest-xdist
    workers collecting at once did so together and ran an 80 GB card out of memory. The build holds a lock file
    every process of the machine shares (another open of it cannot take it meanwhile); on the CPU it takes none."""
    import fcntl
    import os
    import tempfile

    path = os.path.join(tempfile.gettempdir(), "kernel-switchboard-conformance-build.lock")

    def taken_elsewhere() -> bool:
        with open(path, "a") as other:
            try:
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(other, fcntl.LOCK_UN)
            return False

    seen = []
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)  # nothing shared: each call builds
    monkeypatch.setattr(conf, "_op_cases_plus", lambda *a: seen.append(taken_elsewhere()) or [])
    reference = conf.registry.kernels("norm.rms_norm")[:1]
    conf.lazy_kernel_cases(reference, torch.device("cuda"))
    conf.lazy_kernel_cases(reference, torch.device("cpu"))
    assert seen == [True, False]
    assert not taken_elsewhere()  # released after the build


def test_xdist_workers_share_which_cases_each_kernel_declares(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """Under pytest-xdist on a GPU, the first worker's build answers the others (same run id): they read which
    cases each kernel declares instead of building the op's cases again one after another under the lock (8 workers
    took over 8 minutes to collect the Triton backend's folder on an H100). Without a shared run, each builds."""
    import tempfile
    import uuid

    from kernel_switchboard.testing.cases import norm as norm_cases

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the shared answer's file (and the lock): kept here

    builds = []

    def cases(op: str, device: torch.device, size: str, extra: object) -> list[conf.Case]:
        builds.append(op)
        return norm_cases.cases(op, torch.device("cpu"), "small")

    monkeypatch.setattr(conf, "_op_cases_plus", cases)
    reference = conf.registry.kernels("norm.rms_norm")[:1]
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", uuid.uuid4().hex)
    first = conf.lazy_kernel_cases(reference, torch.device("cuda"))
    second = conf.lazy_kernel_cases(reference, torch.device("cuda"))
    assert builds == ["norm.rms_norm"] and first == second and first[reference[0].id]
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID")
    assert conf.lazy_kernel_cases(reference, torch.device("cuda")) == first
    assert builds == ["norm.rms_norm"] * 2
    assert len(list(tmp_path.glob("kernel-switchboard-eligible-*.json"))) == 1
