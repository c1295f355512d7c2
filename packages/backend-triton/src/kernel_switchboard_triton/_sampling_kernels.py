"""Triton jit kernels of the sampling family (launchers live in :mod:`.sampling`). No sorting of the vocabulary.

Every kernel works on a tile of ``ROWS`` rows (one row per program for large vocabularies, many rows
per program for small ones) and walks the vocabulary in ``BLOCK``-wide chunks. Per element it only
ever needs a *weight* ``w``: the probability itself, or ``exp2((x - max) * log2(e) / T)`` for logits
(the same formula in every pass, so weights compare identically across passes). Filters are
thresholds on ``w`` (ties kept together, as the core defines them):

- top-k: ``tau_k`` = the k-th largest weight, found by :func:`_top_k_select` (a lower bound from the
  maxima of small groups, then the few weights above it are compacted into a scratch row and sorted in
  registers; :func:`_select`'s pivot search where they do not fit); for sampling in
  :func:`_top_k_threshold_kernel`, launched before :func:`_top_k_top_p_kernel`, which draws from the top-k set
  that kernel leaves (weights and columns, at most ``KEEP`` of them) without walking the row;
- min-p: ``min_p * max w``;
- top-p: sampled by rejection (FlashInfer's idea): candidates are drawn in proportion to ``w`` from a
  set that contains the nucleus; a candidate c is in the nucleus iff the mass strictly above ``w_c``
  is below ``top_p`` times the top-k mass. The pass that checks ``NUM_CAND`` candidates also draws
  the next ones from the weights above the largest rejected one, so a typical row needs two passes.

Candidates are drawn in one pass by a chunk-level weighted reservoir (a chunk replaces the current
pick with probability chunk mass / mass so far), then inside the chosen chunk by inverse CDF.
Uniforms come from Philox (``tl.rand4x``: four per evaluation) keyed by one seed per call drawn from the caller's
generator (on the host, or on the device while a CUDA graph is captured): the same seed gives the same tokens, and
nothing in the reduction path uses atomics.

Invalid rows (the core's ``ops.sampling.invalid_rows``) are found inside the walks the kernels make anyway: logits
by their row maximum (NaN counts as +inf; a row is invalid when the maximum is not finite), probabilities by a
count of their NaN / infinite / negative entries and their total, summed in the first candidate pass (with top-k:
in the threshold kernel's first walk), and per-row parameters as they are loaded. Such a row gets the sentinel token
-1 (renorm: a row of NaN; chain speculative: tokens -1, nothing accepted), with no host synchronisation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernel_switchboard.variants_lib import COMPILED

from ._gdc import after_prior

LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _weigh(
    x,  # (ROWS, BLOCK) float32 probabilities or logits as loaded
    valid,  # (ROWS, BLOCK) mask of real (row, column) pairs
    m,  # (ROWS,) row max of the logits (unused for probabilities)
    c,  # (ROWS,) log2(e) / temperature (unused for probabilities)
    IS_LOGITS: tl.constexpr,  # x holds logits
):
    """The weights of loaded values: the probabilities themselves, or exp2((x - m) * c) for logits."""
    if IS_LOGITS:
        w = tl.exp2((x - m[:, None]) * c[:, None])
    else:
        w = x
    # masked, negative and NaN entries weigh nothing
    return tl.where(valid & (w > 0), w, 0.0)


@triton.jit
def _weights(
    x_ptr,  # (B, V) probabilities or logits
    row_off,  # (ROWS, 1) int64 element offset of each row
    cols,  # (ROWS, BLOCK) or (1, BLOCK) column indices
    valid,  # (ROWS, BLOCK) mask of real (row, column) pairs
    m,  # (ROWS,) row max of the logits (unused for probabilities)
    c,  # (ROWS,) log2(e) / temperature (unused for probabilities)
    IS_LOGITS: tl.constexpr,  # x holds logits
):
    x = tl.load(x_ptr + row_off + cols, mask=valid, other=0.0).to(tl.float32)
    return _weigh(x, valid, m, c, IS_LOGITS)


@triton.jit
def _chunk_values(
    x_ptr,  # (B, V) probabilities or logits
    row_off,  # (ROWS, 1) int64 element offset of each row
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m,  # (ROWS,) row max of the logits (unused for probabilities)
    c,  # (ROWS,) log2(e) / temperature (unused for probabilities)
    start,  # first column of the chunk
    IS_LOGITS: tl.constexpr,  # x holds logits
    BLOCK: tl.constexpr,  # chunk width
):
    """One chunk of a walk over the vocabulary: its columns (BLOCK,), the mask of real (row, column) pairs, the
    values as loaded (float32, for the validity check) and the weights, (ROWS, BLOCK) each."""
    cols = start + tl.arange(0, BLOCK)
    valid = rmask[:, None] & (cols[None, :] < V)
    x = tl.load(x_ptr + row_off + cols[None, :], mask=valid, other=0.0).to(tl.float32)
    return cols, valid, x, _weigh(x, valid, m, c, IS_LOGITS)


@triton.jit
def _chunk(
    x_ptr,  # (B, V) probabilities or logits
    row_off,  # (ROWS, 1) int64 element offset of each row
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m,  # (ROWS,) row max of the logits (unused for probabilities)
    c,  # (ROWS,) log2(e) / temperature (unused for probabilities)
    start,  # first column of the chunk
    IS_LOGITS: tl.constexpr,  # x holds logits
    BLOCK: tl.constexpr,  # chunk width
):
    """One chunk of a walk over the vocabulary: its columns (BLOCK,), the mask of real (row, column) pairs and
    the weights, (ROWS, BLOCK) each."""
    cols, valid, _x, w = _chunk_values(x_ptr, row_off, rmask, V, m, c, start, IS_LOGITS, BLOCK)
    return cols, valid, w


@triton.jit
def _bad_entries(
    x,  # (ROWS, BLOCK) float32 probabilities as loaded
    valid,  # (ROWS, BLOCK) mask of real (row, column) pairs
):
    """1.0 where a real entry is no probability (NaN, infinite or negative), else 0.0: a row with any is invalid."""
    return tl.where(valid & ~((x >= 0) & (x < float("inf"))), 1.0, 0.0)


@triton.jit
def _out_of(
    v,  # (ROWS,) float32 per-row parameter
    lo,  # lowest allowed value
    hi,  # highest allowed value
    LO_OPEN: tl.constexpr,  # lo itself is not allowed
):
    """Rows whose parameter lies outside [lo, hi] ((lo, hi] when LO_OPEN; NaN is outside): the row is invalid."""
    if LO_OPEN:
        inside = (v > lo) & (v <= hi)
    else:
        inside = (v >= lo) & (v <= hi)
    return ~inside


@triton.jit
def _row_max(
    x_ptr,  # (B, V) input
    row_off,  # (ROWS, 1) int64 row offsets
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    STAGES: tl.constexpr,  # software-pipeline depth of the walks over the vocabulary (loads run ahead)
):
    acc = tl.full((ROWS, BLOCK), float("-inf"), tl.float32)
    for start in tl.range(0, V, BLOCK, num_stages=STAGES):
        cols = start + tl.arange(0, BLOCK)
        valid = rmask[:, None] & (cols[None, :] < V)
        x = tl.load(x_ptr + row_off + cols[None, :], mask=valid, other=float("-inf")).to(tl.float32)
        acc = tl.maximum(acc, tl.where(x == x, x, float("inf")))  # NaN counts as +inf: the row is invalid
    return tl.max(acc, axis=1)


@triton.jit
def _checked_max(
    m,  # (ROWS,) float32 row max of the logits from _row_max
):
    """(m with 0 in invalid rows, invalid rows): a logits row is invalid when its max is not finite (NaN or +inf
    present, or every entry -inf). The 0 keeps the weights of such a row finite until its sentinel replaces them."""
    bad = ~((m > float("-inf")) & (m < float("inf")))
    return tl.where(bad, 0.0, m), bad


@triton.jit
def _stats(
    x_ptr,  # (B, V) input
    row_off,  # (ROWS, 1) int64 row offsets
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m,  # (ROWS,) logit max (logits only)
    c,  # (ROWS,) log2(e) / temperature (logits only)
    IS_LOGITS: tl.constexpr,  # x holds logits
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    STAGES: tl.constexpr,  # software-pipeline depth of the walks over the vocabulary (loads run ahead)
):
    """(max weight, total weight) of each row."""
    mx = tl.zeros((ROWS, BLOCK), tl.float32)
    tot = tl.zeros((ROWS, BLOCK), tl.float32)
    for start in tl.range(0, V, BLOCK, num_stages=STAGES):
        _cols, _valid, w = _chunk(x_ptr, row_off, rmask, V, m, c, start, IS_LOGITS, BLOCK)
        mx = tl.maximum(mx, w)
        tot += w
    return tl.max(mx, axis=1), tl.sum(tot, axis=1)


@triton.jit
def _above(w, t):
    """The weights of a (ROWS, BLOCK) tile strictly above t (ROWS,), others 0."""
    return tl.where(w > t[:, None], w, 0.0)


@triton.jit
def _add6(a0, a1, a2, a3, a4, a5, b0, b1, b2, b3, b4, b5):
    return a0 + b0, a1 + b1, a2 + b2, a3 + b3, a4 + b4, a5 + b5


@triton.jit
def _chunk_sums(ws, w, t0, t1, t2, t3):
    """Row sums of one (ROWS, BLOCK) chunk of the candidate pass: of ws (the weights in the sampled set), of w,
    and of the weights strictly above each of t0..t3 (ROWS,). Compiled, one reduction (one exchange between
    warps instead of six); the interpreter, whose tl.reduce with a combine function runs per element in
    Python, sums them one by one."""
    if COMPILED:
        return tl.reduce((ws, w, _above(w, t0), _above(w, t1), _above(w, t2), _above(w, t3)), 1, _add6)
    else:
        return (tl.sum(ws, 1), tl.sum(w, 1), tl.sum(_above(w, t0), 1), tl.sum(_above(w, t1), 1),
                tl.sum(_above(w, t2), 1), tl.sum(_above(w, t3), 1))


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _add3(a0, a1, a2, b0, b1, b2):
    return a0 + b0, a1 + b1, a2 + b2


@triton.jit
def _triple_sums(a, b, d):
    """Row sums of three (ROWS, BLOCK) tiles: one reduction compiled, apart in the interpreter."""
    if COMPILED:
        return tl.reduce((a, b, d), 1, _add3)
    else:
        return tl.sum(a, 1), tl.sum(b, 1), tl.sum(d, 1)


@triton.jit
def _pair_sums(a, b):
    """Row sums of two (ROWS, BLOCK) tiles: one reduction compiled, apart in the interpreter."""
    if COMPILED:
        return tl.reduce((a, b), 1, _add2)
    else:
        return tl.sum(a, 1), tl.sum(b, 1)


@triton.jit
def _pivot_sums(ge, w):
    """Count and mass of the weights w (ROWS, BLOCK) at or above each pivot, from ge (ROWS, BLOCK, NP):
    (ROWS, NP) each. Compiled, one reduction; the interpreter sums them apart (see :func:`_chunk_sums`)."""
    cnt = ge.to(tl.float32)
    mas = tl.where(ge, w[:, :, None], 0.0)
    if COMPILED:
        return tl.reduce((cnt, mas), 1, _add2)
    else:
        return tl.sum(cnt, 1), tl.sum(mas, 1)


@triton.jit
def _columns4(c0, c1, c2, c3, jj):
    """Four (ROWS,) vectors as the columns of a (ROWS, 4) tile; jj = arange(4)."""
    out = tl.where(jj[None, :] == 0, c0[:, None], c1[:, None])
    out = tl.where(jj[None, :] == 2, c2[:, None], out)
    return tl.where(jj[None, :] == 3, c3[:, None], out)


@triton.jit
def _uniform4(seed, offset, jj):
    """(ROWS, 4) uniforms in [0, 1): one Philox evaluation per row at ``offset`` (ROWS,) int32."""
    u0, u1, u2, u3 = tl.rand4x(seed, offset)
    return _columns4(u0, u1, u2, u3, jj)


@triton.jit
def _pick(vals, idx, j):
    """vals[:, j] of a (ROWS, J) tile for a scalar j, as (ROWS,); idx = arange(J)."""
    return tl.sum(tl.where(idx[None, :] == j, vals, 0), axis=1)


@triton.jit
def _pick_rows(vals, idx, j):
    """vals[r, j[r]] of a (ROWS, J) tile for a per-row j (ROWS,), as (ROWS,); idx = arange(J)."""
    return tl.sum(tl.where(idx[None, :] == j[:, None], vals, 0), axis=1)


@triton.jit
def _threshold_of_gathered(
    vals,  # (ROWS, S) the bracket's weights, -1 in unused slots
    nb,  # (ROWS,) int32 used slots
    f_hi,  # (ROWS,) F at the bracket's top (weights >= hi)
    m_hi,  # (ROWS,) mass at the bracket's top
    target,  # (ROWS,) F value to reach
    USE_MASS: tl.constexpr,  # F is a mass (else a count)
    SORT: tl.constexpr,  # sort the slots (GPU); else rank them pairwise (the interpreter, small S)
    S: tl.constexpr,  # slots
):
    """(tau, mass of weights >= tau): the largest gathered weight v with f_hi + F_bracket(v) >= target."""
    real = vals >= 0
    if SORT:
        sc = tl.arange(0, S)
        s = tl.sort(vals, dim=1, descending=True)
        rs = s >= 0
        wt = rs.to(tl.float32)
        if USE_MASS:
            wt = tl.where(rs, s, 0.0)
        g = f_hi[:, None] + tl.cumsum(wt, axis=1)
        istar = tl.sum(((g < target[:, None]) & rs).to(tl.int32), axis=1)
        istar = tl.minimum(istar, tl.maximum(nb - 1, 0))
        t_new = tl.sum(tl.where(sc[None, :] == istar[:, None], s, 0.0), axis=1)
    else:
        wt = real.to(tl.float32)
        if USE_MASS:
            wt = tl.where(real, vals, 0.0)
        # G(v_i) = f_hi + sum of the weights of slots with v_j >= v_i
        above = (vals[:, None, :] >= vals[:, :, None]) & real[:, None, :]
        g = f_hi[:, None] + tl.sum(tl.where(above, wt[:, None, :], 0.0), axis=2)
        t_new = tl.max(tl.where(real & (g >= target[:, None]), vals, -1.0), axis=1)
        t_new = tl.where(t_new < 0, tl.min(tl.where(real, vals, float("inf")), axis=1), t_new)
    m_new = m_hi + tl.sum(tl.where(real & (vals >= t_new[:, None]), vals, 0.0), axis=1)
    return t_new, m_new


@triton.jit
def _select(
    x_ptr,  # (B, V) input
    row_off,  # (ROWS, 1) int64 row offsets
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m,  # (ROWS,) logit max (logits only)
    c,  # (ROWS,) log2(e) / temperature (logits only)
    target,  # (ROWS,) float32: find the largest w with F(w) >= target
    active,  # (ROWS,) rows that need a threshold (others get lo0)
    lo0,  # (ROWS,) float32 lower end, with F(lo0) >= target
    top,  # (ROWS,) float32 scale of the first pass's geometric pivots (an upper estimate of max w)
    scratch_ptr,  # (B, SCRATCH) float32 workspace
    scr_off,  # (ROWS,) int64 row offsets into the workspace
    IS_LOGITS: tl.constexpr,  # x holds logits
    USE_MASS: tl.constexpr,  # F(v) = mass of weights >= v (else their count)
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    STAGES: tl.constexpr,  # software-pipeline depth of the walks over the vocabulary (loads run ahead)
    NP: tl.constexpr,  # pivots per pass (the first is the bracket's low end)
    SCRATCH: tl.constexpr,  # workspace slots per row (power of two)
    MAX_PASSES: tl.constexpr,  # bound on refinement passes
    SORT: tl.constexpr,  # finish by sorting the workspace (else pairwise ranks)
):
    """Exact threshold search. Returns (tau, mass of w >= tau, total weight, max weight) per row.

    Bracket [lo, hi) with F(lo) >= target > F(hi). Each pass counts and weighs the elements at NP
    pivots inside the bracket and, from the second pass on (or the first when the whole row fits),
    compacts the bracket's weights into the scratch row; when they all fit, a sort finishes the row.
    """
    jj = tl.arange(0, NP)
    sc = tl.arange(0, SCRATCH)
    top = tl.maximum(top, 1e-30)
    lo = lo0
    hi = tl.full((ROWS,), float("inf"), tl.float32)
    f_hi = tl.zeros((ROWS,), tl.float32)
    m_hi = tl.zeros((ROWS,), tl.float32)
    m_lo = tl.zeros((ROWS,), tl.float32)
    tau = lo0
    m_tau = tl.zeros((ROWS,), tl.float32)
    total = tl.zeros((ROWS,), tl.float32)
    wmax = tl.zeros((ROWS,), tl.float32)
    done = (~active) | (~rmask)
    for it in range(MAX_PASSES):
        if (it == 0) | (tl.max((~done).to(tl.int32), axis=0) > 0):
            # ascending pivots: pv[:, 0] = lo, the rest geometric inside (lo, hi)
            frac = jj.to(tl.float32)[None, :] / NP
            open_top = hi == float("inf")
            hi_f = tl.where(open_top, top, hi)
            lo_f = tl.maximum(lo, hi_f * 5.960464477539063e-08)  # at most 24 octaves below hi
            lo_f = tl.where(open_top, tl.maximum(lo, top * 5.960464477539063e-08), lo_f)
            geo = tl.exp2(tl.log2(lo_f)[:, None] + frac * (tl.log2(hi_f) - tl.log2(lo_f))[:, None])
            # open bracket: pivots up to `top` itself (frac reaches 1 at the last one)
            geo_open = tl.exp2(tl.log2(lo_f)[:, None] + (jj.to(tl.float32)[None, :] / (NP - 1)) *
                               (tl.log2(hi_f) - tl.log2(lo_f))[:, None])
            geo = tl.where(open_top[:, None], geo_open, geo)
            pv = tl.minimum(tl.maximum(geo, lo[:, None]), hi_f[:, None])
            pv = tl.where(jj[None, :] == 0, lo[:, None], pv)
            gather = (it > 0) | (V <= SCRATCH)
            cnt = tl.zeros((ROWS, NP), tl.float32)
            mas = tl.zeros((ROWS, NP), tl.float32)
            nb = tl.zeros((ROWS,), tl.int32)
            mx = tl.zeros((ROWS,), tl.float32)
            for start in tl.range(0, V, BLOCK, num_stages=STAGES):
                _cols, valid, w = _chunk(x_ptr, row_off, rmask, V, m, c, start, IS_LOGITS, BLOCK)
                mx = tl.maximum(mx, tl.max(w, axis=1))
                ge = (w[:, :, None] >= pv[:, None, :]) & valid[:, :, None]
                cnt_c, mas_c = _pivot_sums(ge, w)
                cnt += cnt_c
                mas += mas_c
                if gather:
                    inb = valid & (w >= lo[:, None]) & (w < hi[:, None]) & (~done)[:, None]
                    pos = nb[:, None] + tl.cumsum(inb.to(tl.int32), axis=1) - 1
                    tl.store(scratch_ptr + scr_off[:, None] + pos, w, mask=inb & (pos < SCRATCH))
                    nb += tl.sum(inb.to(tl.int32), axis=1)
            if it == 0:
                total = _pick(mas, jj, 0)  # pivot 0 is lo0: with lo0 = 0 this is the whole row
                wmax = mx
            f = cnt
            if USE_MASS:
                f = mas
            fits = gather & (~done) & (nb <= SCRATCH)
            if tl.max(fits.to(tl.int32), axis=0) > 0:
                tl.debug_barrier()
                vals = tl.load(scratch_ptr + scr_off[:, None] + sc[None, :], mask=fits[:, None] & (sc[None, :] < nb[:, None]),
                               other=-1.0)
                t_new, m_new = _threshold_of_gathered(vals, nb, f_hi, m_hi, target, USE_MASS, SORT, SCRATCH)
                tau = tl.where(fits, t_new, tau)
                m_tau = tl.where(fits, m_new, m_tau)
                done = done | fits
            # narrow the bracket of the rows still open: pivots ascend, so F descends
            ok = f >= target[:, None]
            jl = tl.sum(ok.to(tl.int32), axis=1) - 1  # last pivot with F >= target
            broken = jl < 0  # F(lo) < target: only for bad data (NaN); keep lo
            jl = tl.maximum(jl, 0)
            has_up = jl + 1 < NP
            new_lo = _pick_rows(pv, jj, jl)
            new_m_lo = _pick_rows(mas, jj, jl)
            new_hi = tl.where(has_up, _pick_rows(pv, jj, jl + 1), hi)
            new_f_hi = tl.where(has_up, _pick_rows(f, jj, jl + 1), f_hi)
            new_m_hi = tl.where(has_up, _pick_rows(mas, jj, jl + 1), m_hi)
            upd = ~done
            lo = tl.where(upd, new_lo, lo)
            m_lo = tl.where(upd, new_m_lo, m_lo)
            hi = tl.where(upd, new_hi, hi)
            f_hi = tl.where(upd, new_f_hi, f_hi)
            m_hi = tl.where(upd, new_m_hi, m_hi)
            tau = tl.where(upd & broken, lo, tau)
            m_tau = tl.where(upd & broken, m_lo, m_tau)
            done = done | broken
    # rows whose bracket never fit (only ties or bad data): lo keeps exactly the weights >= tau that matter
    open_rows = ~done
    tau = tl.where(open_rows, lo, tau)
    m_tau = tl.where(open_rows, m_lo, m_tau)
    m_tau = tl.where(active, m_tau, total)
    tau = tl.where(active, tau, lo0)
    return tau, m_tau, total, wmax


@triton.jit
def _top_k_select(
    x_ptr,  # (B, V) input
    row_off,  # (ROWS, 1) int64 row offsets
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m,  # (ROWS,) logit max (logits only)
    c,  # (ROWS,) log2(e) / temperature (logits only)
    kf,  # (ROWS,) float32 k, in [1, V]
    active,  # (ROWS,) rows that filter by top-k (others get tau 0 and the total weight)
    scratch_ptr,  # (B, SCRATCH) float32 workspace
    cols_ptr,  # (B, SCRATCH) int32 workspace of the compacted weights' columns (when KEEP)
    scr_off,  # (ROWS,) int64 row offsets into the workspace
    IS_LOGITS: tl.constexpr,  # x holds logits
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    KEEP: tl.constexpr,  # > 0: leave the top-k set (weights, columns) at the front of the workspaces when it fits
    CHECK_ENTRIES: tl.constexpr,  # walk 1 also counts the entries that are no probabilities
    WALK_STAGES: tl.constexpr,  # software-pipeline depth of walk 1 (loads run ahead)
    WALK_BLOCK: tl.constexpr,  # walk 1's chunk width (a multiple of BLOCK)
    STAGES: tl.constexpr,  # that of the fallback search's walks
    NP: tl.constexpr,  # pivots per pass of the fallback search
    SCRATCH: tl.constexpr,  # workspace slots per row (power of two)
    MAX_PASSES: tl.constexpr,  # bound on the fallback's passes
    SORT: tl.constexpr,  # finish by sorting the workspace (else pairwise ranks)
):
    """Exact top-k threshold. Returns (tau = the k-th largest weight, mass of w >= tau, total weight, max weight).

    Walk 1 takes the maximum of every GROUP-wide slice: k slices have a maximum at or above the k-th
    largest of those maxima, so at least k weights reach it and it bounds tau from below. Walk 2 reads only
    the slices whose maximum reaches the bound (about k of them: k = 50 of 128256 probabilities in 256-wide
    slices reads a tenth of the row) and compacts their weights at or above it into the scratch row (~55 of
    them); a sort finishes. Rows whose k exceeds the slices or whose compacted weights overflow the workspace
    take :func:`_select`'s pivot search, from the bound. The bound makes top-k faster than the pivot search
    alone (on the H200, 128 x 128256 at k = 50).

    With KEEP, walk 2 stores each compacted weight's column too, and the top-k set (the weights >= tau, ties
    included) is moved to the front of both workspaces: the sampling kernel draws from it without walking the
    row again. The last value returned is its size, or -1 where it was not gathered (the pivot search's rows,
    or a set of more than KEEP weights); with CHECK_ENTRIES the one before it counts the row's entries that are
    no probabilities (NaN, infinite, negative), else it is 0."""
    GROUP: tl.constexpr = 256 if BLOCK >= 256 else BLOCK
    PER: tl.constexpr = BLOCK // GROUP  # slices per step of walk 2
    PER1: tl.constexpr = WALK_BLOCK // GROUP  # slices per step of walk 1
    sc = tl.arange(0, SCRATCH)
    zero = tl.zeros((ROWS,), tl.float32)
    tot = tl.zeros((ROWS, WALK_BLOCK), tl.float32)
    n_bad = tl.zeros((ROWS, WALK_BLOCK), tl.float32)
    wmax = zero
    for start in tl.range(0, V, WALK_BLOCK, num_stages=WALK_STAGES):
        _cols, valid, xv, w = _chunk_values(x_ptr, row_off, rmask, V, m, c, start, IS_LOGITS, WALK_BLOCK)
        tot += w
        if CHECK_ENTRIES:
            n_bad += _bad_entries(xv, valid)
        gmax = tl.max(tl.reshape(w, (ROWS, PER1, GROUP)), axis=2)  # (ROWS, PER1): maxima of GROUP-wide slices
        wmax = tl.maximum(wmax, tl.max(gmax, axis=1))
        slot = (start // WALK_BLOCK) * PER1 + tl.arange(0, PER1)
        tl.store(scratch_ptr + scr_off[:, None] + slot[None, :], gmax,
                 mask=rmask[:, None] & (slot < SCRATCH)[None, :])
    total = tl.sum(tot, axis=1)
    groups = tl.zeros((ROWS,), tl.int32) + tl.cdiv(V, WALK_BLOCK) * PER1
    fits = active & rmask & (kf <= groups.to(tl.float32)) & (groups <= SCRATCH)
    tl.debug_barrier()
    maxima = tl.load(scratch_ptr + scr_off[:, None] + sc[None, :], mask=fits[:, None] & (sc[None, :] < groups[:, None]),
                     other=-1.0)
    bound, _m = _threshold_of_gathered(maxima, groups, zero, zero, kf, False, SORT, SCRATCH)
    bound = tl.where(fits, bound, 0.0)
    tl.debug_barrier()
    # walk 2 visits only the slices whose maximum reaches the bound (k of them, ties aside): no other weight can.
    # Per step, PER of them (a chunk's worth of loads): hot slice number `first + lane` of each row is picked out of
    # the maxima tile by its rank among the row's hot slices, so they are visited in column order
    hot = fits[:, None] & (maxima >= bound[:, None]) & (sc[None, :] < groups[:, None])
    rank = tl.cumsum(hot.to(tl.int32), axis=1) - 1
    n_hot = tl.sum(hot.to(tl.int32), axis=1)
    lane = tl.arange(0, PER)
    in_slice = tl.arange(0, GROUP)
    nb = tl.zeros((ROWS,), tl.int32)
    for first in range(0, tl.max(n_hot, axis=0), PER):
        pick = hot[:, None, :] & (rank[:, None, :] == (first + lane)[None, :, None])
        sid = tl.sum(tl.where(pick, sc[None, None, :], 0), axis=2)  # (ROWS, PER) slice ids
        live = (first + lane)[None, :] < n_hot[:, None]
        cols = tl.reshape(sid[:, :, None] * GROUP + in_slice[None, None, :], (ROWS, BLOCK))
        valid = tl.reshape(live[:, :, None] & (in_slice >= 0)[None, None, :], (ROWS, BLOCK)) & (cols < V)
        w = _weights(x_ptr, row_off, cols, valid, m, c, IS_LOGITS)
        inb = valid & (w >= bound[:, None])
        _compact(scratch_ptr, cols_ptr, scr_off, nb, inb, w, cols, KEEP, SCRATCH)
        nb += tl.sum(inb.to(tl.int32), axis=1)
    done = fits & (nb <= SCRATCH)
    tl.debug_barrier()
    held = done[:, None] & (sc[None, :] < nb[:, None])
    vals = tl.load(scratch_ptr + scr_off[:, None] + sc[None, :], mask=held, other=-1.0)
    tau, mass = _threshold_of_gathered(vals, nb, zero, zero, kf, False, SORT, SCRATCH)
    n_keep = tl.full((ROWS,), -1, tl.int32)
    if KEEP > 0:
        # the top-k set to the front: its weights and columns are in registers before any slot is overwritten
        kept = held & (vals >= tau[:, None])
        kcols = tl.load(cols_ptr + scr_off[:, None] + sc[None, :], mask=kept, other=0)
        n_keep = tl.where(done, tl.sum(kept.to(tl.int32), axis=1), -1)
        tl.debug_barrier()
        _compact(scratch_ptr, cols_ptr, scr_off, tl.zeros((ROWS,), tl.int32), kept, vals, kcols, KEEP, SCRATCH)
        n_keep = tl.where(n_keep <= KEEP, n_keep, -1)
    rest = active & rmask & (~done)
    if tl.max(rest.to(tl.int32), axis=0) > 0:
        ones = tl.full((ROWS,), 1.0, tl.float32)  # weights lie in [0, 1]: probabilities, or exp2 of <= 0
        tl.debug_barrier()
        t_rest, m_rest, _t, _x = _select(x_ptr, row_off, rmask, V, m, c, kf, rest, bound, ones, scratch_ptr, scr_off,
                                         IS_LOGITS, False, ROWS, BLOCK, STAGES, NP, SCRATCH, MAX_PASSES, SORT)
        tau = tl.where(rest, t_rest, tau)
        mass = tl.where(rest, m_rest, mass)
    return tl.where(active, tau, 0.0), tl.where(active, mass, total), total, wmax, tl.sum(n_bad, axis=1), n_keep


@triton.jit
def _compact(
    scratch_ptr,  # (B, SCRATCH) float32 workspace
    cols_ptr,  # (B, SCRATCH) int32 workspace of columns (when KEEP)
    scr_off,  # (ROWS,) int64 row offsets into the workspaces
    nb,  # (ROWS,) int32 slots already used
    inb,  # (ROWS, BLOCK) the entries to append
    w,  # (ROWS, BLOCK) their weights
    cols,  # (ROWS, BLOCK) int32 their columns
    KEEP: tl.constexpr,  # store the columns too
    SCRATCH: tl.constexpr,  # workspace slots per row
):
    """Append the entries ``inb`` of a tile, in column order, after each row's ``nb`` used workspace slots."""
    pos = nb[:, None] + tl.cumsum(inb.to(tl.int32), axis=1) - 1
    keep = inb & (pos < SCRATCH)
    tl.store(scratch_ptr + scr_off[:, None] + pos, w, mask=keep)
    if KEEP > 0:
        tl.store(cols_ptr + scr_off[:, None] + pos, cols, mask=keep)


