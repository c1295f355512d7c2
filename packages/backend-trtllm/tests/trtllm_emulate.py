"""Torch models of what TensorRT-LLM's kernels compute from the arguments they are given.

Each model reads its inputs only the way the vendor kernel does (as documented in flashinfer
0.6.18.post1's sources), so running the translated arguments through it on CPU tensors and
comparing with the switchboard's reference kernels checks the translation: layouts, page
indexing, scales, sliding window, and the [up; gate] order of fc1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernel_switchboard_trtllm.translate import MoeArgs, XqaDecodeArgs, XqaMlaArgs


def xqa_decode(a: XqaDecodeArgs) -> torch.Tensor:
    """XQA: per request b, the first seq_lens[b] tokens of its pages (block_tables row b, read with
    row stride = width); logits = q·k * bmm1_scale; out = softmax · v * bmm2_scale; a window w keeps
    the last w + 1 tokens. K/V are addressed in whole heads (strides multiples of head_dim)."""
    q = a.query
    assert q.is_contiguous() and a.block_tables.is_contiguous(), "XQA reads q and the page list densely"
    assert a.block_tables.dtype == torch.int32 and a.seq_lens.dtype == torch.int32
    k_pages, v_pages = a.kv_cache
    d = q.shape[-1]
    for t in (k_pages, v_pages):
        assert t.stride(-1) == 1 and all(s % d == 0 for s in t.stride()[:-1]), "strides in whole heads"
    if a.kv_layout == "HND":  # XQA transposes HND to NHD by strides
        k_pages, v_pages = k_pages.transpose(1, 2), v_pages.transpose(1, 2)
    page = k_pages.shape[1]
    b, hq, _ = q.shape
    hkv = k_pages.shape[2]
    out = torch.empty(b, hq, v_pages.shape[-1])
    for i in range(b):
        n = int(a.seq_lens[i])
        pages = a.block_tables[i, : -(-n // page)].long()
        k = k_pages[pages].reshape(-1, hkv, d)[:n].float()
        v = v_pages[pages].reshape(-1, hkv, v_pages.shape[-1])[:n].float()
        if a.window_left >= 0:
            k, v = k[max(0, n - 1 - a.window_left):], v[max(0, n - 1 - a.window_left):]
        kk = k.repeat_interleave(hq // hkv, dim=1)  # (n, hq, d)
        vv = v.repeat_interleave(hq // hkv, dim=1)
        logits = torch.einsum("hd,nhd->hn", q[i].float(), kk) * a.bmm1_scale
        out[i] = torch.einsum("hn,nhd->hd", logits.softmax(-1), vv) * a.bmm2_scale if n else 0.0
    return out.to(q.dtype)


def xqa_mla(a: XqaMlaArgs) -> torch.Tensor:
    """XQA MLA: one latent head; logits = [q_nope, q_pe]·[ckv, kpe] * bmm1_scale; out = softmax · ckv * bmm2_scale."""
    q = a.query[:, 0].float()  # (B, H, 576)
    page = a.kv_cache.shape[1]
    out = torch.empty(q.shape[0], q.shape[1], a.kv_lora_rank)
    for i in range(q.shape[0]):
        n = int(a.seq_lens[i])
        pages = a.block_tables[i, : -(-n // page)].long()
        kv = a.kv_cache[pages].reshape(-1, a.kv_cache.shape[-1])[:n].float()
        p = (q[i] @ kv.t() * a.bmm1_scale).softmax(-1)
        out[i] = p @ kv[:, : a.kv_lora_rank] * a.bmm2_scale if n else 0.0
    return out.to(a.query.dtype)


def _dequant(w: torch.Tensor, scale: torch.Tensor | None, block: int = 128) -> torch.Tensor:
    if scale is None:
        return w.float()
    n, k = w.shape
    s = scale.repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return w.float() * s


def fused_moe(a: MoeArgs) -> torch.Tensor:
    """TensorRT-LLM CUTLASS MoE: h = x fc1[e]^T (2I); act = silu(h[I:]) * h[:I] (fc1 rows [up; gate]);
    y = Σ_k w_k · act fc2[e]^T. fp8: weights dequantised by 128x128 blocks (quant_scales[0], [1])."""
    x = a.input.float()
    assert a.token_selected_experts.dtype == torch.int32 and a.token_final_scales.dtype == torch.float32
    assert a.fc1_expert_weights.is_contiguous() and a.fc2_expert_weights.is_contiguous()
    inter = a.fc2_expert_weights.shape[2]
    s1, s2 = [*a.quant_scales, None, None][:2] if a.use_deepseek_fp8_block_scale else (None, None)
    y = torch.zeros(x.shape)
    for t in range(x.shape[0]):
        for j in range(a.token_selected_experts.shape[1]):
            e = int(a.token_selected_experts[t, j])
            w1 = _dequant(a.fc1_expert_weights[e], None if s1 is None else s1[e])
            w2 = _dequant(a.fc2_expert_weights[e], None if s2 is None else s2[e])
            h = w1 @ x[t]
            act = F.silu(h[inter:]) * h[:inter]
            y[t] += a.token_final_scales[t, j] * (w2 @ act)
    return y.to(a.output_dtype)
