"""GPU checks of the Triton attention kernels at real sizes, and CUDA-graph capture of their plans.

Outputs are poisoned (NaN) before each run so a kernel that skips a row cannot pass; the
reference kernels compute in float32.
"""

from __future__ import annotations

import math

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.paged import PagedKVCache, PageTable
from kernel_switchboard.testing import assert_close, tolerance
from kernel_switchboard.testing.cases.attention import unwritten_slots

pytestmark = pytest.mark.gpu
FP8 = torch.float8_e4m3fn


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cuda").manual_seed(seed)


def _cache(kv_lens: list[int], page_size: int, kv_heads: int, head_dim: int, head_dim_v: int | None = None, *,
           dtype: torch.dtype = torch.bfloat16, layout: str = "NHD", fp8: bool = False,
           seed: int = 0) -> tuple[PagedKVCache, PageTable]:
    g = _gen(seed)
    dv = head_dim if head_dim_v is None else head_dim_v
    width = max(1, max(math.ceil(n / page_size) for n in kv_lens))
    num_pages = len(kv_lens) * width + 7
    bt = torch.randperm(num_pages, device="cuda", generator=g)[: len(kv_lens) * width].view(len(kv_lens), width)

    def pages(d: int) -> torch.Tensor:
        shape = (num_pages, page_size, kv_heads, d) if layout == "NHD" else (num_pages, kv_heads, page_size, d)
        return torch.randn(shape, device="cuda", generator=g)

    k, v = pages(head_dim), pages(dv)
    unused = unwritten_slots(bt, torch.tensor(kv_lens), num_pages, page_size)  # NaN: no kernel may read them
    unused = unused[:, :, None, None] if layout == "NHD" else unused[:, None, :, None]
    k, v = k.masked_fill(unused, float("nan")), v.masked_fill(unused, float("nan"))
    if fp8:
        cache = PagedKVCache((k * 2).to(FP8), (v * 2).to(FP8), layout, k_scale=0.5, v_scale=0.75)
    else:
        cache = PagedKVCache(k.to(dtype), v.to(dtype), layout)
    return cache, PageTable(bt.to(torch.int32), torch.tensor(kv_lens, dtype=torch.int32, device="cuda"))


