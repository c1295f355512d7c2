"""``switchboard bench --preset first-call`` on the CPU: fresh processes, the reference kernels, every column."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from kernel_switchboard import bench
from kernel_switchboard.bench import first_call as bench_first_call


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, object]]:
    out = tmp_path_factory.mktemp("first-call")
    code = bench.main(["--preset", "first-call", "--op", "norm.rms_norm", "--cache", "cold,warm,built",
                       "--device", "cpu", "--out", str(out)])
    assert code == 0
    return json.loads((out / "first-call.json").read_text())  # type: ignore[no-any-return]


def test_one_row_per_mode_with_every_part_timed(rows: list[dict[str, object]]) -> None:
    assert [r["mode"] for r in rows] == ["cold", "warm", "built"]
    for r in rows:
        assert "error" not in r, r
        assert r["op"] == "norm.rms_norm" and r["device"] == "cpu"
        assert r["chosen"] == "reference:rms_norm" and r["correct"] == "is the reference"
        parts = [float(r[k]) for k in ("import_s", "select_s", "first_call_s")]  # type: ignore[arg-type]
        assert all(p > 0 for p in parts)
        assert float(r["first_result_s"]) == pytest.approx(sum(parts), abs=2e-3)  # type: ignore[arg-type]
        assert 0 < float(r["import_torch_s"]) < float(r["import_s"])  # type: ignore[arg-type]
        assert float(r["wall_s"]) > float(r["first_result_s"])  # type: ignore[arg-type]
        assert r["vendors_at_import"] == [] and r["vendors_after_select"] == [] and r["vendors_after_call"] == []


def test_every_installed_backend_is_discovered_in_the_child(rows: list[dict[str, object]]) -> None:
    backends = rows[0]["backends"]
    assert isinstance(backends, dict) and backends["reference"] is True


def test_import_timer_times_a_vendor_package_and_keeps_its_loader(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text("import time\ntime.sleep(0.05)\nVALUE = 3\n")
    (tmp_path / "flashinfer" / "data.txt").write_text("kept")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    timer = bench_first_call._ImportTimer()
    sys.meta_path.insert(0, timer)
    try:
        import flashinfer  # type: ignore[import-not-found]
    finally:
        sys.meta_path.remove(timer)
        sys.modules.pop("flashinfer", None)
    assert isinstance(flashinfer, types.ModuleType) and flashinfer.VALUE == 3
    assert timer.seconds["flashinfer"] >= 0.04
    assert flashinfer.__spec__.loader.get_resource_reader("flashinfer") is not None  # delegated to the real loader


def test_unknown_mode_or_op_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_first_call.main(["--cache", "lukewarm", "--out", str(tmp_path)]) == 2
    assert bench_first_call.main(["--op", "norm.nope", "--out", str(tmp_path)]) == 2
    assert "modes: cold, warm, built, here" in capsys.readouterr().err


def test_the_preset_covers_every_op_family() -> None:
    from kernel_switchboard.registry import registry

    families = {op.partition(".")[0] for op in registry.ops()}
    assert families <= {p.op.partition(".")[0] for p in bench_first_call.POINTS}
    assert {p.op for p in bench.PRESETS["first-call"]()} == {p.op for p in bench_first_call.POINTS}


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["norm.rms_norm", "attention.decode"])
def test_gpu_warm_caches_load_without_compiling(op: str) -> None:
    """On a GPU: the cold run compiles into its caches, the warm run adds nothing to them, both results match the
    reference, and no vendor library other than the chosen kernel's is imported."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    point = next(p for p in bench_first_call.POINTS if p.op == op)
    cold, warm = bench_first_call.run([point], ("cold", "warm"), "cuda", (), 300.0, float("inf"))
    for row in (cold, warm):
        assert "error" not in row, row
        assert row["correct"] in (True, "is the reference"), row
        assert row["vendors_at_import"] == [] and row["vendors_after_select"] == [], row
    chosen_backend = str(cold["chosen"]).partition(":")[0]
    expected = {"triton": {"triton"}, "cudnn": {"cudnn"}, "fa": {"flash_attn"}, "trtllm": {"flashinfer"}}
    assert set(cold["vendors_after_call"]) <= expected.get(chosen_backend, set()), cold  # type: ignore[arg-type]
    if chosen_backend == "triton":
        assert int(cold["cache_files_added"]) > 0  # type: ignore[call-overload]
        assert warm["cache_files_added"] == 0, warm
