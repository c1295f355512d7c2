"""The persistent autotune cache: storage, hysteresis, foreign/corrupt files, ranking."""

from __future__ import annotations

import json
import types
import warnings

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard import Backend, Capability, Kernel, hookimpl, tuning


@pytest.fixture
def two_kernels():
    cap = Capability(devices=frozenset({"cpu"}))
    from kernel_switchboard.reference.norm import rms_norm as run

    @hookimpl
    def ksb_backend() -> Backend:
        return Backend("tt", "1", [Kernel("norm.rms_norm", "a", "tt", cap, run, cost=lambda p: 1e-6),
                                   Kernel("norm.rms_norm", "b", "tt", cap, run, cost=lambda p: 1e-3)])

    plugin = types.SimpleNamespace(__name__="tt", ksb_backend=ksb_backend)
    ksb.registry.register(plugin)
    yield
    ksb.registry.unregister(plugin)


def test_store_and_lookup_round_trip_with_environment(cache_file) -> None:
    problem = ("p", 1)
    assert tuning.lookup("op.x", problem) is None
    assert tuning.store("op.x", problem, {"k:a": 2e-3, "k:b": 1e-3}) == "k:b"
    data = json.loads(cache_file.read_text())
    assert data["environment"]["torch"] == torch.__version__
    tuning._state["entries"] = None  # force a re-read from disk
    assert tuning.lookup("op.x", problem) == "k:b"


def test_near_ties_do_not_flap(cache_file) -> None:
    tuning.store("op.x", "p", {"k:a": 1.00e-3, "k:b": 1.10e-3})
    assert tuning.store("op.x", "p", {"k:a": 1.01e-3, "k:b": 1.00e-3}) == "k:a"  # 1% better: keep the winner
    assert tuning.store("op.x", "p", {"k:a": 1.00e-3, "k:b": 0.90e-3}) == "k:b"  # 10% better: replace


def test_corrupt_cache_is_ignored_with_one_warning_and_rewritten(cache_file) -> None:
    cache_file.write_text("{not json")
    with pytest.warns(UserWarning, match="unreadable autotune cache"):
        assert tuning.lookup("op.x", "p") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert tuning.lookup("op.x", "p") is None  # warned once only
    tuning.store("op.x", "p", {"k:a": 1.0})
    assert json.loads(cache_file.read_text())["entries"]["op.x"]


def test_foreign_environment_is_ignored(cache_file) -> None:
    cache_file.write_text(json.dumps({"format": 1, "environment": {"gpu": "other"}, "entries": {"op.x": {}}}))
    with pytest.warns(UserWarning, match="another environment"):
        assert tuning.lookup("op.x", "p") is None


def test_tuned_winner_outranks_cost_and_explain_says_so(cache_file, two_kernels) -> None:
    x, w = torch.randn(4, 64), torch.randn(64)
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "tt:a"
    tuning.store("norm.rms_norm", sel.problem, {"tt:a": 2e-3, "tt:b": 1e-3})
    sel = ksb.explain("norm.rms_norm", x, w)
    assert sel.kernel.id == "tt:b" and sel.source == "tuned"
    assert "autotune cache" in str(sel)
    # an explicit choice is never overridden by the cache
    assert ksb.explain("norm.rms_norm", x, w, backend="tt:a").kernel.id == "tt:a"


def test_cache_off_writes_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KSB_TUNE_CACHE", "off")
    assert tuning.store("op.x", "p", {"k:a": 2.0, "k:b": 1.0}) == "k:b"
    assert list(tmp_path.iterdir()) == []
    assert tuning.lookup("op.x", "p") is None


def test_switchboard_tune_stores_the_winner_of_an_adhoc_point(cache_file, two_kernels, capsys) -> None:
    from kernel_switchboard.bench import tune_main

    argv = ["--op", "norm.rms_norm", "--param", "rows=4", "--param", "hidden=64", "--param", "dtype=float32",
            "--device", "cpu", "--reps-ms", "2"]
    assert tune_main(argv) == 0
    (entry,) = tuning.entries()["norm.rms_norm"].values()
    assert {"tt:a", "tt:b"} <= set(entry["times"]) and entry["kernel"] == min(entry["times"], key=entry["times"].get)
    assert "norm.rms_norm rows=4 hidden=64 dtype=float32 (eager)" in capsys.readouterr().out


class _FakeNvml:
    """Stands in for libnvidia-ml: init status, then the driver version written into the caller's buffer."""

    def __init__(self, init_status: int, version: bytes) -> None:
        self.init_status, self.version, self.shut = init_status, version, False

    def nvmlInit_v2(self) -> int:
        return self.init_status

    def nvmlSystemGetDriverVersion(self, buf, length) -> int:
        buf.value = self.version
        return 0

    def nvmlShutdown(self) -> int:
        self.shut = True
        return 0


@pytest.mark.parametrize(("init_status", "version", "want"),
                         [(0, b"580.159.04", "580.159.04"), (9, b"580.159.04", None), (0, b"", None)])
def test_driver_version_from_nvml(init_status: int, version: bytes, want: str | None,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard import device

    fake = _FakeNvml(init_status, version)
    monkeypatch.setattr(device.ctypes, "CDLL", lambda name: fake)
    device.driver_version.cache_clear()
    try:
        assert device.driver_version() == want
        assert fake.shut == (init_status == 0)  # NVML shut down again whenever it started
    finally:
        device.driver_version.cache_clear()


def test_driver_version_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernel_switchboard import device

    def missing(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(device.ctypes, "CDLL", missing)
    device.driver_version.cache_clear()
    try:
        assert device.driver_version() is None
    finally:
        device.driver_version.cache_clear()
