"""Conformance cases for the sampling family: statistical checks of samplers, exact checks of renorm.

Sampler cases (``Case.check``): a few distinct rows, each replicated many times, are sampled
``calls`` times by the kernel under test (seeded); the counts per row must pass a chi-square
goodness-of-fit test (significance 1e-3, rows combined into one statistic) against the filtered
distribution computed here in float64 from the inputs, and no token outside that distribution's
support may ever appear. Inputs are drawn so that no token sits within ``MARGIN`` of a filter
threshold (float32 and float64 filtering then agree). ``sampling.chain_speculative`` is checked the
same way on the joint law of (tokens emitted, last token) given the draft tokens, plus a z-test
on ``accepted`` and exact checks of the structure (accepted drafts copied, -1 padding).

Invalid rows (``ops.sampling.invalid_rows``: NaN / inf / negative / all-zero data, out-of-range per-row
parameters) are mixed into some batches: the samplers must answer each of them with exactly -1 (chain
speculative: tokens all -1, nothing accepted or emitted) while the valid rows of the same batch keep passing
the checks above; renorm's invalid rows (NaN) are compared with the reference like the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..case import Case

#: distinct rows, replicas of each row per call, calls; vocabulary
SIZES = {
    "small": {"rows": 3, "replicas": 1500, "calls": 3, "vocab": 24, "draft": 3, "spec_vocab": 16},
    "large": {"rows": 4, "replicas": 512, "calls": 6, "vocab": 128256, "draft": 4, "spec_vocab": 16384},
}
SIGNIFICANCE = 1e-3
#: no token within this distance of a top-p threshold (as a fraction of the mass) or a min-p one (relative)
MARGIN = 1e-4
SEED = 1234


# -- the target distribution, float64 ------------------------------------------------------------
def _rows(v: Any, n: int) -> torch.Tensor | None:
    """Per-row float64 column (n, 1) from a scalar or a (n,) tensor; None stays None."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return v.detach().cpu().double().reshape(n, 1)
    return torch.full((n, 1), float(v), dtype=torch.float64)


def base_probs(x: torch.Tensor, is_logits: bool, temperature: Any = None) -> torch.Tensor:
    """(B, V) float64 probabilities on the CPU from probabilities or (tempered) logits."""
    x64 = x.detach().cpu().double()
    if not is_logits:
        return x64 / x64.sum(-1, keepdim=True)
    t = _rows(temperature, x.shape[0])
    return torch.softmax(x64 / t if t is not None else x64, dim=-1)


def _mass_greater(p: torch.Tensor) -> torch.Tensor:
    """For each token, the total mass of the tokens strictly more probable than it (float64)."""
    asc, _ = torch.sort(p, dim=-1)
    cum = torch.cumsum(asc, dim=-1)
    le = torch.searchsorted(asc, p, right=True)  # tokens with probability <= p_i
    below = torch.where(le > 0, cum.gather(-1, (le - 1).clamp_min(0)), torch.zeros_like(p))
    return cum[:, -1:] - below


def target_distribution(x: torch.Tensor, top_k: Any = None, top_p: Any = None, min_p: Any = None,
                        is_logits: bool = False, temperature: Any = None) -> torch.Tensor:
    """The filtered, renormalised distribution (B, V) float64 on the CPU (docs of ops.sampling)."""
    p = base_probs(x, is_logits, temperature)
    n = p.shape[0]
    keep = p > 0
    if top_k is not None:
        k = _rows(top_k, n)
        assert k is not None
        rank = (p.unsqueeze(-1) < p.unsqueeze(-2)).sum(-1) if p.shape[1] <= 1024 else _rank_sorted(p)
        keep &= (k <= 0) | (rank < k)
    if top_p is not None:
        q = torch.where(keep, p, 0.0)
        tp = _rows(top_p, n)
        assert tp is not None
        keep &= _mass_greater(q) < tp * q.sum(-1, keepdim=True)
    if min_p is not None:
        mp = _rows(min_p, n)
        assert mp is not None
        keep &= p >= mp * p.amax(-1, keepdim=True)
    w = torch.where(keep, p, 0.0)
    return w / w.sum(-1, keepdim=True)


def _rank_sorted(p: torch.Tensor) -> torch.Tensor:
    """Number of tokens strictly more probable than each token (large vocabularies)."""
    asc, _ = torch.sort(p, dim=-1)
    le = torch.searchsorted(asc, p, right=True)
    return p.shape[-1] - le


