"""fp8 attention in the Triton kernels: KV scales as device tensors (one or one per KV head) in decode, prefill, POD and
the append, against the reference (interpreter on the CPU; real sizes on a GPU, ``gpu``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl  # noqa: F401 - the interpreter runs a jit function only where it sees triton.language

import kernel_switchboard as ksb
from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import assert_close
from kernel_switchboard.testing.cases.attention import AttnSpec, decode_case, pod_case, prefill_case

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(DEVICE == "cpu" and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")
E4M3, F16, BF16 = torch.float8_e4m3fn, torch.float16, torch.bfloat16


def _scaled(cache: ksb.PagedKVCache, k_scale: torch.Tensor, v_scale: torch.Tensor) -> ksb.PagedKVCache:
    return ksb.PagedKVCache(cache.k_pages, cache.v_pages, cache.layout, k_scale.to(cache.device),
                            v_scale.to(cache.device))


@pytest.mark.parametrize("op", ["decode", "prefill", "pod"])
def test_per_head_scale_tensors_match_reference(op: str) -> None:
    small = DEVICE == "cpu"
    spec = AttnSpec(F16 if small else BF16, "HND", 16, 4 if small else 32, 2 if small else 8, 64 if small else 128,
                    kv_lens=(21, 40, 1) if small else (3000, 700, 1), q_lens=(7, 40, 1) if small else (512, 700, 1),
                    kv_dtype=E4M3, lse=True)
    heads = spec.kv_heads
    k_scale = torch.tensor([0.5 * 2.0 ** -(h % 3) for h in range(heads)])
    v_scale = torch.tensor([1.0 + h / heads for h in range(heads)])
    if op == "pod":
        case = pod_case(spec, (33, 5) if small else (4096, 77), DEVICE)
        i = 3
    else:
        case = (decode_case if op == "decode" else prefill_case)(spec, DEVICE)
        i = 1 if op == "decode" else 2
    args = list(case.args)
    args[i] = _scaled(args[i], k_scale, v_scale)
    fn = getattr(ksb.attention, op)
    assert "kv_scale_tensor" in ksb.explain(case.op, *args, **case.kwargs, backend="triton").problem.features
    got = fn(*args, **case.kwargs, backend="triton")
    want = fn(*args, **case.kwargs, backend="reference")
    for g, w in zip(got, want):
        assert_close(g, w, atol=3e-2, rtol=3e-2, what=f"{op} with per-head scale tensors")


@pytest.mark.parametrize("op", ["decode", "prefill", "pod"])
@pytest.mark.parametrize("q_magnitude", [1.0, 1e5])
def test_bf16_queries_on_fp8_pages_match_reference(op: str, q_magnitude: float) -> None:
    """bf16 queries over e4m3 pages compute in fp16 (one conversion per fp8 pair): the result stays the reference's
    within bf16 tolerance, also for queries past fp16's range (1e5: scaled into range, the factor folded back)."""
    small = DEVICE == "cpu"
    spec = AttnSpec(BF16, "NHD", 16, 4 if small else 32, 2 if small else 8, 64 if small else 128,
                    kv_lens=(21, 40, 1) if small else (3000, 700, 1), q_lens=(7, 40, 1) if small else (512, 700, 1),
                    kv_dtype=E4M3, lse=True, soft_cap=None if q_magnitude == 1.0 else 30.0)
    if op == "pod":
        case, queries = pod_case(spec, (33, 5) if small else (4096, 77), DEVICE), (0, 2)
    elif op == "decode":
        case, queries = decode_case(replace(spec, q_lens=None), DEVICE), (0,)
    else:
        case, queries = prefill_case(spec, DEVICE), (0,)
    args = list(case.args)
    for i in queries:
        args[i] = (args[i].float() * q_magnitude).to(BF16)
    kwargs = {**case.kwargs, "sm_scale": spec.head_dim ** -0.5 / q_magnitude}
    fn = getattr(ksb.attention, op)
    got = fn(*args, **kwargs, backend="triton")
    want = fn(*args, **kwargs, backend="reference")
    for g, w in zip(got, want):
        assert torch.isfinite(g).all()
        assert_close(g, w, atol=2e-2, rtol=2e-2, what=f"{op}: bf16 queries x{q_magnitude:g} on e4m3 pages")


def test_append_quantises_each_head_by_its_scale_tensor() -> None:
    pages = torch.zeros(3, 4, 2, 64, dtype=E4M3, device=DEVICE)
    table = ksb.PageTable(torch.arange(3, dtype=torch.int32, device=DEVICE)[:, None],
                          torch.full((3,), 4, dtype=torch.int32, device=DEVICE))
    g = torch.Generator().manual_seed(0)
    k = (torch.randn(3, 2, 64, generator=g) * 30).to(DEVICE, F16)
    v = torch.randn(3, 2, 64, generator=g).to(DEVICE, F16)
    positions = torch.full((3,), 1, dtype=torch.int32, device=DEVICE)
    stored = []
    for backend in ("triton", "reference"):
        cache = ksb.PagedKVCache(pages.clone(), pages.clone(), "NHD", torch.tensor([0.25, 3.0], device=DEVICE),
                                 torch.tensor(0.5, device=DEVICE))
        ksb.kv_cache.append(k, v, cache, table, positions, backend=backend)
        stored.append((cache.k_pages[:, 1].view(torch.uint8).cpu(), cache.v_pages[:, 1].view(torch.uint8).cpu()))
    assert torch.equal(stored[0][0], stored[1][0]) and torch.equal(stored[0][1], stored[1][1])


