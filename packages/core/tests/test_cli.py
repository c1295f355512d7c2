"""The switchboard command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from kernel_switchboard.cli import main

BACKENDS = {"reference", "triton", "cudnn", "fa", "cutlass", "trtllm"}


def test_doctor_json_lists_every_backend_with_availability(capsys) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    names = set(report["backends"])
    assert names >= {"reference"}
    for name, b in report["backends"].items():
        assert isinstance(b["available"], bool)
        if not b["available"]:
            assert b["reason"], name
    assert "torch" in report["environment"]
    assert report["gpus"]["count"] == (torch.cuda.device_count() if torch.cuda.is_available() else 0)


def test_doctor_human(capsys) -> None:
    assert main(["doctor", "-v"]) == 0
    out = capsys.readouterr().out
    assert "reference" in out and "reference:rms_norm" in out


class _NoEngine:
    """A meta-path finder that hides the engine package, as if it were not installed."""

    def find_spec(self, name, path, target=None):
        if name == "kernel_switchboard_engine":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def test_demo_without_the_engine_package_names_its_install_command(monkeypatch, capsys) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "kernel_switchboard_engine"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_NoEngine(), *sys.meta_path])
    assert main(["demo"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "pip install kernel-switchboard-engine" in err and "pip install -e packages/engine" in err


def test_explain_prints_ranked_candidates(capsys) -> None:
    assert main(["explain", "norm.rms_norm", "rows=4", "hidden=64", "dtype=float32", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "chosen reference:rms_norm" in out and "problem device=cpu" in out


def test_explain_bad_backend_reports_error(capsys) -> None:
    assert main(["explain", "norm.rms_norm", "rows=4", "hidden=64", "--device", "cpu", "--backend", "nope"]) == 1
    assert "matches no registered kernel" in capsys.readouterr().err


def test_bench_dispatch_overhead_on_cpu(tmp_path, capsys) -> None:
    assert main(["bench", "--preset", "dispatch", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "bench.json").read_text())
    row = data["rows"][0]
    assert row["kernel"] == "dispatch overhead" and row["unit"] == "us/call"
    assert row["extra"]["public_us"] > 0 and row["extra"]["direct_us"] > 0


@pytest.mark.parametrize("presets", [["nope"], ["dispatch", "nope"], ["attention", "nope"]])
def test_bench_names_an_unknown_preset_before_running_anything(tmp_path, capsys, presets: list[str]) -> None:
    """On a CPU too (where model-sized presets are otherwise turned away with advice) and before ``dispatch`` runs."""
    args = ["bench", *(a for name in presets for a in ("--preset", name)), "--out", str(tmp_path)]
    assert main(args) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err and not (tmp_path / "bench.json").exists()


def test_bench_times_attention_through_plans_and_reports_regret_per_call_kind(tmp_path) -> None:
    args = ["bench", "--op", "attention.prefill_ragged", "--param", "batch=2", "--param", "q_len=8", "--param",
            "kv_len=8", "--param", "num_q_heads=4", "--param", "num_kv_heads=2", "--param", "head_dim=16", "--param",
            "dtype=fp32", "--device", "cpu", "--reps-ms", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    names = [r["kernel"] for r in rows]
    assert "reference:prefill_ragged" in names and "reference:prefill_ragged [plan]" in names
    auto = {r["kernel"]: r for r in rows if r["auto"]}
    assert set(auto) == {"auto -> reference:prefill_ragged", "auto -> reference:prefill_ragged [plan]"}
    assert all(r["regret"] is not None and r["regret"] > 0 for r in auto.values())


def test_bench_times_mla_decode_through_its_plan(tmp_path) -> None:
    args = ["bench", "--op", "attention.mla_decode", "--param", "batch=2", "--param", "kv_len=40", "--param",
            "num_heads=4", "--param", "page_size=16", "--param", "dtype=fp32", "--device", "cpu", "--reps-ms", "2",
            "--out", str(tmp_path)]
    assert main(args) == 0
    names = {r["kernel"] for r in json.loads((tmp_path / "bench.json").read_text())["rows"]}
    assert {"reference:mla_decode [plan]", "auto -> reference:mla_decode [plan]"} <= names


def test_bench_times_a_high_regret_again_back_to_back_with_the_best(monkeypatch) -> None:
    import torch

    from kernel_switchboard.bench import measure, timing
    from kernel_switchboard.bench.points import Row

    # first pass: the auto row 20% slower than the same kernel (clock drift); timed again in turn: 1.0 and 1.05 ms
    rows = [Row("p", "op", "pt", "k", 1.0), Row("p", "op", "pt", "k [graph]", 1.0),
            Row("p", "op", "pt", "auto -> k", 1.2, auto=True),
            Row("p", "op", "pt", "auto -> k [graph]", 1.01, auto=True)]
    again = {"k": 1.05, "auto -> k": 1.0}
    timed: list[str] = []
    monkeypatch.setattr(timing, "time_ms", lambda call, device, reps: again[call()])
    calls = {name: (lambda name=name: timed.append(name) or name) for name in ("k", "auto -> k", "k [graph]")}
    measure._regrets(rows, calls, torch.device("cpu"), 1.0, units=2e9)
    eager, graph = rows[2], rows[3]
    assert eager.ms == 1.0 and rows[0].ms == 1.05 and eager.regret == 1.0 / 1.05  # both take the retimed times
    assert eager.extra["retimed"] == {"auto_ms": 1.2, "best_ms": 1.0} and rows[0].extra["retimed"]
    assert timed == ["auto -> k", "k"] * 3  # alternately, three times each
    assert graph.regret == 1.01 and "retimed" not in graph.extra  # within 3%: left as measured
    assert eager.metric == 2e9 / 1e-3 / 1e12


def test_bench_retimes_the_next_best_row_when_the_first_was_luck(monkeypatch) -> None:
    import torch

    from kernel_switchboard.bench import measure, timing
    from kernel_switchboard.bench.points import Row

    # k1's first time was luck (1.0, then 1.08 in turn with auto); k2 then leads at 1.02 and is timed in turn too
    rows = [Row("p", "op", "pt", "k1", 1.0), Row("p", "op", "pt", "k2", 1.02),
            Row("p", "op", "pt", "auto -> k1", 1.1, auto=True)]
    times = {"k1": [1.08] * 3, "auto -> k1": [1.08] * 3 + [1.07] * 3, "k2": [1.06] * 3}
    monkeypatch.setattr(timing, "time_ms", lambda call, device, reps: times[call()].pop(0))
    calls = {name: (lambda name=name: name) for name in times}
    measure._regrets(rows, calls, torch.device("cpu"), 1.0, units=None)
    auto = rows[2]
    assert (rows[0].ms, rows[1].ms, auto.ms) == (1.08, 1.06, 1.07)
    assert auto.regret == 1.07 / 1.06 and all(not t for t in times.values())  # every planned timing ran


def test_fastest_of_rounds_times_the_calls_in_turn_and_drops_a_failing_one(monkeypatch, capsys) -> None:
    import torch

    from kernel_switchboard.bench import timing

    clock = iter([3.0, 2.0, 9.0, 1.0, 4.0, 5.0, 6.0])  # a, b, c; a, b (c fails); a, b
    order: list[str] = []

    def fake_time(call, device, reps):
        name = call()
        order.append(name)
        if name == "c" and order.count("c") > 1:
            raise RuntimeError("launch failed")
        return next(clock)

    monkeypatch.setattr(timing, "time_ms", fake_time)
    calls = {name: (lambda name=name: name) for name in ("a", "b", "c")}
    best = timing.fastest_of_rounds(calls, torch.device("cpu"), 1.0, rounds=3)
    assert order == ["a", "b", "c", "a", "b", "c", "a", "b"]  # in turn; c dropped after it raised
    assert best["a"] == 1.0 and best["b"] == 2.0 and "c" not in best
    assert "timing c failed: RuntimeError: launch failed" in capsys.readouterr().err


def test_flashinfer_baselines_get_the_points_masking(monkeypatch) -> None:
    import sys
    import types

    import torch

    from kernel_switchboard.bench import baselines
    from kernel_switchboard.testing.cases.attention import example

    calls: list[tuple[str, tuple, dict]] = []

    class Wrapper:
        def __init__(self, name: str, *args, **kw) -> None:
            self.name = name
            calls.append((f"{name}()", args, kw))

        def plan(self, *args, **kw) -> None:
            calls.append((f"{self.name}.plan", args, kw))

        def run(self, *args, **kw) -> str:
            return f"{self.name} ran with {len(args)} tensors"

    fake = types.ModuleType("flashinfer")
    fake.BatchPrefillWithRaggedKVCacheWrapper = lambda *a, **k: Wrapper("ragged", *a, **k)
    fake.BatchDecodeWithPagedKVCacheWrapper = lambda *a, **k: Wrapper("decode", *a, **k)
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    ragged = example("attention.prefill_ragged", "cpu", batch=2, kv_len=32, q_heads=4, kv_heads=2, head_dim=16,
                     window=8, soft_cap=30.0)
    got = baselines.flashinfer_externals(ragged.op, ragged.args, ragged.kwargs)
    assert got["flashinfer prefill"]() == "ragged ran with 3 tensors"
    plan = next(kw for name, _a, kw in calls if name == "ragged.plan")
    assert plan["causal"] is True and plan["window_left"] == 8 and plan["logits_soft_cap"] == 30.0
    assert plan["q_data_type"] == torch.bfloat16
    decode = example("attention.decode", "cpu", batch=2, kv_len=32, q_heads=4, kv_heads=2, head_dim=16)
    got = baselines.flashinfer_externals(decode.op, decode.args, decode.kwargs)
    assert set(got) == {"flashinfer decode", "flashinfer decode (tensor cores)"}
    assert all(kw["window_left"] == -1 and kw["logits_soft_cap"] is None for name, _a, kw in calls
               if name == "decode.plan")
    monkeypatch.setenv("KSB_BENCH_FLASHINFER", "0")
    assert baselines.flashinfer_externals(decode.op, decode.args, decode.kwargs) == {}


def test_explain_and_bench_run_without_pytest(tmp_path) -> None:
    """A user's install (README command 1) has no pytest: the case builders behind ``explain``, ``bench --op`` and
    ``tune`` must not need it (only the conformance tests do)."""
    script = (
        "import sys; sys.modules['pytest'] = None  # `import pytest` now fails, as where it is not installed\n"
        "from kernel_switchboard.cli import main\n"
        "assert main(['explain', 'attention.mla_decode', '--device', 'cpu']) == 0\n"
        f"assert main(['bench', '--op', 'norm.rms_norm', '--param', 'rows=4', '--param', 'hidden=64', '--device', 'cpu',"
        f" '--reps-ms', '1', '--out', {str(tmp_path)!r}]) == 0\n"
        "assert main(['explain', 'nosuch.op', '--device', 'cpu']) == 2\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "chosen reference:mla_decode" in done.stdout and "unknown op 'nosuch.op'" in done.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert rows and all(not r.get("error") for r in rows), rows


def test_an_unknown_op_is_a_usage_error_that_lists_the_known_ones(capsys) -> None:
    """``attention.cascade`` is composed from registered ops (prefill, merge_states), not one itself."""
    for command in (["explain", "attention.cascade"], ["bench", "--op", "attention.cascade", "--device", "cpu"],
                    ["tune", "--op", "attention.cascade", "--device", "cpu"],
                    ["build", "--op", "attention.cascade", "--device", "cpu"]):
        assert main(command) == 2, command
        err = capsys.readouterr().err
        assert "unknown op 'attention.cascade'" in err and "attention.merge_states" in err, command


def test_explain_names_the_shape_option_it_cannot_use(capsys) -> None:
    assert main(["explain", "attention.decode", "batch=x", "--device", "cpu"]) == 2
    assert "switchboard explain attention.decode batch=x: batch='x' is invalid: expected an int" in capsys.readouterr().err