def ambiguous(x: torch.Tensor, top_k: Any, top_p: Any, min_p: Any, is_logits: bool, temperature: Any) -> bool:
    """True when some token lies near a filter threshold (ties at the k-th place, top-p or min-p edges)."""
    p = base_probs(x, is_logits, temperature)
    n = p.shape[0]
    s, _ = torch.sort(p, dim=-1, descending=True)
    if top_k is not None:
        k = _rows(top_k, n).long().clamp(0, p.shape[1])  # type: ignore[union-attr]
        inside = (k > 0) & (k < p.shape[1])
        kth = s.gather(-1, (k - 1).clamp_min(0))
        nxt = s.gather(-1, k.clamp(max=p.shape[1] - 1))
        if (inside & ((kth - nxt) <= MARGIN * kth)).any():
            return True
        keep = (k <= 0) | (p >= kth)
    else:
        keep = torch.ones_like(p, dtype=torch.bool)
    q = torch.where(keep, p, 0.0)
    if top_p is not None:
        rel = _mass_greater(q) / q.sum(-1, keepdim=True) - _rows(top_p, n)  # type: ignore[operator]
        if ((rel.abs() < MARGIN) & keep).any():
            return True
    if min_p is not None:
        mp = _rows(min_p, n)
        ratio = p / p.amax(-1, keepdim=True)
        if ((ratio - mp).abs() < MARGIN * mp).any():  # type: ignore[operator]
            return True
    return bool((p.sum(-1) <= 0).any())


# -- statistics ----------------------------------------------------------------------------------
def chi_square_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Goodness of fit of count rows ``observed`` to expected-count rows (same shape), rows combined.

    Bins expected below 5 are pooled (and the pool joins the smallest bin when itself below 5).
    """
    stat, dof = 0.0, 0
    for o_row, e_row in zip(observed.double(), expected.double()):
        pos = e_row > 0
        big = pos & (e_row >= 5)
        small = pos & ~big
        o, e = o_row[big], e_row[big]
        if small.any():
            po, pe = o_row[small].sum(), e_row[small].sum()
            if pe < 5 and e.numel():
                j = int(e.argmin())
                o, e = o.clone(), e.clone()
                o[j] += po
                e[j] += pe
            else:
                o, e = torch.cat([o, po.view(1)]), torch.cat([e, pe.view(1)])
        stat += float(((o - e) ** 2 / e).sum())
        dof += max(e.numel() - 1, 0)
    if dof == 0:
        return 1.0
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def _check_tokens(tok: Any, n: int, vocab: int) -> torch.Tensor:
    assert isinstance(tok, torch.Tensor), f"expected a tensor of tokens, got {type(tok).__name__}"
    assert tok.dtype == torch.int64 and tuple(tok.shape) == (n,), f"tokens: {tok.dtype} {tuple(tok.shape)}, want int64 ({n},)"
    t = tok.cpu()
    assert bool(((t >= 0) & (t < vocab)).all()), f"token out of range [0, {vocab}): {t[(t < 0) | (t >= vocab)][:5].tolist()}"
    return t


def _reseed(generator: torch.Generator | None, seed: int) -> None:
    if generator is not None:
        generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)


def sampler_check(target: torch.Tensor, replicas: int, calls: int, generator: torch.Generator | None = None,
                  reproducible: bool = False, seed: int = SEED) -> Callable[[Callable[..., Any]], None]:
    """Case.check for a sampler whose input rows are ``target``'s rows each repeated ``replicas`` times."""
    rows, vocab = target.shape

    def check(run: Callable[..., Any]) -> None:
        _reseed(generator, seed)
        counts = torch.zeros(rows, vocab, dtype=torch.float64)
        for _ in range(calls):
            t = _check_tokens(run(), rows * replicas, vocab).view(rows, replicas)
            counts.scatter_add_(1, t, torch.ones(t.shape, dtype=torch.float64))
        bad = (counts > 0) & (target == 0)
        assert not bad.any(), (f"sampled a filtered-out token: (row, token) {bad.nonzero()[:5].tolist()}, "
                               f"counts {counts[bad][:5].tolist()}")
        pval = chi_square_pvalue(counts, target * counts.sum(-1, keepdim=True))
        assert pval > SIGNIFICANCE, f"sample counts do not fit the filtered distribution: chi-square p = {pval:.3g}"
        if reproducible:
            _reseed(generator, seed + 1)
            first = run().cpu()
            _reseed(generator, seed + 1)
            again = run().cpu()
            assert torch.equal(first, again), "deterministic=True with the same seed gave different tokens"

    return check


