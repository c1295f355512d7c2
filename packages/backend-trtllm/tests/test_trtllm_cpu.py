"""trtllm backend without a GPU or vendor libraries: gating, declarations, argument translation (run
through torch models of the vendor kernels and compared with the reference kernels), the weight
cache, and the kernels' run functions end to end against stand-ins with the vendors' signatures."""

from __future__ import annotations

import gc
import math
import sys

import pytest
import torch
import trtllm_emulate as emu
import trtllm_fake_vendor as fake_vendor

import kernel_switchboard as ksb
from kernel_switchboard import KernelUnavailableError, artefacts
from kernel_switchboard.ops.attention import AttnParams, DecodeProblem, MLADecodeProblem
from kernel_switchboard.ops.moe import MoeProblem
from kernel_switchboard.reference import attention as ref_attn
from kernel_switchboard.reference import moe as ref_moe
from kernel_switchboard.registry import registry
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, mla_case
from kernel_switchboard.testing.cases.moe import expert_weights
from kernel_switchboard_trtllm import jit, moe, plugin, providers, translate, xqa

F16, BF16, F32, E4M3 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn


def _decode_problem(**kw: object) -> DecodeProblem:
    base = dict(device="cuda", cc=(9, 0), dtype=BF16, kv_dtype=BF16, head_dim=128, head_dim_v=128, page_size=64,
                layout="HND", num_q_heads=32, num_kv_heads=8, group_size=4, batch=16, max_kv_len=2048,
                features=frozenset({"paged"}))
    base.update(kw)
    return DecodeProblem(**base)  # type: ignore[arg-type]


def _moe_problem(**kw: object) -> MoeProblem:
    base = dict(device="cuda", cc=(9, 0), dtype=BF16, w_dtype=BF16, hidden=4096, intermediate=14336, num_experts=8,
                top_k=2, quant="none", tokens=4096, features=frozenset())
    base.update(kw)
    return MoeProblem(**base)  # type: ignore[arg-type]


def _by_op() -> dict[str, list[ksb.Kernel]]:
    out: dict[str, list[ksb.Kernel]] = {}
    for k in plugin.kernels():
        out.setdefault(k.op, []).append(k)
    return out


# -- gating -------------------------------------------------------------------------------------------------
def test_backend_lists_kernels_with_provider_names_and_reasons() -> None:
    backend = registry.all_backends()["trtllm"]
    names = {k.op: [] for k in backend.kernels}
    for k in backend.kernels:
        names[k.op].append(k.name)
    assert names["attention.decode"][0].startswith("trtllm-xqa@flashinfer")
    assert names["attention.mla_decode"][0].startswith("trtllm-xqa-mla@flashinfer")
    assert sorted(n.split("@")[0] for n in names["moe.fused_moe"]) == ["fused_moe", "trtllm-cutlass-moe"]
    assert backend.unavailable is not None and backend.providers.keys() == {"flashinfer-python", "tensorrt_llm"}
    for k in backend.kernels:
        (reason,) = k.reasons(_decode_problem())
        assert reason.startswith("unavailable: ") and "install: " in reason


def test_explicit_backend_raises_with_reason() -> None:
    q = torch.randn(2, 4, 64, dtype=F16)
    cache = ksb.PagedKVCache(torch.randn(4, 16, 2, 64, dtype=F16), torch.randn(4, 16, 2, 64, dtype=F16))
    table = ksb.PageTable(torch.tensor([[0], [1]], dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32))
    with pytest.raises(KernelUnavailableError, match=r"trtllm-xqa@flashinfer.*unavailable"):
        ksb.attention.decode(q, cache, table, backend="trtllm")


