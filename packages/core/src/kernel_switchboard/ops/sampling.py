"""Sampling ops: ``sampling.top_k_top_p``, ``sampling.renorm``, ``sampling.chain_speculative``.

Kernel ``run`` signatures (arguments validated and canonical, see docs/ops.md):

- ``sampling.top_k_top_p``: ``run(x, top_k, top_p, min_p, is_logits, temperature, generator, deterministic, out,
  invalid_token)`` -> ``out``, the (B,) int32 or int64 tensor it writes the tokens into (``invalid_token`` for an
  invalid row). x (B, V); top_k: int >= 1 | (B,) int32 tensor | None; top_p, min_p, temperature: float | (B,)
  float32 tensor | None; tensors live on x's device.
- ``sampling.renorm``: ``run(probs, top_k, top_p, min_p) -> (B, V) float32``, the filtered distribution (a row of
  NaN for an invalid row).
- ``sampling.chain_speculative``: ``run(draft_probs, draft_token_ids, target_probs, generator, deterministic)``
  -> (tokens (B, n+1) int64 padded with -1, accepted (B,) int32, emitted (B,) int32); an invalid row
  (:func:`speculative_invalid_rows`) gets tokens all -1, accepted 0, emitted 0.

Filter semantics, applied in this order (ties at a threshold are kept together, so the filtered
distribution is well defined):

1. temperature (logits only): ``x / t``; then softmax in float32 (logits may hold ``-inf`` = masked);
2. top-k: keep token i iff fewer than k tokens are strictly more probable (k >= V keeps all);
3. top-p, on the renormalised top-k survivors: keep i iff the mass of the survivors strictly more
   probable than i is below ``top_p``;
4. min-p, on the renormalised survivors: keep i iff ``p_i >= min_p * max p``.

Zero-probability tokens are never sampled. Probabilities need not sum to exactly one (rows are
weights with a positive sum). Neutral values mean "filter off" and are canonicalised to ``None``:
top_k 0 (or >= V), top_p 1.0, min_p 0.0, temperature 1.0; a per-row ``top_k`` of 0 (or >= V) disables
top-k for that row, so kernels receive per-row k in [0, 2^31) (an int64 entry past that range saturates: it
keeps every token, as any k >= V does) and scalar k in [1, V). Temperature -> 0 is the argmax (ties share the
mass), however small a positive temperature is.

Invalid rows (:func:`invalid_rows`): a row whose data is not a distribution (probabilities NaN, infinite,
negative or all zero; logits NaN, +inf or all -inf) or whose per-row parameter is out of range is never sampled.
Every kernel checks each row on the device, inside the op, and answers an invalid row with the sentinel
:data:`INVALID` (-1) as its token (``renorm``: a row of NaN; ``chain_speculative``: tokens all -1, accepted and
emitted 0), so the default call does no host synchronisation and can be captured in a CUDA graph; the caller finds
the invalid rows later as ``tokens < 0``. ``check_nan=True`` adds a host check before the launch (one device-to-host
read) that raises :class:`~kernel_switchboard.errors.InvalidArgumentError` naming the first bad argument and row.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features

INT_DTYPES = frozenset({torch.int32, torch.int64})
_INT32_MAX = 2**31 - 1
PARAM_FLOAT_DTYPES = FLOAT_DTYPES | {torch.float64}
#: a scalar-or-per-row parameter
Param = float | int | torch.Tensor | None


class SamplingProblem(NamedTuple):
    """Signature of a top-k / top-p / min-p sampling or renorm call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    vocab: int
    batch: int  # bucketed
    is_logits: bool
    uses_temperature: bool
    uses_top_k: bool
    uses_top_p: bool
    uses_min_p: bool
    features: frozenset[str]


