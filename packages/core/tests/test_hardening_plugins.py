"""Backend names and plugins: an unknown name is refused with the known ones; whatever a plugin does wrong stays
with that plugin (listed unavailable with the error); a name clash is reported; a kernel's wrong result is caught."""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, hookimpl
from kernel_switchboard.errors import InvalidArgumentError, KernelResultError, SwitchboardError, UnknownBackendError
from kernel_switchboard.reference.norm import rms_norm as ref_rms_norm

CPU = Capability(devices=frozenset({"cpu"}))


def _plugin(name: str, kernels: Any, source: str | None = None, **backend_kw: Any) -> Any:
    @hookimpl
    def ksb_backend() -> Backend:
        return Backend(name, "9.9", kernels, **backend_kw)

    return types.SimpleNamespace(__name__=source or f"test_{name}", ksb_backend=ksb_backend)


def _raising(exc: BaseException) -> Any:
    @hookimpl
    def ksb_backend() -> Backend:
        raise exc

    return types.SimpleNamespace(__name__=f"raises_{type(exc).__name__}", ksb_backend=ksb_backend)


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Hide installed backend packages (their entry points), as on a machine where they are not installed."""
    real = metadata.entry_points

    def _hide(*names: str) -> None:
        monkeypatch.setattr(metadata, "entry_points",
                            lambda group: [ep for ep in real(group=group) if ep.name not in names])
        ksb.registry.reload()

    yield _hide
    monkeypatch.undo()
    ksb.registry.reload()


def _xw() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(4, 64), torch.rand(64) + 0.5


# -- backend names ---------------------------------------------------------------------------------
def test_use_of_an_unknown_backend_name_raises_with_the_known_ones() -> None:
    with pytest.raises(UnknownBackendError, match=r"^ksb.use='tritn' is invalid.*known backends: .*reference.*triton"):
        with ksb.use("tritn"):
            pass
    with pytest.raises(UnknownBackendError, match="known backends"):
        with ksb.use("reference", "reference:nonexistent_kernel"):
            pass


def test_a_known_backend_that_is_not_installed_stays_a_preference(without: Any) -> None:
    without("cudnn", "triton")
    x, w = _xw()
    with ksb.use("cudnn"):  # implements nothing here: automatic selection continues
        assert ksb.explain("norm.rms_norm", x, w).kernel.id == "reference:rms_norm"


def test_explicit_unknown_backend_raises_listing_known_backends() -> None:
    x, w = _xw()
    with pytest.raises(UnknownBackendError, match=r"^backend='tritn' is invalid.*known backends: .*cudnn"):
        ksb.norm.rms_norm(x, w, backend="tritn")
    assert issubclass(UnknownBackendError, InvalidArgumentError)


@pytest.mark.parametrize("value", [123, 1.5, [1, 2], ("reference", None), ("",)])
def test_backend_of_a_wrong_type_raises_naming_backend(value: Any) -> None:
    x, w = _xw()
    with pytest.raises(InvalidArgumentError, match=r"^backend=.* is invalid: expected a backend name"):
        ksb.norm.rms_norm(x, w, backend=value)


def test_ksb_prefer_with_an_unknown_name_raises_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KSB_PREFER", "nonexistent")
    ksb.clear_cache()
    try:
        x, w = _xw()
        with pytest.raises(UnknownBackendError, match=r"^KSB_PREFER='nonexistent' is invalid.*known backends"):
            ksb.norm.rms_norm(x, w)
    finally:
        monkeypatch.delenv("KSB_PREFER")
        ksb.clear_cache()


def test_preferred_backends_that_cannot_run_all_give_their_reasons(register: Any, without: Any) -> None:
    """``use("cudnn", "triton")`` where neither can run: cuDNN's absence is reported too, with its install command."""
    without("cudnn", "triton")
    register(_plugin("triton", [Kernel("norm.rms_norm", "rms", "triton", Capability(devices=frozenset({"cuda"})),
                                       ref_rms_norm)], unavailable="python module 'triton' is not installed",
                     install="pip install triton", source="fake_triton"))
    x, w = _xw()
    with ksb.use("cudnn", "triton"), pytest.raises(ksb.KernelUnavailableError) as info:
        ksb.norm.rms_norm(x, w)
    text = str(info.value)
    assert "triton:rms: unavailable: python module 'triton' is not installed; install: pip install triton" in text
    assert 'cudnn: not installed; install: pip install "kernel-switchboard[cudnn]"' in text