def test_provider_reasons_and_install_commands(monkeypatch) -> None:
    reason, install = providers.missing_flashinfer()  # not installed here: the command that installs it
    assert "'flashinfer' is not installed" in reason and install == 'pip install "kernel-switchboard[trtllm]"'
    reason, install = providers.missing_tensorrt_llm()
    assert "'tensorrt_llm' is not installed" in reason and "stub" in reason and "pypi.nvidia.com" in install
    monkeypatch.setattr(providers, "installed", lambda m: True)
    reason, install = providers.missing_flashinfer()
    assert "CUDA" in reason and install == providers.GPU_NEEDED  # installed, but no GPU here
    monkeypatch.setattr(providers, "missing_cuda", lambda **kw: None)
    monkeypatch.setattr(providers, "missing_module", lambda m, *a: f"python module {m!r} is not installed")
    reason, install = providers.missing_flashinfer()
    assert "'flashinfer'" in reason and install == 'pip install "kernel-switchboard[trtllm]"'
    reason, install = providers.missing_tensorrt_llm()
    assert "'tensorrt_llm'" in reason and "stub" in reason
    assert install == "pip install tensorrt-llm --extra-index-url https://pypi.nvidia.com"


def test_flashinfer_version_window_is_passed(monkeypatch) -> None:
    seen = {}
    monkeypatch.setattr(providers, "installed", lambda m: True)
    monkeypatch.setattr(providers, "missing_cuda", lambda **kw: None)
    monkeypatch.setattr(providers, "missing_module", lambda *a: seen.setdefault("args", a) and None)
    assert providers.missing_flashinfer() == (None, None)
    assert seen["args"] == ("flashinfer", "flashinfer-python", "0.6.18", "0.8")


def test_discovery_with_flashinfer_installed_imports_none_of_it(monkeypatch, tmp_path) -> None:
    """An installed flashinfer (here one whose import would fail) is found from its files and metadata; nothing of
    it is imported until a kernel runs."""
    (tmp_path / "flashinfer").mkdir()
    (tmp_path / "flashinfer" / "__init__.py").write_text("raise ImportError('imported at discovery')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    monkeypatch.setattr("kernel_switchboard.availability.package_version",
                        lambda dist: "0.6.18.post1" if dist == providers.FLASHINFER_DIST else None)
    monkeypatch.setattr(providers, "missing_cuda", lambda **kw: None)
    assert providers.missing_flashinfer() == (None, None)
    assert "flashinfer" not in sys.modules


ENV = {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "driver": "580.1", "cuda": "13.0"}


def test_needs_build_without_flashinfer_reads_the_records(monkeypatch, tmp_path) -> None:
    """Ranking never imports flashinfer: a module counts as built only when an earlier process recorded it and its
    library is still on disk."""
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: ENV)
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    decode_kernel = next(k for k in plugin.kernels() if k.op == "attention.decode")
    moe_kernel = next(k for k in plugin.kernels() if k.name.startswith("trtllm-cutlass-moe"))
    problem, moe_problem = _decode_problem(), _moe_problem()
    assert decode_kernel.needs_build(problem) and moe_kernel.needs_build(moe_problem)
    library = tmp_path / "xqa.so"
    library.write_bytes(b"\x7fELF")
    artefacts.record(jit.xqa_record(problem), {"path": str(library)})
    artefacts.record(jit.moe_record((9, 0)), {"path": str(library)})
    assert not decode_kernel.needs_build(problem) and not moe_kernel.needs_build(moe_problem)
    assert decode_kernel.needs_build(_decode_problem(page_size=16))  # another module
    assert decode_kernel.needs_build(_decode_problem(features=frozenset({"paged", "sliding_window"})))
    library.unlink()  # flashinfer's cache was cleared
    assert decode_kernel.needs_build(problem) and moe_kernel.needs_build(moe_problem)
    assert "flashinfer" not in sys.modules


