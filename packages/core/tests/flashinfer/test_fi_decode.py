"""``kernel_switchboard.flashinfer`` decode: the batch decode wrapper driven as vLLM and SGLang drive it (eager and
with CUDA-graph buffers rewritten between runs) and ``single_decode_with_kv_cache``, against the float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch
from fi_oracle import Paged, attention, close, make_paged, other_layer, workspace

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

KV_HEADS = 2
LENS = [0, 5, 33, 70]

# every (group, head_dim) pair, and every (layout, page_size) pair
CASES = [("NHD", 1, 1, 64), ("HND", 16, 1, 128), ("NHD", 64, 1, 256), ("HND", 1, 4, 64), ("NHD", 16, 4, 128),
         ("HND", 64, 4, 256), ("NHD", 16, 8, 64), ("HND", 1, 8, 128), ("NHD", 64, 8, 256)]


def expected(paged: Paged, q: torch.Tensor, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode oracle: each request's one query over all its keys."""
    outs, lses = zip(*(attention(q[b:b + 1], paged.keys[b], paged.values[b], causal=True, **kw)  # type: ignore[arg-type]
                       for b in range(q.shape[0])))
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize(("layout", "page_size", "group", "head_dim"), CASES)
def test_decode_matches_oracle(layout: str, page_size: int, group: int, head_dim: int) -> None:
    paged = make_paged(LENS, page_size, KV_HEADS, head_dim, layout=layout)
    q = torch.randn(len(LENS), KV_HEADS * group, head_dim)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout)
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, KV_HEADS * group, KV_HEADS, head_dim, page_size,
                 q_data_type=torch.float32)
    kv = paged.combined() if group == 4 else (paged.k_pages, paged.v_pages)
    out, lse = wrapper.run(q, kv, return_lse=True)
    want_out, want_lse = expected(paged, q)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_decode_half_precision_with_window_cap_and_scale(dtype: torch.dtype) -> None:
    paged = make_paged(LENS, 16, KV_HEADS, 64, dtype=dtype)
    q = torch.randn(len(LENS), 8, 64).to(dtype)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True)
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 8, KV_HEADS, 64, 16, window_left=20,
                 logits_soft_cap=30.0, q_data_type=dtype, sm_scale=0.2)
    out, lse = wrapper.run_return_lse(q, (paged.k_pages, paged.v_pages))
    want_out, want_lse = expected(paged, q, sm_scale=0.2, soft_cap=30.0, window_left=20)
    assert out.dtype == dtype
    close(out, want_out, dtype)
    close(lse, want_lse, torch.float32)


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_decode_fp8_pages_with_scales(fp8: torch.dtype) -> None:
    paged = make_paged(LENS, 16, KV_HEADS, 64, dtype=fp8, scales=(0.5, 2.0), layout="HND")
    q = torch.randn(len(LENS), 4, 64)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "HND")
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, q_data_type=torch.float32,
                 kv_data_type=fp8)
    out, lse = wrapper.run(q, paged.combined(), k_scale=0.5, v_scale=2.0, return_lse=True)
    want_out, want_lse = expected(paged, q)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    # another layer with its own scales: the same plan
    layer2 = other_layer(paged, scales=(1.5, 0.25))
    out2 = wrapper.run(q, layer2.combined(), k_scale=1.5, v_scale=0.25)
    close(out2, expected(layer2, q)[0], torch.float32)


def test_decode_non_fp8_scales_follow_flashinfer() -> None:
    """k_scale folds into the softmax scale and v_scale multiplies the output, as FlashInfer does for 16-bit KV."""
    paged = make_paged(LENS, 16, KV_HEADS, 64)
    q = torch.randn(len(LENS), 4, 64)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, q_data_type=torch.float32)
    out, lse = wrapper.run(q, (paged.k_pages, paged.v_pages), k_scale=0.5, v_scale=3.0, return_lse=True)
    want_out, want_lse = expected(paged, q, sm_scale=0.5 / 8)
    close(out, want_out * 3.0, torch.float32)
    close(lse, want_lse, torch.float32)


def test_decode_writes_given_out_and_lse() -> None:
    paged = make_paged(LENS, 16, KV_HEADS, 128)
    q = torch.randn(len(LENS), 8, 128)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD")
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 8, KV_HEADS, 128, 16, q_data_type="float32")
    out = torch.full((len(LENS), 8, 128), float("nan"))
    lse = torch.full((len(LENS), 8), float("nan"))
    got_out, got_lse = wrapper.run(q, (paged.k_pages, paged.v_pages), out=out, lse=lse, return_lse=True)
    assert got_out.data_ptr() == out.data_ptr() and got_lse.data_ptr() == lse.data_ptr()
    want_out, want_lse = expected(paged, q)
    close(out, want_out, torch.float32)
    close(lse, want_lse, torch.float32)
    with pytest.raises(InvalidArgumentError, match="out"):
        wrapper.run(q, (paged.k_pages, paged.v_pages), out=torch.empty(len(LENS), 8, 64))


