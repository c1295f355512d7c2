"""Op specs: every op has one (with its reference kernel and conformance cases), custom ops are made from them on
first lookup, ``ksb.explain`` asks them for the problem, and importing the switchboard then calling an op eagerly
imports no compiler and no vendor library."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.capability import FEATURES, Capability
from kernel_switchboard.registry import registry
from kernel_switchboard.spec import KINDS, Arg, all_specs, spec_of
from kernel_switchboard.testing.conformance import op_cases

VENDOR = ("flashinfer", "cudnn", "flash_attn", "cutlass", "tensorrt_llm", "triton")


def _fresh(code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter with the installed backends' entry points hidden (the core alone); it
    prints one JSON object, returned."""
    prelude = textwrap.dedent("""
        import importlib.metadata as md
        _entry_points = md.entry_points
        md.entry_points = lambda **kw: (() if kw.get("group") == "kernel_switchboard.backends"
                                        else _entry_points(**kw))
    """)
    done = subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_import_and_an_eager_reference_call_import_no_compiler_and_no_vendor_library() -> None:
    """``import kernel_switchboard`` and eager reference calls (attention and norm) load neither torch._dynamo nor
    torch._inductor, no vendor library, and register no custom op; the first lookup of one registers it."""
    got = _fresh("""
        import json, sys, torch
        import kernel_switchboard as ksb
        from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case
        q, cache, table = decode_case(AttnSpec(torch.float16, "NHD", 4, 4, 2, kv_lens=(9, 23)), "cpu").args
        ksb.attention.decode(q, cache, table)
        ksb.norm.rms_norm(torch.randn(4, 64), torch.randn(64))
        ops = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("ksb::")]
        loaded = sorted({m.split(".")[0] for m in sys.modules} & set(VENDOR))
        compiler = sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules)
        torch.ops.ksb.rms_norm
        after = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("ksb::")]
        print(json.dumps({"ops": ops, "vendor": loaded, "compiler": compiler, "after": after}))
    """.replace("VENDOR", repr(VENDOR)))
    assert got == {"ops": [], "vendor": [], "compiler": [], "after": ["ksb::rms_norm"]}


def test_every_op_has_a_spec_with_its_reference_kernel_and_cases() -> None:
    specs = all_specs()
    assert set(registry.ops()) <= set(specs)
    for name, spec in specs.items():
        ids = {k.id for k in registry.kernels(spec.kernel_op)}
        assert f"reference:{spec.reference}" in ids, name
        assert spec.prepare is not None and spec.problem.__name__.endswith("Problem"), name
        if spec.kernels is None:
            assert op_cases(name, torch.device("cpu")), f"{name}: no conformance case"


def test_custom_op_schemas_come_from_the_specs() -> None:
    spec = spec_of("kv_cache.append")
    assert spec.schema == (
        "(Tensor k, Tensor v, Tensor(a0!) k_pages, Tensor(a1!) v_pages, str layout, float? k_scale, float? v_scale, "
        "Tensor? k_scale_tensor, Tensor? v_scale_tensor, Tensor block_table, Tensor seq_lens, SymInt? max_seq_len, "
        "Tensor positions, Tensor? batch_indices, bool check_indices, str? backend) -> ()")
    pod = spec_of("attention.pod").schema  # two tables: each one's parameters carry its name
    assert ("Tensor prefill_block_table, Tensor prefill_seq_lens, SymInt? prefill_max_seq_len, "
            "Tensor decode_block_table, Tensor decode_seq_lens, SymInt? decode_max_seq_len") in pod
    assert str(torch.ops.ksb.kv_cache_append.default._schema).startswith("ksb::kv_cache_append(Tensor k, Tensor v")
    with pytest.raises(ValueError, match="kind"):
        Arg("x", "matrix")
    assert "cache" in KINDS and "table" in KINDS


def test_backend_preference_lists_cross_the_custom_op_as_one_string() -> None:
    arg = Arg("backend", "backend")
    assert arg.flatten(("triton", "reference")) == ("triton,reference",)
    assert arg.unflatten(["triton,reference"]) == ("triton", "reference")
    assert arg.unflatten([None]) is None and arg.flatten("triton") == ("triton",)
    rows = Arg("top_p", "float|rows", neutral=1.0)
    t = torch.ones(3)
    assert rows.flatten(None) == (1.0, None) and rows.flatten(0.5) == (0.5, None) and rows.flatten(t) == (1.0, t)
    assert rows.unflatten([1.0, None]) is None and rows.unflatten([0.5, None]) == 0.5 and rows.unflatten([1.0, t]) is t


class _Refusing:
    """A backend whose rms_norm kernel refuses to run: explain must rank it without calling it."""

    @ksb.hookimpl
    def ksb_backend(self) -> ksb.Backend:
        def run(*_: Any) -> Any:
            raise AssertionError("explain ran a kernel")

        cap = Capability(devices=frozenset({"cpu"}), features=FEATURES)
        return ksb.Backend("refusing", kernels=[ksb.Kernel("norm.rms_norm", "k", "refusing", cap, run, priority=50)])


def test_explain_asks_the_spec_and_runs_nothing() -> None:
    plugin = _Refusing()
    ksb.registry.register(plugin)
    try:
        x, w = torch.randn(4, 64), torch.randn(64)
        sel = ksb.explain("norm.rms_norm", x, w, 1e-5, gemma=True)
        assert sel.kernel.id == "refusing:k" and sel.problem.gemma and sel.op == "norm.rms_norm"
        assert ksb.explain("norm.rms_norm", x, w, backend="reference").kernel.id == "reference:rms_norm"
        with pytest.raises(ksb.InvalidArgumentError, match=r"weight\.shape"):
            ksb.explain("norm.rms_norm", x, torch.randn(8))
    finally:
        ksb.registry.unregister(plugin)


def test_explain_of_an_op_ranked_among_another_ops_kernels() -> None:
    x = torch.randn(5, 32)
    w = torch.softmax(torch.randn(5, 2), -1)
    ids = torch.randint(0, 4, (5, 2), dtype=torch.int32)
    sel = ksb.explain("moe.experts", x, w, ids, torch.randn(4, 32, 32), torch.randn(4, 32, 16))
    assert sel.op == "moe.fused_moe" and sel.problem.top_k == 2


def test_explain_of_an_unknown_op_lists_the_known_ones() -> None:
    with pytest.raises(ksb.NoEligibleKernelError, match=r"unknown op 'norm\.nope'.*norm\.rms_norm"):
        ksb.explain("norm.nope", torch.randn(2))
    with pytest.raises(ksb.NoEligibleKernelError, match="unknown op"):
        ksb.explain("nofamily.op")
