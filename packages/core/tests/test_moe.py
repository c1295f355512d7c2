"""MoE reference kernels against independent formulations (per-token loops), and the moe API."""

from __future__ import annotations

import math

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.reference.moe import dequantize_block
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases import moe as cases

test_reference_conformance = conformance_test("reference", device="cpu", size="small",
                                              ops=("moe.route", "moe.fused_moe"))

if torch.cuda.is_available():  # the large (model-sized) cases on the GPU; built only where a GPU is
    test_reference_conformance_gpu = conformance_test("reference", device="cuda", size="large",
                                                      ops=("moe.route", "moe.fused_moe"))


# -- independent formulations --------------------------------------------------------------------
def _python_route(logits: list[float], top_k: int, scoring: str, renormalize: bool, groups: int | None,
                  topk_group: int | None, bias: list[float] | None, factor: float) -> list[tuple[int, float]]:
    """One token's routing in plain Python: (expert, weight) pairs, best selection score first."""
    e = len(logits)
    if scoring == "softmax":
        m = max(logits)
        z = sum(math.exp(v - m) for v in logits)
        scores = [math.exp(v - m) / z for v in logits]
    else:
        scores = [1 / (1 + math.exp(-v)) for v in logits]
    sel = [s + (bias[i] if bias else 0.0) for i, s in enumerate(scores)]
    allowed = set(range(e))
    if groups:
        size = e // groups
        members = [list(range(g * size, (g + 1) * size)) for g in range(groups)]
        if bias:
            gscore = [sum(sorted((sel[i] for i in m), reverse=True)[:2]) for m in members]
        else:
            gscore = [max(sel[i] for i in m) for m in members]
        best_groups = sorted(range(groups), key=lambda g: -gscore[g])[:topk_group]
        allowed = {i for g in best_groups for i in members[g]}
    chosen = sorted(allowed, key=lambda i: -sel[i])[:top_k]
    weights = [scores[i] for i in chosen]
    if renormalize:
        total = sum(weights)
        weights = [w / total for w in weights]
    return [(i, w * factor) for i, w in zip(chosen, weights)]