def test_decode_vllm_call_sequence() -> None:
    """vLLM: legacy positional plan arguments, a permuted (pages, 2, ...) cache, float scales, ``out`` slices,
    one plan serving several layers, the attributes it asserts on."""
    layout = "HND"
    paged = make_paged(LENS, 16, KV_HEADS, 64, layout=layout)
    layer2 = other_layer(paged)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), layout, use_tensor_cores=True)
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, "NONE", -1, None,
                 torch.float32, torch.float32, None, None, 0.125, None, None, True, None, None, -1, False)
    assert wrapper._sm_scale == 0.125 and wrapper._window_left == -1 and wrapper._logits_soft_cap == 0.0
    q = torch.randn(len(LENS) + 2, 4, 64)  # padded rows after the real ones
    output = torch.zeros(len(LENS) + 2, 4, 64)
    for layer in (paged, layer2):
        kv = layer.combined()
        wrapper.run(q[: len(LENS)], kv.permute(0, 1, 2, 3, 4), k_scale=1.0, v_scale=1.0, out=output[: len(LENS)])
        close(output[: len(LENS)], expected(layer, q[: len(LENS)], sm_scale=0.125)[0], torch.float32)


def test_decode_sglang_call_sequence() -> None:
    """SGLang: page size 1 with 3-d (tokens, heads, dim) K and V buffers, ``begin_forward`` with ``data_type``, the
    deprecated ``forward`` carrying sm_scale / soft cap / scales, and ``fast_decode_plan`` installed as
    ``begin_forward``."""
    paged = make_paged(LENS, 1, KV_HEADS, 64)
    k3, v3 = paged.k_pages[:, 0], paged.v_pages[:, 0]  # (tokens, Hkv, D)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=False)
    wrapper.begin_forward(paged.indptr, paged.indices, paged.last_page_len, 8, KV_HEADS, 64, 1, data_type=torch.float32,
                          q_data_type=torch.float32, non_blocking=True)
    q = torch.randn(len(LENS), 8, 64)
    out = wrapper.forward(q, (k3, v3), sm_scale=0.1, logits_soft_cap=20.0, k_scale=1.0, v_scale=1.0)
    close(out, expected(paged, q, sm_scale=0.1, soft_cap=20.0)[0], torch.float32)
    assert wrapper._sm_scale == 0.1  # forward's parameters stay for later runs, as in FlashInfer
    close(wrapper.run(q, (k3, v3)), expected(paged, q, sm_scale=0.1, soft_cap=20.0)[0], torch.float32)
    lens2 = [3, 0, 9, 1]
    paged2 = make_paged(lens2, 1, KV_HEADS, 64)
    fast = flashinfer.fast_decode_plan.__get__(wrapper)
    fast(paged2.indptr, paged2.indices, paged2.last_page_len, 8, KV_HEADS, 64, 1, q_data_type=torch.float32,
         global_override_indptr_cpu=paged2.indptr)
    out2, lse2 = wrapper.forward_return_lse(q, (paged2.k_pages[:, 0], paged2.v_pages[:, 0]), sm_scale=0.1)
    want_out, want_lse = expected(paged2, q, sm_scale=0.1)
    close(out2, want_out, torch.float32)
    close(lse2, want_lse, torch.float32)


def test_decode_several_query_tokens_per_request() -> None:
    """``q_len_per_req=2``: each request's two newest tokens, causal between them."""
    lens = [2, 9, 40]
    paged = make_paged(lens, 16, KV_HEADS, 64)
    q = torch.randn(2 * len(lens), 4, 64)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", use_tensor_cores=True)
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, q_data_type=torch.float32,
                 q_len_per_req=2)
    out, lse = wrapper.run(q, (paged.k_pages, paged.v_pages), return_lse=True)
    for b in range(len(lens)):
        want_out, want_lse = attention(q[2 * b:2 * b + 2], paged.keys[b], paged.values[b], causal=True)
        close(out[2 * b:2 * b + 2], want_out, torch.float32)
        close(lse[2 * b:2 * b + 2], want_lse, torch.float32)