@triton.jit
def _inverse_cdf(
    w,  # (ROWS, N) weights, 0 where out
    offs,  # (N,) arange(N)
    u,  # (ROWS,) uniforms in [0, 1)
):
    """The slot each row's uniform falls in by the running sum of its weights, and the last slot with a weight
    (-1 where none has: the slot is then meaningless), (ROWS,) int32 each."""
    cs = tl.cumsum(w, axis=1)
    i = tl.sum((cs <= (u * tl.sum(w, axis=1))[:, None]).to(tl.int32), axis=1)
    last = tl.max(tl.where(w > 0, offs[None, :], -1), axis=1)
    return tl.minimum(i, last), last


@triton.jit
def _draw_in_chunk(
    x_ptr,  # (B, V) input
    row_off,  # (ROWS, 1) int64 row offsets
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m, c,  # logit max and log2(e)/T per row (logits only)
    chunk,  # (ROWS,) int32 chunk the candidate's reservoir chose (-1: none)
    u,  # (ROWS,) uniforms in [0, 1)
    floor,  # (ROWS,) weights below are out
    above,  # (ROWS,) weights <= this are out
    IS_LOGITS: tl.constexpr,  # x holds logits
    BLOCK: tl.constexpr,  # chunk width
):
    """Inverse-CDF draw of one candidate per row inside its chosen chunk: (token, weight), (ROWS,) each;
    token -1 and weight 0 where there is no chunk."""
    offs = tl.arange(0, BLOCK)
    base = tl.maximum(chunk, 0) * BLOCK
    cols = base[:, None] + offs[None, :]
    valid = rmask[:, None] & (chunk >= 0)[:, None] & (cols < V)
    w = _weights(x_ptr, row_off, cols, valid, m, c, IS_LOGITS)
    w = tl.where((w >= floor[:, None]) & (w > above[:, None]), w, 0.0)
    i, last = _inverse_cdf(w, offs, u)
    tok = tl.where(last >= 0, base + i, -1)
    wt = tl.sum(tl.where(offs[None, :] == i[:, None], w, 0.0), axis=1)
    return tok, tl.where(last >= 0, wt, 0.0)


