"""``kernel_switchboard.flashinfer`` as an API: FlashInfer's argument names, order and defaults; refusals that
name the argument for what is not served; a cheap import that loads no vendor library; the ``flashinfer`` alias."""

from __future__ import annotations

import inspect
import subprocess
import sys
from typing import Any

import pytest
import torch
from fi_oracle import attention, close, make_paged, other_layer, qo_indptr, workspace

import kernel_switchboard.flashinfer as flashinfer
from kernel_switchboard import InvalidArgumentError

# FlashInfer 0.6.18's parameter names, in order, with the defaults engines rely on
SIGNATURES: dict[str, tuple[list[str], dict[str, Any]]] = {
    "BatchDecodeWithPagedKVCacheWrapper.__init__": (
        ["self", "float_workspace_buffer", "kv_layout", "use_cuda_graph", "use_tensor_cores", "paged_kv_indptr_buffer",
         "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer", "backend", "jit_args"],
        {"kv_layout": "NHD", "use_cuda_graph": False, "use_tensor_cores": False, "backend": "auto"}),
    "BatchDecodeWithPagedKVCacheWrapper.run": (
        ["self", "q", "paged_kv_cache", "args", "q_scale", "k_scale", "v_scale", "out", "lse", "return_lse",
         "enable_pdl", "window_left", "sinks", "q_len_per_req", "skip_softmax_threshold_scale_factor", "kv_cache_sf"],
        {"return_lse": False}),
    "BatchPrefillWithPagedKVCacheWrapper.plan": (
        ["self", "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "num_qo_heads",
         "num_kv_heads", "head_dim_qk", "page_size", "head_dim_vo", "custom_mask", "packed_custom_mask", "causal",
         "pos_encoding_mode", "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap", "rope_scale",
         "rope_theta", "q_data_type", "kv_data_type", "o_data_type", "non_blocking", "prefix_len_ptr",
         "token_pos_in_items_ptr", "token_pos_in_items_len", "max_item_len_ptr", "seq_lens", "seq_lens_q",
         "block_tables", "max_token_per_sequence", "max_sequence_kv", "fixed_split_size", "disable_split_kv"],
        {"causal": False, "pos_encoding_mode": "NONE", "window_left": -1, "q_data_type": "float16"}),
    "BatchPrefillWithRaggedKVCacheWrapper.plan": (
        ["self", "qo_indptr", "kv_indptr", "num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo",
         "custom_mask", "packed_custom_mask", "causal", "pos_encoding_mode", "use_fp16_qk_reduction", "window_left",
         "logits_soft_cap", "sm_scale", "rope_scale", "rope_theta", "q_data_type", "kv_data_type", "o_data_type",
         "non_blocking", "prefix_len_ptr", "token_pos_in_items_ptr", "token_pos_in_items_len", "max_item_len_ptr",
         "fixed_split_size", "disable_split_kv", "seq_lens", "seq_lens_q", "max_token_per_sequence",
         "max_sequence_kv", "v_indptr", "o_indptr"],
        {"causal": False}),
    "BatchMLAPagedAttentionWrapper.plan": (
        ["self", "qo_indptr", "kv_indptr", "kv_indices", "kv_len_arr", "num_heads", "head_dim_ckv", "head_dim_kpe",
         "page_size", "causal", "sm_scale", "q_data_type", "kv_data_type", "use_profiler"], {"use_profiler": False}),
    "MultiLevelCascadeAttentionWrapper.plan": (
        ["self", "qo_indptr_arr", "paged_kv_indptr_arr", "paged_kv_indices_arr", "paged_kv_last_page_len",
         "num_qo_heads", "num_kv_heads", "head_dim", "page_size", "causal", "pos_encoding_mode",
         "use_fp16_qk_reduction", "sm_scale", "window_left", "logits_soft_cap", "rope_scale", "rope_theta",
         "q_data_type", "kv_data_type"], {"causal": False}),
    "PODWithPagedKVCacheWrapper.__init__": (
        ["self", "float_workspace_buffer", "kv_layout", "use_cuda_graph", "paged_kv_indptr_buffer",
         "paged_kv_indices_buffer", "paged_kv_last_page_len_buffer", "jit_args"],
        {"kv_layout": "NHD", "use_cuda_graph": False}),
    "PODWithPagedKVCacheWrapper.plan": (
        ["self", "indptr", "indices", "last_page_len", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
         "pos_encoding_mode", "window_left", "q_data_type", "kv_data_type", "data_type", "sm_scale", "rope_scale",
         "rope_theta", "non_blocking"], {"pos_encoding_mode": "NONE", "window_left": -1, "q_data_type": "float16"}),
    "PODWithPagedKVCacheWrapper.run": (
        ["self", "q_p", "k_p", "v_p", "q_d", "paged_kv_cache_d", "custom_mask_p", "packed_custom_mask_p", "causal_p",
         "kv_layout_p", "pos_encoding_mode_p", "sm_scale_p", "window_left_p", "rope_scale_p", "rope_theta_p",
         "return_lse_p", "custom_mask_d", "packed_custom_mask_d", "causal_d", "kv_layout_d", "pos_encoding_mode_d",
         "sm_scale_d", "window_left_d", "rope_scale_d", "rope_theta_d", "q_scale", "k_scale", "v_scale",
         "return_lse_d", "use_fp16_qk_reduction", "enable_pdl", "args"],
        {"causal_p": False, "kv_layout_p": "NHD", "window_left_p": -1, "window_left_d": -1}),
    "BatchPODWithPagedKVCacheWrapper.__init__": (["self", "float_workspace_buffer", "kv_layout"], {"kv_layout": "NHD"}),
    "BatchPODWithPagedKVCacheWrapper.plan": (
        ["self", "qo_indptr_p", "kv_indptr_p", "kv_indices_p", "last_page_len_p", "qo_indptr_d", "kv_indptr_d",
         "kv_indices_d", "last_page_len_d", "num_qo_heads", "num_kv_heads", "head_dim", "page_size",
         "pos_encoding_mode", "window_left", "q_data_type", "kv_data_type", "data_type", "sm_scale", "rope_scale",
         "rope_theta", "non_blocking"], {"window_left": -1, "q_data_type": "float16", "non_blocking": True}),
    "BatchPODWithPagedKVCacheWrapper.run": (
        ["self", "q_p", "paged_kv_cache_p", "q_d", "paged_kv_cache_d", "custom_mask_p", "packed_custom_mask_p",
         "causal_p", "q_scale", "k_scale", "v_scale", "return_lse", "use_fp16_qk_reduction", "enable_pdl"],
        {"causal_p": False, "return_lse": False}),
    "apply_llama31_rope_pos_ids": (
        ["q", "k", "pos_ids", "rotary_dim", "interleave", "rope_scale", "rope_theta", "low_freq_factor",
         "high_freq_factor", "old_context_len"],
        {"rope_scale": 8, "rope_theta": 5e5, "low_freq_factor": 1, "high_freq_factor": 4, "old_context_len": 8192}),
    "apply_rope_with_cos_sin_cache_inplace": (
        ["positions", "query", "key", "head_size", "cos_sin_cache", "is_neox"], {"is_neox": True}),
    "top_k_top_p_sampling_from_probs": (
        ["probs", "top_k", "top_p", "indices", "filter_apply_order", "deterministic", "generator", "check_nan",
         "seed", "offset", "return_valid"], {"filter_apply_order": "top_k_first", "deterministic": True,
                                             "check_nan": False}),
    "chain_speculative_sampling": (
        ["draft_probs", "draft_token_ids", "target_probs", "maybe_output_accepted_token_num",
         "maybe_output_emitted_draft_token_num", "deterministic", "generator", "seed", "offset"], {}),
    "fused_add_rmsnorm": (["input", "residual", "weight", "eps", "enable_pdl"], {"eps": 1e-6}),
    "append_paged_kv_cache": (
        ["append_key", "append_value", "batch_indices", "positions", "paged_kv_cache", "kv_indices", "kv_indptr",
         "kv_last_page_len", "kv_layout"], {"kv_layout": "NHD"}),
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signatures_mirror_flashinfer(name: str) -> None:
    obj: Any = flashinfer
    for part in name.split("."):
        obj = getattr(obj, part)
    params = inspect.signature(obj).parameters
    names, defaults = SIGNATURES[name]
    assert list(params)[: len(names)] == names
    for arg, default in defaults.items():
        assert params[arg].default == default, arg


def _decode_wrapper(**ctor: Any) -> tuple[Any, Any]:
    paged = make_paged([5, 9], 16, 2, 64)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NHD", **ctor)
    return wrapper, paged


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"pos_encoding_mode": "ROPE_LLAMA"}, "pos_encoding_mode"),
    ({"pos_encoding_mode": "ALIBI"}, "pos_encoding_mode"),
    ({"q_data_type": torch.float8_e4m3fn}, "q_data_type"),
    ({"o_data_type": torch.float16}, "o_data_type"),
    ({"window_right": 4}, "window_right"),
    ({"fixed_split_size": 64}, "fixed_split_size"),
    ({"kv_data_type": torch.float16}, "kv_data_type"),
])
def test_decode_plan_refusals(kwargs: dict[str, Any], name: str) -> None:
    wrapper, paged = _decode_wrapper()
    args = {"q_data_type": torch.float32, **kwargs}
    with pytest.raises(InvalidArgumentError, match=name):
        wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16, **args)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"sinks": torch.zeros(4)}, "sinks"),
    ({"kv_cache_sf": torch.zeros(1)}, "kv_cache_sf"),
    ({"skip_softmax_threshold_scale_factor": 0.1}, "skip_softmax_threshold_scale_factor"),
    ({"window_left": 3}, "window_left"),
    ({"k_scale": torch.tensor(0.5)}, "k_scale"),
])
def test_decode_run_refusals(kwargs: dict[str, Any], name: str) -> None:
    wrapper, paged = _decode_wrapper()
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16, q_data_type=torch.float32)
    with pytest.raises(InvalidArgumentError, match=name):
        wrapper.run(torch.randn(2, 4, 64), (paged.k_pages, paged.v_pages), **kwargs)