class SpeculativeProblem(NamedTuple):
    """Signature of a chain speculative sampling call."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    vocab: int
    num_draft: int
    batch: int  # bucketed
    features: frozenset[str]


# -- parameter canonicalisation ------------------------------------------------------------------
def _int_param(v: Any, name: str, x: torch.Tensor) -> int | torch.Tensor | None:
    """top_k: None / 0 / >= V -> None; int >= 1; (B,) int tensor -> int32 (entries >= 0, 0 = off for that row)."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        _check_row_tensor(v, name, x, INT_DTYPES)
        if v.dtype == torch.int32:
            return v
        # saturate, never wrap: any k >= V keeps every token, so 2**31 - 1 means what a larger k means, and a
        # negative entry stays negative (refused by the data check) instead of wrapping to a small positive k
        return v.clamp(-1, _INT32_MAX).to(torch.int32)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise fail(name, v, "an int >= 1 (0 or None = off) or a (B,) int32/int64 tensor")
    return v if 0 < v < x.shape[-1] else None  # k >= V keeps every token


def _float_param(v: Any, name: str, x: torch.Tensor, lo: float, hi: float, lo_open: bool,
                 neutral: float, allowed: str) -> float | torch.Tensor | None:
    """A float in its range (``neutral`` -> None) or a (B,) float tensor -> float32."""
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        _check_row_tensor(v, name, x, PARAM_FLOAT_DTYPES)
        return v if v.dtype == torch.float32 else v.to(torch.float32)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise fail(name, v, allowed)
    f = float(v)
    ok = (lo < f if lo_open else lo <= f) and f <= hi and math.isfinite(f)
    if not ok:
        raise fail(name, v, allowed)
    return None if f == neutral else f


def _check_row_tensor(t: torch.Tensor, name: str, x: torch.Tensor, dtypes: frozenset[torch.dtype]) -> None:
    check_tensor(t, name, dims=1, dtypes=dtypes)
    if t.shape[0] != x.shape[0]:
        raise fail(f"{name}.shape", tuple(t.shape), f"({x.shape[0]},): one value per row of x")
    check_same_device(name, t, "x", x)


_TOP_P = "a float in (0, 1] (1 or None = off) or a (B,) float tensor"
_MIN_P = "a float in [0, 1] (0 or None = off) or a (B,) float tensor"
_TEMP = "a float > 0 (1 or None = off) or a (B,) float tensor; logits only"


class _Params(NamedTuple):
    top_k: int | torch.Tensor | None
    top_p: float | torch.Tensor | None
    min_p: float | torch.Tensor | None
    temperature: float | torch.Tensor | None


def _params(x: torch.Tensor, top_k: Any, top_p: Any, min_p: Any, temperature: Any, is_logits: bool) -> _Params:
    if temperature is not None and not is_logits:
        raise fail("temperature", temperature, "None when x holds probabilities (is_logits=False)")
    return _Params(
        _int_param(top_k, "top_k", x),
        _float_param(top_p, "top_p", x, 0.0, 1.0, True, 1.0, _TOP_P),
        _float_param(min_p, "min_p", x, 0.0, 1.0, False, 0.0, _MIN_P),
        _float_param(temperature, "temperature", x, 0.0, math.inf, True, 1.0, _TEMP),
    )


def _check_x(x: Any, name: str, dims: int = 2) -> None:
    check_tensor(x, name, dims=dims, dtypes=FLOAT_DTYPES)
    if x.shape[-1] < 1:
        raise fail(f"{name}.shape", tuple(x.shape), "a non-empty vocabulary (last dim >= 1)")


def _check_generator(generator: Any, x: torch.Tensor) -> None:
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise fail("generator", type(generator).__name__, "a torch.Generator or None")
    if generator.device.type != x.device.type:
        raise fail("generator.device", generator.device, f"the device of x ({x.device})")


# -- invalid rows ----------------------------------------------------------------------------------
#: the token a sampler returns for a row it cannot sample (and ``chain_speculative`` writes across such a row)
INVALID = -1

#: (argument name, (B,) bool mask of the rows it makes invalid, what is allowed)
RowCheck = tuple[str, torch.Tensor, str]

_PROBS = "probabilities: finite, >= 0, a positive sum in every row"
_LOGITS = "logits without NaN or +inf and a finite value in every row (-inf = masked)"


def _bad_prob_rows(p: torch.Tensor) -> torch.Tensor:
    """Per row (over the last dim): some entry negative / NaN / inf, or no positive mass (float32 sum)."""
    return (~((p >= 0) & (p < math.inf))).any(-1) | ~(p.sum(-1, dtype=torch.float32) > 0)