# -- fp8 queries (FlashAttention-3's fp8 attention) ----------------------------------------------------------------
@triton.jit
def _unrounded(p):
    """Stands for ``_round_e4m3`` in the kernel: P left as it is."""
    return p

FP8_Q = AttnSpec(BF16, "NHD", 16, 4, 2, kv_lens=(21, 40, 1), q_lens=(7, 40, 1), lse=True, kv_dtype=E4M3, q_fp8=True)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's emulation of the fp8 dots")
def test_fp8_query_dequantisation_matches_reference_when_p_is_not_rounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter computes the dots on the fp8 values in float32 (exact products), so with P left unrounded the
    kernel's folding of q_scale, k_scale and v_scale into its score and output scales is checked against the
    reference tightly; with P rounded to e4m3 (what the GPU's fp8 PV dot sees) the error is fp8's."""
    from kernel_switchboard_triton import _prefill

    case = prefill_case(FP8_Q, DEVICE, seed=3)
    want = ksb.attention.prefill(*case.args, **case.kwargs, backend="reference")
    rounded = ksb.attention.prefill(*case.args, **case.kwargs, backend="triton:prefill_fp8")
    monkeypatch.setattr(_prefill, "_round_e4m3", _unrounded)
    exact = ksb.attention.prefill(*case.args, **case.kwargs, backend="triton:prefill_fp8")
    assert exact[0].dtype == BF16
    for g, w in zip(exact, want):
        assert_close(g, w, atol=1e-2, rtol=1e-2, what="P unrounded")
    assert not torch.equal(rounded[0], exact[0])  # the emulated fp8 P is on
    for g, w in zip(rounded, want):
        assert_close(g, w, atol=0.1, rtol=0.1, what="P rounded to e4m3")


def test_fp8_queries_need_hopper_and_the_fp8_kernel() -> None:
    from kernel_switchboard_triton.catalog.attention import PREFILL, PREFILL_FP8

    case = prefill_case(FP8_Q, DEVICE)
    problem = ksb.explain("attention.prefill", *case.args, **case.kwargs, backend="triton:prefill_fp8").problem
    assert "compute capability 8.9 below minimum 9.0" in " ".join(PREFILL_FP8.reasons(problem._replace(cc=(8, 9))))
    assert "dtype=float8_e4m3fn not supported" in " ".join(PREFILL.reasons(problem))


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [128, 16], ids=["tma", "pointer"])
def test_fp8_prefill_accuracy_against_bf16(page_size: int) -> None:
    """1x4096 causal, Llama-3-8B heads: the fp8 kernel (queries, keys, values and P in e4m3) against the float32
    reference on the same fp8 inputs (fp8's math tolerance), and both it and the bf16 kernel against the float32
    attention of the bf16 inputs (the error of the whole fp8 recipe, printed for docs/benchmarks.md). Most of the
    recipe's error is the inputs' quantisation to e4m3 (a half step of e4m3 at |v| ~ 4 is 0.125), which the float32
    attention of the quantised inputs shows alone; the kernel's own fp8 math (P in e4m3) may add at most 0.05 to it
    (an H200 measured 0.0156 and 0.0078 over quantisation errors of 0.141 and 0.195)."""
    spec = AttnSpec(BF16, "NHD", page_size, 32, 8, 128, kv_lens=(4096,), q_lens=(4096,), lse=True)
    q, qo, cache, table = prefill_case(spec, "cuda", seed=7).args
    k_scale = cache.k_pages.float().nan_to_num(0.0).abs().amax().item() / 448
    v_scale = cache.v_pages.float().nan_to_num(0.0).abs().amax().item() / 448
    q_scale = q.float().abs().amax().item() / 448
    cache8 = ksb.PagedKVCache((cache.k_pages.float() / k_scale).to(E4M3), (cache.v_pages.float() / v_scale).to(E4M3),
                              "NHD", k_scale, v_scale)
    q8 = (q.float() / q_scale).to(E4M3)
    got = ksb.attention.prefill(q8, qo, cache8, table, q_scale=q_scale, return_lse=True, backend="triton:prefill_fp8")
    same_inputs = ksb.attention.prefill(q8, qo, cache8, table, q_scale=q_scale, return_lse=True, backend="reference")
    assert_close(got[0], same_inputs[0], atol=0.1, rtol=0.1, what="fp8 kernel vs reference on fp8 inputs")
    exact = ksb.attention.prefill(q, qo, cache, table, backend="reference")  # float32 math on the bf16 inputs
    bf16 = ksb.attention.prefill(q, qo, cache, table, backend="triton")
    err_fp8 = (got[0].float() - exact).abs().max().item()
    err_quant = (same_inputs[0].float() - exact).abs().max().item()
    err_bf16 = (bf16.float() - exact).abs().max().item()
    print(f"fp8 prefill page {page_size}: max abs error {err_fp8:.4f} (quantised inputs alone {err_quant:.4f}; "
          f"bf16 kernel {err_bf16:.4f}) against float32")
    assert err_fp8 <= err_quant + 0.05 and err_bf16 < 0.02
