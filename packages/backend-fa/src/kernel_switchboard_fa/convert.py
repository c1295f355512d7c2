"""The canonical attention arguments in FlashAttention's forms: pure torch, CPU-testable, no sync.

- Paged K/V: FA takes the NHD pools as they are (``(num_pages, page_size, Hkv, D)``), the block
  table as ``page_table`` / ``block_table`` (B, max_pages) int32 and the lengths as
  ``seqused_k`` / ``cache_seqlens`` (B,) int32; FA2's varlen path wants ``cu_seqlens_k`` (B+1,).
- Decode queries (B, Hq, D) are a batch of one-token sequences, ``(B, 1, Hq, D)``.
- LSE: natural log in every provider; batched calls return ``(B, Hq, S_q)``, varlen calls
  ``(Hq, T)``; the op's layout is ``(B, Hq)`` / ``(T, Hq)``.
- Masks: FA aligns causal masks bottom-right (as the op does); ``window_size=(left, right)``
  keeps keys in ``[pos - left, pos + right]``; FA4 spells "none" as ``None``, FA2/3 as ``-1``.
- Split-KV by page-table slicing (FA4 on sm_90 has no split-KV of its own): request b's pages
  are cut into ``splits`` chunks that run as separate sequences; their (out, lse) pairs are merged.
"""

from __future__ import annotations

import torch


def decode_queries(q: torch.Tensor) -> torch.Tensor:
    """(B, Hq, D) -> (B, 1, Hq, D) view."""
    return q.unsqueeze(1)


def lse_batched(lse: torch.Tensor) -> torch.Tensor:
    """(B, Hq, 1) -> (B, Hq)."""
    return lse[..., 0]


def lse_batched_tokens(lse: torch.Tensor) -> torch.Tensor:
    """(B, Hq, S) -> contiguous (B * S, Hq): a dense batch's LSE as packed tokens."""
    return lse.transpose(1, 2).flatten(0, 1).contiguous()


def lse_varlen(lse: torch.Tensor) -> torch.Tensor:
    """(Hq, T) -> contiguous (T, Hq)."""
    return lse.t().contiguous()


def cu_seqlens(lengths: torch.Tensor) -> torch.Tensor:
    """(B,) lengths -> (B+1,) int32 offsets starting at 0 (device ops)."""
    out = torch.zeros(lengths.shape[0] + 1, dtype=torch.int32, device=lengths.device)
    out[1:] = torch.cumsum(lengths, 0)
    return out


def window_fa4(window_left: int) -> tuple[int | None, None]:
    """FA4's ``window_size`` for the op's ``window_left`` (the right side comes from ``causal``)."""
    return (None if window_left < 0 else window_left, None)


def window_fa(window_left: int, causal: bool) -> tuple[int, int]:
    """FA2/FA3's ``window_size``: -1 = unbounded; causal bounds the right side at 0."""
    return (-1 if window_left < 0 else window_left, 0 if causal else -1)


def softcap(cap: float | None) -> float:
    """FA's ``softcap``: 0.0 = off."""
    return 0.0 if cap is None else float(cap)


# -- split-KV by page-table slicing --------------------------------------------------------------------
def split_pages(max_pages: int, splits: int) -> int:
    """Pages per chunk when a table of ``max_pages`` columns is cut into ``splits`` chunks."""
    return -(-max_pages // splits)


def split_table(block_table: torch.Tensor, seq_lens: torch.Tensor, page_size: int, splits: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) table, (B,) lengths -> (B*splits, C) table and (B*splits,) lengths, C = ceil(P / splits).

    Row ``b * splits + s`` holds pages ``s*C .. s*C+C-1`` of request b and the tokens of request b
    that fall in them (0 for chunks past its end). Device ops; columns past P read page 0.
    """
    b, p = block_table.shape
    c = split_pages(p, splits)
    table = torch.nn.functional.pad(block_table, (0, c * splits - p)).view(b * splits, c)
    start = torch.arange(splits, device=seq_lens.device, dtype=torch.int32) * (c * page_size)
    lens = (seq_lens[:, None] - start[None, :]).clamp(0, c * page_size).to(torch.int32).reshape(-1)
    return table, lens


def merge_splits(out: torch.Tensor, lse: torch.Tensor, splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Partials (B*splits, H, D), (B*splits, H) -> merged (B, H, D) in out's dtype, lse (B, H) float32.

    Chunks with nothing to attend (lse -inf) weigh 0; a request with no token gets out 0, lse -inf.
    """
    n, h, d = out.shape
    lse3 = lse.view(n // splits, splits, h)
    mx = lse3.amax(dim=1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    w = torch.exp(lse3 - mx)  # (B, S, H)
    total = w.sum(dim=1)  # (B, H)
    merged = torch.einsum("bsh,bshd->bhd", w, out.view(n // splits, splits, h, d).float())
    merged = merged / torch.where(total > 0, total, torch.ones_like(total))[..., None]
    return merged.to(out.dtype), torch.log(total) + mx[:, 0]


def merge_two(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attentions over disjoint keys: (T, H, D) + (T, H) each -> merged pair."""
    out = torch.stack((out_a, out_b), dim=1).flatten(0, 1)
    lse = torch.stack((lse_a, lse_b), dim=1).flatten(0, 1)
    return merge_splits(out, lse, 2)