def test_records_of_another_environment_are_never_read(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("KSB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: ENV)
    library = tmp_path / "xqa.so"
    library.write_bytes(b"\x7fELF")
    artefacts.record(jit.xqa_record(_decode_problem()), {"path": str(library)})
    monkeypatch.setattr(artefacts, "environment", lambda device_index=None: {**ENV, "driver": "590.2"})
    monkeypatch.delitem(sys.modules, "flashinfer", raising=False)
    decode_kernel = next(k for k in plugin.kernels() if k.op == "attention.decode")
    assert decode_kernel.needs_build(_decode_problem())


def test_tensorrt_llm_kernel_keeps_its_own_reason_when_flashinfer_is_available(monkeypatch) -> None:
    monkeypatch.setattr(providers, "missing_flashinfer", lambda: (None, None))
    monkeypatch.setattr(providers, "missing_tensorrt_llm", lambda: ("no tensorrt_llm here", providers.TRTLLM_INSTALL))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    backend = plugin.ksb_backend()
    assert backend.unavailable is None
    trt = [k for k in backend.kernels if k.name.startswith("fused_moe@tensorrt_llm")]
    assert trt and trt[0].unavailable == "no tensorrt_llm here" and trt[0].install == providers.TRTLLM_INSTALL
    assert all(k.unavailable is None for k in backend.kernels if k not in trt and k.op != "attention.mla_decode")


# -- declarations -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("change", "words"), [
    ({"cc": (8, 0)}, "below minimum 9.0"),
    ({"cc": (11, 0)}, "flashinfer builds XQA for sm_90, sm_100 and sm_120 only"),
    ({"page_size": 8}, "page_size=8 not supported"),
    ({"dtype": F32, "kv_dtype": F32}, "dtype=float32 not supported"),
    ({"kv_dtype": torch.float8_e5m2, "features": frozenset({"paged", "fp8_kv"})}, "kv_dtype=float8_e5m2"),
    ({"features": frozenset({"paged", "soft_cap"})}, "features {soft_cap} not supported"),
    ({"features": frozenset({"paged", "return_lse"})}, "features {return_lse} not supported"),
    ({"head_dim": 72, "head_dim_v": 72}, "head_dim=72: XQA needs a multiple of 16"),
    ({"head_dim": 256, "head_dim_v": 256, "num_q_heads": 64, "num_kv_heads": 1, "group_size": 64},
     "at most 32 query heads per KV head"),
    ({"head_dim": 512, "head_dim_v": 512, "num_q_heads": 32, "num_kv_heads": 1, "group_size": 32},
     "at most 16 query heads per KV head above 256"),
    ({"head_dim_v": 64, "features": frozenset({"paged", "qk_v_dims_differ"})}, "qk_v_dims_differ"),
])
def test_decode_rejects(change: dict[str, object], words: str) -> None:
    (kernel,) = _by_op()["attention.decode"]
    reasons = kernel.capability.reasons(_decode_problem(**change))
    assert any(words in r for r in reasons), reasons


@pytest.mark.parametrize("change", [
    {},
    {"layout": "NHD", "page_size": 16, "dtype": F16, "kv_dtype": F16},
    {"kv_dtype": E4M3, "features": frozenset({"paged", "fp8_kv", "sliding_window", "cuda_graph"})},
    {"cc": (10, 0), "head_dim": 64, "head_dim_v": 64, "group_size": 128, "num_q_heads": 128, "num_kv_heads": 1},
    {"cc": (12, 0), "page_size": 128, "group_size": 1, "num_q_heads": 8, "num_kv_heads": 8},
])
def test_decode_accepts(change: dict[str, object]) -> None:
    (kernel,) = _by_op()["attention.decode"]
    assert kernel.capability.reasons(_decode_problem(**change)) == []


def test_mla_is_declared_for_sm120_only() -> None:
    (kernel,) = _by_op()["attention.mla_decode"]
    p = MLADecodeProblem("cuda", (12, 0), BF16, BF16, 512, 512, 64, 64, None, 128, 1, 128, 8, 1024, frozenset({"paged"}))
    assert kernel.capability.reasons(p) == []
    assert any("below minimum 12.0" in r for r in kernel.capability.reasons(p._replace(cc=(9, 0))))
    assert any("128 query heads" in r for r in kernel.capability.reasons(p._replace(num_q_heads=16, group_size=16)))
    assert any("dtype=float16" in r for r in kernel.capability.reasons(p._replace(dtype=F16, kv_dtype=F16)))