def _q(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", generator=_gen(seed)).to(dtype)


def _indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")


def _close(got: tuple, want: tuple, dtype: torch.dtype) -> None:  # type: ignore[type-arg]
    atol, rtol = tolerance(dtype)
    for g, w in zip(got, want):
        assert_close(g, w, atol=atol, rtol=rtol)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("page_size", [1, 16, 32, 64, 128])
def test_decode_llama_shape(layout: str, page_size: int) -> None:
    lens = [1, 100, 2048, 4097, 777, 3000, 16, 5000]
    cache, table = _cache(lens, page_size, 8, 128, layout=layout)
    q = _q(len(lens), 32, 128)
    got = ksb.attention.decode(q, cache, table, return_lse=True, backend="triton")
    _close(got, ksb.attention.decode(q, cache, table, return_lse=True, backend="reference"), torch.bfloat16)


@pytest.mark.parametrize(("kwargs", "fp8", "dims", "dtype"), [
    ({"logits_soft_cap": 30.0}, False, (128, 128), torch.bfloat16),
    ({"window_left": 1000}, False, (128, 128), torch.float16),
    ({}, True, (128, 128), torch.bfloat16),
    ({}, False, (256, 256), torch.bfloat16),
    ({}, False, (64, 64), torch.float16),
    ({}, False, (192, 128), torch.bfloat16),
])
def test_decode_features(kwargs: dict, fp8: bool, dims: tuple[int, int], dtype: torch.dtype) -> None:  # type: ignore[type-arg]
    lens = [3000, 17, 1500, 8192]
    cache, table = _cache(lens, 16, 4, dims[0], dims[1], dtype=dtype, fp8=fp8)
    q = _q(len(lens), 16, dims[0], dtype=dtype)
    got = ksb.attention.decode(q, cache, table, return_lse=True, backend="triton", **kwargs)
    want = ksb.attention.decode(q, cache, table, return_lse=True, backend="reference", **kwargs)
    _close(got, want, FP8 if fp8 else dtype)


@pytest.mark.parametrize(("dims", "kwargs"), [
    ((128, 128), {}),
    ((128, 128), {"causal": False}),
    ((64, 64), {"window_left": 300}),
    ((128, 128), {"logits_soft_cap": 30.0}),
    ((256, 256), {}),
    ((192, 128), {}),
])
def test_prefill_paged_and_ragged(dims: tuple[int, int], kwargs: dict) -> None:  # type: ignore[type-arg]
    qo, kv = [1000, 1, 300, 1, 2048], [1000, 3000, 900, 17, 2048]  # prefill, decode, append, mixed
    d, dv = dims
    cache, table = _cache(kv, 16, 8, d, dv)
    q = _q(sum(qo), 32, d)
    args = (q, _indptr(qo), cache, table)
    got = ksb.attention.prefill(*args, return_lse=True, backend="triton", **kwargs)
    _close(got, ksb.attention.prefill(*args, return_lse=True, backend="reference", **kwargs), torch.bfloat16)
    k, v = _q(sum(kv), 8, d, seed=2), _q(sum(kv), 8, dv, seed=3)
    rargs = (q, k, v, _indptr(qo), _indptr(kv))
    got = ksb.attention.prefill_ragged(*rargs, return_lse=True, backend="triton", **kwargs)
    _close(got, ksb.attention.prefill_ragged(*rargs, return_lse=True, backend="reference", **kwargs), torch.bfloat16)


@pytest.mark.parametrize("layout", [None, "NHD", "HND"])
@pytest.mark.parametrize("causal", [True, False])
def test_prefill_soft_cap_takes_the_warp_specialised_gluon_kernel_on_hopper(layout: str | None, causal: bool,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16, head dim 128, cap 30, ragged K/V or pages of 128 slots: on sm_90 the default route is
    ``_prefill_gluon_ws`` (asserted, so the check cannot pass on the Triton kernel); long prefill, decode rows, an
    empty request and partial last tiles, against the float32 reference."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the warp-specialised Gluon prefill is an sm_90 kernel")
    from kernel_switchboard_triton import _prefill

    routes: list[object] = []
    real_descriptors = _prefill.gluon_ws_descriptors
    monkeypatch.setattr(_prefill, "gluon_ws_descriptors", lambda *a: routes.append(real_descriptors(*a)) or routes[-1])
    qo, kv = [2048, 1, 0, 333, 1], [2048, 4100, 500, 900, 129]
    q = _q(sum(qo), 32, 128)
    if layout is None:
        k, v = _q(sum(kv), 8, 128, seed=2), _q(sum(kv), 8, 128, seed=3)
        args: tuple = (q, k, v, _indptr(qo), _indptr(kv))  # type: ignore[type-arg]
        op = ksb.attention.prefill_ragged
    else:
        cache, table = _cache(kv, 128, 8, 128, layout=layout)
        args, op = (q, _indptr(qo), cache, table), ksb.attention.prefill
    kwargs = {"logits_soft_cap": 30.0, "causal": causal, "return_lse": True}
    got = op(*args, backend="triton", **kwargs)
    assert routes and routes[0] is not None, "the soft-capped bf16 prefill did not take the Gluon kernel"
    _close(got, op(*args, backend="reference", **kwargs), torch.bfloat16)


def test_prefill_fp8_hnd() -> None:
    qo, kv = [512, 1, 64], [512, 700, 1000]
    cache, table = _cache(kv, 32, 8, 128, layout="HND", fp8=True)
    q = _q(sum(qo), 32, 128)
    args = (q, _indptr(qo), cache, table)
    _close(ksb.attention.prefill(*args, return_lse=True, backend="triton"),
           ksb.attention.prefill(*args, return_lse=True, backend="reference"), FP8)


BF16, F16 = torch.bfloat16, torch.float16


@pytest.mark.parametrize(("page_size", "kernel", "splits", "dtype"), [
    (1, "triton", None, BF16), (16, "triton", None, BF16), (64, "triton", None, BF16), (128, "triton", None, BF16),
    (64, "gluon", None, BF16), (64, "gluon", 1, BF16), (128, "gluon", 3, BF16), (64, "gluon", None, F16),
    (64, "gluon_ws", None, BF16), (64, "gluon_ws", 1, BF16), (128, "gluon_ws", 3, BF16), (64, "gluon_ws", None, F16)],
    ids=str)
def test_mla_decode_deepseek_shape(page_size: int, kernel: str, splits: int | None, dtype: torch.dtype,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``gluon_ws``: the warp-specialised Gluon kernel (the Hopper default on TMA-ready pages) with the default, one
    and three KV splits; ``gluon``: the Gluon kernel without warp specialisation; ``triton``: the Triton kernels (TMA
    or pointer loads)."""
    from kernel_switchboard_triton import _mla

    real_config = _mla.mla_config
    if kernel != "triton":
        if torch.cuda.get_device_capability()[0] != 9:
            pytest.skip("the Gluon MLA kernels use Hopper's wgmma (sm_90 only)")
        assert real_config(torch.device("cuda"), 4, 128, 8192, 64).gluon_ws  # the default here
    monkeypatch.setattr(_mla, "mla_config", lambda *a: real_config(*a, splits)._replace(
        gluon=kernel != "triton", gluon_ws=kernel == "gluon_ws"))
    _check_mla_on_deepseek_pages(page_size, dtype)


@pytest.mark.parametrize(("heads", "page_size", "splits", "dtype"), [
    (128, 64, None, BF16), (128, 64, 1, BF16), (128, 128, 3, BF16), (128, 64, None, F16), (96, 64, None, BF16),
    (192, 64, 2, BF16)], ids=str)
def test_mla_decode_on_2cta_clusters(heads: int, page_size: int, splits: int | None, dtype: torch.dtype,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``MLAConfig.cluster``: the warp-specialised Gluon kernel on 2-CTA clusters of 128 heads that share each latent
    tile (TMA multicast), with the default, one and three splits; 96 heads (the second CTA's rows partly past the
    end) and 192 (a second cluster with one CTA's heads only)."""
    from kernel_switchboard_triton import _mla, _mla_gluon_ws
    from kernel_switchboard_triton._common import gluon_clusters

    if torch.cuda.get_device_capability()[0] != 9 or not gluon_clusters():
        pytest.skip("the 2-CTA MLA kernel needs Hopper (wgmma) and Triton >= 3.9's multi-CTA Gluon")
    real_config, real_launch = _mla.mla_config, _mla_gluon_ws.launch
    monkeypatch.setattr(_mla, "mla_config", lambda *a: real_config(*a, splits)._replace(cluster=True))
    launched: list[int] = []
    monkeypatch.setattr(_mla_gluon_ws, "launch", lambda *a, ctas=1: (launched.append(ctas), real_launch(*a, ctas=ctas)))
    _check_mla_on_deepseek_pages(page_size, dtype, heads)
    assert launched == [2]  # the cluster kernel ran, not another one


@pytest.mark.parametrize(("heads", "splits"), [(16, None), (16, 1), (32, 3), (8, None)], ids=str)
def test_mla_decode_fewer_heads_than_a_tile_on_gluon(heads: int, splits: int | None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """16 heads (DeepSeek-V3 on eight-way tensor parallelism), 32 and 8 on the warp-specialised Gluon kernel's
    64-row tiles: the rows past the heads are computed on zero queries and never stored."""
    from kernel_switchboard_triton import _mla

    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon MLA kernels use Hopper's wgmma (sm_90 only)")
    default = _mla.mla_config(torch.device("cuda"), 5, heads, 8192, 64)
    assert (default.block_h, default.gluon_ws) == (64, True), default  # the default on 64-token pages
    real_config = _mla.mla_config
    monkeypatch.setattr(_mla, "mla_config", lambda *a: real_config(*a, splits))
    _check_mla_on_deepseek_pages(64, BF16, heads)
    assert _mla.mla_config(torch.device("cuda"), 5, heads, 8192, 16).block_h < 64  # 16-token pages: no Gluon tiles


def _check_mla_on_deepseek_pages(page_size: int, dtype: torch.dtype, heads: int = 128) -> None:
    """The Triton backend's MLA decode against the reference on five requests of 0-5000 tokens whose unwritten page
    slots hold NaN."""
    lens = [5000, 1, 0, 2049, 700]  # an empty request: zero tiles in every split, out 0 and lse -inf
    g = _gen(4)
    width = max(math.ceil(n / page_size) for n in lens)
    pages = len(lens) * width + 3
    ckv = (torch.randn(pages, page_size, 512, device="cuda", generator=g) * 0.3).to(dtype)
    kpe = torch.randn(pages, page_size, 64, device="cuda", generator=g).to(dtype)
    bt = torch.randperm(pages, device="cuda", generator=g)[: len(lens) * width].view(len(lens), width).to(torch.int32)
    written = torch.zeros(pages, page_size, dtype=torch.bool, device="cuda")
    for i, n in enumerate(lens):
        pos = torch.arange(n, device="cuda")
        written[bt[i, pos // page_size].long(), pos % page_size] = True
    ckv[~written] = float("nan")  # unwritten slots must not reach the output (page 64: the TMA kernel's tail)
    kpe[~written] = float("nan")
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device="cuda"))
    qn, qp = _q(len(lens), heads, 512, dtype=dtype), _q(len(lens), heads, 64, dtype=dtype, seed=5)
    args = (qn, qp, ckv, kpe, table)
    _close(ksb.attention.mla_decode(*args, sm_scale=0.07, return_lse=True, backend="triton"),
           ksb.attention.mla_decode(*args, sm_scale=0.07, return_lse=True, backend="reference"), dtype)


def test_mla_decode_on_views_of_one_latent_cache() -> None:
    """[ckv | kpe] in one (P, 64, 576) cache (vLLM's layout): TMA descriptors over the strided views."""
    lens = [3000, 64, 1]
    g = _gen(11)
    cache = (torch.randn(200, 64, 576, device="cuda", generator=g) * 0.3).to(torch.bfloat16)
    bt = torch.randperm(200, device="cuda", generator=g)[:3 * 47].view(3, 47).to(torch.int32)
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device="cuda"))
    args = (_q(3, 128, 512), _q(3, 128, 64, seed=5), cache[..., :512], cache[..., 512:], table)
    _close(ksb.attention.mla_decode(*args, sm_scale=0.07, return_lse=True, backend="triton"),
           ksb.attention.mla_decode(*args, sm_scale=0.07, return_lse=True, backend="reference"), torch.bfloat16)


def test_mla_decode_cuda_graph_capture_and_replay() -> None:
    """MLA decode (the warp-specialised Gluon kernel on sm_90, split KV) captured once, replayed on new queries and
    latent rows written in place: the capture keeps the TMA descriptors and the split count of the first call."""
    lens = [3000, 64, 1, 1500]
    g = _gen(12)
    ckv = (torch.randn(200, 64, 512, device="cuda", generator=g) * 0.3).to(torch.bfloat16)
    kpe = torch.randn(200, 64, 64, device="cuda", generator=g).to(torch.bfloat16)
    bt = torch.randperm(200, device="cuda", generator=g)[:4 * 47].view(4, 47).to(torch.int32)
    table = PageTable(bt, torch.tensor(lens, dtype=torch.int32, device="cuda"))
    qn, qp = _q(4, 128, 512), _q(4, 128, 64, seed=5)
    args = (qn, qp, ckv, kpe, table)
    ksb.attention.mla_decode(*args, return_lse=True, backend="triton")  # warm-up compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = ksb.attention.mla_decode(*args, return_lse=True, backend="triton")
    for step in range(2):
        qn.copy_(_q(4, 128, 512, seed=20 + step))
        qp.copy_(_q(4, 128, 64, seed=30 + step))
        ckv[int(bt[0, 0])].copy_(torch.randn(64, 512, device="cuda", generator=g).to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        _close((out, lse), ksb.attention.mla_decode(*args, return_lse=True, backend="reference"), torch.bfloat16)


def test_decode_plan_cuda_graph_capture_and_replay() -> None:
    lens = [100, 2000, 3990, 33]
    cache, written = _cache([n + 3 for n in lens], 16, 8, 128, layout="HND")  # the three replays' tokens
    table = PageTable(written.block_table, torch.tensor(lens, dtype=torch.int32, device="cuda"))
    plan = ksb.attention.plan_decode(table, num_q_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16,
                                     layout="HND", page_size=16, return_lse=True, max_kv_len=4000, backend="triton")
    assert plan.kernel.id == "triton:decode_splitkv"
    q = _q(4, 32, 128)
    out = torch.full((4, 32, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    lse = torch.full((4, 32), float("nan"), device="cuda")
    plan.run(q, cache, out=out, lse=lse)  # warm-up compiles outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, cache, out=out, lse=lse)
    for step in range(3):
        q.copy_(_q(4, 32, 128, seed=10 + step))
        table.seq_lens.add_(1)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        now = PageTable(table.block_table, table.seq_lens)
        _close((out, lse), ksb.attention.decode(q, cache, now, return_lse=True, backend="reference"), torch.bfloat16)


def test_prefill_plan_cuda_graph_capture_and_replay() -> None:
    qo, kv = [300, 1, 1, 64], [300, 900, 40, 1000]
    cache, table = _cache(kv, 16, 8, 128)
    qo_indptr = _indptr(qo)
    plan = ksb.attention.plan_prefill(table, qo_indptr, num_q_heads=32, num_kv_heads=8, head_dim=128,
                                      dtype=torch.bfloat16, page_size=16, return_lse=True, backend="triton")
    assert plan.kernel.id == "triton:prefill_paged"
    q = _q(sum(qo), 32, 128)
    out = torch.empty(sum(qo), 32, 128, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(sum(qo), 32, device="cuda")
    plan.run(q, cache, out=out, lse=lse)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        plan.run(q, cache, out=out, lse=lse)
    q.copy_(_q(sum(qo), 32, 128, seed=9))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _close((out, lse), ksb.attention.prefill(q, qo_indptr, cache, table, return_lse=True, backend="reference"),
           torch.bfloat16)


def test_append_then_decode_on_gpu() -> None:
    cache, table = _cache([64, 200], 16, 8, 128, fp8=True)
    k, v = _q(2, 8, 128, seed=6), _q(2, 8, 128, seed=7)
    pos = torch.tensor([64, 200], dtype=torch.int32, device="cuda")
    got = PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "NHD", k_scale=0.5, v_scale=0.75)
    want = PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "NHD", k_scale=0.5, v_scale=0.75)
    ksb.kv_cache.append(k, v, got, table, pos, backend="triton")
    ksb.kv_cache.append(k, v, want, table, pos, backend="reference")
    assert torch.equal(got.k_pages.view(torch.uint8), want.k_pages.view(torch.uint8))
    assert torch.equal(got.v_pages.view(torch.uint8), want.v_pages.view(torch.uint8))
