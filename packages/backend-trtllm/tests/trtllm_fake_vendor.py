"""Stand-ins for the vendor entry points, with their exact parameter lists (flashinfer 0.6.18.post1,
tensorrt_llm's torch custom op), computing through the models in trtllm_emulate.py.

Installed into ``sys.modules`` by :func:`install`, they let the kernels' ``run`` functions execute
on CPU tensors end to end: a wrong keyword, a wrong positional order or a wrong layout fails.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
import trtllm_emulate as emu

from kernel_switchboard_trtllm.translate import MoeArgs, XqaDecodeArgs, XqaMlaArgs

CALLS: list[str] = []
#: what the stand-in XQA writes for a request with no tokens: NaN, as XQA does on the H200 (test_trtllm_gpu.py)
EMPTY_ROW_VALUE = float("nan")


def trtllm_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens, max_seq_len,
                                      bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1, out=None, out_dtype=None,
                                      o_sf_scale=None, o_sf_vec_size=None, sinks=None, kv_layout="HND", enable_pdl=None,
                                      backend="auto", q_len_per_req=1, o_scale=1.0, mask=None, max_q_len=None,
                                      cum_seq_lens_q=None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None,
                                      uses_shared_paged_kv_idx=True, lse=None, return_lse=False, bmm1_scale_log2=None,
                                      multi_ctas_kv_counter_buffer=None, enable_block_sparse_attention=False,
                                      bf16q_fp8kv_transform_mode=None):
    assert backend == "xqa" and isinstance(kv_cache, tuple) and not return_lse
    assert workspace_buffer.dtype == torch.uint8
    CALLS.append("xqa")
    result = emu.xqa_decode(XqaDecodeArgs(query, kv_cache, block_tables, seq_lens, max_seq_len, bmm1_scale, bmm2_scale,
                                          window_left, kv_layout))
    result[seq_lens == 0] = EMPTY_ROW_VALUE
    out.copy_(result)
    return out


def xqa_batch_decode_with_kv_cache_mla(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank,
                                       qk_rope_head_dim, block_tables, seq_lens, max_seq_len, out=None, bmm1_scale=1.0,
                                       bmm2_scale=1.0, sinks=None, enable_pdl=None):
    assert query.dim() == 4 and query.shape[1] == 1 and kv_cache.dim() == 3
    CALLS.append("xqa_mla")
    out.copy_(emu.xqa_mla(XqaMlaArgs(query, kv_cache, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim, block_tables,
                                     seq_lens, max_seq_len, bmm1_scale, bmm2_scale)))
    return out


def cutlass_fused_moe(input, token_selected_experts, token_final_scales, fc1_expert_weights, fc2_expert_weights,
                      output_dtype, quant_scales, fc1_expert_biases=None, fc2_expert_biases=None, input_sf=None,
                      swiglu_alpha=None, swiglu_beta=None, swiglu_limit=None, tp_size=1, tp_rank=0, ep_size=1,
                      ep_rank=0, cluster_size=1, cluster_rank=0, output=None, enable_alltoall=False,
                      use_deepseek_fp8_block_scale=False, use_w4_group_scaling=False, use_mxfp8_act_scaling=False,
                      min_latency_mode=False, use_packed_weights=False, use_wfp4afp8_humming=False,
                      tune_max_num_tokens=8192, enable_pdl=None, activation_type=None, swizzled_input_sf=True,
                      use_fused_finalize=True, profile_ids=None, workspace_buffer=None):
    CALLS.append("cutlass_fused_moe")
    y = emu.fused_moe(MoeArgs(input, token_selected_experts, token_final_scales, fc1_expert_weights,
                              fc2_expert_weights, output_dtype, list(quant_scales), use_deepseek_fp8_block_scale))
    output.copy_(y)
    return [output, None, None, None]  # flashinfer returns a list in the non-min-latency mode


def trtllm_fused_moe(input, token_selected_experts, token_final_scales, fc1_expert_weights, fc1_expert_biases,
                     fc2_expert_weights, fc2_expert_biases, output_dtype, quant_scales, input_sf=None,
                     swizzled_input_sf=True, swiglu_alpha=None, swiglu_beta=None, swiglu_limit=None, tp_size=1,
                     tp_rank=0, ep_size=1, ep_rank=0, cluster_size=1, cluster_rank=0, enable_alltoall=False,
                     use_deepseek_fp8_block_scale=False, use_w4_group_scaling=False, use_int8_woq_per_channel=False,
                     use_mxfp8_act_scaling=False, min_latency_mode=False, use_fused_finalize=True,
                     tune_max_num_tokens=8192, tuner_num_tokens=None, tuner_top_k=None, unpadded_hidden_size=None):
    assert fc1_expert_biases is None and fc2_expert_biases is None
    CALLS.append("torch.ops.trtllm.fused_moe")
    return [emu.fused_moe(MoeArgs(input, token_selected_experts, token_final_scales, fc1_expert_weights,
                                  fc2_expert_weights, output_dtype, list(quant_scales), use_deepseek_fp8_block_scale))]


def install(monkeypatch: Any) -> None:
    """Put the stand-ins where the kernels import them from."""
    root = types.ModuleType("flashinfer")
    decode = types.ModuleType("flashinfer.decode")
    decode.trtllm_batch_decode_with_kv_cache = trtllm_batch_decode_with_kv_cache  # type: ignore[attr-defined]
    mla = types.ModuleType("flashinfer.mla")
    mla.xqa_batch_decode_with_kv_cache_mla = xqa_batch_decode_with_kv_cache_mla  # type: ignore[attr-defined]
    fused = types.ModuleType("flashinfer.fused_moe")
    fused.cutlass_fused_moe = cutlass_fused_moe  # type: ignore[attr-defined]
    trt = types.ModuleType("tensorrt_llm")
    trt_torch = types.ModuleType("tensorrt_llm._torch")
    trt_ops = types.ModuleType("tensorrt_llm._torch.custom_ops")
    for name, mod in (("flashinfer", root), ("flashinfer.decode", decode), ("flashinfer.mla", mla),
                      ("flashinfer.fused_moe", fused), ("tensorrt_llm", trt), ("tensorrt_llm._torch", trt_torch),
                      ("tensorrt_llm._torch.custom_ops", trt_ops)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(torch.ops, "trtllm", types.SimpleNamespace(fused_moe=trtllm_fused_moe), raising=False)
    CALLS.clear()