def _dense_moe(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Per token, per chosen expert, in float64: Σ_j w_j · (silu(x G^T) * (x U^T)) D^T."""
    inter = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            g, u, d = w13[e, :inter].double(), w13[e, inter:].double(), w2[e].double()
            h = torch.nn.functional.silu(g @ x[t].double()) * (u @ x[t].double())
            out[t] += float(w[t, j]) * (d @ h)
    return out


ROUTE_SPECS = [
    (8, 2, "softmax", True, None, None, False, 1.0),
    (16, 4, "softmax", False, None, None, False, 1.0),
    (16, 3, "sigmoid", True, None, None, True, 1.0),
    (32, 4, "sigmoid", True, 8, 4, True, 2.5),
    (24, 3, "softmax", False, 6, 2, False, 1.0),
    (12, 2, "sigmoid", False, 3, 1, False, 0.5),
]


@pytest.mark.parametrize(("experts", "top_k", "scoring", "renormalize", "groups", "topk_group", "biased", "factor"),
                         ROUTE_SPECS)
def test_route_matches_python(experts: int, top_k: int, scoring: str, renormalize: bool, groups: int | None,
                              topk_group: int | None, biased: bool, factor: float) -> None:
    logits = torch.randn(9, experts)
    bias = torch.rand(experts) * 0.2 if biased else None
    w, ids = ksb.moe.route(logits, top_k, scoring=scoring, renormalize=renormalize, num_expert_group=groups,
                           topk_group=topk_group, correction_bias=bias, routed_scaling_factor=factor)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == ids.shape == (9, top_k)
    for t in range(9):
        want = _python_route(logits[t].double().tolist(), top_k, scoring, renormalize, groups, topk_group,
                             None if bias is None else bias.double().tolist(), factor)
        assert ids[t].tolist() == [i for i, _ in want]
        torch.testing.assert_close(w[t].double(), torch.tensor([v for _, v in want], dtype=torch.float64),
                                   atol=1e-6, rtol=1e-5)


def test_grouped_route_only_picks_kept_groups() -> None:
    logits = torch.randn(50, 64)
    bias = torch.randn(64) * 0.1
    _, ids = ksb.moe.route(logits, 8, scoring="sigmoid", num_expert_group=8, topk_group=3, correction_bias=bias)
    groups = (ids // 8).long()
    assert all(len(set(row.tolist())) <= 3 for row in groups)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_moe_matches_dense_loop(dtype: torch.dtype) -> None:
    t, h, i, e, k = 6, 48, 24, 5, 2
    x = torch.randn(2, 3, h).to(dtype)  # leading dims are kept
    logits = torch.randn(2, 3, e)
    w13 = (torch.randn(e, 2 * i, h) / h ** 0.5).to(dtype)
    w2 = (torch.randn(e, h, i) / i ** 0.5).to(dtype)
    y = ksb.moe.fused_moe(x, logits, w13, w2, k)
    assert y.shape == x.shape and y.dtype == dtype
    w, ids = ksb.moe.route(logits.view(t, e), k)
    want = _dense_moe(x.view(t, h), w, ids, w13, w2)
    atol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(y.view(t, h).double(), want, atol=atol, rtol=atol)


def test_fp8_block_weights_match_dequantized_dense_loop() -> None:
    t, h, i, e, k = 5, 256, 192, 4, 2  # several 128x128 blocks, ragged last blocks
    g = torch.Generator().manual_seed(0)
    w13, w2, s13, s2 = cases.expert_weights(e, h, i, torch.float32, True, g, torch.device("cpu"))
    assert w13.dtype == torch.float8_e4m3fn and s13.shape == (e, 3, 2) and s2.shape == (e, 2, 2)
    x = torch.randn(t, h).to(torch.bfloat16)
    logits = torch.randn(t, e)
    y = ksb.moe.fused_moe(x, logits, w13, w2, k, w13_scale=s13, w2_scale=s2)
    w, ids = ksb.moe.route(logits, k)
    # dequantize element by element from the block index, independently of dequantize_block
    r, c = torch.arange(2 * i)[:, None] // 128, torch.arange(h)[None, :] // 128
    d13 = w13.double() * s13.double()[:, r, c]
    r, c = torch.arange(h)[:, None] // 128, torch.arange(i)[None, :] // 128
    d2 = w2.double() * s2.double()[:, r, c]
    torch.testing.assert_close(y.double(), _dense_moe(x, w, ids, d13, d2), atol=2e-2, rtol=2e-2)


def test_block_quantization_round_trip() -> None:
    w = torch.randn(3, 300, 130)
    q, s = cases.quantize_fp8_block(w)
    assert q.shape == w.shape and s.shape == (3, 3, 2)
    err = (dequantize_block(q, s) - w).abs() / w.abs().amax()
    assert float(err.max()) < 0.07  # e4m3: 3 mantissa bits


def test_experts_accepts_external_routing() -> None:
    t, h, i, e = 4, 32, 16, 3
    x = torch.randn(t, h)
    w13, w2 = torch.randn(e, 2 * i, h) / 6, torch.randn(e, h, i) / 4
    ids = torch.tensor([[0, 2], [1, 1], [2, 0], [0, 0]])  # int64, repeated experts allowed
    w = torch.rand(t, 2).half()
    y = ksb.moe.experts(x, w, ids, w13, w2)
    torch.testing.assert_close(y.double(), _dense_moe(x, w.float(), ids, w13, w2), atol=1e-5, rtol=1e-5)
    assert ksb.moe.experts(x[:0], w[:0], ids[:0], w13, w2).shape == (0, h)


def test_bad_inputs_name_the_argument() -> None:
    t, h, i, e = 4, 32, 16, 8
    x, logits = torch.randn(t, h), torch.randn(t, e)
    w13, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    err = ksb.InvalidArgumentError
    for kwargs, name in (({"scoring": "relu"}, "scoring"), ({"num_expert_group": 3, "topk_group": 1}, "num_expert_group"),
                         ({"topk_group": 2}, "topk_group"), ({"num_expert_group": 4, "topk_group": 5}, "topk_group"),
                         ({"num_expert_group": 4, "topk_group": 1, "top_k": 3}, "top_k"), ({"top_k": 0}, "top_k"),
                         ({"top_k": 9}, "top_k"), ({"correction_bias": torch.zeros(7)}, r"correction_bias\.shape"),
                         ({"routed_scaling_factor": 0.0}, "routed_scaling_factor")):
        kw = {"top_k": 2, **kwargs}
        with pytest.raises(err, match=rf"^{name}"):
            ksb.moe.route(logits, kw.pop("top_k"), **kw)
    with pytest.raises(err, match=r"^router_logits\.shape"):
        ksb.moe.fused_moe(x, logits[:3], w13, w2, 2)
    with pytest.raises(err, match=r"^router_logits\.shape"):
        ksb.moe.fused_moe(x, logits[:, :7], w13, w2, 2)
    with pytest.raises(err, match=r"^w2\.shape"):
        ksb.moe.fused_moe(x, logits, w13, w2[:, :, :8], 2)
    with pytest.raises(err, match=r"^w13\.shape"):
        ksb.moe.fused_moe(x, logits, w13[:, :, :16], w2, 2)
    with pytest.raises(err, match=r"^w13\.dtype"):
        ksb.moe.fused_moe(x.half(), logits, w13, w2, 2)
    fp8 = w13.to(torch.float8_e4m3fn), w2.to(torch.float8_e4m3fn)
    with pytest.raises(err, match=r"^w13_scale"):
        ksb.moe.fused_moe(x, logits, *fp8, 2)
    with pytest.raises(err, match=r"^w2_scale\.shape"):
        ksb.moe.fused_moe(x, logits, *fp8, 2, w13_scale=torch.ones(e, 1, 1), w2_scale=torch.ones(e, 2, 1))
    with pytest.raises(err, match=r"^w13_scale"):
        ksb.moe.fused_moe(x, logits, w13, w2, 2, w13_scale=torch.ones(e, 1, 1))
    with pytest.raises(err, match=r"^topk_ids="):
        ksb.moe.experts(x, torch.ones(t, 2), torch.full((t, 2), e), w13, w2)
    with pytest.raises(err, match=r"^topk_ids\.shape"):
        ksb.moe.experts(x, torch.ones(t, 2), torch.zeros(t, 3, dtype=torch.int32), w13, w2)


def test_explain_fused_moe_reports_the_experts_choice() -> None:
    x, logits = torch.randn(4, 32), torch.randn(4, 8)
    sel = ksb.explain("moe.fused_moe", x, logits, torch.randn(8, 32, 32), torch.randn(8, 32, 16), 2)
    assert sel.op == "moe.fused_moe" and sel.problem.intermediate == 16 and sel.problem.quant == "none"


def test_torch_compile_fullgraph_traces_moe_ops() -> None:
    t, h, i, e = 5, 32, 16, 8
    x, logits = torch.randn(t, h), torch.randn(t, e)
    w13, w2 = torch.randn(e, 2 * i, h) / 6, torch.randn(e, h, i) / 4
    bias = torch.rand(e) * 0.1

    def f(x: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w, ids = ksb.moe.route(logits, 2, scoring="sigmoid", num_expert_group=4, topk_group=2, correction_bias=bias)
        return w * 2, ids, ksb.moe.fused_moe(x, logits, w13, w2, 2) + 1

    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x, logits), f(x, logits))


def test_opcheck_moe_ops() -> None:
    t, h, i, e = 4, 32, 16, 8
    x, logits = torch.randn(t, h), torch.randn(t, e)
    w13, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    torch.library.opcheck(torch.ops.ksb.moe_route.default, (logits, 3, "sigmoid", True, 4, 2, torch.rand(e), 2.5, None))
    w, ids = ksb.moe.route(logits, 2)
    torch.library.opcheck(torch.ops.ksb.moe_experts.default, (x, w, ids, w13, w2, None, None, True, None))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tf32", [False, True])
def test_reference_on_gpu_matches_cpu(tf32: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference, on both devices (``backend="reference"``: with GPU backends installed the automatic choice is
    a fast kernel that quantizes activations, a different computation). Its definition is float32 math without
    TF32, whatever the global setting: the two results differ only by float32 summation order, so after the
    rounding to bf16 they agree to one bf16 ulp (2**-7 relative, the worst case in a binade) plus, for outputs
    near zero, float32 accumulation error (about n * 2**-24 of the summed terms; 1e-3 of the output scale bounds it
    with a wide margin)."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", tf32)
    g = torch.Generator().manual_seed(1)
    w13, w2, s13, s2 = cases.expert_weights(8, 256, 128, torch.bfloat16, True, g, torch.device("cpu"))
    x, logits = torch.randn(16, 256, generator=g).bfloat16(), torch.randn(16, 8, generator=g)
    ref = {"backend": "reference", "route_backend": "reference"}
    want = ksb.moe.fused_moe(x, logits, w13, w2, 2, w13_scale=s13, w2_scale=s2, **ref)
    got = ksb.moe.fused_moe(*(a.cuda() for a in (x, logits, w13, w2)), 2, w13_scale=s13.cuda(), w2_scale=s2.cuda(),
                            **ref)
    assert torch.backends.cuda.matmul.allow_tf32 == tf32  # the reference restores the caller's setting
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got.cpu(), want, atol=1e-3 * scale, rtol=2**-7)


@pytest.mark.parametrize(("op", "shape"), [("moe.route", {"tokens": "16", "experts": "64", "top_k": "6", "grouped": "1"}),
                                           ("moe.fused_moe", {"tokens": "6", "hidden": "128", "inter": "64", "fp8": "1"})])
def test_example_cases_run(op: str, shape: dict[str, str]) -> None:
    cases.example(op, torch.device("cpu"), **shape).compare("reference")


def _w8a8_experts(x: torch.Tensor, w: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
                  s13: torch.Tensor, s2: torch.Tensor) -> torch.Tensor:
    """What fast fp8 kernels do: activations quantized per token and 128-group to e4m3, bf16 intermediate."""
    def quant(a: torch.Tensor) -> torch.Tensor:
        n = a.shape[1]
        g = torch.nn.functional.pad(a.float(), (0, -n % 128)).view(a.shape[0], -1, 128)
        s = g.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448
        return ((g / s).to(torch.float8_e4m3fn).float() * s).view(a.shape[0], -1)[:, :n]

    inter = w2.shape[2]
    y = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            h = quant(x[t:t + 1]) @ dequantize_block(w13[e], s13[e]).T
            a = (torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]).bfloat16()
            y[t] += float(w[t, j]) * (quant(a) @ dequantize_block(w2[e], s2[e]).T)[0]
    return y.to(x.dtype)


def test_fp8_check_accepts_w8a8_kernels_and_rejects_wrong_scales() -> None:
    case = next(c for c in cases.cases("moe.fused_moe", torch.device("cpu"), "small") if c.id.startswith("bf16-fp8"))
    x, logits, w13, w2, k = case.args
    s13, s2 = case.kwargs["w13_scale"], case.kwargs["w2_scale"]
    w, ids = ksb.moe.route(logits, k)

    def run(backend: str | None = None) -> torch.Tensor:
        return case.run("reference")[1] if backend == "reference" else _w8a8_experts(x, w, ids, w13, w2, s13, s2)

    case.check(run)
    swapped = s13.flip(1)  # block scales applied to the wrong blocks

    def wrong(backend: str | None = None) -> torch.Tensor:
        return case.run("reference")[1] if backend == "reference" else _w8a8_experts(x, w, ids, w13, w2, swapped, s2)

    with pytest.raises(AssertionError):
        case.check(wrong)
