"""Bad options of ``switchboard explain`` / ``tune`` / ``bench``: one clear line on stderr and a non-zero status."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_switchboard.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["attention.decode", "rows=abc"], "rows='abc' is invalid: expected one of the parameters of attention.decode: "),
    (["attention.decode", "batch=abc"], "batch='abc' is invalid: expected an int >= 0"),
    (["attention.decode", "batch=-4"], "batch='-4' is invalid: expected an int >= 0"),
    (["attention.decode", "dtype=int7"], "dtype='int7' is invalid: expected a float dtype"),
    (["norm.rms_norm", "rows=abc"], "rows='abc' is invalid: expected an int >= 0"),
    (["norm.rms_norm", "rows=-4"], "rows='-4' is invalid: expected an int >= 0"),
    (["norm.rms_norm", "rows=4", "hidden=8", "dtype=int7"], "dtype='int7' is invalid"),
    (["norm.rms_norm", "gemma=maybe"], "gemma='maybe' is invalid: expected a boolean"),
    (["attention.decode", "soft_cap=inf"], "soft_cap='inf' is invalid: expected a finite number"),
    (["attention.decode", "batch"], "parameter='batch' is invalid: expected key=value"),
    (["attention.decode", "batch=2", "kv_len=16", "soft_cap=-1"], "logits_soft_cap=-1.0 is invalid"),
    (["sampling.top_k_top_p", "batch=2", "vocab=64", "top_p=2"], "top_p=2.0 is invalid"),
])
def test_explain_bad_shape_options_give_one_line_and_status_2(argv: list[str], message: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", *argv, "--device", "cpu"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], captured.err
    assert lines[0].startswith(f"switchboard explain {' '.join(argv)}: ")


def test_explain_good_options_still_work(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "attention.decode", "batch=2", "kv_len=16", "head_dim=64", "dtype=fp32", "lse=1",
                 "--device", "cpu"]) == 0
    assert "chosen reference:decode" in capsys.readouterr().out
    assert main(["explain", "rope.apply", "tokens=4", "rotary_dim=none", "--device", "cpu"]) == 0


@pytest.mark.parametrize("command", ["tune", "bench"])
def test_tune_and_bench_refuse_a_bad_param_with_status_2(command: str, cache_file: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--op", "norm.rms_norm", "--param", "rows=abc", "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip() == "switchboard: --param: rows='abc' is invalid: expected an int >= 0"
    assert not cache_file.exists()


def test_tune_exits_non_zero_when_a_point_cannot_be_made(cache_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tune", "--op", "attention.decode", "--param", "batch=2", "--param", "kv_len=16", "--param",
                 "soft_cap=-1", "--device", "cpu", "--reps-ms", "1"]) == 1
    assert "logits_soft_cap=-1.0 is invalid" in capsys.readouterr().err


def test_tune_refuses_an_unusable_cache_location(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    for place, why in ((tmp_path, "is a directory"), (Path("/proc/ksb-no/tune.json"), "cannot write")):
        monkeypatch.setenv("KSB_TUNE_CACHE", str(place))
        assert main(["tune", "--op", "norm.rms_norm", "--param", "rows=4", "--device", "cpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("switchboard tune: ") and why in err and len(err.splitlines()) == 1