# -- plugins ---------------------------------------------------------------------------------------
def _works_everywhere() -> None:
    """Every op family still dispatches, and the registry lists every backend."""
    x, w = _xw()
    torch.testing.assert_close(ksb.norm.rms_norm(x, w), ref_rms_norm(x, w, 1e-6, False))
    torch.testing.assert_close(ksb.norm.rms_norm(x, w, backend="reference"), ref_rms_norm(x, w, 1e-6, False))
    assert ksb.activation.silu_and_mul(torch.randn(3, 8)).shape == (3, 4)
    assert ksb.registry.all_backends()["reference"].available


@pytest.mark.parametrize(("kernels", "reason"), [
    ([Kernel("norm.rms_norm", "ok", "bad", CPU, ref_rms_norm), "not a kernel"], r"kernels\[1\] is a str"),
    ("rms_norm", "Backend.kernels is a str"),
    (None, "Backend.kernels is a NoneType"),
])
def test_a_plugin_with_a_malformed_kernel_list_is_unavailable_and_breaks_nothing(register: Any, kernels: Any,
                                                                                  reason: str) -> None:
    register(_plugin("bad", kernels))
    backend = ksb.registry.all_backends()["bad"]
    assert not backend.available and "plugin test_bad failed" in (backend.unavailable or "")
    assert __import__("re").search(reason, backend.unavailable or "")
    assert all(k.unavailable for k in backend.kernels)
    _works_everywhere()


def test_a_kernel_whose_capability_is_none_is_unavailable_with_the_reason(register: Any) -> None:
    good = Kernel("norm.rms_norm", "good", "capnone", CPU, ref_rms_norm, priority=10**6)
    register(_plugin("capnone", [Kernel("norm.rms_norm", "bad", "capnone", None, ref_rms_norm),  # type: ignore[arg-type]
                                 good]))
    kernels = {k.id: k for k in ksb.registry.all_backends()["capnone"].kernels}
    assert "capability is a NoneType, expected a Capability" in (kernels["capnone:bad"].unavailable or "")
    assert kernels["capnone:good"].unavailable is None
    x, w = _xw()
    assert ksb.explain("norm.rms_norm", x, w).kernel.id == "capnone:good"
    _works_everywhere()


@pytest.mark.parametrize("exc", [ValueError("check exploded"), SystemExit(3), AttributeError("no attr")])
def test_a_capability_check_that_raises_rejects_only_its_kernel(register: Any, exc: BaseException) -> None:
    def check(problem: Any) -> list[str]:
        raise exc

    cap = Capability(devices=frozenset({"cpu"}), check=check)
    register(_plugin("chk", [Kernel("norm.rms_norm", "k", "chk", cap, ref_rms_norm, priority=10**6)]))
    x, w = _xw()
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "reference:rms_norm"
    assert "chk:k" in str(sel) and f"its capability check failed: {type(exc).__name__}" in str(sel)
    with pytest.raises(ksb.KernelUnavailableError, match="its capability check failed"):
        ksb.norm.rms_norm(x, w, backend="chk")
    _works_everywhere()


@pytest.mark.parametrize("exc", [RuntimeError("boom"), SystemExit(1), SystemExit("plugin quit")])
def test_any_exception_of_a_plugin_hook_is_contained(register: Any, exc: BaseException) -> None:
    register(_raising(exc))
    name = f"raises_{type(exc).__name__}"
    backend = ksb.registry.all_backends()[name]
    assert f"plugin {name} failed: {type(exc).__name__}" in (backend.unavailable or "")
    _works_everywhere()


def test_keyboard_interrupt_in_a_plugin_still_stops() -> None:
    plugin = _raising(KeyboardInterrupt())
    ksb.registry.register(plugin)
    try:
        with pytest.raises(KeyboardInterrupt):
            ksb.registry.all_backends()
    finally:
        ksb.registry.unregister(plugin)