@triton.jit
def _draw_in_chunks(
    x_ptr,  # (B, V) input
    row_off,  # (ROWS, 1) int64 row offsets
    rmask,  # (ROWS,) real rows
    V,  # vocabulary size
    m, c,  # logit max and log2(e)/T per row (logits only)
    chunk,  # (ROWS, J) int32 chunk each candidate's reservoir chose (-1: none)
    u,  # (ROWS, J) uniforms in [0, 1)
    floor,  # (ROWS,) weights below are out
    above,  # (ROWS,) weights <= this are out
    IS_LOGITS: tl.constexpr,  # x holds logits
    BLOCK: tl.constexpr,  # chunk width
    J: tl.constexpr,  # candidates per row
):
    """:func:`_draw_in_chunk` for each of the J candidates: (tokens, weights), (ROWS, J) each. One candidate
    at a time keeps the tiles 2-D (a (ROWS, J, BLOCK) scan spills to the stack inside the round loop)."""
    jj = tl.arange(0, J)
    tok = tl.full(chunk.shape, -1, tl.int32)
    wt = tl.zeros(chunk.shape, tl.float32)
    for j in tl.static_range(J):
        t1, w1 = _draw_in_chunk(x_ptr, row_off, rmask, V, m, c, _pick(chunk, jj, j), _pick(u, jj, j), floor, above,
                                IS_LOGITS, BLOCK)
        tok = tl.where(jj[None, :] == j, t1[:, None], tok)
        wt = tl.where(jj[None, :] == j, w1[:, None], wt)
    return tok, wt