@pytest.mark.parametrize(("change", "words"), [
    ({"quant": "fp8_block", "w_dtype": E4M3, "cc": (10, 0)}, "sm_90 only"),
    ({"quant": "fp8_block", "w_dtype": E4M3, "dtype": F16}, "take bfloat16 activations"),
    ({"quant": "fp8_block", "w_dtype": E4M3, "intermediate": 192}, "multiples of 128"),
    ({"hidden": 100}, "multiples of 64"),
    ({"dtype": F32, "w_dtype": F32}, "dtype=float32 not supported"),
    ({"cc": (8, 0)}, "below minimum 8.9"),
])
def test_moe_rejects(change: dict[str, object], words: str) -> None:
    fi = next(k for k in _by_op()["moe.fused_moe"] if k.name.startswith("trtllm-cutlass-moe"))
    reasons = fi.capability.reasons(_moe_problem(**change))
    assert any(words in r for r in reasons), reasons


def test_moe_accepts_deepseek_fp8_on_hopper() -> None:
    fi = next(k for k in _by_op()["moe.fused_moe"] if k.name.startswith("trtllm-cutlass-moe"))
    p = _moe_problem(quant="fp8_block", w_dtype=E4M3, hidden=7168, intermediate=2048, num_experts=256, top_k=8)
    assert fi.capability.reasons(p) == []


def test_costs_rank_only_on_the_gpu() -> None:
    (dec,) = _by_op()["attention.decode"]
    assert dec.cost(_decode_problem(device="cpu")) == math.inf
    assert dec.cost(_decode_problem(batch=128, max_kv_len=8192)) > dec.cost(_decode_problem()) > 0


# -- decode translation against the reference -----------------------------------------------------------
DECODE_SPECS = [
    AttnSpec(F16, "NHD", 16, 4, 2, 64, kv_lens=(0, 1, 37)),
    AttnSpec(BF16, "HND", 32, 8, 2, 64, kv_lens=(5, 70, 23)),
    AttnSpec(F16, "HND", 16, 4, 1, 128, kv_lens=(33, 9), window=6),
    AttnSpec(BF16, "NHD", 64, 4, 4, 64, kv_lens=(100, 3), window=0),
    AttnSpec(F16, "NHD", 16, 8, 2, 64, kv_lens=(40, 16), kv_dtype=E4M3),
    AttnSpec(BF16, "HND", 128, 4, 1, 64, kv_lens=(130, 1), kv_dtype=E4M3),
]


def _params(case) -> AttnParams:
    q, _, table = case.args
    window = case.kwargs.get("window_left", -1)
    return AttnParams(1.0 / math.sqrt(q.shape[-1]), None, window, True, False, 1, int(table.seq_lens.max()))


@pytest.mark.parametrize("spec", DECODE_SPECS, ids=lambda s: s.tag("decode"))
def test_xqa_translation_matches_reference(spec: AttnSpec) -> None:
    case = decode_case(spec, "cpu", seed=3)
    q, cache, table = case.args
    p = _params(case)
    args = translate.xqa_decode_args(q, cache, table, p)
    assert args.kv_layout == spec.layout and args.window_left == p.window_left
    if spec.kv_dtype is not None:
        assert args.bmm1_scale == pytest.approx(p.sm_scale * cache.k_scale) and args.bmm2_scale == cache.v_scale
    got = emu.xqa_decode(args)
    got[table.seq_lens == 0] = 0.0
    want, _ = ref_attn.decode(q, cache, table, p)
    atol, rtol = case.tol or tolerance(spec.dtype)
    assert_close(got, want, atol=atol, rtol=rtol, what=case.id)