def test_other_refusals() -> None:
    with pytest.raises(InvalidArgumentError, match="jit_args"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), jit_args=["variant"])
    with pytest.raises(InvalidArgumentError, match="backend"):
        flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace(), backend="magic")
    with pytest.raises(InvalidArgumentError, match="kv_layout"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace(), "NDH")
    wrapper, paged = _decode_wrapper()
    with pytest.raises(InvalidArgumentError, match="plan"):
        wrapper.run(torch.randn(2, 4, 64), (paged.k_pages, paged.v_pages))
    prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace())
    with pytest.raises(InvalidArgumentError, match="custom_mask"):
        prefill.plan(qo_indptr([1, 1]), paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16,
                     custom_mask=torch.ones(14, dtype=torch.bool))
    with pytest.raises(InvalidArgumentError, match="prefix_len_ptr"):
        prefill.plan(qo_indptr([1, 1]), paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16,
                     prefix_len_ptr=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(InvalidArgumentError, match="custom_mask_buf"):
        flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace(), custom_mask_buf=torch.zeros(4, dtype=torch.uint8))
    ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace())
    with pytest.raises(InvalidArgumentError, match="pos_encoding_mode"):
        ragged.plan(qo_indptr([2]), qo_indptr([2]), 4, 2, 64, pos_encoding_mode="ROPE_LLAMA")
    with pytest.raises(InvalidArgumentError, match="use_profiler"):
        flashinfer.BatchMLAPagedAttentionWrapper(workspace()).plan(qo_indptr([1]), qo_indptr([1]),
                                                                   torch.zeros(1, dtype=torch.int32),
                                                                   torch.ones(1, dtype=torch.int32), 4, 64, 16, 16,
                                                                   False, 0.1, torch.float32, torch.float32, True)
    e5m2 = torch.zeros(1, 4, 4).to(torch.float8_e5m2)
    with pytest.raises(InvalidArgumentError, match=r"A\.dtype"):
        flashinfer.bmm_fp8(e5m2, e5m2, torch.tensor(1.0), torch.tensor(1.0), torch.bfloat16)
    with pytest.raises(InvalidArgumentError, match="filter_apply_order"):
        flashinfer.top_k_top_p_sampling_from_probs(torch.ones(1, 4) / 4, 2, 0.9, filter_apply_order="top_p_first")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_import_loads_no_vendor_library() -> None:
    code = ("import sys, kernel_switchboard.flashinfer\n"
            "vendors = {'flashinfer', 'triton', 'cudnn', 'flash_attn', 'cutlass', 'cutlass_library', 'tensorrt_llm'}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & vendors))\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_install_as_flashinfer() -> None:
    code = ("import kernel_switchboard.flashinfer as compat\n"
            "compat.install_as_flashinfer()\n"
            "import flashinfer\n"
            "from flashinfer.decode import fast_decode_plan\n"
            "from flashinfer.cascade import merge_state\n"
            "from flashinfer.mla import BatchMLAPagedAttentionWrapper\n"
            "from flashinfer.pod import BatchPODWithPagedKVCacheWrapper\n"
            "assert BatchPODWithPagedKVCacheWrapper is compat.BatchPODWithPagedKVCacheWrapper\n"
            "assert flashinfer is compat and fast_decode_plan is compat.fast_decode_plan\n"
            "assert BatchMLAPagedAttentionWrapper is compat.BatchMLAPagedAttentionWrapper\n"
            "print(flashinfer.__version__)\n")
    result = _python(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0.6.18"


def test_kv_pages_are_not_kept_alive() -> None:
    """The wrapper remembers page tensors by weak reference (a pair) or keeps the split of a combined tensor in views
    over its storage that do not reference it: once the caller drops them, nothing of them remains, memory included."""
    import gc
    import weakref

    wrapper, paged = _decode_wrapper()
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16, q_data_type=torch.float32)
    k, v = paged.k_pages.clone(), paged.v_pages.clone()
    combined = paged.combined()
    q = torch.randn(2, 4, 64)
    first = wrapper.run(q, (k, v))
    assert torch.equal(wrapper.run(q, (k, v)), first)  # the second call takes the remembered path
    assert torch.equal(wrapper.run(q, combined), first)
    assert torch.equal(wrapper.run(q, combined), first)
    assert torch.equal(wrapper.run(q, combined.permute(0, 1, 2, 3, 4)), first)  # a fresh view: remembered too
    assert wrapper._kv._owners
    refs = [weakref.ref(t) for t in (k, v, combined)]
    storage = weakref.ref(combined.untyped_storage())
    del k, v, combined, paged
    gc.collect()
    assert all(r() is None for r in refs)
    assert storage() is None  # the remembered K/V views have gone with the tensor
    assert not wrapper._kv._known and not wrapper._kv._owners


def test_remembered_split_goes_without_gc() -> None:
    """The remembered split of a combined tensor is released as soon as the tensor's last reference goes (no cycle
    waits for the garbage collector), with the wrapper alive."""
    import gc
    import weakref

    wrapper, paged = _decode_wrapper()
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16, q_data_type=torch.float32)
    q = torch.randn(2, 4, 64)
    combined = paged.combined()
    wrapper.run(q, combined)
    wrapper.run(q, combined)
    assert any(owner.splits for owner in wrapper._kv._owners.values())
    storage = weakref.ref(combined.untyped_storage())
    gc.disable()
    try:
        del combined
        assert storage() is None and not wrapper._kv._owners
    finally:
        gc.enable()


