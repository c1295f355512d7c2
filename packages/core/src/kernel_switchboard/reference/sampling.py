"""Reference sampling kernels (see :mod:`kernel_switchboard.ops.sampling` for signatures and semantics).

Sort-based filtering in float32 and inverse-CDF sampling with one uniform per row drawn from
``generator`` (or the default generator): reproducible for a seeded generator, deterministic on
every device, no host sync (CUDA-graph capturable). Invalid rows (:func:`~kernel_switchboard.ops.sampling.invalid_rows`)
are answered with the sentinel the op defines (token -1, a NaN renorm row, a chain row of -1 with nothing accepted),
selected on the device; their draws are computed on clamped values and discarded.
"""

from __future__ import annotations

import dataclasses

import torch

from ..invariance import one_request_draws
from ..ops.sampling import INVALID, invalid_rows, speculative_invalid_rows
from ..registry import Kernel
from ._cap import INVARIANT_CAPTURABLE, PRIORITY
from ._rows import rowwise

ParamArg = float | int | torch.Tensor | None


def _column(v: ParamArg, like: torch.Tensor) -> torch.Tensor | float | None:
    """A per-row tensor as a (B, 1) float32 column; scalars pass through."""
    if isinstance(v, torch.Tensor):
        return v.to(device=like.device, dtype=torch.float32).unsqueeze(-1)
    return v


def probabilities(x: torch.Tensor, is_logits: bool, temperature: ParamArg) -> torch.Tensor:
    """(B, V) float32 probabilities: softmax(x / temperature) for logits, else x itself (as float32).

    The logits are shifted by their row maximum before the division, ``softmax((x - max) / t)``, which is the
    same distribution without overflow: every positive temperature, however small, gives finite shifted logits
    ``<= 0`` whose maximum is exactly 0, so as ``t -> 0`` the mass goes to the argmax (shared by tied maxima)
    instead of overflowing to ``inf - inf = NaN``.
    """
    x32 = x.float()
    if not is_logits:
        return x32.clamp_min(0).nan_to_num(0.0)
    t = _column(temperature, x32)
    if t is not None:
        mx = x32.amax(dim=-1, keepdim=True)
        x32 = (x32 - torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))) / t
    return torch.softmax(x32, dim=-1).nan_to_num(0.0)


def keep_mask(p: torch.Tensor, top_k: ParamArg, top_p: ParamArg, min_p: ParamArg) -> torch.Tensor:
    """(B, V) bool: the tokens that survive top-k, then top-p, then min-p (ties kept together)."""
    vocab = p.shape[-1]
    s = torch.sort(p, dim=-1, descending=True, stable=True).values  # (B, V)
    keep = p > 0
    if top_k is not None:
        k = top_k if isinstance(top_k, torch.Tensor) else torch.full((p.shape[0],), int(top_k), device=p.device)
        k = k.to(device=p.device, dtype=torch.int64)
        k = torch.where(k <= 0, vocab, k).clamp(1, vocab)
        thr = s.gather(-1, (k - 1).unsqueeze(-1))
        keep &= p >= thr
        s = torch.where(s >= thr, s, 0.0)  # the survivors, still sorted
    if top_p is not None:
        cum = torch.cumsum(s, dim=-1)
        total = cum[:, -1:]
        before = cum - s  # mass strictly ahead in sorted order
        tp = _column(top_p, p)
        tp = tp.clamp(1e-30, 1.0) if isinstance(tp, torch.Tensor) else min(max(float(tp), 1e-30), 1.0)  # type: ignore[arg-type]
        n_keep = (before < tp * total).sum(-1, keepdim=True).clamp_min(1)
        thr = s.gather(-1, n_keep - 1)
        keep &= p >= thr
    if min_p is not None:
        mp = _column(min_p, p)
        mp = mp.clamp(0.0, 1.0) if isinstance(mp, torch.Tensor) else min(max(float(mp), 0.0), 1.0)  # type: ignore[arg-type]
        keep &= p >= mp * s[:, :1]
    return keep


def filtered(x: torch.Tensor, top_k: ParamArg, top_p: ParamArg, min_p: ParamArg, is_logits: bool = False,
             temperature: ParamArg = None) -> torch.Tensor:
    """(B, V) float32 unnormalised filtered weights (zero where filtered out)."""
    p = probabilities(x, is_logits, temperature)
    return torch.where(keep_mask(p, top_k, top_p, min_p), p, 0.0)