def test_xqa_translation_densifies_what_xqa_reads_densely() -> None:
    case = decode_case(AttnSpec(F16, "NHD", 16, 4, 2, 64, kv_lens=(20, 7)), "cpu")
    q, cache, table = case.args
    wide = torch.zeros(2, table.block_table.shape[1] + 5, dtype=torch.int32)
    wide[:, : table.block_table.shape[1]] = table.block_table
    sliced = ksb.PageTable(wide[:, : table.block_table.shape[1]], table.seq_lens)  # row stride > width
    q_strided = torch.cat((q, q), dim=-1)[..., :64]  # unit stride in the last dim only
    args = translate.xqa_decode_args(q_strided, cache, sliced, _params(case))
    assert args.block_tables.is_contiguous() and args.query.is_contiguous()
    assert args.kv_cache[0] is cache.k_pages  # pages are passed in place


def test_xqa_mla_translation_matches_reference() -> None:
    case = mla_case(BF16, (9, 40), 16, 16, "cpu", seed=1)
    q_nope, q_pe, ckv, kpe, table = case.args
    p = AttnParams(case.kwargs["sm_scale"], None, -1, True, False, 1, 40)
    a = translate.xqa_mla_args(q_nope, q_pe, ckv, kpe, table, p)
    assert a.query.shape == (2, 1, 16, 576) and a.kv_cache.shape[-1] == 576 and a.kv_lora_rank == 512
    want, _ = ref_attn.mla_decode(q_nope, q_pe, ckv, kpe, table, p)
    assert_close(emu.xqa_mla(a), want, atol=2e-2, rtol=2e-2)


# -- MoE weight layout against the reference ---------------------------------------------------------------
def _moe_inputs(dtype: torch.dtype, fp8: bool, hidden: int = 256, inter: int = 128, experts: int = 4, top_k: int = 2,
                tokens: int = 5):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w13, w2, s13, s2 = expert_weights(experts, hidden, inter, dtype, fp8, g, torch.device("cpu"))
    logits = torch.randn(tokens, experts, generator=g)
    weights, ids = ref_moe.route(logits, top_k, "softmax", True, None, None, None, 1.0)
    return x, weights, ids, w13, w2, s13, s2


@pytest.mark.parametrize(("dtype", "fp8"), [(BF16, False), (F16, False), (BF16, True)])
def test_moe_translation_matches_reference(dtype: torch.dtype, fp8: bool) -> None:
    x, w, ids, w13, w2, s13, s2 = _moe_inputs(dtype, fp8)
    a = translate.moe_args(x, w, ids, w13, w2, s13, s2)
    inter = w2.shape[2]
    assert torch.equal(a.fc1_expert_weights[:, :inter].float(), w13[:, inter:].float())  # up rows first
    assert a.use_deepseek_fp8_block_scale == fp8 and len(a.quant_scales) == (2 if fp8 else 0)
    want = ref_moe.fused_moe(x, w, ids, w13, w2, s13, s2)
    tol = (1.5e-1, 1e-1) if fp8 else (3e-2, 3e-2)
    assert_close(emu.fused_moe(a), want, atol=tol[0], rtol=tol[1])


def test_moe_untranslated_weights_would_be_wrong() -> None:
    """The model is sensitive to the gate/up order: without the swap the result differs."""
    x, w, ids, w13, w2, _, _ = _moe_inputs(F16, False)
    a = translate.moe_args(x, w, ids, w13, w2, None, None)
    wrong = a._replace(fc1_expert_weights=w13.contiguous())
    want = ref_moe.fused_moe(x, w, ids, w13, w2, None, None)
    assert (emu.fused_moe(wrong).float() - want.float()).abs().max() > 0.1


def test_fp8_scale_swap_needs_whole_blocks() -> None:
    with pytest.raises(ValueError, match="intermediate size 192 is not a multiple of 128"):
        translate.to_trtllm_w13_scale(torch.ones(2, 3, 2), 192)