# -- input generation ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Spec:
    id: str
    dtype: torch.dtype
    is_logits: bool
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    temperature: float | None = None
    per_row: bool = False
    generator: bool = False
    deterministic: bool = False


def _row_params(spec: _Spec, rows: int, vocab: int, g: torch.Generator) -> dict[str, Any]:
    """Scalar params as given, or per-row tensors drawn around them (top_k: one row 0 = off)."""
    out: dict[str, Any] = {"top_k": spec.top_k, "top_p": spec.top_p, "min_p": spec.min_p,
                           "temperature": spec.temperature}
    if not spec.per_row:
        return out
    if spec.top_k is not None:
        k = torch.randint(1, min(vocab, 2 * spec.top_k) + 1, (rows,), generator=g)
        k[0] = 0
        out["top_k"] = k.to(torch.int64)
    if spec.top_p is not None:
        out["top_p"] = torch.empty(rows).uniform_(0.5, 0.95, generator=g)
    if spec.min_p is not None:
        out["min_p"] = torch.empty(rows).uniform_(0.0, 2 * spec.min_p, generator=g)
    if spec.temperature is not None:
        out["temperature"] = torch.empty(rows).uniform_(0.5, 1.5, generator=g)
    return out


def _distinct_rows(spec: _Spec, rows: int, vocab: int, g: torch.Generator, params: dict[str, Any]) -> torch.Tensor:
    """Rows of x (CPU, spec.dtype) with no token near a threshold.

    Small vocabularies: Gaussian logits. Large ones: Zipf-like rows (p ∝ rank^-s, s in [1.6, 2.5]) so the
    filters cut where tokens still carry visible mass, as in real LLM distributions.
    """
    for _ in range(100):
        if vocab <= 1024:
            logits = torch.randn(rows, vocab, generator=g) * 2.0
        else:
            rank = torch.argsort(torch.rand(rows, vocab, generator=g), dim=-1).float() + 1
            s = torch.empty(rows, 1).uniform_(1.6, 2.5, generator=g)
            logits = -s * rank.log() + 0.01 * torch.randn(rows, vocab, generator=g)
        x = logits if spec.is_logits else torch.softmax(logits, -1)
        x = x.to(spec.dtype)
        temp = params["temperature"] if spec.is_logits else None
        if not ambiguous(x, params["top_k"], params["top_p"], params["min_p"], spec.is_logits, temp):
            return x
    raise RuntimeError(f"could not draw unambiguous rows for {spec.id}")


def _rep(v: Any, replicas: int, device: torch.device) -> Any:
    return v.repeat_interleave(replicas, 0).to(device) if isinstance(v, torch.Tensor) else v


def _rows_and_target(spec: _Spec, size: str, g: torch.Generator) -> tuple[dict[str, int], dict[str, Any],
                                                                        torch.Tensor, torch.Tensor]:
    """(the size's settings, the drawn per-row parameters, the distinct rows, their target distribution)."""
    cfg = SIZES[size]
    params = _row_params(spec, cfg["rows"], cfg["vocab"], g)
    x = _distinct_rows(spec, cfg["rows"], cfg["vocab"], g, params)
    target = target_distribution(x, params["top_k"], params["top_p"], params["min_p"], spec.is_logits,
                                 params["temperature"] if spec.is_logits else None)
    return cfg, params, x, target


def _sampler_case(spec: _Spec, device: torch.device, size: str, g: torch.Generator) -> Case:
    cfg, params, x, target = _rows_and_target(spec, size, g)
    replicas = cfg["replicas"]
    gen = torch.Generator(device=device) if spec.generator else None
    kwargs: dict[str, Any] = {"min_p": _rep(params["min_p"], replicas, device), "is_logits": spec.is_logits}
    if spec.is_logits:
        kwargs["temperature"] = _rep(params["temperature"], replicas, device)
    if gen is not None:
        kwargs["generator"] = gen
    if spec.deterministic:
        kwargs["deterministic"] = True
    args = (_rep(x, replicas, device), _rep(params["top_k"], replicas, device), _rep(params["top_p"], replicas, device))
    check = sampler_check(target, replicas, cfg["calls"], gen, reproducible=spec.deterministic)
    return Case("sampling.top_k_top_p", spec.id, args, kwargs, spec.dtype, check=check)


