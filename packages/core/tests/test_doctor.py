"""``switchboard doctor``: the real cause of an unusable backend, its fix, and the --strict / --require check."""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, availability, doctor, hookimpl
from kernel_switchboard.cli import main

CPU_ONLY = ("this torch build (2.13.0+cpu) has no CUDA support: it is a CPU-only build",
            'install a CUDA build of torch: pip install --force-reinstall "torch==2.13.0"')
VENDOR_MISSING = "python module 'cudnn' is not installed"
VENDOR_INSTALL = 'pip install "kernel-switchboard[cudnn]"'


def _kernel(backend: str, devices: frozenset[str]) -> Kernel:
    return Kernel("norm.rms_norm", "k", backend, Capability(devices=devices), lambda *a: None)


def _plugin(name: str, devices: frozenset[str] = frozenset({"cuda"}), raises: bool = False, **kw: Any) -> Any:
    @hookimpl
    def ksb_backend() -> Backend:
        if raises:
            raise RuntimeError("boom")
        return Backend(name, ksb.__version__, [_kernel(name, devices)], **kw)

    return types.SimpleNamespace(__name__=f"test_{name}", ksb_backend=ksb_backend)


@pytest.fixture
def cpu_only_torch(monkeypatch):
    monkeypatch.setattr(doctor, "cuda_problem", lambda: CPU_ONLY)


def _run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(["doctor", *argv])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def test_gpu_backend_on_a_cpu_only_torch_names_the_torch_build_not_the_vendor_install(register, cpu_only_torch,
                                                                                       capsys) -> None:
    register(_plugin("fakecudnn", unavailable=VENDOR_MISSING, install=VENDOR_INSTALL))
    rc, out = _run(capsys, "--require", "fakecudnn")
    assert rc == 1
    assert "has no CUDA support: it is a CPU-only build" in out
    assert "install a CUDA build of torch" in out
    assert VENDOR_INSTALL not in out


def test_cpu_capable_backend_keeps_its_own_reason_without_cuda(register, cpu_only_torch, capsys) -> None:
    register(_plugin("fakecpu", devices=frozenset({"cpu", "cuda"}), unavailable=VENDOR_MISSING, install=VENDOR_INSTALL))
    rc, out = _run(capsys, "--require", "fakecpu")
    assert rc == 1
    assert VENDOR_MISSING in out and VENDOR_INSTALL in out


def test_require_passes_for_usable_backends_and_fails_for_missing_ones(register, capsys) -> None:
    register(_plugin("fakeok", devices=frozenset({"cpu"})))
    rc, out = _run(capsys, "--require", "reference,fakeok")
    assert rc == 0 and "2 requested backend(s) usable" in out
    rc, out = _run(capsys, "--require", "nosuchbackend")
    assert rc == 1 and "no backend named 'nosuchbackend' is installed" in out
    # one of ours, not installed: the fix is its extra (a report without it, whatever this environment holds)
    assert doctor.failures({"backends": {}}, ["fa"]) == [
        ("fa", "no backend named 'fa' is installed", 'pip install "kernel-switchboard[fa]"')]


def test_a_plugin_that_raises_is_broken_with_a_reinstall_fix(register, capsys) -> None:
    register(_plugin("fakebroken", raises=True))
    rc, out = _run(capsys, "--json", "--require", "test_fakebroken")
    assert rc == 1
    rep = json.loads(out[:out.rindex("}") + 1])
    backend = rep["backends"]["test_fakebroken"]
    assert backend["state"] == "broken" and "RuntimeError: boom" in backend["cause"]
    assert rep["check"]["failed"][0]["backend"] == "test_fakebroken"


def test_a_backend_of_another_version_than_the_core_is_broken() -> None:
    backend = Backend("cudnn", "0.0.1", [_kernel("cudnn", frozenset({"cuda"}))], source="cudnn")
    d = doctor.diagnose(backend, "kernel-switchboard-cudnn", None)
    assert d["state"] == "broken"
    assert d["fix"] == f'pip install "kernel-switchboard-cudnn=={ksb.__version__}"'
    third_party = doctor.diagnose(Backend("mine", "0.0.1", source="mine"), "ksb-mine", None)
    assert third_party["state"] == "usable"


def test_strict_covers_every_installed_backend_package(monkeypatch, register) -> None:
    monkeypatch.setattr(doctor, "installed_backends", lambda: {"test_fakeinst": "kernel-switchboard-fake"})
    register(_plugin("fakeinst", devices=frozenset({"cpu"})))
    rep = doctor.report()
    assert doctor.requested(rep, True, []) == ["fakeinst"]
    assert "reference" not in doctor.requested(rep, True, [])


def test_json_report_carries_what_a_bug_report_needs(capsys) -> None:
    rc, out = _run(capsys, "--json")
    assert rc == 0
    rep = json.loads(out)
    assert rep["packages"]["torch"] == torch.__version__ and "kernel-switchboard" in rep["packages"]
    assert set(rep) >= {"environment", "platform", "packages", "variables", "cuda", "gpus", "backends", "check"}
    assert rep["cuda"]["usable"] == torch.cuda.is_available()


def test_cuda_problem_names_a_cpu_only_build(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    reason, fix = availability.cuda_problem()
    assert "has no CUDA support" in reason and "CPU-only" in reason
    assert "install a CUDA build of torch" in fix


def test_cuda_problem_names_a_driver_older_than_torchs_cuda(monkeypatch) -> None:
    import kernel_switchboard.device as device

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(device, "driver_version", lambda: "470.82.01")
    reason, fix = availability.cuda_problem()
    assert "driver 470.82.01 is older than CUDA 12.8" in reason and ">= 525.60" in reason
    assert "upgrade the driver" in fix


def test_cuda_problem_names_hidden_gpus_and_a_missing_driver(monkeypatch) -> None:
    import kernel_switchboard.device as device

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "hides every GPU" in availability.cuda_problem()[0]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(device, "driver_version", lambda: None)
    reason, fix = availability.cuda_problem()
    assert "no NVIDIA driver answers" in reason and ">= 580.65" in fix


def test_cuda_problem_names_a_gpu_the_torch_build_has_no_kernels_for(monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (12, 0))
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_86", "sm_90"])
    reason, fix = availability.cuda_problem()
    assert "no kernels for this GPU (sm_120)" in reason and "sm_90" in reason and "sm_120" in fix
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))  # sm_86 code runs on sm_89
    assert availability.cuda_problem() is None
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "compute_90"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (10, 0))  # PTX for 9.0 JIT-compiles for 10.0
    assert availability.cuda_problem() is None