def test_combined_tensor_changed_in_place_is_validated_again() -> None:
    """A combined tensor reshaped or moved to new memory in place is not served from what was remembered of it; the
    memory it gave up is released."""
    import weakref

    wrapper, paged = _decode_wrapper()
    wrapper.plan(paged.indptr, paged.indices, paged.last_page_len, 4, 2, 64, 16, q_data_type=torch.float32)
    q = torch.randn(2, 4, 64)
    combined = paged.combined()
    wrapper.run(q, combined)
    first = wrapper.run(q, combined)  # the second sight of its memory keeps the split
    old = weakref.ref(combined.untyped_storage())
    layer2 = other_layer(paged)
    combined.set_(layer2.combined())  # new memory, same shape
    assert old() is not None  # still held by the remembered split until the next call sees the change
    second = wrapper.run(q, combined)
    want = torch.cat([attention(q[b:b + 1], layer2.keys[b], layer2.values[b], causal=True)[0] for b in range(2)])
    close(second, want, torch.float32)
    assert not torch.equal(first, second)
    assert old() is None
    combined.set_(combined.untyped_storage(), 0, (combined.shape[0] - 1, *combined.shape[1:]), combined.stride())
    with pytest.raises(InvalidArgumentError, match="cache"):  # fewer pages than the table uses: checked again
        wrapper.run(q, combined)


