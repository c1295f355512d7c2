"""Page allocation and per-request block tables for the paged KV cache.

- :class:`PageAllocator`: a free list of page ids with reference counts (a page shared by
  several requests, e.g. a common prompt prefix, returns to the free list with its last user).
- :class:`BlockTables`: each request's pages and cached length; grows, truncates, forks
  (shares the full pages of a prefix) and frees them, and turns a batch of requests into a
  :class:`kernel_switchboard.PageTable`.
- :class:`StepBatch` / :func:`build_batch`: the flattened tokens of one engine step (any mix of
  prefill chunks and single decode tokens) with positions, ``qo_indptr`` and the page table.

The KV tensors themselves belong to the model (their shapes differ between GQA and MLA); every
layer uses the same page ids.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from kernel_switchboard.errors import fail
from kernel_switchboard.paged import PageTable


class OutOfPagesError(RuntimeError):
    """The allocator has fewer free pages than a request needs."""


class PageAllocator:
    """Page ids ``0..num_pages-1`` with reference counts; lowest free ids are handed out first."""

    def __init__(self, num_pages: int) -> None:
        if not (isinstance(num_pages, int) and num_pages > 0):
            raise fail("num_pages", num_pages, "a positive int")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pop() gives the lowest id
        self._refs = [0] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh pages (reference count 1), or :class:`OutOfPagesError` (nothing is taken)."""
        if n > len(self._free):
            raise OutOfPagesError(f"need {n} pages, {len(self._free)} of {self.num_pages} free")
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def share(self, pages: Sequence[int]) -> None:
        """One more user of each page."""
        for p in pages:
            if self._refs[p] <= 0:
                raise fail("pages", p, "pages that are allocated")
            self._refs[p] += 1

    def free(self, pages: Sequence[int]) -> None:
        """One user fewer of each page; a page with no user left is free again."""
        for p in pages:
            if self._refs[p] <= 0:
                raise fail("pages", p, "pages that are allocated (double free)")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def refcount(self, page: int) -> int:
        return self._refs[page]