def _bad_logit_rows(x: torch.Tensor) -> torch.Tensor:
    """Per row: NaN or +inf present, or no finite logit (``-inf`` alone = masked token, allowed)."""
    return ~torch.isfinite(x.amax(-1))


def _row_checks(x: torch.Tensor, is_logits: bool, top_k: Any, top_p: Any, min_p: Any, temperature: Any,
                name: str = "x") -> list[RowCheck]:
    """The per-row validity checks of a sampling / renorm call on its canonical arguments (as kernels get them)."""
    out = [(name, _bad_logit_rows(x), _LOGITS) if is_logits else (name, _bad_prob_rows(x), _PROBS)]
    if isinstance(top_k, torch.Tensor):
        out.append(("top_k", top_k < 0, "entries >= 0 (0 = off for that row)"))
    if isinstance(top_p, torch.Tensor):
        out.append(("top_p", ~((top_p > 0) & (top_p <= 1)), "entries in (0, 1]"))
    if isinstance(min_p, torch.Tensor):
        out.append(("min_p", ~((min_p >= 0) & (min_p <= 1)), "entries in [0, 1]"))
    if is_logits and isinstance(temperature, torch.Tensor):
        out.append(("temperature", ~((temperature > 0) & (temperature < math.inf)), "finite entries > 0"))
    return out


def invalid_rows(x: torch.Tensor, is_logits: bool = False, top_k: Any = None, top_p: Any = None, min_p: Any = None,
                 temperature: Any = None) -> torch.Tensor:
    """(B,) bool: the rows of x (B, V) that ``top_k_top_p`` answers with :data:`INVALID` and ``renorm`` with NaN.

    A row is invalid when its data is no distribution (probabilities: an entry NaN, infinite or negative, or no positive mass;
    logits: NaN or +inf, or no finite entry) or when a per-row parameter tensor holds an out-of-range entry for it
    (top_k < 0; top_p outside (0, 1]; min_p outside [0, 1]; temperature not finite and > 0). Parameters in the
    canonical forms kernels receive; computed on x's device without a host read (every kernel applies this
    definition on the device)."""
    bad = [b for _, b, _ in _row_checks(x, is_logits, top_k, top_p, min_p, temperature)]
    return functools.reduce(torch.logical_or, bad)


def _speculative_checks(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor
                        ) -> list[RowCheck]:
    v = draft_probs.shape[-1]
    ids = draft_token_ids
    return [("draft_probs", _bad_prob_rows(draft_probs).any(-1), _PROBS),
            ("target_probs", _bad_prob_rows(target_probs).any(-1), _PROBS),
            ("draft_token_ids", ((ids < 0) | (ids >= v)).any(-1), f"token ids in [0, {v})")]


def speculative_invalid_rows(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor
                             ) -> torch.Tensor:
    """(B,) bool: the rows that ``chain_speculative`` answers with tokens all :data:`INVALID`, accepted 0 and
    emitted 0: some draft or target distribution of the row is not valid probabilities (as :func:`invalid_rows`
    defines them) or a draft token id lies outside [0, V). No host read."""
    return functools.reduce(torch.logical_or, [b for _, b, _ in _speculative_checks(draft_probs, draft_token_ids,
                                                                                    target_probs)])


def _raise_first_bad(checks: list[RowCheck]) -> None:
    """``check_nan=True``: evaluate every check with one host read; raise naming the first bad argument and row."""
    if not checks:
        return
    flags = torch.stack([bad.any() for _, bad, _ in checks]).tolist()
    for (name, bad, allowed), flagged in zip(checks, flags):
        if flagged:
            rows = bad.nonzero().flatten()
            raise fail(name, f"bad data in row {int(rows[0])} ({len(rows)} of {bad.shape[0]} rows bad)", allowed)