@triton.jit
def _draw_from_set(
    set_ptr,  # (B, stride) float32 the rows' top-k sets at the front
    cols_ptr,  # (B, stride) int32 their columns
    off,  # (ROWS,) int64 row offsets into both
    live,  # (ROWS,) rows that draw from their set
    n,  # (ROWS,) int32 set sizes, at most KEEP
    floor,  # (ROWS,) weights below are out (the top-k threshold, min-p)
    mass_p,  # (ROWS,) top_p times the top-k mass: a weight is in the nucleus iff the mass strictly above it is less
    u,  # (ROWS,) uniforms in [0, 1)
    HAS_P: tl.constexpr,  # top-p filters the set
    KEEP: tl.constexpr,  # slots read per row (power of two)
    SORT: tl.constexpr,  # find the nucleus by sorting (else pairwise ranks)
):
    """Inverse-CDF draw from a row's top-k set (weights and columns gathered by the threshold kernel), after
    top-p and min-p: (ROWS,) int32 tokens, -1 where nothing is left. Every weight above a set member is in the
    set, so the nucleus test on it is exact: the nucleus is the weights at or above the largest v whose mass
    F(v) = sum of weights >= v reaches mass_p."""
    kk = tl.arange(0, KEEP)
    real = live[:, None] & (kk[None, :] < n[:, None])
    w = tl.load(set_ptr + off[:, None] + kk[None, :], mask=real, other=-1.0)
    cols = tl.load(cols_ptr + off[:, None] + kk[None, :], mask=real, other=0)
    lo = floor
    if HAS_P:
        zero = tl.zeros(floor.shape, tl.float32)
        t_p, _m = _threshold_of_gathered(w, n, zero, zero, mass_p, True, SORT, KEEP)
        lo = tl.maximum(lo, t_p)
    ws = tl.where(real & (w >= lo[:, None]) & (w > 0), w, 0.0)
    i, last = _inverse_cdf(ws, kk, u)
    tok = tl.sum(tl.where(kk[None, :] == i[:, None], cols, 0), axis=1)
    return tl.where(last >= 0, tok, -1)