# -- the weight cache -------------------------------------------------------------------------------------
def test_weight_cache_hits_invalidates_and_evicts() -> None:
    cache = translate.WeightCache(max_bytes=3 * 64 * 4)
    made = []

    def make(t: torch.Tensor) -> torch.Tensor:
        made.append(1)
        return translate.swap_halves(t, 0)

    a = torch.arange(64, dtype=torch.float32)
    first = cache.get(a, "w", make)
    assert cache.get(a, "w", make) is first and len(made) == 1
    a.add_(1)  # in-place update: version changes
    assert torch.equal(cache.get(a, "w", make)[:32], a[32:]) and len(made) == 2
    twin = a.clone()  # same values, another tensor: its own entry
    cache.get(twin, "w", make)
    assert len(made) == 3 and len(cache) == 2
    for _ in range(3):
        cache.get(torch.zeros(64), "w", make)
    assert len(cache) <= 3
    assert len(cache.get(torch.zeros(1000), "w", make)) == 1000 and len(cache) <= 3  # too big: not kept
    del twin
    gc.collect()
    b = torch.arange(64, dtype=torch.float32)
    assert torch.equal(cache.get(b, "w", make)[:32], b[32:])  # a reused address never returns stale data


# -- the kernels' run functions against stand-ins with the vendors' signatures ------------------------------
@pytest.fixture
def vendor(monkeypatch):
    fake_vendor.install(monkeypatch)
    monkeypatch.setattr(xqa, "workspace", lambda device: torch.zeros(16, dtype=torch.uint8))
    moe.weight_cache.clear()
    yield fake_vendor.CALLS
    moe.weight_cache.clear()


@pytest.mark.parametrize("spec", DECODE_SPECS[:3], ids=lambda s: s.tag("decode"))
def test_xqa_kernel_run(vendor, spec: AttnSpec) -> None:
    case = decode_case(spec, "cpu", seed=5)
    q, cache, table = case.args
    p = _params(case)
    out, lse = xqa.decode(q, cache, table, p)
    assert vendor == ["xqa"] and lse is None and out.shape == q.shape and out.dtype == q.dtype
    want, _ = ref_attn.decode(q, cache, table, p)
    atol, rtol = case.tol or tolerance(spec.dtype)
    assert_close(out, want, atol=atol, rtol=rtol, what=case.id)  # empty requests zeroed, not NaN


def test_xqa_trust_mode_skips_the_zeroing_pass(vendor, monkeypatch) -> None:
    monkeypatch.setattr(xqa, "ZERO_EMPTY_ROWS", False)  # KSB_TRTLLM_XQA_EMPTY_ROWS=trust
    case = decode_case(AttnSpec(F16, "NHD", 16, 4, 2, 64, kv_lens=(20, 0, 7)), "cpu", seed=6)
    q, cache, table = case.args
    out, _ = xqa.decode(q, cache, table, _params(case))
    assert torch.isnan(out[1]).all() and torch.isfinite(out[[0, 2]]).all()  # what XQA wrote, untouched


def test_xqa_plan_run_writes_into_out(vendor, monkeypatch) -> None:
    built = []
    monkeypatch.setattr(xqa.jit, "xqa_build", lambda problem: built.append(problem))
    case = decode_case(DECODE_SPECS[1], "cpu", seed=2)
    q, cache, table = case.args
    p = _params(case)
    plan = xqa.plan(_decode_problem(), table, p)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    plan.run(q, cache, out, None)
    assert built and vendor == ["xqa"]
    assert_close(out, ref_attn.decode(q, cache, table, p)[0], atol=2e-2, rtol=2e-2)