def _problem(x: torch.Tensor, is_logits: bool, p: _Params, extra: frozenset[str]) -> SamplingProblem:
    dev, cc = device_key(x)
    per_row = any(isinstance(v, torch.Tensor) for v in p)
    features = graph_features(dev) | extra | (frozenset({"per_row_params"}) if per_row else frozenset())
    return SamplingProblem(dev, cc, x.dtype, x.shape[1], bucket(x.shape[0]), is_logits, p.temperature is not None,
                           p.top_k is not None, p.top_p is not None, p.min_p is not None, features)


def _run_features(generator: Any, deterministic: bool) -> frozenset[str]:
    feats = set()
    if generator is not None:
        feats.add("generator")
    if deterministic:
        feats.add("deterministic")
    return frozenset(feats)


# -- top_k_top_p ---------------------------------------------------------------------------------
def top_k_top_p(x: torch.Tensor, top_k: Param = None, top_p: Param = None, *, min_p: Param = None,
                is_logits: bool = False, temperature: Param = None, generator: torch.Generator | None = None,
                deterministic: bool = False, check_nan: bool = False, out: torch.Tensor | None = None,
                invalid_token: int = INVALID, backend: BackendArg = None) -> torch.Tensor:
    """Sample one token per row after temperature / top-k / top-p / min-p filtering.

    x: (B, V) probabilities (``is_logits=False``) or logits, fp32/fp16/bf16. top_k: int or (B,) int
    tensor; top_p, min_p: float or (B,) float tensor; temperature (logits only): float or (B,) tensor.
    Returns (B,) int64 token ids: for a valid row a token in [0, V) that survives the filters, for an invalid
    row (:func:`invalid_rows`: NaN / inf / negative / all-zero data, or an out-of-range per-row parameter)
    :data:`INVALID` (-1), decided on the device: the call does no host synchronisation.

    ``out``: a (B,) int32 or int64 tensor on x's device to write the tokens into (and return), e.g. an engine's
    fixed buffer or int32 ids; ``invalid_token``: the id an invalid row gets instead of -1 (a caller that wants a
    valid id there, as FlashInfer answers such rows with 0). Both are written by the sampling kernel itself: no
    extra launch.

    ``generator`` makes the draw reproducible (eager only: it cannot enter a torch.compile graph);
    ``deterministic`` asks for bitwise reproducible results with the same generator state.
    ``check_nan=True`` also checks the rows on the host before the launch (one device-to-host read) and raises
    :class:`~kernel_switchboard.errors.InvalidArgumentError` naming the first bad argument and row; it is skipped
    while a CUDA graph is captured.
    """
    if torch.compiler.is_compiling():
        if generator is not None:
            raise fail("generator", "a torch.Generator", "None under torch.compile (use eager mode for seeded draws)")
        tokens = TOP_K_TOP_P.compiled(x, top_k, top_p, min_p, temperature, bool(is_logits), bool(deterministic),
                                      bool(check_nan), backend)
        if out is None and invalid_token == INVALID:
            return tokens  # type: ignore[no-any-return]
        out = _token_out(out, invalid_token, x)  # the compiler fuses the sentinel and the copy into one kernel
        return out.copy_(torch.where(tokens < 0, invalid_token, tokens))
    return _sample_eager(x, top_k, top_p, min_p, is_logits, temperature, generator, deterministic, check_nan, out,
                         invalid_token, backend)


def _token_out(out: Any, invalid_token: Any, x: torch.Tensor) -> torch.Tensor:
    """The tensor a draw of the (validated) x writes its tokens into: ``out`` checked, or a new (B,) int64 one."""
    if isinstance(invalid_token, bool) or not isinstance(invalid_token, int) or not -2**31 <= invalid_token <= _INT32_MAX:
        raise fail("invalid_token", invalid_token, "a Python int in [-2**31, 2**31)")
    if out is None:
        return torch.empty(x.shape[0], dtype=torch.int64, device=x.device)
    check_tensor(out, "out", 1, INT_DTYPES)
    if out.shape[0] != x.shape[0]:
        raise fail("out.shape", tuple(out.shape), f"({x.shape[0]},): one token per row of x")
    check_same_device("out", out, "x", x)
    if not out.is_contiguous():
        raise fail("out.stride", out.stride(), "a contiguous tensor")
    return out


