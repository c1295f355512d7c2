"""Which tokens attend which: a transformers attention mask turned into per-request lengths.

The switchboard's kernels take attention as per-request lengths: request ``b`` has ``n_q`` query rows and ``n_k``
key/value rows, query row ``r`` sits at key position ``n_k - n_q + r`` (bottom-right aligned), causal masks later
positions and a window of ``window_left`` keeps positions ``>= position - window_left``. A 4-d boolean mask from
transformers (True = attend) is served by them exactly when it is that pattern over the rows and columns it keeps:
:func:`layout_of` finds the kept rows and columns, builds the mask the kernels would apply, and compares it with the
given one element by element. Left padding, a static cache's unwritten slots and a sliding window pass; anything
else (right padding, whose padding queries still see the tokens before them; a bidirectional image block; a
packed-sequence mask) does not, and the caller serves it another way or refuses it.

A mask object is shared by every layer of one forward pass, so the analysis (one host read) is kept for the last
few masks seen and done once per forward, not once per layer.
"""

from __future__ import annotations

import functools
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

_Tensor = torch.Tensor


@dataclass(frozen=True)
class Layout:
    """Per-request lengths of a batch of dense ``(B, H, L, D)`` attention inputs.

    ``q_index`` / ``kv_index``: the flat rows (``b * L + i``) that take part, in order, or None when every row does.
    ``kv_prefix``: every request's kept key columns are ``0 .. n_k - 1`` (no left padding), so a request's keys can
    be read in place as one page of a paged cache.
    """

    batch: int
    q_len: int
    kv_len: int
    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]
    qo_indptr: _Tensor  # (B+1,) int32
    kv_indptr: _Tensor  # (B+1,) int32
    q_index: _Tensor | None
    kv_index: _Tensor | None
    kv_prefix: bool
    pages: _Tensor  # (B, 1) int32: request b's keys are page b when they are read in place
    seq_lens: _Tensor  # (B,) int32: kv_lens on the device

    @property
    def all_q(self) -> bool:
        return self.q_index is None


@functools.lru_cache(maxsize=64)
def uniform_layout(batch: int, q_len: int, kv_len: int, device: torch.device) -> Layout:
    """Every query row and every key column of every request takes part (kept per shape: no work per layer)."""
    steps = torch.arange(batch + 1, dtype=torch.int32, device=device)
    return Layout(batch, q_len, kv_len, (q_len,) * batch, (kv_len,) * batch, steps * q_len, steps * kv_len, None, None,
                  True, steps[:-1, None].contiguous(), torch.full((batch,), kv_len, dtype=torch.int32, device=device))


def _pattern(q_keep: _Tensor, kv_keep: _Tensor, causal: bool, window_left: int | None) -> _Tensor:
    """(B, Lq, Lk) bool: the mask the kernels apply to the kept rows and columns, at their original positions."""
    col = kv_keep.cumsum(1) - 1  # rank of each kept column within its request
    row = q_keep.cumsum(1) - 1
    allowed = q_keep[:, :, None] & kv_keep[:, None, :]
    if causal:
        n_q, n_k = q_keep.sum(1), kv_keep.sum(1)
        position = (n_k - n_q)[:, None] + row  # key position of each query row (bottom-right aligned)
        allowed &= col[:, None, :] <= position[:, :, None]
        if window_left is not None:
            allowed &= col[:, None, :] >= position[:, :, None] - window_left
    return allowed


def _analyse(mask: _Tensor, batch: int, causal: bool, window_left: int | None) -> Layout | None:
    _, _, q_len, kv_len = mask.shape
    rows = mask[:, 0].expand(batch, q_len, kv_len)
    q_keep, kv_keep = rows.any(2), rows.any(1)
    if not torch.equal(_pattern(q_keep, kv_keep, causal, window_left), rows):
        return None
    n_q, n_k = q_keep.sum(1, dtype=torch.int32), kv_keep.sum(1, dtype=torch.int32)
    prefix = torch.equal(kv_keep, torch.arange(kv_len, device=mask.device)[None, :] < n_k[:, None])
    lengths = torch.cat((n_q, n_k)).tolist()
    q_lens, kv_lens = tuple(lengths[:batch]), tuple(lengths[batch:])
    zero = torch.zeros(1, dtype=torch.int32, device=mask.device)
    qo_indptr = torch.cat((zero, n_q.cumsum(0, dtype=torch.int32)))
    kv_indptr = torch.cat((zero, n_k.cumsum(0, dtype=torch.int32)))
    q_index = None if all(n == q_len for n in q_lens) else q_keep.reshape(-1).nonzero().squeeze(1)
    kv_index = None if all(n == kv_len for n in kv_lens) else kv_keep.reshape(-1).nonzero().squeeze(1)
    pages = torch.arange(batch, dtype=torch.int32, device=mask.device)[:, None]
    return Layout(batch, q_len, kv_len, q_lens, kv_lens, qo_indptr, kv_indptr, q_index, kv_index, prefix, pages, n_k)


class _Memo:
    """The layouts of the last few masks, keyed by the mask object (held weakly) and its version counter."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self.entries: OrderedDict[tuple[int, int, int, bool, int | None], tuple[weakref.ref[_Tensor], Layout | None]] = (
            OrderedDict())

    def get(self, mask: _Tensor, batch: int, causal: bool, window_left: int | None) -> Layout | None:
        key = (id(mask), mask._version, batch, causal, window_left)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is mask:
            self.entries.move_to_end(key)
            return hit[1]
        layout = _analyse(mask, batch, causal, window_left)
        self.entries[key] = (weakref.ref(mask), layout)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return layout


_MEMO = _Memo()


def layout_of(mask: _Tensor, batch: int, causal: bool, window_left: int | None) -> Layout | None:
    """The :class:`Layout` a 4-d bool mask ``(B or 1, 1, Lq, Lk)`` describes for ``batch`` requests, or None when
    the switchboard's kernels would not apply exactly this mask (see the module docstring)."""
    return _MEMO.get(mask, batch, causal, window_left)