class BlockTables:
    """Per-request pages and cached token counts over one :class:`PageAllocator`."""

    def __init__(self, num_pages: int, page_size: int, device: torch.device | str = "cpu",
                 reserved_pages: int = 0) -> None:
        if not (isinstance(page_size, int) and page_size > 0):
            raise fail("page_size", page_size, "a positive int")
        self.page_size = page_size
        self.device = torch.device(device)
        self.allocator = PageAllocator(num_pages)
        #: pages taken once for the engine's own use (e.g. the CUDA-graph padding rows' scratch page)
        self.reserved = self.allocator.allocate(reserved_pages) if reserved_pages else []
        self._pages: dict[Hashable, list[int]] = {}
        self._lens: dict[Hashable, int] = {}

    # -- per-request state ---------------------------------------------------------------------
    def __contains__(self, rid: Hashable) -> bool:
        return rid in self._pages

    def length(self, rid: Hashable) -> int:
        """Tokens whose KV is (or is being) written for ``rid``."""
        return self._lens.get(rid, 0)

    def pages(self, rid: Hashable) -> list[int]:
        return self._pages.get(rid, [])

    def pages_needed(self, rid: Hashable, new_tokens: int) -> int:
        """Fresh pages ``rid`` needs to hold ``new_tokens`` more tokens."""
        total = self.length(rid) + new_tokens
        return max(0, -(-total // self.page_size) - len(self.pages(rid)))

    def extend(self, rid: Hashable, new_tokens: int) -> None:
        """Room for ``new_tokens`` more tokens (allocates pages; raises OutOfPagesError, changing nothing)."""
        need = self.pages_needed(rid, new_tokens)
        fresh = self.allocator.allocate(need) if need else []
        self._pages.setdefault(rid, []).extend(fresh)
        self._lens[rid] = self.length(rid) + new_tokens

    def truncate(self, rid: Hashable, length: int) -> None:
        """Keep only the first ``length`` tokens of ``rid`` (frees the pages past them)."""
        if not 0 <= length <= self.length(rid):
            raise fail("length", length, f"an int in [0, {self.length(rid)}]")
        keep = -(-length // self.page_size)
        pages = self._pages.get(rid, [])
        self.allocator.free(pages[keep:])
        self._pages[rid] = pages[:keep]
        self._lens[rid] = length

    def fork(self, src: Hashable, dst: Hashable, num_tokens: int) -> int:
        """Let new request ``dst`` share the full pages of ``src``'s first ``num_tokens`` tokens.

        Only whole pages are shared (they are never written again), so ``dst`` starts with
        ``num_tokens`` rounded down to a page boundary cached; returns that count.
        """
        if dst in self._pages:
            raise fail("dst", dst, "a request without pages")
        shared = min(num_tokens, self.length(src)) // self.page_size
        pages = self.pages(src)[:shared]
        self.allocator.share(pages)
        self._pages[dst] = list(pages)
        self._lens[dst] = shared * self.page_size
        return shared * self.page_size

    def free(self, rid: Hashable) -> None:
        """Give back every page of ``rid`` and forget it."""
        self.allocator.free(self._pages.pop(rid, []))
        self._lens.pop(rid, None)

    # -- tensors ---------------------------------------------------------------------------------
    def page_table(self, rids: Sequence[Hashable], width: int | None = None) -> PageTable:
        """``PageTable`` of these requests (rows in order), padded with page 0 to ``width`` columns."""
        rows = [self.pages(r) for r in rids]
        width = max([len(r) for r in rows] + [1]) if width is None else width
        table = torch.zeros(len(rows), width, dtype=torch.int32)
        for i, r in enumerate(rows):
            if len(r) > width:
                raise fail("width", width, f"at least {len(r)} (pages of request {rids[i]!r})")
            table[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
        lens = [self.length(r) for r in rids]
        seq_lens = torch.tensor(lens, dtype=torch.int32)
        return PageTable(table.to(self.device), seq_lens.to(self.device), max_seq_len=max(lens, default=0))


@dataclass
class StepBatch:
    """The tokens of one forward step, flattened: request ``b`` owns rows ``qo_indptr[b]:qo_indptr[b+1]``.

    token_ids (T,) int64; positions (T,) int32 (KV position of each token); batch_indices (T,) int32;
    qo_indptr (B+1,) int32; table: the requests' pages with ``seq_lens`` = cached + new tokens;
    logits_indices (N,) int64: the rows whose logits the step returns. Host copies of the
    per-request lengths come along for the model's planning (no device reads).
    """

    token_ids: torch.Tensor
    positions: torch.Tensor
    batch_indices: torch.Tensor
    qo_indptr: torch.Tensor
    table: PageTable
    logits_indices: torch.Tensor
    qo_lens: list[int]
    seq_lens: list[int]
    block_rows: list[list[int]]

    @property
    def is_decode(self) -> bool:
        """Every request feeds exactly one token (and has a cache to attend to)."""
        return all(n == 1 for n in self.qo_lens)

    @property
    def num_tokens(self) -> int:
        return sum(self.qo_lens)

    def decode_rows(self) -> list[int]:
        """Requests of this step with one new token."""
        return [b for b, n in enumerate(self.qo_lens) if n == 1]


def build_batch(tables: BlockTables, rids: Sequence[Hashable], new_tokens: Sequence[Sequence[int]],
                logits: Sequence[str | int], device: torch.device | str | None = None) -> StepBatch:
    """Flatten one step. Call ``tables.extend`` for each request first: its length then counts the new tokens.

    ``logits[b]``: ``"last"`` (the logits of the request's last new token), ``"all"`` (every new
    token), ``"none"`` (a prefill chunk that does not end the prompt) or an int k (the last k new tokens,
    e.g. speculative verification).
    """
    device = tables.device if device is None else torch.device(device)
    ids: list[int] = []
    pos: list[int] = []
    bidx: list[int] = []
    indptr = [0]
    want: list[int] = []
    qo_lens: list[int] = []
    seq_lens: list[int] = []
    for b, (rid, toks) in enumerate(zip(rids, new_tokens)):
        n, total = len(toks), tables.length(rid)
        if n == 0 or n > total:
            raise fail(f"new_tokens[{b}]", n, f"1..{total} tokens (extend the request's pages first)")
        start = indptr[-1]
        ids.extend(toks)
        pos.extend(range(total - n, total))
        bidx.extend([b] * n)
        indptr.append(start + n)
        spec = logits[b]
        keep = {"last": 1, "all": n, "none": 0}.get(spec, spec) if isinstance(spec, str) else spec
        if isinstance(keep, str) or not 0 <= keep <= n:
            raise fail(f"logits[{b}]", spec, f"'last', 'all', 'none' or an int in [0, {n}] (trailing rows)")
        want.extend(range(start + n - keep, start + n))
        qo_lens.append(n)
        seq_lens.append(total)
    table = tables.page_table(rids)

    def t(values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(device)

    return StepBatch(t(ids, torch.int64), t(pos, torch.int32), t(bidx, torch.int32), t(indptr, torch.int32), table,
                     t(want, torch.int64), qo_lens, seq_lens, [list(tables.pages(r)) for r in rids])