def top_k_top_p_call(x: torch.Tensor, top_k: Param = None, top_p: Param = None, min_p: Param = None,
                     is_logits: bool = False, temperature: Param = None, generator: torch.Generator | None = None,
                     deterministic: bool = False, check_nan: bool = False, out: torch.Tensor | None = None,
                     invalid_token: int = INVALID) -> tuple[SamplingProblem, _Params, torch.Tensor]:
    """Validate a :func:`top_k_top_p` call (``check_nan``: also the data, one host read): its problem, canonical
    parameters and the tensor the tokens go into."""
    _check_x(x, "x")
    p = _params(x, top_k, top_p, min_p, temperature, bool(is_logits))
    _check_generator(generator, x)
    tokens = _token_out(out, invalid_token, x)
    problem = _problem(x, bool(is_logits), p, _run_features(generator, deterministic))
    if check_nan and x.shape[0] and "cuda_graph" not in problem.features:
        _raise_first_bad(_row_checks(x, bool(is_logits), *p))
    return problem, p, tokens


def _sample_eager(x: torch.Tensor, top_k: Any, top_p: Any, min_p: Any, is_logits: bool, temperature: Any,
                  generator: torch.Generator | None, deterministic: bool, check_nan: bool, out: Any,
                  invalid_token: Any, backend: BackendArg) -> torch.Tensor:
    problem, p, out = top_k_top_p_call(x, top_k, top_p, min_p, is_logits, temperature, generator, deterministic,
                                       check_nan, out, invalid_token)
    kernel = select("sampling.top_k_top_p", problem, backend).kernel
    return kernel.run(x, p.top_k, p.top_p, p.min_p, bool(is_logits), p.temperature, generator, bool(deterministic),  # type: ignore[no-any-return]
                      out, invalid_token)