def sample_rows(w: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw from non-negative weights w (B, V) with uniforms u (B,) in [0, 1): (B,) int64.

    Never returns a zero-weight token (when a row has any positive weight).
    """
    cdf = torch.cumsum(w, dim=-1)
    target = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(-1)
    tok = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    index = torch.arange(w.shape[-1], device=w.device)
    last = torch.where(w > 0, index, 0).amax(-1)  # the last positive token (0 if none)
    return torch.minimum(tok, last)


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    return torch.rand(shape, generator=generator, device=device, dtype=torch.float64)


def top_k_top_p(x: torch.Tensor, top_k: ParamArg, top_p: ParamArg, min_p: ParamArg, is_logits: bool,
                temperature: ParamArg, generator: torch.Generator | None, deterministic: bool, out: torch.Tensor,
                invalid_token: int) -> torch.Tensor:
    w = filtered(x, top_k, top_p, min_p, is_logits, temperature)
    tokens = sample_rows(w, _uniform((x.shape[0],), generator, x.device))
    return out.copy_(torch.where(invalid_rows(x, is_logits, top_k, top_p, min_p, temperature), invalid_token, tokens))


def renorm(probs: torch.Tensor, top_k: ParamArg, top_p: ParamArg, min_p: ParamArg) -> torch.Tensor:
    w = filtered(probs, top_k, top_p, min_p)
    out = w / w.sum(-1, keepdim=True).clamp_min(1e-30)
    return out.masked_fill(invalid_rows(probs, False, top_k, top_p, min_p).unsqueeze(-1), float("nan"))


def chain_speculative(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
                      generator: torch.Generator | None, deterministic: bool
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, n, _ = draft_probs.shape
    pd = draft_probs.float().clamp_min(0)
    pt = target_probs.float().clamp_min(0)
    ids = draft_token_ids.clamp(0, pd.shape[-1] - 1).unsqueeze(-1)
    u = _uniform((b, n + 1), generator, pd.device)
    pd_d = pd.gather(-1, ids).squeeze(-1).double()
    pt_d = pt[:, :n].gather(-1, ids).squeeze(-1).double()
    passed = u[:, :n] * pd_d < pt_d  # accept with probability min(1, pt / pd)
    accepted = passed.sum(-1, dtype=torch.int32)
    emitted = passed.to(torch.int64).cumprod(-1).sum(-1)  # accepted prefix length, (B,)
    rows = torch.arange(b, device=pd.device)
    pd_pad = torch.cat([pd, torch.zeros_like(pd[:, :1])], dim=1)  # position n: residual = target itself
    pt_e, pd_e = pt[rows, emitted], pd_pad[rows, emitted]
    residual = (pt_e - pd_e).clamp_min(0)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, pt_e)
    last = sample_rows(residual, u[:, n])
    pos = torch.arange(n + 1, device=pd.device)
    padded_ids = torch.cat([draft_token_ids, draft_token_ids.new_full((b, 1), -1)], dim=1)
    tokens = torch.where(pos < emitted.unsqueeze(-1), padded_ids, -1)
    tokens = torch.where(pos == emitted.unsqueeze(-1), last.unsqueeze(-1), tokens)
    bad = speculative_invalid_rows(draft_probs, draft_token_ids, target_probs)
    tokens = tokens.masked_fill(bad.unsqueeze(-1), INVALID)
    return tokens, accepted.masked_fill(bad, 0), emitted.to(torch.int32).masked_fill(bad, 0)


#: draws: batch invariant for a batch of one request (see :func:`kernel_switchboard.invariance.one_request_draws`)
DRAWS = dataclasses.replace(INVARIANT_CAPTURABLE, check=one_request_draws)

KERNELS = [
    Kernel("sampling.top_k_top_p", "top_k_top_p", "reference", DRAWS, top_k_top_p, priority=PRIORITY,
           doc="sort-based filter, inverse-CDF draw (float32)"),
    Kernel("sampling.renorm", "renorm", "reference", INVARIANT_CAPTURABLE, rowwise(renorm, rows=(0, 1, 2, 3)),
           priority=PRIORITY),
    Kernel("sampling.chain_speculative", "chain_speculative", "reference", DRAWS, chain_speculative,
           priority=PRIORITY),
]
