"""Triton sampling kernels: top-k / top-p / min-p sampling from probabilities or logits, renorm, and
chain speculative verification, without sorting the vocabulary (see :mod:`._sampling_kernels`).

Signatures and semantics: :mod:`kernel_switchboard.ops.sampling`. Randomness: ``top_k_top_p`` draws
one Philox seed per call from ``generator`` (torch's default generator when None; on the host, or on the device
while a CUDA graph is captured) and derives every uniform from it in-kernel; ``chain_speculative`` draws its
(B, n+1) uniforms with ``torch.rand``. Both are reproducible for a seeded generator and deterministic (no atomics).
Invalid rows (NaN / inf / negative entries, no positive mass, an out-of-range per-row parameter) are found inside
the kernels and get the op's sentinel (token -1, a NaN renorm row, a chain row of -1): no launch reads anything
back to the host.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import torch
import triton

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.invariance import active as invariant_scope

from . import _sampling_kernels as K
from ._common import pdl_launch

#: candidates checked per pass of the top-p rejection loop, and the bound on those passes
NUM_CAND = 4
MAX_ROUNDS = 16
#: pivots per pass of the exact top-k / top-p threshold search, its workspace and pass bound
NUM_PIVOTS = 8
MAX_SCRATCH = 2048
MAX_PASSES = 8
#: widest chunk and the most elements one program holds per chunk (rows x chunk); the interpreter, whose
#: cost is per operation and per nested call rather than per element, takes much bigger tiles. On a GPU one
#: program walks a whole row, so the chunk sets the bytes in flight per SM: 8192 fp32 = 32 KiB per step.
#: sm_90 compile, per kernel variant: 1-10 s; the pipelined top-p walk (8 warps) keeps ~500 B of stack.
MAX_BLOCK = 8192
TILE = 65536 if triton_interpreting() else 4096
#: elements of a chunk per warp (4 per thread: one 16-byte load of fp32), and the fewest warps
WARP_ELEMS = 128
MIN_WARPS = 4
#: (chunk, load pipeline stages, most warps) of the walks over the vocabulary. Stages > 1 issue the next
#: chunks' loads (cp.async into shared memory) while this chunk's reductions run. The top-p walk (the
#: candidate passes, with or without top-k) gains from stages and wide chunks; the threshold-search walk
#: (top-k's own kernel, renorm) spills once pipelined or widened. On the H200 (128 x 128256 fp32 probs) the top-p
#: walk runs fastest on 8192-wide chunks with 3 stages and 8 warps, and the search walk on 4096-wide chunks with 16
#: warps and one stage; top-k runs its threshold search in its own kernel, with its pivot counts and masses in one
#: reduction and the slice-maxima bound, and the first candidate pass sums only what it needs.
TOP_P_WALK = (8192, 3, 8)
SEARCH_WALK = (4096, 1, 16)
#: load pipeline stages of top-k's whole-row walks (row max, slice maxima; the pivot search keeps SEARCH_WALK's):
#: with one CTA per row and one row per SM, an unpipelined walk waits out each chunk's load latency.
#: H100, 128 x 128256 probabilities, k = 50, when the compaction walked the whole row too: 1 / 2 / 3 / 4 stages
#: 150 / 145 / 120 / 121 us; with only the slice-maxima walk whole: 3 / 4 stages 90.4 / 89.0 us
TOP_K_WALK_STAGES = 3
#: chunk width of those walks (the search walk's, SEARCH_WALK[0], or wider); on that H100 8192 takes 91.8 us
TOP_K_WALK_BLOCK = 4096
#: finish threshold searches with tl.sort; the interpreter ranks pairwise instead (its sort is very slow)
SORT = not triton_interpreting()
#: the largest top-k set (ties included) the threshold kernel hands to the sampling kernel, which then draws from
#: it without walking the row; a larger set is sampled by the candidate passes over the whole row (0: every set)
TOP_K_SET = 256
_MAX_NUMEL = 1 << 20


class _Config(NamedTuple):
    rows: int
    block: int
    scratch: int
    num_warps: int
    stages: int


@functools.lru_cache(maxsize=256)
def _config(batch: int, vocab: int, walk: tuple[int, int, int]) -> _Config:
    """Launch shape of a sampling kernel; ``walk``: (chunk, load pipeline stages, most warps)."""
    chunk, stages, max_warps = walk
    block = min(triton.next_power_of_2(vocab), chunk, MAX_BLOCK)
    scratch = min(triton.next_power_of_2(vocab), MAX_SCRATCH if SORT else min(MAX_SCRATCH, 512))
    # (rows, block, pivots) tiles, and (rows, scratch, scratch) ranks without sort, stay under Triton's numel cap
    cap = min(TILE // block, _MAX_NUMEL // (block * max(NUM_PIVOTS, NUM_CAND)))
    if not SORT:
        cap = min(cap, _MAX_NUMEL // (scratch * scratch))
    rows = max(1, min(cap, triton.next_power_of_2(max(batch, 1))))
    num_warps = min(max_warps, max(MIN_WARPS, rows * block // WARP_ELEMS))
    return _Config(rows, block, scratch, num_warps, stages)


def _split(v: Any, dtype: torch.dtype, device: torch.device) -> tuple[bool, bool, Any, Any]:
    """(given, per_row, tensor_or_dummy, scalar) for one scalar-or-(B,)-tensor parameter."""
    if v is None:
        return False, False, None, 0
    if isinstance(v, torch.Tensor):
        return True, True, v, 0
    return True, False, None, v


_SEED_RANGE = 2**31 - 1


@functools.lru_cache(maxsize=16)
def _zero_seed(device: torch.device) -> torch.Tensor:
    return torch.zeros(1, dtype=torch.int64, device=device)


def _seed(generator: torch.Generator | None, device: torch.device) -> tuple[torch.Tensor, int]:
    """The Philox seed of one call, from ``generator`` (the device's default generator when None), as a (1,)
    device tensor plus a host int that the kernel adds together.

    Outside capture a CUDA generator's (seed, offset) pair is read and its offset advanced on the host, as torch's
    own random ops do: no launch, and the same generator state gives the same seed (the tensor is a cached zero).
    Inside capture torch draws the tensor on the device, so each replay of the graph draws a fresh seed; both paths
    run the same compiled kernel, so a capture after eager calls compiles nothing."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.randint(0, _SEED_RANGE, (1,), generator=generator, device=device, dtype=torch.int64), 0
    if device.type != "cuda":  # a CPU generator has no offset: one draw from it, on the host
        return _zero_seed(device), int(torch.randint(0, _SEED_RANGE, (1,), generator=generator))
    if generator is None:
        index = device.index if device.index is not None else torch.cuda.current_device()
        generator = torch.cuda.default_generators[index]
    offset = generator.get_offset()
    generator.set_offset(offset + 4)  # Philox offsets advance in fours
    return _zero_seed(device), (generator.initial_seed() * 0x9E3779B97F4A7C15 + offset) % _SEED_RANGE


class _TopK(NamedTuple):
    """What top_k_top_p's first launch leaves for its second, per row of x (B, V)."""
    #: float32 (6, B): the logit max (0 for probabilities and invalid rows), the top-k threshold on the weights, the
    #: top-k mass, the max weight, 1 where the row is invalid by its logits, its entries or its top-k (the second
    #: launch checks the rest), and the size of the top-k set left in ``weights`` / ``cols`` (-1: none left)
    stats: torch.Tensor
    #: (B, S) float32 and int32: each row's top-k set (weights, columns) at the front, where it was left
    weights: torch.Tensor
    cols: torch.Tensor
    #: slots the second launch reads per row
    keep: int


def top_k_threshold(x: torch.Tensor, top_k: Any, is_logits: bool, temperature: Any) -> _TopK:
    """The first of top_k_top_p's two launches, over x (B, V) with unit column stride."""
    batch, vocab = x.shape
    _, k_rows, k_t, k_v = _split(top_k, torch.int32, x.device)
    has_t, t_rows, t_t, t_v = _split(temperature if is_logits else None, torch.float32, x.device)
    search = _config(batch, vocab, SEARCH_WALK)
    keep = min(TOP_K_SET, search.scratch)
    walk_block = max(search.block, min(TOP_K_WALK_BLOCK, MAX_BLOCK, triton.next_power_of_2(vocab)))
    weights = torch.empty((batch, search.scratch), dtype=torch.float32, device=x.device)
    cols = torch.empty((batch, search.scratch), dtype=torch.int32, device=x.device)
    stats = torch.empty((6, batch), dtype=torch.float32, device=x.device)
    K._top_k_threshold_kernel[(triton.cdiv(batch, search.rows),)](
        x, k_t if k_rows else stats, t_t if t_rows else stats, int(k_v), float(t_v) if has_t else 1.0, weights, cols,
        stats, batch, vocab, x.stride(0), IS_LOGITS=is_logits, K_ROWS=k_rows, HAS_T=has_t, T_ROWS=t_rows,
        ROWS=search.rows, BLOCK=search.block, KEEP=keep, WALK_STAGES=TOP_K_WALK_STAGES, WALK_BLOCK=walk_block,
        STAGES=search.stages, NP=NUM_PIVOTS, SCRATCH=search.scratch, MAX_PASSES=MAX_PASSES, SORT=SORT,
        num_warps=search.num_warps, **pdl_launch(x.device),
    )
    return _TopK(stats, weights, cols, keep)


def top_k_top_p(x: torch.Tensor, top_k: Any, top_p: Any, min_p: Any, is_logits: bool, temperature: Any,
                generator: torch.Generator | None, deterministic: bool, out: torch.Tensor,
                invalid_token: int) -> torch.Tensor:
    batch, vocab = x.shape
    if batch == 0:
        return out
    if x.stride(1) != 1:  # the kernel walks rows with unit stride
        x = x.contiguous()
    has_k = top_k is not None
    has_p, p_rows, p_t, p_v = _split(top_p, torch.float32, x.device)
    has_m, m_rows, m_t, m_v = _split(min_p, torch.float32, x.device)
    has_t, t_rows, t_t, t_v = _split(temperature if is_logits else None, torch.float32, x.device)
    t_val = float(t_v) if has_t else 1.0
    if has_k:
        first = top_k_threshold(x, top_k, is_logits, temperature)
    else:  # unused without top-k
        first = _TopK(out, out, out, 0)
    cfg = _config(batch, vocab, TOP_P_WALK)
    seed_t, seed = _seed(generator, x.device)
    K._top_k_top_p_kernel[(triton.cdiv(batch, cfg.rows),)](
        x, out, first.stats, first.weights, first.cols, first.weights.stride(0) if has_k else 0,
        p_t if p_rows else out, m_t if m_rows else out, t_t if t_rows else out, float(p_v), float(m_v),
        t_val, seed_t, seed, invalid_token, batch, vocab, x.stride(0),
        IS_LOGITS=is_logits, HAS_K=has_k, HAS_P=has_p, P_ROWS=p_rows, HAS_MINP=has_m, MINP_ROWS=m_rows, HAS_T=has_t,
        T_ROWS=t_rows, ROWS=cfg.rows, BLOCK=cfg.block, STAGES=cfg.stages, NUM_CAND=NUM_CAND, MAX_ROUNDS=MAX_ROUNDS,
        KEEP=first.keep, SORT=SORT, num_warps=cfg.num_warps, **pdl_launch(x.device),
    )
    return out


def renorm(probs: torch.Tensor, top_k: Any, top_p: Any, min_p: Any) -> torch.Tensor:
    batch, vocab = probs.shape
    out = torch.empty((batch, vocab), dtype=torch.float32, device=probs.device)
    if batch == 0:
        return out
    if probs.stride(1) != 1:
        probs = probs.contiguous()
    cfg = _config(1 if invariant_scope() else batch, vocab, SEARCH_WALK)  # the scope: one row per program
    has_k, k_rows, k_t, k_v = _split(top_k, torch.int32, probs.device)
    has_p, p_rows, p_t, p_v = _split(top_p, torch.float32, probs.device)
    has_m, m_rows, m_t, m_v = _split(min_p, torch.float32, probs.device)
    scratch = torch.empty((batch, cfg.scratch) if (has_k or has_p) else (1,), dtype=torch.float32, device=probs.device)
    K._renorm_kernel[(triton.cdiv(batch, cfg.rows),)](
        probs, out, k_t if k_rows else out, p_t if p_rows else out, m_t if m_rows else out, int(k_v), float(p_v),
        float(m_v), scratch, batch, vocab, probs.stride(0),
        HAS_K=has_k, K_ROWS=k_rows, HAS_P=has_p, P_ROWS=p_rows, HAS_MINP=has_m, MINP_ROWS=m_rows, ROWS=cfg.rows,
        BLOCK=cfg.block, STAGES=cfg.stages, WALK_STAGES=TOP_K_WALK_STAGES, NP=NUM_PIVOTS, SCRATCH=cfg.scratch,
        MAX_PASSES=MAX_PASSES, SORT=SORT, num_warps=cfg.num_warps, **pdl_launch(probs.device),
    )
    return out


def chain_speculative(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
                      generator: torch.Generator | None, deterministic: bool
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    batch, n, vocab = draft_probs.shape
    dev = draft_probs.device
    tokens = torch.empty((batch, n + 1), dtype=torch.int64, device=dev)
    accepted = torch.empty(batch, dtype=torch.int32, device=dev)
    emitted = torch.empty(batch, dtype=torch.int32, device=dev)
    if batch == 0:
        return tokens, accepted, emitted
    u = torch.rand((batch, n + 1), generator=generator, device=dev, dtype=torch.float64)
    cfg = _config(batch, vocab, SEARCH_WALK)
    K._chain_speculative_kernel[(triton.cdiv(batch, cfg.rows),)](
        draft_probs.contiguous(), draft_token_ids.contiguous(), target_probs.contiguous(), u, tokens, accepted,
        emitted, batch, n, vocab, ROWS=cfg.rows, BLOCK=cfg.block, STAGES=cfg.stages, num_warps=cfg.num_warps,
    )
    return tokens, accepted, emitted
