"""Pieces every module of :mod:`kernel_switchboard.flashinfer` shares: refusals, dtype names, base-2 log-sum-exp,
and page tables built from FlashInfer's CSR description (once per plan, or rewritten in place at every run for CUDA
graphs). FlashInfer's paged KV forms are in :mod:`._kv`."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import InvalidArgumentError, fail
from ..ops.attention_runner import LOG2E as LOG2E
from ..ops.attention_runner import LOG2E_TENSOR as LOG2E_TENSOR
from ..paged import PageTable

#: FlashInfer's log-sum-exp is base 2 (``log2(sum(exp2(...)))``), the switchboard's natural: ``lse2 = lse * LOG2E``
#: (``LOG2E_TENSOR``: the same as a 0-d CPU tensor, for ``lse.mul_``; plans made with ``lse_base2=True`` return
#: base 2 themselves), and back: ``lse = lse2 * LN2``
LN2 = math.log(2.0)

#: implementation backends FlashInfer's wrappers accept; whichever is named, the switchboard ranks its own kernels
BACKENDS = ("auto", "fa2", "fa3", "cudnn", "cutlass", "trtllm-gen", "cute-dsl")
LAYOUTS = ("NHD", "HND")
_INT_DTYPES = (torch.int32, torch.int64)


def check_backend(backend: Any) -> None:
    if backend not in BACKENDS:
        raise fail("backend", backend, f"one of {BACKENDS} (the switchboard picks its own kernel whichever is named)")


def check_layout(kv_layout: Any) -> None:
    if kv_layout not in LAYOUTS:
        raise fail("kv_layout", kv_layout, f"one of {LAYOUTS}")


def check_pos_encoding(pos_encoding_mode: Any) -> None:
    """RoPE or ALiBi fused into attention is not served: rotate q and k with :mod:`kernel_switchboard.flashinfer.rope`
    before attention instead."""
    if pos_encoding_mode != "NONE":
        raise fail("pos_encoding_mode", pos_encoding_mode,
                   "'NONE' (apply RoPE with kernel_switchboard.flashinfer.rope before attention; ALiBi is not served)")


def check_unserved(**values: Any) -> None:
    """Raise naming the first argument given a value: each is a FlashInfer feature this layer does not serve."""
    for name, value in values.items():
        if value is not None:
            raise fail(name, _shown(value), "None: not served by kernel_switchboard.flashinfer")


def check_jit_args(jit_args: Any) -> None:
    if jit_args is not None:
        raise fail("jit_args", _shown(jit_args), "None: FlashInfer JIT variants are not served "
                                                 "(use kernel_switchboard.Variant with kernel_switchboard.attention)")


def check_workspace(buffer: Any) -> torch.Tensor:
    if not isinstance(buffer, torch.Tensor):
        raise fail("float_workspace_buffer", type(buffer).__name__, "a torch.Tensor (its device is the wrappers' device)")
    return buffer


def to_dtype(value: Any, name: str) -> torch.dtype:
    """A torch dtype from a dtype or its name (``"float16"``), as FlashInfer's arguments take them."""
    if isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype):
        return getattr(torch, value)  # type: ignore[no-any-return]
    raise fail(name, value, "a torch.dtype or its name, e.g. 'bfloat16'")


def scale_value(value: Any, name: str) -> float:
    """A calibration scale as a host float (1.0 for None). Tensor scales are served only where the cache can carry
    them (k_scale / v_scale of fp8 pages in the batch wrappers): elsewhere they would need a device read per call."""
    if value is None:
        return 1.0
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf:
        return float(value)
    raise fail(name, _shown(value), "a positive Python float or None (a tensor scale is served only as k_scale / "
                                     "v_scale of fp8 pages in the batch wrappers' run)")


def window_of(window_left: Any) -> int | None:
    """FlashInfer's ``window_left`` (-1 = no window) as the switchboard's (None = no window)."""
    if not (isinstance(window_left, int) and window_left >= -1):
        raise fail("window_left", window_left, "an int >= -1 (-1 = no window)")
    return None if window_left < 0 else window_left


def soft_cap_of(logits_soft_cap: Any) -> float | None:
    """FlashInfer's ``logits_soft_cap`` (None or 0 = off) as the switchboard's (None = off)."""
    if logits_soft_cap is None or logits_soft_cap == 0:
        return None
    return float(logits_soft_cap)