def test_a_plugin_module_that_exits_at_import_is_listed_and_the_process_goes_on(tmp_path: Any) -> None:
    """An entry point whose module raises SystemExit at import: a subprocess with a real installed entry point."""
    pkg = tmp_path / "site"
    (pkg / "ksb_exits").mkdir(parents=True)
    (pkg / "ksb_exits" / "__init__.py").write_text("raise SystemExit('exiting plugin')\n")
    dist = pkg / "ksb_exits-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ksb-exits\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kernel_switchboard.backends]\nexits = ksb_exits\n")
    code = ("import json, torch, kernel_switchboard as ksb\n"
            "b = ksb.registry.all_backends()['exits']\n"
            "y = ksb.norm.rms_norm(torch.ones(2, 8), torch.ones(8))\n"
            "print(json.dumps([b.available, b.unavailable, float(y.sum())]))\n")
    env = {"PYTHONPATH": str(pkg), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    available, reason, total = json.loads(done.stdout.strip().splitlines()[-1])
    assert not available and "SystemExit: exiting plugin" in reason and "import of ksb_exits failed" in reason
    assert total == pytest.approx(16.0, rel=1e-3)


def test_an_installed_plugin_named_like_a_built_in_one_is_reported_with_both_distributions(tmp_path: Any) -> None:
    """A real entry point named ``reference`` from another distribution (a subprocess sees the fake install)."""
    site = tmp_path / "site"
    (site / "ksb_impostor").mkdir(parents=True)
    (site / "ksb_impostor" / "__init__.py").write_text(
        "from kernel_switchboard import Backend, hookimpl\n"
        "@hookimpl\n"
        "def ksb_backend():\n"
        "    return Backend('reference', '6.6')\n")
    dist = site / "ksb_impostor-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ksb-impostor\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[kernel_switchboard.backends]\nreference = ksb_impostor\n")
    code = ("import json, kernel_switchboard as ksb\n"
            "b = ksb.registry.all_backends()\n"
            "print(json.dumps([b['reference'].version, b['reference (reference)'].unavailable]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    version, reason = json.loads(done.stdout.strip().splitlines()[-1])
    assert version == ksb.__version__  # the built-in reference kept its name
    assert "the built-in backend from 'reference', kernel-switchboard" in reason
    assert "ksb-impostor (ksb_impostor), is ignored" in reason


def test_a_doctor_run_survives_every_broken_plugin(register: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from kernel_switchboard.cli import main

    register(_plugin("bad", [object()]))
    register(_plugin("capnone", [Kernel("norm.rms_norm", "k", "capnone", None, ref_rms_norm)]))  # type: ignore[arg-type]
    register(_raising(SystemExit(2)))
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["backends"]
    assert not report["bad"]["available"] and not report["raises_SystemExit"]["available"]
    assert report["capnone"]["kernels"][0]["available"] is False


def test_a_third_party_backend_named_like_a_built_in_one_is_reported(register: Any) -> None:
    fake = Kernel("norm.rms_norm", "rms_norm", "reference", CPU, lambda x, w, eps, g: x * 0, priority=10**6)
    register(_plugin("reference", [fake], source="impostor"))
    backends = ksb.registry.all_backends()
    assert backends["reference"].builtin and backends["reference"].source == "reference"
    loser = backends["reference (impostor)"]
    assert not loser.available
    assert "clash" in (loser.unavailable or "") and "'reference'" in (loser.unavailable or "")
    assert "'impostor'" in (loser.unavailable or "")
    x, w = _xw()
    torch.testing.assert_close(ksb.norm.rms_norm(x, w), ref_rms_norm(x, w, 1e-6, False))  # never the impostor's


def test_between_third_party_backends_of_one_name_the_winner_is_deterministic(register: Any) -> None:
    for source in ("zeta_plugin", "alpha_plugin"):
        register(_plugin("dup", [Kernel("norm.rms_norm", "k", "dup", CPU, ref_rms_norm)], source=source))
    backends = ksb.registry.all_backends()
    assert backends["dup"].source == "alpha_plugin"
    reason = backends["dup (zeta_plugin)"].unavailable or ""
    assert "from 'alpha_plugin', registered object alpha_plugin, has it" in reason and "zeta_plugin" in reason
    assert ksb.registry.kernels("norm.rms_norm").count(backends["dup"].kernels[0]) == 1


# -- results ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("run", "match"), [
    (lambda x, w, eps, g: ref_rms_norm(x, w, eps, g)[:-1], r"shape \(3, 64\), expected \(4, 64\)"),
    (lambda x, w, eps, g: ref_rms_norm(x, w, eps, g).double(), "dtype torch.float64, expected torch.float32"),
    (lambda x, w, eps, g: (ref_rms_norm(x, w, eps, g),), "returned a tuple of 1 as its result, expected a tensor"),
    (lambda x, w, eps, g: None, "returned a NoneType"),
])
def test_a_kernel_that_returns_the_wrong_result_is_caught(register: Any, run: Any, match: str) -> None:
    register(_plugin("wrong", [Kernel("norm.rms_norm", "k", "wrong", CPU, run)]))
    x, w = _xw()
    with pytest.raises(KernelResultError, match=rf"kernel wrong:k \(norm.rms_norm\) .*{match}"):
        ksb.norm.rms_norm(x, w, backend="wrong")
    assert issubclass(KernelResultError, SwitchboardError)