def test_mla_kernel_run(vendor) -> None:
    case = mla_case(BF16, (9, 40), 128, 16, "cpu", seed=4)
    q_nope, q_pe, ckv, kpe, table = case.args
    p = AttnParams(case.kwargs["sm_scale"], None, -1, True, False, 1, 40)
    out, _ = xqa.mla_decode(q_nope, q_pe, ckv, kpe, table, p)
    assert vendor == ["xqa_mla"]
    assert_close(out, ref_attn.mla_decode(q_nope, q_pe, ckv, kpe, table, p)[0], atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("fn", [moe.flashinfer_moe, moe.tensorrt_llm_moe], ids=["flashinfer", "tensorrt_llm"])
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8-block"])
def test_moe_kernel_run(vendor, fn, fp8: bool) -> None:
    x, w, ids, w13, w2, s13, s2 = _moe_inputs(BF16, fp8)
    y = fn(x, w, ids, w13, w2, s13, s2)
    y2 = fn(x, w, ids, w13, w2, s13, s2)
    assert len(moe.weight_cache) == (2 if fp8 else 1)  # translated once, reused
    tol = (1.5e-1, 1e-1) if fp8 else (3e-2, 3e-2)
    want = ref_moe.fused_moe(x, w, ids, w13, w2, s13, s2)
    assert_close(y, want, atol=tol[0], rtol=tol[1])
    assert torch.equal(y, y2) and len(vendor) == 2


def test_moe_kernel_doubles_no_memory_for_unchanged_weights_across_layers(vendor) -> None:
    layers = [_moe_inputs(BF16, False) for _ in range(3)]
    for x, w, ids, w13, w2, s13, s2 in layers:
        moe.flashinfer_moe(x, w, ids, w13, w2, s13, s2)
    assert len(moe.weight_cache) == 3


def test_kernels_outside_this_gpu_are_unavailable(monkeypatch) -> None:
    monkeypatch.setattr(providers, "missing_flashinfer", lambda: (None, None))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    kernels = {k.op + ":" + k.name.split("@")[0]: k for k in plugin.ksb_backend().kernels}
    assert kernels["attention.decode:trtllm-xqa"].unavailable is None
    assert "sm_120 / sm_121 only; this GPU is 9.0" in kernels["attention.mla_decode:trtllm-xqa-mla"].unavailable
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 9))
    kernels = {k.op + ":" + k.name.split("@")[0]: k for k in plugin.ksb_backend().kernels}
    assert "this GPU is 8.9" in kernels["attention.decode:trtllm-xqa"].unavailable
    assert kernels["moe.fused_moe:trtllm-cutlass-moe"].unavailable is None


def test_benchmark_smoke() -> None:
    """The benchmark runs end to end on tiny shapes; here every vendor row reports its error."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "benchmarks" / "decode.py"
    spec = importlib.util.spec_from_file_location("trtllm_bench_decode", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.bench_decode("cpu", mod.SMOKE)
    impls = {r["impl"] for r in rows}
    assert {"trtllm xqa (plan)", "flashinfer xqa direct", "trtllm cutlass moe (default tactic)", "triton"} <= impls
    assert all(("error" in r) or ("tb_s" in r) or ("tflop_s" in r) or ("empty_row_finite" in r) for r in rows), rows


def test_decode_cost_follows_the_h200_measurements() -> None:
    """XQA's GPU time on the H200 (CUDA-graph replays, page 128): 3.09 TB/s at B=16 L=4096, 4.28 at B=128 L=8192; page 16
    is slower (3.82 at B=128 L=8192): the estimates agree within 5%."""
    (dec,) = _by_op()["attention.decode"]
    small = _decode_problem(batch=16, max_kv_len=4096, page_size=128)
    big = _decode_problem(batch=128, max_kv_len=8192, page_size=128)
    gb = 16 * 4096 * 8 * 256 * 2
    assert gb / dec.cost(small) == pytest.approx(3.09e12, rel=0.05)
    assert (16 * gb) / dec.cost(big) == pytest.approx(4.28e12, rel=0.05)
    assert (16 * gb) / dec.cost(big._replace(page_size=16)) == pytest.approx(3.82e12, rel=0.05)