@triton.jit
def _logit_scale(
    rows,  # (ROWS,) row indices
    rmask,  # (ROWS,) real rows
    t_ptr,  # (B,) float32 per-row temperature (when T_ROWS)
    t_val,  # scalar temperature (otherwise)
    HAS_T: tl.constexpr, T_ROWS: tl.constexpr,  # temperature given; per row
    ROWS: tl.constexpr,  # rows per program
):
    """(log2(e) / temperature, rows whose temperature is out of range), (ROWS,) each: the factor of every logit
    weight, and the rows a per-row temperature makes invalid (not finite and > 0)."""
    c = tl.full((ROWS,), LOG2E, tl.float32)
    bad = rows < 0
    if HAS_T:
        if T_ROWS:
            t = tl.load(t_ptr + rows, mask=rmask, other=1.0)
            bad = ~((t > 0) & (t < float("inf")))
        else:
            t = tl.full((ROWS,), 1.0, tl.float32) * t_val
        c = LOG2E / tl.maximum(t, 1e-30)
    return c, bad


@triton.jit
def _top_k_of_rows(
    rows,  # (ROWS,) row indices
    rmask,  # (ROWS,) real rows
    k_ptr,  # (B,) int32 per-row top-k (when K_ROWS)
    k_val,  # scalar top-k (otherwise)
    V,  # vocabulary size
    K_ROWS: tl.constexpr,  # top-k per row
    ROWS: tl.constexpr,  # rows per program
):
    """(k as float32 clamped to [1, V] with k <= 0 meaning V, rows where top-k filters anything, rows a negative
    per-row k makes invalid), (ROWS,) each."""
    if K_ROWS:
        k = tl.load(k_ptr + rows, mask=rmask, other=0)
    else:
        k = tl.zeros((ROWS,), tl.int32) + k_val
    return tl.minimum(tl.where(k > 0, k, V), V).to(tl.float32), (k > 0) & (k < V) & rmask, k < 0