def test_a_third_party_kernel_that_exits_raises_instead(register: Any) -> None:
    def run(*args: Any) -> Any:
        raise SystemExit(0)

    register(_plugin("quits", [Kernel("norm.rms_norm", "k", "quits", CPU, run)]))
    x, w = _xw()
    with pytest.raises(KernelResultError, match=r"kernel quits:k \(norm.rms_norm\) raised SystemExit\(0\)"):
        ksb.norm.rms_norm(x, w, backend="quits")


def test_a_needs_build_check_that_raises_rejects_only_its_kernel(register: Any) -> None:
    def needs_build(problem: Any) -> bool:
        raise RuntimeError("no compiler")

    register(_plugin("nb", [Kernel("norm.rms_norm", "k", "nb", CPU, ref_rms_norm, needs_build=needs_build,
                                   priority=10**6)]))
    x, w = _xw()
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "reference:rms_norm" and "its needs_build check failed: RuntimeError" in str(sel)


def test_a_multi_output_kernel_is_checked_output_by_output(register: Any) -> None:
    from kernel_switchboard.reference.rope import apply as ref_apply

    def run(q: torch.Tensor, k: torch.Tensor, *rest: Any) -> Any:
        q2, k2 = ref_apply(q, k, *rest)
        return q2, k2.half()

    register(_plugin("wrope", [Kernel("rope.apply", "k", "wrope", CPU, run)]))
    q, k = torch.randn(5, 4, 16), torch.randn(5, 2, 16)
    with pytest.raises(KernelResultError, match=r"output 1 with dtype torch.float16, expected torch.float32"):
        ksb.rope.apply(q, k, torch.arange(5), backend="wrope")


def test_a_correct_third_party_kernel_passes_the_result_check(register: Any) -> None:
    register(_plugin("right", [Kernel("norm.rms_norm", "k", "right", CPU, ref_rms_norm)]))
    x, w = _xw()
    torch.testing.assert_close(ksb.norm.rms_norm(x, w, backend="right"), ref_rms_norm(x, w, 1e-6, False))


def test_str_of_a_selection_under_autotune(register: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard.ops.norm import NormProblem

    monkeypatch.setenv("KSB_TUNE_CACHE", "off-by-select.json")
    cap = Capability(devices=frozenset({"cuda"}))
    register(_plugin("at", [Kernel("norm.rms_norm", n, "at", cap, ref_rms_norm, cost=lambda p, c=c: c,
                                   reads_stale_slots=n == "b") for n, c in (("a", 1e-6), ("b", 2e-6))]))
    problem = NormProblem("cuda", (9, 0), torch.bfloat16, 64, 4, False, frozenset())
    with ksb.autotune():
        sel = ksb.select("norm.rms_norm", problem)
    assert sel.kernel.id.startswith("autotune(")
    text = str(sel)
    assert "autotuning on first call among at:a, at:b" in text and "must hold finite values" in text