def merge_legacy_args(api: str, names: Sequence[str], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Optional plan arguments given positionally (deprecated by FlashInfer, still accepted) merged into ``kwargs``."""
    if len(args) > len(names):
        raise TypeError(f"{api}.plan() takes at most {len(names)} optional positional arguments, got {len(args)}")
    merged = dict(kwargs)
    for name, value in zip(names, args):
        if name in merged:
            raise TypeError(f"{api}.plan() got multiple values for argument {name!r}")
        merged[name] = value
    return merged


def _shown(value: Any) -> Any:
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else value


# -- page tables from FlashInfer's CSR form ------------------------------------------------------------------------
def _index_tensor(t: Any, name: str, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INT_DTYPES:
        raise fail(name, _shown(t) if isinstance(t, torch.Tensor) else type(t).__name__, "a 1-d int32 tensor")
    return t.to(device, non_blocking=True)


def check_page_size(page_size: Any) -> int:
    if not (isinstance(page_size, int) and not isinstance(page_size, bool) and page_size >= 1):
        raise fail("page_size", page_size, "a positive int")
    return page_size


def csr_table(indptr: Any, indices: Any, page_size: int, device: torch.device, *, last_page_len: Any = None,
              seq_lens: Any = None, names: tuple[str, str, str] = ("indptr", "indices", "last_page_len")) -> PageTable:
    """The :class:`PageTable` of FlashInfer's CSR pages (``indptr`` (B+1,), ``indices``), the lengths from
    ``last_page_len`` (B,) or given as ``seq_lens`` (B,), on ``device``. Host work: the page counts are read once."""
    indptr = _index_tensor(indptr, names[0], device)
    indices = _index_tensor(indices, names[1], device)
    batch = indptr.numel() - 1
    if batch < 0:
        raise fail(names[0], "an empty tensor", "a (batch + 1,) tensor")
    if seq_lens is not None:
        lens = _index_tensor(seq_lens, names[2], device)
        if lens.numel() != batch:
            raise fail(names[2], _shown(lens), f"({batch},): one length per request")
        # the last page's fill follows from each length and page count; from_csr checks that they agree
        counts = (indptr[1:] - indptr[:-1]).to(lens.dtype)
        last = torch.where(counts > 0, lens - (counts - 1).clamp(min=0) * page_size, torch.zeros_like(lens))
        try:
            pages = PageTable.from_csr(indptr, indices, last, page_size).block_table
        except InvalidArgumentError as exc:
            if not str(exc).startswith("last_page_len"):
                raise
            raise fail(names[2], _shown(lens), "lengths that fill each request's pages: "
                       "(pages - 1) * page_size < length <= pages * page_size (0 without pages)") from None
        return PageTable(pages, lens.to(torch.int32).contiguous())
    last = _index_tensor(last_page_len, names[2], device)
    return PageTable.from_csr(indptr, indices, last, page_size)


def page_counts(indptr: torch.Tensor) -> list[int]:
    """Pages per request of a CSR ``indptr`` (one host read)."""
    values = indptr.tolist()
    return [b - a for a, b in itertools.pairwise(values)]


class GraphTable:
    """The page table of a CUDA-graph wrapper: a fixed ``(batch, width)`` block table and ``(batch,)`` lengths that
    :meth:`refresh` rebuilds from the caller's CSR buffers with fixed shapes, no allocation and no host read, so the
    caller may rewrite its buffers in place between graph replays.

    ``width`` (the most pages one request may use) follows the engines' sizing: the indices buffer holds ``width``
    pages for each of the requests the indptr buffer's storage has rows for. :meth:`check` refuses a step whose
    requests need more.
    """

    def __init__(self, indptr_buf: torch.Tensor, indices_buf: torch.Tensor, page_size: int, *,
                 last_page_len_buf: torch.Tensor | None = None, seq_lens_buf: torch.Tensor | None = None,
                 workspace: torch.Tensor | None = None) -> None:
        device = indices_buf.device
        batch = indptr_buf.numel() - 1
        rows = max(batch, indptr_buf.untyped_storage().nbytes() // indptr_buf.element_size()
                   - indptr_buf.storage_offset() - 1, 1)
        width = max(indices_buf.numel() // rows, 1)
        self.batch, self.width, self.page_size = batch, width, page_size
        self.indptr, self.indices, self.last_page_len = indptr_buf, indices_buf, last_page_len_buf
        self._gather, block_table = _scratch(workspace, batch, width, device)
        self._cols = torch.arange(width, dtype=torch.int32, device=device)
        self._last_index = max(indices_buf.numel() - 1, 0)
        self._counts = torch.empty(batch, dtype=torch.int32, device=device)
        self._nonempty = torch.empty(batch, dtype=torch.int32, device=device)
        given = seq_lens_buf is not None and seq_lens_buf.dtype == torch.int32 and seq_lens_buf.is_contiguous()
        self._seq_lens_src = None if given else seq_lens_buf
        seq_lens = seq_lens_buf if given else torch.zeros(batch, dtype=torch.int32, device=device)
        assert seq_lens is not None
        self.table = PageTable(block_table, seq_lens, max_seq_len=width * page_size)
        self.refresh()

    @property
    def max_kv_len(self) -> int:
        return self.width * self.page_size

    def check(self, counts: list[int], name: str = "paged_kv_indices_buffer") -> None:
        """Refuse a step whose page counts this table cannot hold."""
        most = max(counts, default=0)
        if most > self.width:
            raise fail(name, f"{self.indices.numel()} entries for a request of {most} pages",
                       f"room for every request's pages: this CUDA-graph wrapper serves at most {self.width} pages "
                       f"per request (the indices buffer split over the requests its indptr buffer's storage holds)")

    def refresh(self) -> PageTable:
        """Rewrite the block table and lengths from the caller's buffers (fixed shapes: capturable)."""
        table = self.table
        starts, ends = self.indptr[:-1], self.indptr[1:]
        torch.add(starts.unsqueeze(1), self._cols, out=self._gather)
        self._gather.clamp_(max=self._last_index)
        torch.index_select(self.indices, 0, self._gather.view(-1), out=table.block_table.view(-1))
        if self.last_page_len is not None:  # lengths from the pages: (pages - 1) * page_size + last, 0 when no pages
            torch.sub(ends, starts, out=self._counts)
            torch.clamp(self._counts, max=1, out=self._nonempty)
            lens = table.seq_lens
            torch.sub(self._counts, 1, out=lens)
            lens.mul_(self.page_size).add_(self.last_page_len).mul_(self._nonempty)
        elif self._seq_lens_src is not None:
            table.seq_lens.copy_(self._seq_lens_src)
        return table


def _scratch(workspace: torch.Tensor | None, batch: int, width: int, device: torch.device
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(gather index, block table), both (batch, width) int32: carved from the caller's float workspace when it has
    room (they are rewritten at every run, so wrappers sharing a workspace may share them), else allocated."""
    count = batch * width
    nbytes = 8 * count
    if (workspace is not None and workspace.device == device and workspace.is_contiguous()
            and workspace.numel() * workspace.element_size() >= nbytes and workspace.data_ptr() % 4 == 0):
        words = workspace.view(-1).view(torch.uint8)[:nbytes].view(torch.int32)
        return words[:count].view(batch, width), words[count:].view(batch, width)
    return (torch.empty(batch, width, dtype=torch.int32, device=device),
            torch.zeros(batch, width, dtype=torch.int32, device=device))


def write_out(out: Any, y: torch.Tensor) -> torch.Tensor:
    """``y``, or ``y`` written into the caller's ``out`` (FlashInfer's optional output), which must match it: shape,
    dtype and device (``copy_`` alone would broadcast or cast into a wrong one)."""
    if out is None:
        return y
    if not (isinstance(out, torch.Tensor) and out.shape == y.shape and out.dtype == y.dtype and out.device == y.device):
        got = f"{tuple(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor) else type(out).__name__
        raise fail("out", got, f"{tuple(y.shape)} {y.dtype} on {y.device}: the result's shape, dtype and device")
    return out.copy_(y)


def copy_into(buffer: torch.Tensor, values: Any, name: str) -> None:
    """FlashInfer's CUDA-graph ``plan``: the step's values go into the caller's fixed buffer (nothing when they are
    that buffer already)."""
    if not isinstance(values, torch.Tensor) or values.dim() != 1:
        raise fail(name, _shown(values) if isinstance(values, torch.Tensor) else type(values).__name__,
                   "a 1-d int32 tensor")
    if values.numel() > buffer.numel():
        raise fail(name, f"{values.numel()} entries", f"at most the {buffer.numel()} of the buffer given at construction")
    target = buffer[: values.numel()]
    if values.device == target.device and values.data_ptr() == target.data_ptr():
        return
    target.copy_(values, non_blocking=True)


def check_graph_buffers(batch_name: str, buffers: dict[str, Any]) -> None:
    for name, buf in buffers.items():
        if not isinstance(buf, torch.Tensor) or buf.dim() != 1 or buf.dtype != torch.int32 or not buf.is_contiguous():
            raise fail(name, _shown(buf) if isinstance(buf, torch.Tensor) else type(buf).__name__,
                       f"a contiguous 1-d int32 tensor when use_cuda_graph=True ({batch_name})")