def _graph_buffers(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An engine's persistent buffers: indptr for ``rows`` requests, ``width`` pages each in indices."""
    return (torch.zeros(rows + 1, dtype=torch.int32), torch.zeros(rows * width, dtype=torch.int32),
            torch.ones(rows, dtype=torch.int32))


def _write_step(paged: Paged, indptr: torch.Tensor, indices: torch.Tensor, last: torch.Tensor) -> None:
    """What an engine does between replays: the step's values into its buffers, in place."""
    indptr.copy_(paged.indptr)
    indices[: paged.indices.numel()].copy_(paged.indices)
    last.copy_(paged.last_page_len)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_cuda_graph_buffers_read_at_every_run(layout: str) -> None:
    """use_cuda_graph: the wrapper reads the caller's fixed buffers at run time; rewriting them in place (no new
    plan) changes the next run's pages and lengths, as a replayed graph would see them."""
    batch, page_size = 4, 16
    indptr_all, indices_all, last_all = _graph_buffers(8, 8)
    indptr, last = indptr_all[: batch + 1], last_all[:batch]  # vLLM's slices of persistent buffers
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), layout, use_cuda_graph=True, use_tensor_cores=True, paged_kv_indptr_buffer=indptr,
        paged_kv_indices_buffer=indices_all, paged_kv_last_page_len_buffer=last)
    pool = make_paged([40, 0, 17, 100], page_size, KV_HEADS, 64, layout=layout, spare_pages=20)
    wrapper.plan(pool.indptr, pool.indices, pool.last_page_len, 4, KV_HEADS, 64, page_size, q_data_type=torch.float32)
    q = torch.randn(batch, 4, 64)
    out = torch.empty(batch, 4, 64)
    wrapper.run(q, (pool.k_pages, pool.v_pages), out=out)
    close(out, expected(pool, q)[0], torch.float32)
    # next step: other pages and lengths, written straight into the buffers (padding request: 0 pages, last 1)
    step2 = _reuse_pool(pool, [3, 90, 0, 55], page_size, empty_last=1)
    _write_step(step2, indptr, indices_all, last)
    wrapper.run(q, (pool.k_pages, pool.v_pages), out=out)
    close(out, expected(step2, q)[0], torch.float32)
    # and a plan with the next step's host arrays copies them into the buffers
    step3 = _reuse_pool(pool, [1, 2, 3, 4], page_size)
    wrapper.plan(step3.indptr, step3.indices, step3.last_page_len, 4, KV_HEADS, 64, page_size,
                 q_data_type=torch.float32)
    assert torch.equal(indptr, step3.indptr)
    close(wrapper.run(q, (pool.k_pages, pool.v_pages)), expected(step3, q)[0], torch.float32)


def test_decode_cuda_graph_refuses_more_pages_than_it_holds() -> None:
    indptr, indices, last = _graph_buffers(2, 3)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
        workspace(), "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=indptr, paged_kv_indices_buffer=indices,
        paged_kv_last_page_len_buffer=last)
    paged = make_paged([4 * 16, 16], 16, KV_HEADS, 64)
    with pytest.raises(InvalidArgumentError, match="paged_kv_indices_buffer"):
        wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, KV_HEADS, 64, 16, q_data_type=torch.float32)


def _reuse_pool(pool: Paged, lens: list[int], page_size: int, empty_last: int = 0) -> Paged:
    """A new step over ``pool``'s pages: each request takes random pages of the pool."""
    counts = [-(-n // page_size) for n in lens]
    order = torch.randperm(pool.k_pages.shape[0])
    indptr, indices, last, keys, values, at = [0], [], [], [], [], 0
    k_nhd = pool.k_pages if pool.layout == "NHD" else pool.k_pages.transpose(1, 2)
    v_nhd = pool.v_pages if pool.layout == "NHD" else pool.v_pages.transpose(1, 2)
    for n, c in zip(lens, counts):
        pages = order[at:at + c].tolist()
        at += c
        indices += pages
        indptr.append(len(indices))
        last.append(n - (c - 1) * page_size if c else empty_last)
        keys.append(torch.cat([k_nhd[p] for p in pages])[:n].float() if c else torch.zeros(0, *k_nhd.shape[2:]))
        values.append(torch.cat([v_nhd[p] for p in pages])[:n].float() if c else torch.zeros(0, *v_nhd.shape[2:]))
    i32 = torch.int32
    return Paged(pool.k_pages, pool.v_pages, torch.tensor(indptr, dtype=i32), torch.tensor(indices, dtype=i32),
                 torch.tensor(last, dtype=i32), keys, values, pool.layout)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode(layout: str) -> None:
    k, v = torch.randn(37, KV_HEADS, 128), torch.randn(37, KV_HEADS, 128)
    q = torch.randn(8, 128)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous())
    out, lse = flashinfer.single_decode_with_kv_cache(q, kk, vv, kv_layout=layout, window_left=10, return_lse=True)
    want_out, want_lse = attention(q[None], k, v, causal=True, window_left=10)
    close(out, want_out[0], torch.float32)
    close(lse, want_lse[0], torch.float32)


def test_single_decode_fp8_scales() -> None:
    k, v = torch.randn(20, 1, 64), torch.randn(20, 1, 64)
    k8, v8 = (k / 0.5).to(torch.float8_e4m3fn), (v / 2.0).to(torch.float8_e4m3fn)
    q = torch.randn(4, 64)
    out = flashinfer.single_decode_with_kv_cache(q, k8, v8, k_scale=0.5, v_scale=2.0, sm_scale=1 / math.sqrt(64))
    close(out, attention(q[None], k8.float() * 0.5, v8.float() * 2.0, causal=True)[0][0], torch.float32)
