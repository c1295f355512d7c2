"""``switchboard demo`` (kernel_switchboard_engine.demo.main) end to end on the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from kernel_switchboard_engine.demo import main  # noqa: E402
from kernel_switchboard_engine.tiny import FAMILIES  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_threads() -> object:
    threads = torch.get_num_threads()  # the demo sets 1 thread for its tiny preset
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_demo_serves_requests_and_explains_kernels(family: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--model", family, "--device", "cpu", "--requests", "4", "--max-new-tokens", "6", "--page-size", "8",
                 "--speculative", "2", "--check"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "generated tokens/s" in out and "mixed prefill+decode" in out
    mla = family == "deepseek"
    attention = ("attention.prefill_ragged", "attention.mla_decode", "moe.route", "moe.experts") if mla else (
        "attention.prefill", "attention.decode")
    rope = "rope.apply_cos_sin_cache" if family in ("deepseek", "gemma3") else "rope.apply"
    mlp = {"mixtral": ("moe.route", "moe.experts"), "gemma2": ("activation.gelu_tanh_and_mul",),
           "gemma3": ("activation.gelu_tanh_and_mul",)}.get(family, ("activation.silu_and_mul",))
    for op in (*attention, *mlp, "gemm.mm", rope, "norm.fused_add_rms_norm", "sampling.top_k_top_p"):
        line = next((ln for ln in out.splitlines() if ln.strip().startswith(op + " ")), None)
        assert line is not None and "reference:" in line and "(" in line, f"{op} missing from:\n{out}"
    assert "speculative decoding" in out and "16/16 identical" in out


def test_demo_rejects_cuda_graph_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--device", "cpu", "--decode-mode", "cuda_graph"]) == 2
    assert "needs a GPU" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--speculative", "-1", "-1 is invalid: expected an int >= 0"),
    ("--max-new-tokens", "0", "0 is invalid: expected an int >= 1"),
    ("--requests", "x", "'x' is not an int"),
    ("--page-size", "0", "0 is invalid: expected an int >= 1"),
    ("--threads", "0", "0 is invalid: expected an int >= 1"),
])
def test_demo_refuses_a_bad_count_before_building_anything(flag: str, value: str, expected: str,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cpu", flag, value])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and f"argument {flag}: {expected}" in captured.err and captured.out == ""


def test_demo_reports_an_impossible_backend_choice(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--device", "cpu", "--requests", "1", "--max-new-tokens", "2", "--backend", "no-such-backend"])
    assert code == 2
    assert "no-such-backend" in capsys.readouterr().err


def test_demo_without_transformers_draws_random_weights(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    assert main(["--device", "cpu", "--model", "deepseek", "--requests", "2", "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "transformers is not installed" in out and "generated tokens/s" in out


@pytest.mark.parametrize("family", ["llama", "mixtral"])
def test_bfloat16_check_refuses_a_model_that_differs_everywhere(family: str, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The 16-bit check's MoE allowance (a few positions whose expert choice flips) cannot hide an error at every
    position: a final norm 1.5x off in the reference fails it, for a dense model and a MoE one alike."""
    from kernel_switchboard_engine import families

    real = families.from_hf

    def off_by_norm(hf, **kw):  # type: ignore[no-untyped-def]
        model = real(hf, **kw)
        hf.model.norm.weight.data.mul_(1.5)
        return model

    args = ["--model", family, "--device", "cpu", "--dtype", "bfloat16", "--requests", "1", "--max-new-tokens", "2",
            "--check"]
    assert main(args) == 0, capsys.readouterr().out
    assert "positions past it: 0 of" in capsys.readouterr().out
    monkeypatch.setattr(families, "from_hf", off_by_norm)
    assert main(args) == 3