SAMPLER_SPECS = (
    _Spec("probs-fp32-topk-topp", torch.float32, False, top_k=8, top_p=0.8),
    _Spec("logits-fp32-temp-topk-topp-minp", torch.float32, True, top_k=10, top_p=0.9, min_p=0.05, temperature=0.7),
    _Spec("logits-bf16-per-row", torch.bfloat16, True, top_k=6, top_p=0.8, min_p=0.05, temperature=1.0,
          per_row=True),
    _Spec("probs-fp16-minp", torch.float16, False, min_p=0.1),
    _Spec("probs-fp32-plain", torch.float32, False),
    _Spec("logits-fp32-topp-generator-deterministic", torch.float32, True, top_p=0.7, generator=True,
          deterministic=True),
)


# -- invalid rows --------------------------------------------------------------------------------
INVALID = -1
_NAN, _INF = float("nan"), float("inf")

#: (what makes the row invalid, its data or None (a valid row), the per-row parameter values that differ)
_DATA_PROBS = (("a NaN entry", lambda r: _set(r, 1, _NAN)), ("a +inf entry", lambda r: _set(r, 2, _INF)),
               ("a -inf entry", lambda r: _set(r, 0, -_INF)), ("a negative entry", lambda r: _set(r, 3, -0.25)),
               ("all zero", lambda r: torch.zeros_like(r)))
_DATA_LOGITS = (("a NaN logit", lambda r: _set(r, 1, _NAN)), ("a +inf logit", lambda r: _set(r, 2, _INF)),
                ("every logit -inf", lambda r: torch.full_like(r, -_INF)))
#: out-of-range per-row parameter entries, by parameter
_BAD_PARAMS: dict[str, tuple[Any, ...]] = {"top_k": (-1, -7), "top_p": (0.0, 1.5, _NAN, -0.5),
                                           "min_p": (-0.1, 1.5, _NAN), "temperature": (0.0, -1.0, _INF, _NAN)}


def _set(row: torch.Tensor, i: int, value: float) -> torch.Tensor:
    row = row.clone()
    row[i] = value
    return row


def _bad_rows(x: torch.Tensor, params: dict[str, Any], is_logits: bool, g: torch.Generator
              ) -> tuple[torch.Tensor, dict[str, Any]]:
    """Invalid rows for a batch like x: one per kind of bad data, one per out-of-range value of each per-row
    parameter (on otherwise valid data), with per-row parameters (valid ones where a row's data makes it invalid)."""
    base = x[torch.randint(0, x.shape[0], (1,), generator=g)].squeeze(0).float()
    rows: list[torch.Tensor] = []
    values: dict[str, list[Any]] = {k: [] for k, v in params.items() if isinstance(v, torch.Tensor)}

    def add(row: torch.Tensor, bad_param: tuple[str, Any] | None = None) -> None:
        rows.append(row)
        for name in values:
            ok = params[name][0].item()
            values[name].append(bad_param[1] if bad_param is not None and bad_param[0] == name else ok)

    for _, make in (_DATA_LOGITS if is_logits else _DATA_PROBS):
        add(make(base))
    for name in values:
        if name == "temperature" and not is_logits:
            continue
        for bad in _BAD_PARAMS[name]:
            add(base, (name, bad))
    out = {name: torch.tensor(v, dtype=params[name].dtype) for name, v in values.items()}
    return torch.stack(rows).to(x.dtype), out