def top_k(x: torch.Tensor, k: int | torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Top-k sampling: :func:`top_k_top_p` with only ``top_k`` (same keyword arguments)."""
    return top_k_top_p(x, k, None, **kwargs)


def top_p(x: torch.Tensor, p: float | torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Top-p (nucleus) sampling: :func:`top_k_top_p` with only ``top_p`` (same keyword arguments)."""
    return top_k_top_p(x, None, p, **kwargs)


def min_p(x: torch.Tensor, p: float | torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Min-p sampling: :func:`top_k_top_p` with only ``min_p`` (same keyword arguments)."""
    return top_k_top_p(x, None, None, min_p=p, **kwargs)


def sample(x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """Plain categorical sampling from probabilities or logits (``is_logits=True``, optional ``temperature``)."""
    return top_k_top_p(x, None, None, **kwargs)


# -- renorm --------------------------------------------------------------------------------------
def renorm(probs: torch.Tensor, top_k: Param = None, top_p: Param = None, min_p: Param = None, *,
           check_nan: bool = False, backend: BackendArg = None) -> torch.Tensor:
    """The filtered, renormalised distribution: (B, V) probabilities -> (B, V) float32 (rows sum to 1).

    Same filters and parameter forms as :func:`top_k_top_p` (no temperature: probabilities only). An invalid row
    (:func:`invalid_rows`) comes back as a row of NaN, decided on the device (no host synchronisation);
    ``check_nan=True`` raises instead, as there (one host read).
    """
    if torch.compiler.is_compiling():
        return RENORM.compiled(probs, top_k, top_p, min_p, bool(check_nan), backend)  # type: ignore[no-any-return]
    return _renorm_eager(probs, top_k, top_p, min_p, check_nan, backend)


def renorm_call(probs: torch.Tensor, top_k: Param = None, top_p: Param = None, min_p: Param = None,
                check_nan: bool = False) -> tuple[SamplingProblem, _Params]:
    """Validate a :func:`renorm` call (``check_nan``: also the data, one host read): its problem and canonical
    parameters."""
    _check_x(probs, "probs")
    p = _params(probs, top_k, top_p, min_p, None, False)
    problem = _problem(probs, False, p, frozenset())
    if check_nan and probs.shape[0] and "cuda_graph" not in problem.features:
        _raise_first_bad(_row_checks(probs, False, *p, name="probs"))
    return problem, p


def _renorm_eager(probs: torch.Tensor, top_k: Any, top_p: Any, min_p: Any, check_nan: bool,
                  backend: BackendArg) -> torch.Tensor:
    problem, p = renorm_call(probs, top_k, top_p, min_p, check_nan)
    kernel = select("sampling.renorm", problem, backend).kernel
    return kernel.run(probs, p.top_k, p.top_p, p.min_p)


# -- chain_speculative ---------------------------------------------------------------------------
def chain_speculative(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor, *,
                      generator: torch.Generator | None = None, deterministic: bool = False, check_nan: bool = False,
                      backend: BackendArg = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chain speculative sampling (Leviathan et al. / Chen et al.; FlashInfer's and vLLM's rule).

    draft_probs (B, n, V), draft_token_ids (B, n) int64 (int32 accepted), target_probs (B, n+1, V), same
    float dtype. Draft token d_i is accepted with probability min(1, p_target(d_i) / p_draft(d_i)); at
    the first rejection a token is drawn from the normalised residual max(0, p_target - p_draft) (from
    p_target when that residual is all zero); when all n pass, a bonus token is drawn from target_probs[:, n].

    Returns ``(tokens, accepted, emitted)``: tokens (B, n+1) int64 = the accepted drafts then the drawn
    token, padded with -1; accepted (B,) int32 = positions whose test passes, each considered on its own
    (an acceptance-rate metric, FlashInfer's ``accepted_token_num``); emitted (B,) int32 = accepted
    drafts actually emitted (the tokens written minus one). A row with an invalid distribution (NaN, inf, negative
    or all zero, at any of its n + n+1 positions) or a draft id outside [0, V) (:func:`speculative_invalid_rows`)
    gets tokens all -1 (``tokens[:, 0] < 0`` finds it), accepted 0 and emitted 0, decided on the device (no host
    synchronisation); ``check_nan=True`` raises instead, naming the argument and row (one host read).
    """
    if torch.compiler.is_compiling():
        if generator is not None:
            raise fail("generator", "a torch.Generator", "None under torch.compile (use eager mode for seeded draws)")
        return CHAIN_SPECULATIVE.compiled(draft_probs, draft_token_ids, target_probs,  # type: ignore[no-any-return]
                                          bool(deterministic), bool(check_nan), backend)
    return _chain_eager(draft_probs, draft_token_ids, target_probs, generator, deterministic, check_nan, backend)


def chain_speculative_call(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
                           generator: torch.Generator | None = None, deterministic: bool = False,
                           check_nan: bool = False) -> tuple[SpeculativeProblem, torch.Tensor]:
    """Validate a :func:`chain_speculative` call (``check_nan``: also the data, one host read): its problem and the
    draft token ids as int64."""
    _check_x(draft_probs, "draft_probs", dims=3)
    b, n, v = draft_probs.shape
    if n < 1:
        raise fail("draft_probs.shape", tuple(draft_probs.shape), "(B, n, V) with n >= 1 draft tokens")
    check_tensor(target_probs, "target_probs", dims=3)
    if tuple(target_probs.shape) != (b, n + 1, v):
        raise fail("target_probs.shape", tuple(target_probs.shape),
                   f"(B, n+1, V) = {(b, n + 1, v)} from draft_probs.shape (B, n, V) = {(b, n, v)}")
    if target_probs.dtype != draft_probs.dtype:
        raise fail("target_probs.dtype", target_probs.dtype, f"draft_probs' dtype ({draft_probs.dtype})")
    check_tensor(draft_token_ids, "draft_token_ids", dims=2, dtypes=INT_DTYPES)
    if tuple(draft_token_ids.shape) != (b, n):
        raise fail("draft_token_ids.shape", tuple(draft_token_ids.shape), f"(B, n) = {(b, n)} from draft_probs.shape")
    check_same_device("target_probs", target_probs, "draft_probs", draft_probs)
    check_same_device("draft_token_ids", draft_token_ids, "draft_probs", draft_probs)
    _check_generator(generator, draft_probs)
    dev, cc = device_key(draft_probs)
    features = graph_features(dev) | _run_features(generator, deterministic)
    if check_nan and b and "cuda_graph" not in features:
        _raise_first_bad(_speculative_checks(draft_probs, draft_token_ids, target_probs))
    ids64 = draft_token_ids if draft_token_ids.dtype == torch.int64 else draft_token_ids.to(torch.int64)
    return SpeculativeProblem(dev, cc, draft_probs.dtype, v, n, bucket(b), features), ids64


def _chain_eager(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor,
                 generator: torch.Generator | None, deterministic: bool, check_nan: bool,
                 backend: BackendArg) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    problem, ids64 = chain_speculative_call(draft_probs, draft_token_ids, target_probs, generator, deterministic,
                                            check_nan)
    kernel = select("sampling.chain_speculative", problem, backend).kernel
    return kernel.run(draft_probs, ids64, target_probs, generator, bool(deterministic))  # type: ignore[no-any-return]


# -- specs ---------------------------------------------------------------------------------------
_FILTERS = (Arg("top_k", "int|rows", neutral=0), Arg("top_p", "float|rows", neutral=1.0),
            Arg("min_p", "float|rows", neutral=0.0))
_SEEDED = (torch.Tag.nondeterministic_seeded,)  # compilers never merge or replay two draws
TOP_K_TOP_P = define(OpSpec(
    "sampling.top_k_top_p", top_k_top_p, SamplingProblem, top_k_top_p_call, reference="top_k_top_p",
    cases="sampling", op="top_k_top_p",
    args=(Arg("x"), *_FILTERS, Arg("temperature", "float|rows", neutral=1.0), Arg("is_logits", "bool"),
          Arg("deterministic", "bool"), Arg("check_nan", "bool"), Arg("backend", "backend")),
    tags=_SEEDED, fake=lambda x, *rest: torch.empty(x.shape[0], dtype=torch.int64, device=x.device),
))


def _alias(name: str, function: Any, prepare: Any) -> OpSpec:
    """The spec of a convenience form of ``sampling.top_k_top_p`` (same kernels, explained with its arguments)."""
    return define(OpSpec(f"sampling.{name}", function, SamplingProblem, prepare, reference="top_k_top_p",
                         cases="sampling", kernels="sampling.top_k_top_p"))


TOP_K = _alias("top_k", top_k, lambda x, k, **kw: top_k_top_p_call(x, k, None, **kw))
TOP_P = _alias("top_p", top_p, lambda x, p, **kw: top_k_top_p_call(x, None, p, **kw))
MIN_P = _alias("min_p", min_p, lambda x, p, **kw: top_k_top_p_call(x, None, None, min_p=p, **kw))
SAMPLE = _alias("sample", sample, lambda x, **kw: top_k_top_p_call(x, None, None, **kw))
RENORM = define(OpSpec(
    "sampling.renorm", renorm, SamplingProblem, renorm_call, reference="renorm", cases="sampling", op="renorm",
    args=(Arg("probs"), *_FILTERS, Arg("check_nan", "bool"), Arg("backend", "backend")),
    fake=lambda probs, *rest: torch.empty(probs.shape, dtype=torch.float32, device=probs.device),
))


def _chain_fake(draft_probs: torch.Tensor, draft_token_ids: torch.Tensor, target_probs: torch.Tensor, *rest: Any
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b, n = draft_token_ids.shape
    dev = draft_probs.device
    return (torch.empty(b, n + 1, dtype=torch.int64, device=dev), torch.empty(b, dtype=torch.int32, device=dev),
            torch.empty(b, dtype=torch.int32, device=dev))


CHAIN_SPECULATIVE = define(OpSpec(
    "sampling.chain_speculative", chain_speculative, SpeculativeProblem, chain_speculative_call,
    reference="chain_speculative", cases="sampling", op="chain_speculative",
    args=(Arg("draft_probs"), Arg("draft_token_ids"), Arg("target_probs"), Arg("deterministic", "bool"),
          Arg("check_nan", "bool"), Arg("backend", "backend")),
    returns="(Tensor, Tensor, Tensor)", tags=_SEEDED, fake=_chain_fake,
))