def test_remembered_pages_equal_a_validated_cache() -> None:
    """The remembered paths build the same PagedKVCache a full construction does."""
    from kernel_switchboard.flashinfer._kv import KVForms
    from kernel_switchboard.paged import PagedKVCache

    paged = make_paged([5, 9], 16, 2, 64, layout="HND", dtype=torch.float8_e4m3fn)
    forms = KVForms("HND")
    combined = paged.combined()
    for pages, (k, v) in (((paged.k_pages, paged.v_pages), (paged.k_pages, paged.v_pages)),
                          (combined, (combined[:, 0], combined[:, 1]))):
        forms.cache(pages, 0.5, 2.0)
        forms.cache(pages, 0.5, 2.0)
        fast = forms.cache(pages, 0.5, 2.0)  # the remembered path (a combined tensor's split from its second sight)
        full = PagedKVCache(k, v, "HND", 0.5, 2.0)
        if pages is combined:  # the split's views share the storage without referencing the caller's tensor
            assert fast.k_pages._base is None and fast.v_pages._base is None
        for field in PagedKVCache.__slots__:
            got, want = getattr(fast, field), getattr(full, field)
            if isinstance(want, torch.Tensor):
                assert (got.data_ptr(), got.shape, got.stride(), got.dtype) == \
                    (want.data_ptr(), want.shape, want.stride(), want.dtype), field
            else:
                assert got == want, field


def test_bench_preset_host_overhead_runs_on_cpu() -> None:
    from kernel_switchboard import bench

    assert "flashinfer-compat" in bench.PRESETS
    point = next(p for p in bench.PRESETS["flashinfer-compat"]() if p.op == "flashinfer.host_overhead")
    rows = bench.run_point("flashinfer-compat", point, torch.device("cpu"), 10.0)
    assert len(rows) == 3 and all(r.error is None and r.unit == "us/call" for r in rows)
    assert {"native_run_us", "overhead_pair_us", "overhead_lse_us"} <= set(rows[0].extra)