def _with_bad_rows(x: torch.Tensor, params: dict[str, Any], is_logits: bool, g: torch.Generator
                   ) -> tuple[torch.Tensor, dict[str, Any], torch.Tensor]:
    """x (n, V) with invalid rows scattered among its rows: (x, per-row parameters, (n + bad,) bool invalid mask)."""
    bad_x, bad_params = _bad_rows(x, params, is_logits, g)
    n = x.shape[0]
    perm = _interleave(n, bad_x.shape[0], g)
    out = {k: (torch.cat([v, bad_params[k]])[perm] if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    return torch.cat([x, bad_x])[perm], out, perm >= n


def _interleave(n: int, extra: int, g: torch.Generator) -> torch.Tensor:
    """A permutation of n + extra rows that scatters the last ``extra`` among the first n and keeps those in order."""
    keys = torch.cat([torch.arange(n, dtype=torch.float64), torch.rand(extra, generator=g, dtype=torch.float64) * n])
    return torch.argsort(keys, stable=True)


def with_invalid_rows(check: Callable[[Callable[..., Any]], None], invalid: torch.Tensor
                      ) -> Callable[[Callable[..., Any]], None]:
    """A Case.check for a batch whose rows ``invalid`` (bool, (B,)) are invalid: each call must answer those rows
    with the sentinel (tokens -1; chain speculative: a row of -1, accepted and emitted 0); the valid rows' results
    go to ``check``, which was built for them alone."""

    def wrapped(run: Callable[..., Any]) -> None:
        def valid_part() -> Any:
            result = run()
            if isinstance(result, torch.Tensor):
                tok = result.cpu()
                assert tuple(tok.shape) == tuple(invalid.shape), f"tokens {tuple(tok.shape)}, want {tuple(invalid.shape)}"
                wrong = invalid & (tok != INVALID)
                assert not wrong.any(), (f"invalid rows must give token {INVALID}: rows {wrong.nonzero().flatten()[:5].tolist()} "
                                         f"gave {tok[wrong][:5].tolist()}")
                return result[~invalid.to(result.device)]
            tokens, accepted, emitted = (t.cpu() for t in result)
            wrong = invalid & ((tokens != INVALID).any(-1) | (accepted != 0) | (emitted != 0))
            assert not wrong.any(), (f"invalid rows must give tokens all {INVALID}, accepted 0, emitted 0: rows "
                                     f"{wrong.nonzero().flatten()[:5].tolist()}")
            keep = ~invalid.to(result[0].device)
            return tuple(t[keep] for t in result)

        check(valid_part)

    return wrapped


def _invalid_sampler_case(spec: _Spec, device: torch.device, size: str, g: torch.Generator) -> Case:
    """:func:`_sampler_case` with invalid rows scattered through the batch."""
    cfg, params, x, target = _rows_and_target(spec, size, g)
    replicas = cfg["replicas"]
    rep = {k: (v.repeat_interleave(replicas, 0) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    big, rep, invalid = _with_bad_rows(x.repeat_interleave(replicas, 0), rep, spec.is_logits, g)
    kwargs: dict[str, Any] = {"min_p": _rep(rep["min_p"], 1, device), "is_logits": spec.is_logits}
    if spec.is_logits:
        kwargs["temperature"] = _rep(rep["temperature"], 1, device)
    args = (big.to(device), _rep(rep["top_k"], 1, device), _rep(rep["top_p"], 1, device))
    check = with_invalid_rows(sampler_check(target, replicas, cfg["calls"]), invalid)
    return Case("sampling.top_k_top_p", spec.id, args, kwargs, spec.dtype, check=check)


#: batches with invalid rows, one per path the kernels take (top-k search or not, min-p, logits or not)
INVALID_SPECS = (
    _Spec("probs-fp32-per-row-invalid-rows", torch.float32, False, top_k=8, top_p=0.8, min_p=0.05, per_row=True),
    _Spec("probs-fp16-topp-invalid-rows", torch.float16, False, top_p=0.9),
    _Spec("probs-fp32-minp-per-row-invalid-rows", torch.float32, False, min_p=0.1, per_row=True),
    _Spec("logits-bf16-per-row-invalid-rows", torch.bfloat16, True, top_k=6, top_p=0.8, min_p=0.05, temperature=1.0,
          per_row=True),
    _Spec("logits-fp32-temperature-rows-invalid-rows", torch.float32, True, top_p=0.9, temperature=0.8, per_row=True),
)


def _greedy_case(device: torch.device, size: str, g: torch.Generator) -> Case:
    vocab = SIZES[size]["vocab"]
    x = torch.randn(16, vocab, generator=g).to(device)
    return Case("sampling.top_k_top_p", "logits-fp32-topk1-greedy", (x, 1, None), {"is_logits": True}, torch.float32)


def _renorm_cases(device: torch.device, size: str, g: torch.Generator) -> list[Case]:
    vocab = SIZES[size]["vocab"] if size == "small" else 32000
    rows = 8
    out = []
    for spec in (_Spec("fp32-topk-topp", torch.float32, False, top_k=7, top_p=0.85),
                 _Spec("bf16-minp-per-row", torch.bfloat16, False, top_k=9, top_p=0.9, min_p=0.05, per_row=True),
                 _Spec("fp16-topp", torch.float16, False, top_p=0.6)):
        params = _row_params(spec, rows, vocab, g)
        x = _distinct_rows(spec, rows, vocab, g, params)
        args = tuple(_rep(v, 1, device) for v in (x, params["top_k"], params["top_p"], params["min_p"]))
        out.append(Case("sampling.renorm", spec.id, args, {}, torch.float32))
    for spec in (_Spec("fp32-per-row-invalid-rows", torch.float32, False, top_k=9, top_p=0.9, min_p=0.05, per_row=True),
                 _Spec("bf16-topp-invalid-rows", torch.bfloat16, False, top_p=0.7),
                 _Spec("fp32-plain-invalid-rows", torch.float32, False)):
        params = _row_params(spec, rows, vocab, g)
        x, params, _ = _with_bad_rows(_distinct_rows(spec, rows, vocab, g, params), params, False, g)
        args = tuple(_rep(v, 1, device) for v in (x, params["top_k"], params["top_p"], params["min_p"]))
        out.append(Case("sampling.renorm", spec.id, args, {}, torch.float32))  # invalid rows: NaN, as the reference
    return out


# -- chain speculative ---------------------------------------------------------------------------
def speculative_law(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Exact law of one chain speculative step given the draft tokens, float64 on the CPU.

    Returns (joint (B, n+1, V): P(emitted = j, token at j = t), accept (B, n): min(1, pt(d)/pd(d)),
    expected accepted (B,)).
    """
    pd, pt = draft_probs.detach().cpu().double(), target_probs.detach().cpu().double()
    ids = draft_token_ids.detach().cpu().long().unsqueeze(-1)
    b, n, _ = pd.shape
    pd_d, pt_d = pd.gather(-1, ids).squeeze(-1), pt[:, :n].gather(-1, ids).squeeze(-1)
    accept = torch.where(pd_d > 0, (pt_d / pd_d.clamp_min(1e-300)).clamp(max=1.0), (pt_d > 0).double())
    reach = torch.cat([torch.ones(b, 1, dtype=torch.float64), torch.cumprod(accept, -1)], dim=-1)  # P(e >= j)
    stop = reach * torch.cat([1 - accept, torch.ones(b, 1, dtype=torch.float64)], dim=-1)  # P(e == j)
    residual = (pt - torch.cat([pd, torch.zeros_like(pd[:, :1])], dim=1)).clamp_min(0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-300), pt / pt.sum(-1, keepdim=True))
    return stop.unsqueeze(-1) * residual, accept, accept.sum(-1)


def speculative_check(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
                      groups: int, calls: int, generator: torch.Generator | None = None,
                      seed: int = SEED) -> Callable[[Callable[..., Any]], None]:
    """Case.check for chain_speculative on rows made of ``groups`` equal-probability groups."""
    b, n, vocab = draft_probs.shape
    ids = draft_token_ids.detach().cpu().long()
    joint, accept, mean_accepted = speculative_law(draft_probs, draft_token_ids, target_probs)
    expected = joint.reshape(groups, -1, (n + 1) * vocab).sum(1) * calls
    del joint

    def check(run: Callable[..., Any]) -> None:
        _reseed(generator, seed)
        counts = torch.zeros(groups, (n + 1) * vocab, dtype=torch.float64)
        accepted_sum = 0.0
        for _ in range(calls):
            tokens, accepted, emitted = run()
            assert tokens.dtype == torch.int64 and tuple(tokens.shape) == (b, n + 1), f"tokens {tokens.dtype} {tokens.shape}"
            assert accepted.dtype == torch.int32 and emitted.dtype == torch.int32, f"{accepted.dtype}, {emitted.dtype}"
            tokens, accepted, emitted = tokens.cpu(), accepted.cpu().long(), emitted.cpu().long()
            assert bool(((emitted >= 0) & (emitted <= n) & (accepted >= emitted) & (accepted <= n)).all()), \
                "need 0 <= emitted <= accepted <= n"
            pos = torch.arange(n + 1)
            e = emitted.unsqueeze(-1)
            padded = torch.cat([ids, torch.full((b, 1), -1)], dim=1)
            assert torch.equal(torch.where(pos < e, tokens, 0), torch.where(pos < e, padded, 0)), \
                "accepted positions must hold the draft tokens"
            assert bool((torch.where(pos > e, tokens, -1) == -1).all()), "positions after the last token must be -1"
            last = tokens.gather(1, e).squeeze(-1)
            assert bool(((last >= 0) & (last < vocab)).all()), "the last emitted token is out of range"
            cell = (emitted * vocab + last).view(groups, -1)
            counts.scatter_add_(1, cell, torch.ones(cell.shape, dtype=torch.float64))
            accepted_sum += float(accepted.sum())
        bad = (counts > 0) & (expected == 0)
        assert not bad.any(), f"emitted an impossible (position, token): {bad.nonzero()[:5].tolist()}"
        pval = chi_square_pvalue(counts, expected)
        assert pval > SIGNIFICANCE, f"(emitted, last token) counts do not fit the speculative law: p = {pval:.3g}"
        var = float((accept * (1 - accept)).sum()) * calls
        mean = float(mean_accepted.sum()) * calls
        if var == 0:
            assert accepted_sum == mean, f"accepted total {accepted_sum} != {mean} (deterministic acceptance)"
        else:
            z = (accepted_sum - mean) / var ** 0.5
            assert abs(z) < 3.29, f"accepted total {accepted_sum} vs expected {mean:.1f}: z = {z:.2f}"

    return check


def _spec_case(name: str, device: torch.device, size: str, g: torch.Generator, dtype: torch.dtype,
               mode: str = "random", use_generator: bool = False) -> Case:
    cfg = SIZES[size]
    groups, replicas, vocab, n = cfg["rows"], cfg["replicas"], cfg["spec_vocab"], cfg["draft"]
    if size == "large":
        replicas = 256
    draft = torch.softmax(torch.randn(groups, n, vocab, generator=g) * 1.5, -1)
    target = torch.softmax(torch.randn(groups, n + 1, vocab, generator=g) * 1.5, -1)
    if mode == "equal":
        target[:, :n] = draft
    draft, target = draft.to(dtype), target.to(dtype)
    draft_rep = draft.repeat_interleave(replicas, 0)
    ids = torch.multinomial(draft_rep.float().reshape(-1, vocab), 1, generator=g).view(-1, n)
    target_rep = target.repeat_interleave(replicas, 0)
    if mode == "reject_all":  # the target gives no mass to the draft tokens: nothing is accepted
        target_rep = target_rep.clone()
        target_rep[:, :n].scatter_(-1, ids.unsqueeze(-1), 0.0)
    gen = torch.Generator(device=device) if use_generator else None
    args = (draft_rep.to(device), ids.to(device), target_rep.to(device))
    kwargs: dict[str, Any] = {"generator": gen} if gen is not None else {}
    check = speculative_check(*args, groups=groups, calls=cfg["calls"], generator=gen)
    return Case("sampling.chain_speculative", name, args, kwargs, dtype, check=check)


def _spec_invalid_case(device: torch.device, size: str, g: torch.Generator) -> Case:
    """:func:`_spec_case` ("random") with invalid rows scattered through the batch: one per kind of bad draft or
    target distribution (at the first, a middle and the bonus position) and per out-of-range draft id."""
    valid = _spec_case("fp32-invalid-rows", torch.device("cpu"), size, g, torch.float32)
    draft, ids, target = valid.args
    n = ids.shape[1]
    pick = int(torch.randint(0, draft.shape[0], (1,), generator=g))
    bad_d, bad_t, bad_i = [], [], []
    data = ((True, 0, _DATA_PROBS[0][1]), (True, n - 1, _DATA_PROBS[3][1]), (False, n, _DATA_PROBS[1][1]),
            (False, 0, _DATA_PROBS[4][1]), (False, n // 2, _DATA_PROBS[2][1]))  # (in the draft, position, damage)
    for in_draft, pos, make in data:
        d, t = draft[pick].clone(), target[pick].clone()
        if in_draft:
            d[pos] = make(d[pos])
        else:
            t[pos] = make(t[pos])
        bad_d.append(d)
        bad_t.append(t)
        bad_i.append(ids[pick])
    for pos, token in ((0, -1), (n - 1, draft.shape[-1])):
        bad_d.append(draft[pick])
        bad_t.append(target[pick])
        bad_i.append(_set(ids[pick], pos, token))
    b = draft.shape[0]
    perm = _interleave(b, len(bad_d), g)
    args = (torch.cat([draft, torch.stack(bad_d)])[perm].to(device), torch.cat([ids, torch.stack(bad_i)])[perm].to(device),
            torch.cat([target, torch.stack(bad_t)])[perm].to(device))
    assert valid.check is not None
    return Case("sampling.chain_speculative", valid.id, args, {}, torch.float32,
                check=with_invalid_rows(valid.check, perm >= b))


def _spec_cases(device: torch.device, size: str, g: torch.Generator) -> list[Case]:
    return [
        _spec_case("fp32-random", device, size, g, torch.float32),
        _spec_case("fp32-draft-equals-target", device, size, g, torch.float32, mode="equal"),
        _spec_case("fp32-target-rejects-drafts", device, size, g, torch.float32, mode="reject_all"),
        _spec_case("bf16-generator", device, size, g, torch.bfloat16, use_generator=True),
        _spec_invalid_case(device, size, g),
    ]


def cases(op: str, device: torch.device, size: str) -> list[Case]:
    g = torch.Generator().manual_seed(0)
    if op == "sampling.top_k_top_p":
        return ([_sampler_case(s, device, size, g) for s in SAMPLER_SPECS] + [_greedy_case(device, size, g)]
                + [_invalid_sampler_case(s, device, size, g) for s in INVALID_SPECS])
    if op == "sampling.renorm":
        return _renorm_cases(device, size, g)
    if op == "sampling.chain_speculative":
        return _spec_cases(device, size, g)
    return []


#: the parameters :func:`example` reads, with their types (``switchboard explain`` / ``bench`` / ``tune`` check them)
EXAMPLE_PARAMS: dict[str, type] = {
    "batch": int, "vocab": int, "dtype": str, "top_k": int, "top_p": float, "min_p": float, "logits": bool,
    "check_nan": bool, "draft": int, "seed": int,
}


def example(op: str, device: torch.device, **shape: Any) -> Case:
    """One case from CLI-style parameters (strings accepted), for benchmarks and demos.

    top_k_top_p / renorm: batch (128), vocab (128256), dtype ("float32"), top_k (50), top_p (0.9),
    min_p (0), logits (1 = logits input), check_nan (0: the default, invalid rows answered on the device; 1: the host
    check). chain_speculative: batch (64), draft (4), vocab (32000), dtype.
    The case compares with the reference (renorm) or checks output shapes and ranges (samplers).
    """
    g = torch.Generator().manual_seed(int(shape.get("seed", 0)))
    dtype = _dtype(str(shape.get("dtype", "float32")))
    batch = int(shape.get("batch", 128 if op != "sampling.chain_speculative" else 64))
    if op == "sampling.chain_speculative":
        n, vocab = int(shape.get("draft", 4)), int(shape.get("vocab", 32000))
        draft = torch.softmax(torch.randn(batch, n, vocab, generator=g), -1)
        target = torch.softmax(torch.randn(batch, n + 1, vocab, generator=g), -1)
        ids = torch.multinomial(draft.view(-1, vocab), 1, generator=g).view(batch, n)
        args = (draft.to(device, dtype), ids.to(device), target.to(device, dtype))
        tag = f"{batch}x{n}x{vocab}-{str(dtype)[6:]}"
        return Case(op, tag, args, {}, dtype, check=_shape_check(batch, vocab, n))
    vocab = int(shape.get("vocab", 128256))
    is_logits = bool(int(shape.get("logits", 1)))
    logits = torch.randn(batch, vocab, generator=g) * 3
    x = (logits if is_logits else torch.softmax(logits, -1)).to(device, dtype)
    top_k, top_p, min_p = int(shape.get("top_k", 50)), float(shape.get("top_p", 0.9)), float(shape.get("min_p", 0))
    tag = f"{batch}x{vocab}-{str(dtype)[6:]}-k{top_k}-p{top_p}-minp{min_p}"
    if op == "sampling.renorm":
        return Case(op, tag, (torch.softmax(logits, -1).to(device, dtype), top_k, top_p, min_p), {}, torch.float32)
    kwargs = {"min_p": min_p, "is_logits": is_logits, "check_nan": bool(int(shape.get("check_nan", 0)))}
    return Case(op, tag, (x, top_k, top_p), kwargs, dtype, check=_shape_check(batch, vocab))


def _shape_check(batch: int, vocab: int, n: int | None = None) -> Callable[[Callable[..., Any]], None]:
    """A Case.check that only checks output shapes, dtypes and token ranges (benchmark examples)."""

    def check(run: Callable[..., Any]) -> None:
        result = run()
        if n is None:
            _check_tokens(result, batch, vocab)
            return
        tokens, accepted, emitted = result
        assert tuple(tokens.shape) == (batch, n + 1) and accepted.shape == emitted.shape == (batch,)
        assert bool(((tokens >= -1) & (tokens < vocab)).all())

    return check


def _dtype(name: str) -> torch.dtype:
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    dt = getattr(torch, aliases.get(name, name), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"dtype={name!r}: expected one of float32, float16, bfloat16 (or fp32, fp16, bf16)")
    return dt
