"""Translation of the switchboard's canonical arguments into what TensorRT-LLM's kernels take.

Pure torch and host arithmetic: no vendor import, runs on CPU tensors (the tests check it against
the reference kernels through torch models of the vendor semantics).

XQA decode (``flashinfer.decode.trtllm_batch_decode_with_kv_cache(..., backend="xqa")``):
separate K and V page tensors in NHD ``(P, S, Hkv, D)`` or HND ``(P, Hkv, S, D)``; a row-contiguous
int32 block table ``(B, max_pages)`` (its width sets the kernel's page-list stride); int32
sequence lengths; logits = q·k_stored * ``bmm1_scale``; out = softmax · v_stored * ``bmm2_scale``;
``window_left = w`` keeps the last ``w + 1`` positions (the kernel's ``sliding_win_size``).

CUTLASS fused MoE (``flashinfer.fused_moe.cutlass_fused_moe``): fc1 ``(E, 2I, H)`` rows are
``[up; gate]`` (the activation is ``silu(second half) * first half``), the switchboard's w13 is
``[gate; up]``: the halves are swapped, for fp8 weights together with their 128-row scale blocks.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, NamedTuple

import torch


class XqaDecodeArgs(NamedTuple):
    """Keyword arguments of ``trtllm_batch_decode_with_kv_cache`` (minus workspace / out / backend)."""

    query: torch.Tensor  # (B, Hq, D) contiguous
    kv_cache: tuple[torch.Tensor, torch.Tensor]  # K and V pages, in kv_layout
    block_tables: torch.Tensor  # (B, max_pages) int32, contiguous
    seq_lens: torch.Tensor  # (B,) int32
    max_seq_len: int
    bmm1_scale: float
    bmm2_scale: float
    window_left: int
    kv_layout: str


def _heads_strided(t: torch.Tensor, head_dim: int) -> bool:
    """XQA addresses pages / tokens / heads in units of whole heads: every stride but the last is a
    multiple of head_dim, the last is 1."""
    return t.stride(-1) == 1 and all(s % head_dim == 0 for s in t.stride()[:-1])


def xqa_decode_args(q: torch.Tensor, cache: Any, table: Any, p: Any) -> XqaDecodeArgs:
    """q (B, Hq, D), a PagedKVCache, a PageTable and AttnParams -> XQA decode arguments."""
    k, v = cache.k_pages, cache.v_pages
    d = cache.head_dim
    if not _heads_strided(k, d):
        k = k.contiguous()
    if not _heads_strided(v, d):
        v = v.contiguous()
    fp8 = cache.is_fp8
    k_scale = cache.k_scale if fp8 else 1.0
    v_scale = cache.v_scale if fp8 else 1.0
    return XqaDecodeArgs(
        query=q.contiguous(),
        kv_cache=(k, v),
        block_tables=table.block_table.contiguous(),
        seq_lens=table.seq_lens,
        max_seq_len=int(p.max_kv_len),
        bmm1_scale=float(p.sm_scale) * k_scale,
        bmm2_scale=v_scale,
        window_left=int(p.window_left),
        kv_layout=cache.layout,
    )


class XqaMlaArgs(NamedTuple):
    """Keyword arguments of ``flashinfer.mla.xqa_batch_decode_with_kv_cache_mla`` (minus workspace / out)."""

    query: torch.Tensor  # (B, 1, H, Dc + Dr): [q_nope, q_pe]
    kv_cache: torch.Tensor  # (P, S, Dc + Dr): [ckv, kpe]
    qk_nope_head_dim: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    max_seq_len: int
    bmm1_scale: float
    bmm2_scale: float


def xqa_mla_args(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor,
                 table: Any, p: Any) -> XqaMlaArgs:
    """The switchboard's split latent / rope tensors -> XQA MLA's concatenated query and cache.

    The cache concatenation is a full copy of the pages at every call (XQA MLA reads one
    ``[ckv | kpe]`` row per token); engines that keep that layout avoid it.
    """
    dc, dr = q_nope.shape[-1], q_pe.shape[-1]
    return XqaMlaArgs(
        query=torch.cat((q_nope, q_pe), dim=-1).unsqueeze(1),
        kv_cache=torch.cat((ckv_pages, kpe_pages), dim=-1),
        qk_nope_head_dim=128,  # flashinfer checks DeepSeek's value; the kernel does not use it
        kv_lora_rank=dc,
        qk_rope_head_dim=dr,
        block_tables=table.block_table.contiguous(),
        seq_lens=table.seq_lens,
        max_seq_len=int(p.max_kv_len),
        bmm1_scale=float(p.sm_scale),
        bmm2_scale=1.0,
    )


# -- fused MoE weights ------------------------------------------------------------------------------------
def swap_halves(t: torch.Tensor, dim: int = 1) -> torch.Tensor:
    """[first; second] -> [second; first] along ``dim`` (a contiguous copy). The size must be even."""
    first, second = t.chunk(2, dim=dim)
    return torch.cat((second, first), dim=dim).contiguous()


def to_trtllm_w13(w13: torch.Tensor) -> torch.Tensor:
    """(E, 2I, H) rows [gate; up] -> [up; gate]."""
    return swap_halves(w13, 1)


def to_trtllm_w13_scale(scale: torch.Tensor, inter: int, block: int = 128) -> torch.Tensor:
    """(E, 2I/128, H/128) block scales of w13 -> those of the swapped weight (needs I % 128 == 0)."""
    if inter % block:
        raise ValueError(f"intermediate size {inter} is not a multiple of {block}: the gate/up halves share a "
                         "scale block and cannot be swapped")
    return swap_halves(scale, 1)


class WeightCache:
    """Translated copies of weight tensors, reused while the source tensor is alive and unchanged.

    Keyed by the source's identity (a weak reference, so a freed tensor whose address is reused
    never hits) and its version counter (an in-place update invalidates). Least recently used
    entries are dropped beyond ``max_bytes``: translating MoE weights doubles their memory.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[int, tuple[weakref.ref[torch.Tensor], int, Any, torch.Tensor]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, src: torch.Tensor, tag: Any, make: Any) -> torch.Tensor:
        """``make(src)``, cached for this (src, tag)."""
        version = src._version
        key = id(src)
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None and hit[0]() is src and hit[1] == version and hit[2] == tag:
                self._entries.move_to_end(key)
                return hit[3]
        out: torch.Tensor = make(src)
        nbytes = out.numel() * out.element_size()
        if nbytes > self.max_bytes:
            return out
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[3].numel() * old[3].element_size()
            while self._entries and self._bytes + nbytes > self.max_bytes:
                _, (_, _, _, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped.numel() * dropped.element_size()
            self._entries[key] = (weakref.ref(src), version, tag, out)
            self._bytes += nbytes
        return out

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


class MoeArgs(NamedTuple):
    """Arguments of ``cutlass_fused_moe`` / ``torch.ops.trtllm.fused_moe`` for one call."""

    input: torch.Tensor  # (T, H)
    token_selected_experts: torch.Tensor  # (T, k) int32
    token_final_scales: torch.Tensor  # (T, k) float32
    fc1_expert_weights: torch.Tensor  # (E, 2I, H) [up; gate]
    fc2_expert_weights: torch.Tensor  # (E, H, I)
    output_dtype: torch.dtype
    quant_scales: list[torch.Tensor]  # [] or [fc1 block scales, fc2 block scales]
    use_deepseek_fp8_block_scale: bool


def moe_args(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, w13: torch.Tensor,
             w2: torch.Tensor, w13_scale: torch.Tensor | None, w2_scale: torch.Tensor | None,
             cache: WeightCache | None = None) -> MoeArgs:
    """Canonical experts arguments -> TensorRT-LLM's (w13 halves swapped, through ``cache`` if given)."""
    inter = w2.shape[2]

    def get(src: torch.Tensor, tag: str, make: Any) -> torch.Tensor:
        return cache.get(src, tag, make) if cache is not None else make(src)

    fc1 = get(w13, "w13", to_trtllm_w13)
    scales: list[torch.Tensor] = []
    if w13_scale is not None and w2_scale is not None:
        scales = [get(w13_scale, "w13_scale", lambda s: to_trtllm_w13_scale(s, inter)), w2_scale.contiguous()]
    return MoeArgs(x.contiguous(), topk_ids.to(torch.int32).contiguous(), topk_weights.to(torch.float32).contiguous(),
                   fc1, w2.contiguous(), x.dtype, scales, bool(scales))