@triton.jit
def _top_k_threshold_kernel(
    x_ptr,  # (B, V) probabilities or logits, unit stride in V
    k_ptr,  # (B,) int32 per-row top-k (when K_ROWS)
    t_ptr,  # (B,) float32 per-row temperature (when T_ROWS)
    k_val,  # scalar top-k (when not K_ROWS)
    t_val,  # scalar temperature (when not T_ROWS)
    scratch_ptr,  # (B, SCRATCH) float32 workspace of the search; out: the top-k set's weights at the front
    cols_ptr,  # (B, SCRATCH) int32 out: the top-k set's columns at the front
    stats_ptr,  # (6, B) float32 out: logit max, top-k threshold, top-k mass, max weight, 1 for an invalid row,
    # and the size of the top-k set left in the workspaces (-1: not left there; the sampling kernel walks the row)
    B,  # rows
    V,  # vocabulary size
    stride_x,  # row stride of x, elements
    IS_LOGITS: tl.constexpr,  # x holds logits
    K_ROWS: tl.constexpr,  # top-k per row
    HAS_T: tl.constexpr, T_ROWS: tl.constexpr,  # temperature given; per row
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    KEEP: tl.constexpr,  # the largest top-k set left in the workspaces
    WALK_STAGES: tl.constexpr,  # software-pipeline depth of the whole-row walks (row max, slice maxima)
    WALK_BLOCK: tl.constexpr,  # their chunk width (a multiple of BLOCK)
    STAGES: tl.constexpr,  # that of the fallback pivot search's walks (which spill when pipelined)
    NP: tl.constexpr,  # pivots per search pass
    SCRATCH: tl.constexpr,  # workspace slots per row
    MAX_PASSES: tl.constexpr,  # bound on search passes
    SORT: tl.constexpr,  # finish the search by sorting (GPU) or by pairwise ranks (interpreter)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    """The exact top-k threshold of each row, for :func:`_top_k_top_p_kernel`, and the top-k set itself where it
    holds at most KEEP weights (the sampling kernel then draws from it alone). A kernel of its own so that the
    search (which spills when its walk is pipelined or widened) and the candidate passes (which gain from both)
    each get the walk that suits them. Probabilities are checked for entries that are none here, so a row whose
    top-k set is left needs no walk of the sampling kernel at all."""
    after_prior(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    row_off = rows.to(tl.int64)[:, None] * stride_x
    m = tl.zeros((ROWS,), tl.float32)
    c, _t_bad = _logit_scale(rows, rmask, t_ptr, t_val, HAS_T, T_ROWS, ROWS)  # the sampling kernel checks t
    bad = rows < 0
    if IS_LOGITS:
        m, bad = _checked_max(_row_max(x_ptr, row_off, rmask, V, ROWS, WALK_BLOCK, WALK_STAGES))
    kf, k_on, k_bad = _top_k_of_rows(rows, rmask, k_ptr, k_val, V, K_ROWS, ROWS)
    tau, mass_k, _total, wmax, n_bad, n_keep = _top_k_select(
        x_ptr, row_off, rmask, V, m, c, kf, k_on, scratch_ptr, cols_ptr, rows.to(tl.int64) * SCRATCH, IS_LOGITS, ROWS,
        BLOCK, KEEP, not IS_LOGITS, WALK_STAGES, WALK_BLOCK, STAGES, NP, SCRATCH, MAX_PASSES, SORT)
    tl.store(stats_ptr + rows, m, mask=rmask)
    tl.store(stats_ptr + B + rows, tau, mask=rmask)
    tl.store(stats_ptr + 2 * B + rows, mass_k, mask=rmask)
    tl.store(stats_ptr + 3 * B + rows, wmax, mask=rmask)
    tl.store(stats_ptr + 4 * B + rows, (bad | k_bad | (n_bad > 0)).to(tl.float32), mask=rmask)
    tl.store(stats_ptr + 5 * B + rows, n_keep.to(tl.float32), mask=rmask)


@triton.jit(do_not_specialize=["seed"])
def _top_k_top_p_kernel(
    x_ptr,  # (B, V) probabilities or logits, unit stride in V
    out_ptr,  # (B,) int32 or int64 sampled tokens, invalid_token for an invalid row
    stats_ptr,  # (6, B) float32 from _top_k_threshold_kernel (when HAS_K)
    set_ptr,  # (B, set_stride) float32: the top-k set's weights at the front of each row (when HAS_K)
    set_cols_ptr,  # (B, set_stride) int32: their columns
    set_stride,  # row stride of the two, elements
    p_ptr,  # (B,) float32 per-row top-p (when P_ROWS)
    minp_ptr,  # (B,) float32 per-row min-p (when MINP_ROWS)
    t_ptr,  # (B,) float32 per-row temperature (when T_ROWS)
    p_val,  # scalar top-p (when not P_ROWS)
    minp_val,  # scalar min-p (when not MINP_ROWS)
    t_val,  # scalar temperature (when not T_ROWS)
    seed_ptr,  # (1,) int64: the Philox seed drawn on the device inside a CUDA graph capture, else 0
    seed,  # the seed drawn on the host outside capture, else 0; never specialised, so a new seed never recompiles
    invalid_token,  # the token of an invalid row (the op's sentinel -1 unless the caller chose another)
    B,  # rows
    V,  # vocabulary size
    stride_x,  # row stride of x, elements
    IS_LOGITS: tl.constexpr,  # x holds logits (softmax with temperature first)
    HAS_K: tl.constexpr,  # top-k given: its threshold and mass are in stats_ptr
    HAS_P: tl.constexpr, P_ROWS: tl.constexpr,  # top-p given; per row
    HAS_MINP: tl.constexpr, MINP_ROWS: tl.constexpr,  # min-p given; per row
    HAS_T: tl.constexpr, T_ROWS: tl.constexpr,  # temperature given; per row
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    STAGES: tl.constexpr,  # software-pipeline depth of the walks over the vocabulary (loads run ahead)
    NUM_CAND: tl.constexpr,  # candidates drawn per pass (power of two)
    MAX_ROUNDS: tl.constexpr,  # bound on candidate passes
    KEEP: tl.constexpr,  # the largest top-k set the threshold kernel leaves in set_ptr (0: none is left)
    SORT: tl.constexpr,  # the top-p threshold of such a set by sorting it (GPU) or by pairwise ranks (interpreter)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    row_off = rows.to(tl.int64)[:, None] * stride_x
    seed = tl.load(seed_ptr) + seed
    tl.static_assert(NUM_CAND == 4, "the candidate pass carries exactly four candidates")
    jj = tl.arange(0, NUM_CAND)
    nch = tl.cdiv(V, BLOCK)

    m = tl.zeros((ROWS,), tl.float32)
    # bad: the invalid rows found so far (a per-row temperature out of range, here)
    c, bad = _logit_scale(rows, rmask, t_ptr, t_val, HAS_T, T_ROWS, ROWS)
    # filters that are thresholds known before sampling: top-k (exact search, in its own kernel) and min-p
    floor = tl.zeros((ROWS,), tl.float32)
    mass_k = tl.zeros((ROWS,), tl.float32)  # top-k mass (the whole row without top-k: from the first pass)
    wmax = tl.full((ROWS,), 1.0, tl.float32)  # max weight of a logits row is exp2(0) = 1
    if HAS_K:
        m = tl.load(stats_ptr + rows, mask=rmask, other=0.0)
        floor = tl.load(stats_ptr + B + rows, mask=rmask, other=0.0)
        mass_k = tl.load(stats_ptr + 2 * B + rows, mask=rmask, other=0.0)
        if not IS_LOGITS:
            wmax = tl.load(stats_ptr + 3 * B + rows, mask=rmask, other=0.0)
        bad = bad | (tl.load(stats_ptr + 4 * B + rows, mask=rmask, other=0.0) > 0)  # a bad k or logits max
    elif IS_LOGITS:
        m, m_bad = _checked_max(_row_max(x_ptr, row_off, rmask, V, ROWS, BLOCK, STAGES))
        bad = bad | m_bad
    if HAS_MINP:
        if MINP_ROWS:
            mp = tl.load(minp_ptr + rows, mask=rmask, other=0.0)
            bad = bad | _out_of(mp, 0.0, 1.0, False)
        else:
            mp = tl.zeros((ROWS,), tl.float32) + minp_val
        if not IS_LOGITS:
            if not HAS_K:
                wmax, _tot = _stats(x_ptr, row_off, rmask, V, m, c, IS_LOGITS, ROWS, BLOCK, STAGES)
        floor = tl.maximum(floor, tl.minimum(tl.maximum(mp, 0.0), 1.0) * wmax)
    if HAS_P:
        if P_ROWS:
            pp = tl.load(p_ptr + rows, mask=rmask, other=1.0)
            bad = bad | _out_of(pp, 0.0, 1.0, True)
        else:
            pp = tl.zeros((ROWS,), tl.float32) + p_val
        pp = tl.minimum(tl.maximum(pp, 1e-30), 1.0)
    else:
        pp = tl.full((ROWS,), 1.0, tl.float32)

    # candidate passes: draw NUM_CAND candidates in proportion to w from the weights >= floor that lie
    # above every rejected candidate; the next pass checks them (top-p) while drawing the next ones
    token = tl.full((ROWS,), -1, tl.int32)
    cand_tok = tl.full((ROWS, NUM_CAND), -1, tl.int32)
    cand_w = tl.zeros((ROWS, NUM_CAND), tl.float32)
    above = tl.full((ROWS,), -1.0, tl.float32)
    done = ~rmask
    if HAS_K:
        bad = bad | ~(mass_k > 0)
        done = done | bad
    if HAS_K and KEEP > 0:
        # a row whose top-k set the threshold kernel left (checked there: bad entries, bad k or logits) draws from
        # that set alone; the candidate passes below walk only the other rows
        n_set = tl.load(stats_ptr + 5 * B + rows, mask=rmask, other=-1.0).to(tl.int32)
        in_set = rmask & (n_set >= 0) & ~bad
        if tl.max(in_set.to(tl.int32), axis=0) > 0:
            u_set = _pick(_uniform4(seed, rows * MAX_ROUNDS * (nch + 1) + nch, jj), jj, 0)
            t_set = _draw_from_set(set_ptr, set_cols_ptr, rows.to(tl.int64) * set_stride, in_set, n_set, floor,
                                   pp * mass_k, tl.minimum(u_set, 0.99999994), HAS_P, KEEP, SORT)
            token = tl.where(in_set, t_set, token)
        done = done | in_set
    for r in range(MAX_ROUNDS):
        if tl.max((~done).to(tl.int32), axis=0) > 0:
            check = r > 0
            acc = tl.zeros((ROWS,), tl.float32)
            tot = tl.zeros((ROWS,), tl.float32)
            n_bad = tl.zeros((ROWS,), tl.float32)  # probabilities: entries that are none (the first round)
            mass_gt = tl.zeros((ROWS, NUM_CAND), tl.float32)
            chunk_of = tl.full((ROWS, NUM_CAND), -1, tl.int32)
            # Philox offsets: one per (row, round, chunk) for the reservoir, one more for the in-chunk draws
            rbase = (rows * MAX_ROUNDS + r) * (nch + 1)
            u1 = _uniform4(seed, rbase + nch, jj)
            cw0, cw1, cw2, cw3 = _pick(cand_w, jj, 0), _pick(cand_w, jj, 1), _pick(cand_w, jj, 2), _pick(cand_w, jj, 3)
            for ci in tl.range(0, nch, num_stages=STAGES):
                _cols, valid, xv, w = _chunk_values(x_ptr, row_off, rmask, V, m, c, ci * BLOCK, IS_LOGITS, BLOCK)
                ws = tl.where((w >= floor[:, None]) & (w > above[:, None]), w, 0.0)
                if check:  # the previous candidates' masses beside the reservoir's
                    mc, _mw, g0, g1, g2, g3 = _chunk_sums(ws, w, cw0, cw1, cw2, cw3)
                    mass_gt += _columns4(g0, g1, g2, g3, jj)
                elif HAS_K:  # the first round with top-k: the reservoir's mass (the row's is top-k's)
                    if IS_LOGITS:
                        mc = tl.sum(ws, 1)
                    else:  # and the entries that are no probabilities
                        mc, nb = _pair_sums(ws, _bad_entries(xv, valid))
                        n_bad += nb
                elif HAS_MINP:  # the first round: the reservoir's mass and the row's
                    if IS_LOGITS:
                        mc, mw = _pair_sums(ws, w)
                    else:
                        mc, mw, nb = _triple_sums(ws, w, _bad_entries(xv, valid))
                        n_bad += nb
                    tot += mw
                else:  # the first round, nothing filtered yet: the two are one
                    if IS_LOGITS:
                        mc = tl.sum(ws, 1)
                    else:
                        mc, nb = _pair_sums(ws, _bad_entries(xv, valid))
                        n_bad += nb
                    tot += mc
                acc += mc
                # chunk-level weighted reservoir, one uniform per candidate
                take = (_uniform4(seed, rbase + ci, jj) * acc[:, None] < mc[:, None]) & (mc > 0)[:, None]
                chunk_of = tl.where(take, ci, chunk_of)
            if not HAS_K:
                mass_k = tl.where(check, mass_k, tot)
            # after the first round every check is in: bad entries, or no positive mass, make the row invalid
            bad = bad | (n_bad > 0) | ~(mass_k > 0)
            done = done | bad
            # check the previous candidates: the first one inside the nucleus wins
            if HAS_P:
                if check:
                    inside = (mass_gt < (pp * mass_k)[:, None]) & (cand_tok >= 0)
                    first = tl.min(tl.where(inside, jj[None, :], NUM_CAND), axis=1)
                    hit = (first < NUM_CAND) & (~done)
                    token = tl.where(hit, _pick_rows(cand_tok, jj, first), token)
                    done = done | hit
            # the new candidates (from the set above every previous candidate), unless every row of the tile
            # has its token (a row's draws re-read and scan NUM_CAND whole chunks)
            if tl.max((~done).to(tl.int32), axis=0) > 0:
                new_tok, new_w = _draw_in_chunks(x_ptr, row_off, rmask, V, m, c, chunk_of, tl.minimum(u1, 0.99999994),
                                                 floor, above, IS_LOGITS, BLOCK, NUM_CAND)
                empty = tl.max(new_tok, axis=1) < 0  # nothing left above the rejected candidates (bad data)
                if HAS_P:
                    cand_tok = tl.where(done[:, None], cand_tok, new_tok)
                    cand_w = tl.where(done[:, None], cand_w, new_w)
                    above = tl.where(done, above, tl.max(new_w, axis=1))
                    done = done | empty
                else:
                    token = tl.where(done, token, _pick(new_tok, jj, 0))
                    done = done | rmask
    if HAS_P:
        # rows still open after MAX_ROUNDS (pathological): the most probable candidate drawn last
        best = tl.argmax(tl.where(cand_tok >= 0, cand_w, -1.0), axis=1)
        token = tl.where(token < 0, _pick_rows(cand_tok, jj, best), token)
    token = tl.where(token < 0, V - 1, token)
    token = tl.minimum(tl.maximum(token, 0), V - 1)
    token = tl.where(bad, invalid_token, token)  # the sentinel of an invalid row
    tl.store(out_ptr + rows, token.to(out_ptr.dtype.element_ty), mask=rmask)


@triton.jit
def _renorm_kernel(
    x_ptr,  # (B, V) probabilities, unit stride in V
    out_ptr,  # (B, V) float32 renormalised filtered distribution, NaN across an invalid row
    k_ptr, p_ptr, minp_ptr,  # per-row top-k (int32), top-p, min-p (when *_ROWS)
    k_val, p_val, minp_val,  # scalar parameters (otherwise)
    scratch_ptr,  # (B, SCRATCH) float32 workspace
    B,  # rows
    V,  # vocabulary size
    stride_x,  # row stride of x
    HAS_K: tl.constexpr, K_ROWS: tl.constexpr,  # top-k given; per row
    HAS_P: tl.constexpr, P_ROWS: tl.constexpr,  # top-p given; per row
    HAS_MINP: tl.constexpr, MINP_ROWS: tl.constexpr,  # min-p given; per row
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    STAGES: tl.constexpr,  # software-pipeline depth of the walks over the vocabulary (loads run ahead)
    WALK_STAGES: tl.constexpr,  # that of the top-k search's first walk (the slice maxima)
    NP: tl.constexpr,  # pivots per search pass
    SCRATCH: tl.constexpr,  # workspace slots per row
    MAX_PASSES: tl.constexpr,  # bound on search passes
    SORT: tl.constexpr,  # finish the search by sorting (GPU) or by pairwise ranks (interpreter)
    PDL: tl.constexpr,  # launched with programmatic dependent launch (._gdc)
):
    after_prior(PDL)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    row_off = rows.to(tl.int64)[:, None] * stride_x
    scr_off = rows.to(tl.int64) * SCRATCH
    m = tl.zeros((ROWS,), tl.float32)
    c = tl.zeros((ROWS,), tl.float32)
    tau = tl.zeros((ROWS,), tl.float32)
    bad = rows < 0  # the invalid rows: a per-row parameter out of range, bad entries or no positive mass
    if HAS_K:
        kf, k_on, k_bad = _top_k_of_rows(rows, rmask, k_ptr, k_val, V, K_ROWS, ROWS)
        bad = bad | k_bad
        tau, mass_k, total, wmax, n_bad_k, _nk = _top_k_select(
            x_ptr, row_off, rmask, V, m, c, kf, k_on, scratch_ptr, scratch_ptr, scr_off, False, ROWS, BLOCK, 0, True,
            WALK_STAGES, BLOCK, STAGES, NP, SCRATCH, MAX_PASSES, SORT)
    else:
        wmax, total = _stats(x_ptr, row_off, rmask, V, m, c, False, ROWS, BLOCK, STAGES)
        mass_k = total
    bad = bad | ~(total > 0)
    if HAS_P:
        if P_ROWS:
            pp = tl.load(p_ptr + rows, mask=rmask, other=1.0)
            bad = bad | _out_of(pp, 0.0, 1.0, True)
        else:
            pp = tl.zeros((ROWS,), tl.float32) + p_val
        pp = tl.minimum(tl.maximum(pp, 1e-30), 1.0)
        p_on = (pp < 1.0) & rmask
        tau_p, _m, _t, _x = _select(x_ptr, row_off, rmask, V, m, c, pp * mass_k, p_on, tau, wmax, scratch_ptr, scr_off,
                                    False, True, ROWS, BLOCK, STAGES, NP, SCRATCH, MAX_PASSES, SORT)
        tau = tl.maximum(tau, tau_p)
    if HAS_MINP:
        if MINP_ROWS:
            mp = tl.load(minp_ptr + rows, mask=rmask, other=0.0)
            bad = bad | _out_of(mp, 0.0, 1.0, False)
        else:
            mp = tl.zeros((ROWS,), tl.float32) + minp_val
        tau = tl.maximum(tau, tl.minimum(tl.maximum(mp, 0.0), 1.0) * wmax)
    if HAS_K and not (HAS_P or HAS_MINP):
        # top-k alone: the kept mass is top-k's, and the search's first walk counted the bad entries
        bad = bad | (n_bad_k > 0)
        kept_mass = mass_k
    else:
        kept = tl.zeros((ROWS, BLOCK), tl.float32)
        n_bad = tl.zeros((ROWS, BLOCK), tl.float32)
        for start in tl.range(0, V, BLOCK, num_stages=STAGES):
            cols, valid, xv, w = _chunk_values(x_ptr, row_off, rmask, V, m, c, start, False, BLOCK)
            kept += tl.where(w >= tau[:, None], w, 0.0)
            n_bad += _bad_entries(xv, valid)
        bad = bad | (tl.sum(n_bad, axis=1) > 0)
        kept_mass = tl.sum(kept, axis=1)
    inv = tl.where(bad, float("nan"), 1.0 / tl.maximum(kept_mass, 1e-30))  # an invalid row: all NaN
    for start in tl.range(0, V, BLOCK, num_stages=STAGES):
        cols, valid, w = _chunk(x_ptr, row_off, rmask, V, m, c, start, False, BLOCK)
        y = tl.where((w >= tau[:, None]) | bad[:, None], w * inv[:, None], 0.0)
        tl.store(out_ptr + rows.to(tl.int64)[:, None] * V + cols[None, :], y, mask=valid)


@triton.jit
def _chain_speculative_kernel(
    draft_ptr,  # (B, n, V) draft probabilities, contiguous
    ids_ptr,  # (B, n) int64 draft tokens
    target_ptr,  # (B, n+1, V) target probabilities, contiguous
    u_ptr,  # (B, n+1) float64 uniforms drawn by torch: n acceptance tests, then the final draw
    tokens_ptr,  # (B, n+1) int64 out: accepted drafts, the drawn token, -1 padding (all -1: an invalid row)
    accepted_ptr,  # (B,) int32 out: drafts whose test passes, each on its own
    emitted_ptr,  # (B,) int32 out: drafts emitted (the accepted prefix)
    B,  # rows
    N,  # draft tokens per row
    V,  # vocabulary size
    ROWS: tl.constexpr,  # rows per program
    BLOCK: tl.constexpr,  # chunk width
    STAGES: tl.constexpr,  # software-pipeline depth of the walks over the vocabulary
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < B
    r64 = rows.to(tl.int64)
    accepted = tl.zeros((ROWS,), tl.int32)
    emitted = tl.zeros((ROWS,), tl.int32)
    bad = rows < 0  # the invalid rows: a draft id out of range, a distribution with bad entries or no mass
    going = rmask
    for i in range(0, N):
        d = tl.load(ids_ptr + r64 * N + i, mask=rmask, other=0)
        bad = bad | (d < 0) | (d >= V)
        d = tl.minimum(tl.maximum(d, 0), V - 1)
        pd = tl.load(draft_ptr + (r64 * N + i) * V + d, mask=rmask, other=0.0).to(tl.float32)
        pt = tl.load(target_ptr + (r64 * (N + 1) + i) * V + d, mask=rmask, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + r64 * (N + 1) + i, mask=rmask, other=1.0)
        ok = (u * tl.maximum(pd, 0.0).to(tl.float64) < tl.maximum(pt, 0.0).to(tl.float64)) & rmask
        accepted += ok.to(tl.int32)
        going = going & ok
        emitted += going.to(tl.int32)
    # one walk over every distribution of the row: the validity checks, and the mass of the residual at the first
    # rejected position e, max(0, target - draft) (the target itself at e = n), and of the target there
    offs = tl.arange(0, BLOCK)
    res_acc = tl.zeros((ROWS, BLOCK), tl.float32)
    tgt_acc = tl.zeros((ROWS, BLOCK), tl.float32)
    n_bad = tl.zeros((ROWS, BLOCK), tl.float32)
    for i in range(0, N + 1):
        t_i = target_ptr + (r64 * (N + 1) + i) * V
        d_i = draft_ptr + (r64 * N + i) * V
        has_d = (rows * 0 + i) < N  # (ROWS,): a tensor, so the interpreter's masks stay boolean arrays
        at_e = (emitted == i)[:, None]
        t_sum = tl.zeros((ROWS, BLOCK), tl.float32)
        d_sum = tl.zeros((ROWS, BLOCK), tl.float32)
        for start in tl.range(0, V, BLOCK, num_stages=STAGES):
            cols = start + offs
            valid = rmask[:, None] & (cols[None, :] < V)
            pt = tl.load(t_i[:, None] + cols[None, :], mask=valid, other=0.0).to(tl.float32)
            pd = tl.load(d_i[:, None] + cols[None, :], mask=valid & has_d[:, None], other=0.0).to(tl.float32)
            n_bad += _bad_entries(pt, valid) + _bad_entries(pd, valid & has_d[:, None])
            pt = tl.maximum(pt, 0.0)
            pd = tl.maximum(pd, 0.0)
            t_sum += pt
            d_sum += pd
            res_acc += tl.where(at_e, tl.maximum(pt - pd, 0.0), 0.0)
            tgt_acc += tl.where(at_e, pt, 0.0)
        bad = bad | ~(tl.sum(t_sum, axis=1) > 0) | (has_d & ~(tl.sum(d_sum, axis=1) > 0))
    bad = bad | (tl.sum(n_bad, axis=1) > 0)
    res_mass = tl.sum(res_acc, axis=1)
    use_res = res_mass > 0
    e64 = emitted.to(tl.int64)
    t_row = target_ptr + (r64 * (N + 1) + e64) * V
    d_row = draft_ptr + (r64 * N + e64) * V
    has_draft = emitted < N
    # inverse CDF over the residual (or the target when the residual is all zero), float32 running sum
    u_last = tl.load(u_ptr + r64 * (N + 1) + N, mask=rmask, other=0.0).to(tl.float32)
    tgt = u_last * tl.where(use_res, res_mass, tl.sum(tgt_acc, axis=1))
    run = tl.zeros((ROWS,), tl.float32)
    tok = tl.full((ROWS,), -1, tl.int32)
    last_pos = tl.full((ROWS,), -1, tl.int32)
    for start in tl.range(0, V, BLOCK, num_stages=STAGES):
        cols = start + offs
        valid = rmask[:, None] & (cols[None, :] < V)
        pt = tl.maximum(tl.load(t_row[:, None] + cols[None, :], mask=valid, other=0.0).to(tl.float32), 0.0)
        pd = tl.maximum(tl.load(d_row[:, None] + cols[None, :], mask=valid & has_draft[:, None], other=0.0).to(tl.float32),
                        0.0)
        w = tl.where(use_res[:, None], tl.maximum(pt - pd, 0.0), pt)
        cs = run[:, None] + tl.cumsum(w, axis=1)
        first = tl.min(tl.where((cs > tgt[:, None]) & (w > 0), cols[None, :], V), axis=1)
        tok = tl.where((tok < 0) & (first < V), first, tok)
        last_pos = tl.maximum(last_pos, tl.max(tl.where(w > 0, cols[None, :], -1), axis=1))
        run += tl.sum(w, axis=1)
    tok = tl.where(tok < 0, last_pos, tok)
    tok = tl.minimum(tl.maximum(tok, 0), V - 1).to(tl.int64)
    for i in range(0, N + 1):
        d = tl.load(ids_ptr + r64 * N + i, mask=rmask & ((rows * 0 + i) < N), other=-1)
        out = tl.where(i < emitted, d, tl.where(i == emitted, tok, -1))
        tl.store(tokens_ptr + r64 * (N + 1) + i, tl.where(bad, -1, out), mask=rmask)  # an invalid row: all -1
    tl.store(accepted_ptr + rows, tl.where(bad, 0, accepted), mask=rmask)
    tl.store(emitted_ptr + rows, tl.where(bad, 0, emitted), mask=rmask)
