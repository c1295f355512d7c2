"""Kernel Switchboard in one page: a paged KV cache, prefill, decode, a plan, and why a kernel was chosen.

    python examples/quickstart.py          # CPU: the reference kernels; on a GPU the fastest installed backend

One attention layer serves two requests with prompts of 5 and 12 tokens (GQA: 8 query heads share 2 KV heads),
then decodes one token for each. Each result is compared with plain PyTorch attention.
"""

from __future__ import annotations

import torch

import kernel_switchboard as ksb

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
torch.manual_seed(0)
Hq, Hkv, D, PAGE = 8, 2, 64, 4  # query heads, KV heads, head dim, tokens per page
prompts = [5, 12]

# The cache: 8 pages of 4 tokens in NHD layout; request b owns pages 4b..4b+3 (vLLM's block-table form).
k_pages = torch.zeros(8, PAGE, Hkv, D, dtype=dtype, device=device)
v_pages = torch.zeros_like(k_pages)
cache = ksb.PagedKVCache(k_pages, v_pages, layout="NHD")
block_table = torch.arange(8, dtype=torch.int32, device=device).view(2, 4)
seq_lens = torch.tensor(prompts, dtype=torch.int32, device=device)
table = ksb.PageTable(block_table, seq_lens)

# Prefill: the prompts' K/V go into the pages, then every prompt token attends causally to its request.
qo_indptr = torch.tensor([0, 5, 17], dtype=torch.int32, device=device)  # request b's rows: qo_indptr[b]:qo_indptr[b+1]
total = sum(prompts)
k, v = (torch.randn(total, Hkv, D, dtype=dtype, device=device) for _ in range(2))
batch_indices, positions = ksb.kv_cache.batch_indices_positions(qo_indptr, seq_lens, total)
ksb.kv_cache.append(k, v, cache, table, positions, batch_indices)
q = torch.randn(total, Hq, D, dtype=dtype, device=device)
out = ksb.attention.prefill(q, qo_indptr, cache, table, causal=True)  # (17, Hq, D)


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The same attention in plain PyTorch: q (Lq, Hq, D), k / v (Lk, Hkv, D), the last Lq keys are q's own."""
    q, k, v = (t.float().transpose(0, 1) for t in (q, k, v))
    k, v = (t.repeat_interleave(Hq // Hkv, dim=0) for t in (k, v))
    mask = None
    if causal:
        lq, lk = q.shape[1], k.shape[1]
        mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(0, 1)


def report(name: str, got: torch.Tensor, want: torch.Tensor, against: str = "PyTorch") -> None:
    error = (got.float() - want).abs().max().item()
    print(f"{name + ':':<8} out {tuple(got.shape)}, max |error| vs {against} {error:.1e}")
    assert error < (3e-2 if dtype == torch.bfloat16 else 1e-4), f"{name} differs from {against} by {error}"


report("prefill", out, torch.cat([torch_attention(q[a:b], k[a:b], v[a:b], causal=True) for a, b in ((0, 5), (5, 17))]))

# Decode: one new token per request. Append its K/V (lengths first), then attend to the whole cache.
seq_lens += 1  # in place: the table sees it at the next call
k_new, v_new = (torch.randn(2, Hkv, D, dtype=dtype, device=device) for _ in range(2))
ksb.kv_cache.append(k_new, v_new, cache, table, seq_lens - 1)  # one token per request: token b -> request b
q1 = torch.randn(2, Hq, D, dtype=dtype, device=device)
out1 = ksb.attention.decode(q1, cache, table)  # (2, Hq, D)
keys = [torch.cat([k[a:b], k_new[i:i + 1]]) for i, (a, b) in enumerate(((0, 5), (5, 17)))]
values = [torch.cat([v[a:b], v_new[i:i + 1]]) for i, (a, b) in enumerate(((0, 5), (5, 17)))]
report("decode", out1, torch.cat([torch_attention(q1[i:i + 1], keys[i], values[i], causal=False) for i in range(2)]))

# A plan does the host work once per step (selection, schedule, workspace); every layer then calls plan.run,
# which does no host synchronisation, so on a GPU it can be captured in a CUDA graph.
plan = ksb.attention.plan_decode(table, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, dtype=dtype, layout="NHD",
                                 page_size=PAGE)
report("plan", plan.run(q1, cache), out1.float(), against="the eager decode")

# Why this kernel: every registered candidate with its reasons (if rejected) or its rank.
print(ksb.explain("attention.decode", q1, cache, table))
