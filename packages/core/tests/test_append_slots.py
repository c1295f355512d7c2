"""kv_cache.append_slots (the slot-mapping form of vLLM and SGLang) against a Python loop and against
kv_cache.append; padding tokens, both layouts, fp8, engine-shaped K|V views, bad inputs, compile, opcheck."""

from __future__ import annotations

import pytest
import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing import conformance_test
from kernel_switchboard.testing.cases.kv_cache import append_case, append_slots_case, slots_of

test_reference_conformance = conformance_test("reference", device="cpu", size="small", ops=("kv_cache.append_slots",))

F16, BF16, F32, E4M3, E5M2 = torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e5m2


def _loop(k: torch.Tensor, v: torch.Tensor, cache: ksb.PagedKVCache, slots: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The expected pages after the append, written one token at a time (padding skipped)."""
    k_pages, v_pages = cache.k_pages.clone(), cache.v_pages.clone()
    ps = cache.page_size
    for t in range(k.shape[0]):
        slot = int(slots[t])
        if slot < 0:
            continue
        page, off = slot // ps, slot % ps
        for src, dst, scale in ((k, k_pages, cache.k_scale), (v, v_pages, cache.v_scale)):
            val = (src[t].float() / scale).clamp(-448, 448) if scale is not None else src[t]
            if cache.layout == "NHD":
                dst[page, off] = val.to(dst.dtype)
            else:
                dst[page, :, off] = val.to(dst.dtype)
    return k_pages, v_pages


def _bytes_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@pytest.mark.parametrize(("dtype", "layout", "ps", "lens", "new", "kv_dtype", "padding", "slot_dtype"), [
    (F32, "NHD", 4, (1, 9, 13), None, None, 0, torch.int64),
    (F16, "HND", 4, (5, 9), (5, 2), None, 3, torch.int32),
    (BF16, "NHD", 1, (3, 7, 2), (1, 7, 2), None, 2, torch.int64),
    (F32, "HND", 16, (12, 30), (3, 1), E4M3, 1, torch.int64),
    (F16, "NHD", 1, (6, 2), None, E4M3, 5, torch.int32),
])
def test_append_slots_matches_a_python_loop(dtype: torch.dtype, layout: str, ps: int, lens: tuple[int, ...],
                                            new: tuple[int, ...] | None, kv_dtype: torch.dtype | None, padding: int,
                                            slot_dtype: torch.dtype) -> None:
    case = append_slots_case(dtype, layout, ps, 2, 16, lens, new, "cpu", kv_dtype, padding=padding,
                             slot_dtype=slot_dtype, seed=3)
    k, v, cache, slots = case.args
    assert int((slots < 0).sum()) == padding
    want_k, want_v = _loop(k, v, cache, slots)
    ksb.kv_cache.append_slots(k, v, cache, slots)
    assert _bytes_equal(cache.k_pages, want_k) and _bytes_equal(cache.v_pages, want_v)


@pytest.mark.parametrize("kv_dtype", [None, E4M3])
def test_append_slots_writes_what_append_writes(kv_dtype: torch.dtype | None) -> None:
    """The same tokens through (request, position) and through their slots give the same bytes."""
    case = append_case(BF16, "HND", 4, 2, 16, (9, 3, 14), (4, 3, 2), "cpu", kv_dtype, seed=5)
    k, v, cache, table, positions, rows = case.args
    slots = torch.tensor(slots_of(table.block_table, rows.tolist(), positions.tolist(), 4))
    by_slot = ksb.PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "HND",
                               *((cache.k_scale, cache.v_scale) if kv_dtype else (None, None)))
    ksb.kv_cache.append(k, v, cache, table, positions, rows)
    ksb.kv_cache.append_slots(k, v, by_slot, slots)
    assert _bytes_equal(cache.k_pages, by_slot.k_pages) and _bytes_equal(cache.v_pages, by_slot.v_pages)


def test_only_padding_writes_nothing() -> None:
    k, v, cache, _ = append_slots_case(F32, "NHD", 4, 2, 16, (3, 5), None, "cpu").args
    before = (cache.k_pages.clone(), cache.v_pages.clone())
    ksb.kv_cache.append_slots(k, v, cache, torch.full((k.shape[0],), -1, dtype=torch.int64))
    assert torch.equal(cache.k_pages, before[0]) and torch.equal(cache.v_pages, before[1])
    ksb.kv_cache.append_slots(k[:0], v[:0], cache, torch.empty(0, dtype=torch.int64))  # no tokens at all
    assert torch.equal(cache.k_pages, before[0])


@pytest.mark.parametrize(("kv_dtype", "layout"), [(None, "HND"), (E4M3, "HND"), (None, "NHD"), (E5M2, "NHD")])
def test_engine_shaped_kv_views(kv_dtype: torch.dtype | None, layout: str) -> None:
    """K and V as halves of one (pages, heads, slots, 2 * D) tensor (vLLM's cache) or of one (pages, slots, heads,
    2 * D) tensor: strided views, written in place with nothing outside their half touched."""
    heads, d, ps, pages = 2, 16, 4, 6
    dtype = kv_dtype or F16
    g = torch.Generator().manual_seed(0)
    shape = (pages, heads, ps, 2 * d) if layout == "HND" else (pages, ps, heads, 2 * d)
    kv = torch.randn(shape, generator=g).to(dtype)
    scales = (0.25, 4.0) if kv_dtype else (None, None)
    cache = ksb.PagedKVCache(kv[..., :d], kv[..., d:], layout, *scales)
    k = torch.randn(5, heads, d, generator=g).to(F16)
    v = torch.randn(5, heads, d, generator=g).to(F16)
    slots = torch.tensor([3, -1, 17, 8, 23])
    dense = ksb.PagedKVCache(kv[..., :d].contiguous(), kv[..., d:].contiguous(), layout, *scales)
    want = _loop(k, v, dense, slots)
    ksb.kv_cache.append_slots(k, v, cache, slots)
    assert _bytes_equal(cache.k_pages, want[0]) and _bytes_equal(cache.v_pages, want[1])


def test_append_then_decode_sees_the_new_token() -> None:
    """Page size 1 (every token its own page, SGLang's default): append by slot, then decode attends to it."""
    k, v, cache, slots = append_slots_case(F32, "NHD", 1, 2, 16, (6, 11), None, "cpu", padding=2, seed=1).args
    ksb.kv_cache.append_slots(k, v, cache, slots)
    real = slots >= 0
    block_table = torch.tensor([[int(s)] for s in slots[real]], dtype=torch.int32)  # each request's last page
    table = ksb.PageTable(block_table, torch.ones(2, dtype=torch.int32))
    q = torch.randn(2, 4, 16)
    out = ksb.attention.decode(q, cache, table)
    torch.testing.assert_close(out, v[real].repeat_interleave(2, dim=1), atol=1e-6, rtol=1e-6)


def test_append_slots_bad_inputs_name_the_argument() -> None:
    k, v, cache, slots = append_slots_case(F32, "NHD", 4, 2, 16, (5, 9), (5, 2), "cpu", padding=1).args
    too_far = slots.clone()
    too_far[2] = cache.num_pages * cache.page_size
    bad = {
        r"k\.shape": lambda: ksb.kv_cache.append_slots(k[:, :1], v, cache, slots),
        r"k\.dtype": lambda: ksb.kv_cache.append_slots(k.half(), v.half(), cache, slots),
        r"v=": lambda: ksb.kv_cache.append_slots(k, v[:3], cache, slots),
        r"slot_mapping\.dtype": lambda: ksb.kv_cache.append_slots(k, v, cache, slots.float()),
        r"slot_mapping\.shape.*\(8,\)": lambda: ksb.kv_cache.append_slots(k, v, cache, slots[:2]),
        r"slot_mapping=.*at token 2.*negative for a padding token": lambda: ksb.kv_cache.append_slots(k, v, cache,
                                                                                                     too_far),
        r"slot_mapping='non-contiguous'": lambda: ksb.kv_cache.append_slots(k, v, cache, slots.repeat(2)[::2]),
        r"cache=": lambda: ksb.kv_cache.append_slots(k, v, slots, slots),
        r"k\.stride": lambda: ksb.kv_cache.append_slots(torch.randn(8, 16, 2).transpose(1, 2), v, cache, slots),
    }
    before = cache.k_pages.clone()
    for pattern, call in bad.items():
        with pytest.raises(ksb.InvalidArgumentError, match=pattern):
            call()
    assert torch.equal(cache.k_pages, before), "a rejected append must not write"


def test_torch_compile_fullgraph_appends_by_slot() -> None:
    k, v, cache, slots = append_slots_case(F32, "HND", 4, 2, 16, (6, 11), (2, 3), "cpu", padding=2).args
    eager = ksb.PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone(), "HND")

    def step(k: torch.Tensor, v: torch.Tensor, c: ksb.PagedKVCache) -> None:
        ksb.kv_cache.append_slots(k, v, c, slots)

    torch.compile(step, fullgraph=True, backend="aot_eager")(k, v, cache)
    step(k, v, eager)
    assert torch.equal(cache.k_pages, eager.k_pages) and torch.equal(cache.v_pages, eager.v_pages)


def test_opcheck_append_slots() -> None:
    k, v, cache, slots = append_slots_case(F32, "NHD", 4, 2, 16, (5, 9), (5, 2), "cpu", padding=1).args
    torch.library.opcheck(torch.ops.ksb.kv_cache_append_slots.default,
                          (k, v, cache.k_pages, cache.v_pages, "NHD", None, None, None, None, slots, True, None))


def test_explain_names_the_problem() -> None:
    case = append_slots_case(BF16, "HND", 16, 2, 64, (20, 3), (4, 1), "cpu", E4M3, padding=3)
    selection = ksb.explain("kv_cache.append_slots", *case.args)
    assert selection.kernel.id == "reference:append_slots"
    assert selection.problem.tokens == 8 and "fp8_kv" in selection.problem.features


@pytest.mark.gpu
def test_reference_append_slots_on_gpu_matches_cpu() -> None:
    cpu = append_slots_case(BF16, "HND", 16, 8, 128, (100, 1, 37), (30, 1, 5), "cpu", E4M3, padding=7, seed=2)
    gpu = append_slots_case(BF16, "HND", 16, 8, 128, (100, 1, 37), (30, 1, 5), "cuda", E4M3, padding=7, seed=2)
    a = cpu.outputs(*cpu.run("reference"))  # type: ignore[misc]
    b = gpu.outputs(*gpu.run("reference"))  # type: ignore[misc]
    for x, y in zip(a, b):
        assert torch.equal(x.view(torch.uint8), y.cpu().view(torch.uint8))


@pytest.mark.gpu
def test_reference_append_slots_is_captured_in_a_cuda_graph() -> None:
    k, v, cache, slots = append_slots_case(F16, "NHD", 16, 2, 64, (40, 7), (3, 1), "cuda", padding=3).args
    want = ksb.PagedKVCache(cache.k_pages.clone(), cache.v_pages.clone())
    ksb.kv_cache.append_slots(k, v, want, slots, backend="reference")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ksb.kv_cache.append_slots(k, v, cache, slots, backend="reference")
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(cache.k_pages, want.k_pages) and torch.equal(cache.v_pages, want.v_pages)


@pytest.mark.gpu
@pytest.mark.parametrize(("kv_dtype", "page_size"), [(None, 16), (torch.float8_e4m3fn, 16), (None, 1)])
def test_engine_shaped_caches_through_the_selected_attention_kernels(kv_dtype: torch.dtype | None,
                                                                     page_size: int) -> None:
    """vLLM's cache (K and V the halves of one (pages, heads, slots, 2 * D) tensor: strided pages): append by slot,
    then the decode and prefill plans the vLLM adapter makes, with the kernels the switchboard selects on this GPU,
    against the reference kernels on contiguous copies."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    heads, kv_heads, d = 32, 8, 128
    pages = 64 if page_size == 16 else 1024
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(pages, kv_heads, page_size, 2 * d, generator=g, device="cuda").to(kv_dtype or BF16)
    scales = (0.5, 0.25) if kv_dtype else (None, None)
    lens = [37, 5, 300 // page_size * page_size + 3]
    width = max(-(-n // page_size) for n in lens)
    perm = torch.randperm(pages, generator=g, device="cuda")[: len(lens) * width]
    table = ksb.PageTable(perm.view(len(lens), width).to(torch.int32), torch.tensor(lens, dtype=torch.int32,
                                                                                      device="cuda"))
    slots = torch.tensor([int(table.block_table[b, (n - 1) // page_size]) * page_size + (n - 1) % page_size
                          for b, n in enumerate(lens)], device="cuda")
    k = torch.randn(3, kv_heads, d, generator=g, device="cuda").to(BF16)
    v = torch.randn(3, kv_heads, d, generator=g, device="cuda").to(BF16)
    engine = ksb.PagedKVCache(kv[..., :d], kv[..., d:], "HND", *scales)
    ksb.kv_cache.append_slots(k, v, engine, slots)
    dense = ksb.PagedKVCache(kv[..., :d].contiguous(), kv[..., d:].contiguous(), "HND", *scales)
    args = dict(num_q_heads=heads, num_kv_heads=kv_heads, head_dim=d, dtype=BF16, kv_dtype=kv_dtype, layout="HND",
                page_size=page_size)
    q = torch.randn(3, heads, d, generator=g, device="cuda").to(BF16)
    got = ksb.attention.plan_decode(table, **args).run(q, engine)
    want = ksb.attention.plan_decode(table, backend="reference", capturable=False, **args).run(q, dense)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    qo = torch.arange(4, dtype=torch.int32, device="cuda")  # one new token per request, through the prefill plan
    got = ksb.attention.plan_prefill(table, qo, **args).run(q, engine)
    want = ksb.attention.plan_prefill(table, qo, backend="reference", capturable=False, **args).run(q, dense)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
