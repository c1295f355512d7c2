"""Rotary position embedding ops: ``rope.apply`` and ``rope.apply_cos_sin_cache``.

Kernel ``run`` signatures (q (T, Hq, D), k (T, Hk, D), unit stride in the last dim, other strides free;
positions (T,) int32 or int64 on q's device):

- ``rope.apply``: ``run(q, k, positions, inv_freq, interleaved, inplace) -> (q_out, k_out)``;
  inv_freq (rotary_dim/2,) float32 on the device, Llama-3.1 scaling already folded in.
- ``rope.apply_cos_sin_cache``: ``run(q, k, positions, cos_sin_cache, interleaved, inplace) -> (q_out, k_out)``;
  cos_sin_cache (max_position, rotary_dim) float32, each row ``[cos(rotary_dim/2) | sin(rotary_dim/2)]`` (vLLM's form).

Scalings: ``rope.apply`` takes :class:`Llama3Scaling`; the table builder :func:`cos_sin_cache` also takes
:class:`LinearScaling` and :class:`YarnScaling`, whose attention factor multiplies the table's cos and sin (so q and
k come out scaled by it, as transformers' rotary embeddings do).

The angle of pair i at position p is ``p * inv_freq[i]`` in float32. ``interleaved=False`` is NeoX's layout
(pair i = (x[i], x[i + rotary_dim/2])), ``interleaved=True`` GPT-J's (pair i = (x[2i], x[2i+1])). Each pair turns
as ``(x1 cos - x2 sin, x2 cos + x1 sin)``, computed in float32 and stored in q's dtype. Dims ``rotary_dim:D`` pass
through unchanged. ``inplace=False``: outputs are new contiguous tensors; ``inplace=True``: q and k are written
and returned.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..capability import bucket
from ..dispatch import select
from ..errors import fail
from ..spec import Arg, OpSpec, define
from ._common import FLOAT_DTYPES, BackendArg, check_same_device, check_tensor, device_key, graph_features

POSITION_DTYPES = frozenset({torch.int32, torch.int64})


@dataclass(frozen=True)
class Llama3Scaling:
    """Llama-3.1 rope scaling (HF ``rope_type="llama3"``): long wavelengths are slowed by ``factor``,
    short ones kept, the band between them interpolated smoothly."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise fail("scaling.factor", self.factor, "a positive float")
        if not self.low_freq_factor > 0:
            raise fail("scaling.low_freq_factor", self.low_freq_factor, "a positive float")
        if not self.high_freq_factor > self.low_freq_factor:
            raise fail("scaling.high_freq_factor", self.high_freq_factor,
                       f"a float above low_freq_factor ({self.low_freq_factor})")
        if not self.original_max_position > 0:
            raise fail("scaling.original_max_position", self.original_max_position, "a positive int")


@dataclass(frozen=True)
class LinearScaling:
    """Position interpolation (HF ``rope_type="linear"``): every inverse frequency divided by ``factor``."""

    factor: float

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise fail("scaling.factor", self.factor, "a positive float")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN (HF ``rope_type="yarn"``; DeepSeek-V3, Qwen2.5 long context).

    Frequencies whose wavelength fits ``original_max_position`` more than ``beta_fast`` times keep their value
    (extrapolation), those fitting fewer than ``beta_slow`` times are divided by ``factor`` (interpolation), with a
    linear ramp over the dims between (bounds floored / ceiled when ``truncate``). The table's cos and sin are
    multiplied by :attr:`cos_sin_factor`: ``attention_factor`` when given, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set, else ``mscale(factor)``, with
    ``mscale(s, m) = 0.1 m ln(s) + 1`` (1 for s <= 1).
    """

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        if not self.factor > 0:
            raise fail("scaling.factor", self.factor, "a positive float")
        if not (isinstance(self.original_max_position, int) and self.original_max_position > 0):
            raise fail("scaling.original_max_position", self.original_max_position, "a positive int")
        if not self.beta_fast > 0:
            raise fail("scaling.beta_fast", self.beta_fast, "a positive float")
        if not self.beta_slow > 0:
            raise fail("scaling.beta_slow", self.beta_slow, "a positive float")
        if self.attention_factor is not None and not self.attention_factor > 0:
            raise fail("scaling.attention_factor", self.attention_factor, "None or a positive float")

    @staticmethod
    def mscale_of(scale: float, mscale: float = 1.0) -> float:
        """YaRN's magnitude correction ``0.1 mscale ln(scale) + 1`` (1 when scale <= 1)."""
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    @property
    def cos_sin_factor(self) -> float:
        """What the table's cos and sin are multiplied by."""
        if self.attention_factor is not None:
            return float(self.attention_factor)
        if self.mscale and self.mscale_all_dim:
            return self.mscale_of(self.factor, self.mscale) / self.mscale_of(self.factor, self.mscale_all_dim)
        return self.mscale_of(self.factor)


#: every scaling the table builder takes
Scaling = Llama3Scaling | LinearScaling | YarnScaling


class RopeProblem(NamedTuple):
    """Signature of a rope call (both ops)."""

    device: str
    cc: tuple[int, int] | None
    dtype: torch.dtype
    head_dim: int
    rotary_dim: int
    layout: str  # "neox" | "interleaved"
    q_heads: int
    kv_heads: int
    tokens: int  # bucketed
    positions_dtype: torch.dtype
    features: frozenset[str]


# -- inv_freq and cos/sin tables ---------------------------------------------------------------------
def _inv_freq_host(theta: float, rotary_dim: int, scaling: Scaling | None) -> torch.Tensor:
    """(rotary_dim/2,) float32 on the CPU, computed as HF transformers does (float32 throughout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim))
    if scaling is None:
        return inv_freq
    if isinstance(scaling, LinearScaling):
        return inv_freq / scaling.factor
    if isinstance(scaling, YarnScaling):
        return _yarn_inv_freq(inv_freq, theta, rotary_dim, scaling)
    low_wavelen = scaling.original_max_position / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_inv_freq(inv_freq: torch.Tensor, theta: float, rotary_dim: int, scaling: YarnScaling) -> torch.Tensor:
    """YaRN's blend of the plain (extrapolated) and ``factor``-divided (interpolated) frequencies."""

    def dim_of(rotations: float) -> float:  # the dim whose wavelength fits original_max_position `rotations` times
        return rotary_dim * math.log(scaling.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(scaling.beta_fast), dim_of(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a one-step ramp instead of a division by zero
    ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolated = 1 - ramp
    return (inv_freq / scaling.factor) * (1 - extrapolated) + inv_freq * extrapolated


_BUILT: set[tuple[object, ...]] = set()


@functools.cache
def inv_freq(theta: float, rotary_dim: int, scaling: Llama3Scaling | None, device: torch.device) -> torch.Tensor:
    """(rotary_dim/2,) float32 inverse frequencies on ``device``, cached per argument set.

    The first call for a key copies the table to the device: make it before capturing a CUDA graph
    (a warm-up call of :func:`apply` does).
    """
    table = _inv_freq_host(float(theta), int(rotary_dim), scaling).to(device)
    _BUILT.add((theta, rotary_dim, scaling, device))
    return table


def _cached_inv_freq(theta: float, rotary_dim: int, scaling: Llama3Scaling | None, device: torch.device,
                     capturing: bool) -> torch.Tensor:
    if capturing and (theta, rotary_dim, scaling, device) not in _BUILT:
        raise fail("theta/rotary_dim/scaling", (theta, rotary_dim, scaling),
                   "parameters used once before CUDA-graph capture (the first call builds the inv_freq table "
                   "with a host-to-device copy, which capture forbids): run one warm-up call first")
    return inv_freq(theta, rotary_dim, scaling, device)


def cos_sin_cache(max_position: int, rotary_dim: int, theta: float = 1e4, scaling: Scaling | None = None,
                  device: torch.device | str = "cpu") -> torch.Tensor:
    """vLLM's table for :func:`apply_cos_sin_cache`: (max_position, rotary_dim) float32 on ``device``,
    row p = ``[cos(p * inv_freq) | sin(p * inv_freq)]`` with the angles taken in float32.

    ``scaling``: :class:`Llama3Scaling`, :class:`LinearScaling` or :class:`YarnScaling` (whose
    :attr:`~YarnScaling.cos_sin_factor` multiplies every entry), or None."""
    if not (isinstance(max_position, int) and max_position > 0):
        raise fail("max_position", max_position, "a positive int")
    if not (isinstance(rotary_dim, int) and rotary_dim > 0 and rotary_dim % 2 == 0):
        raise fail("rotary_dim", rotary_dim, "a positive even int")
    if not (isinstance(theta, (int, float)) and theta > 0):
        raise fail("theta", theta, "a positive float")
    if scaling is not None and not isinstance(scaling, (Llama3Scaling, LinearScaling, YarnScaling)):
        raise fail("scaling", type(scaling).__name__, "None, Llama3Scaling, LinearScaling or YarnScaling "
                   "(kernel_switchboard.ops.rope)")
    freqs = torch.arange(max_position, dtype=torch.float32)[:, None] * _inv_freq_host(float(theta), rotary_dim, scaling)
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    if isinstance(scaling, YarnScaling):
        table = table * scaling.cos_sin_factor
    return table.to(device)


# -- validation ----------------------------------------------------------------------------------------
def _check_theta_scaling(theta: float, scaling: Llama3Scaling | None) -> None:
    if not (isinstance(theta, (int, float)) and theta > 0):
        raise fail("theta", theta, "a positive float")
    if scaling is not None and not isinstance(scaling, Llama3Scaling):
        raise fail("scaling", type(scaling).__name__, "None or a kernel_switchboard.ops.rope.Llama3Scaling")


def _check_qk(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> None:
    check_tensor(q, "q", dims=3, dtypes=FLOAT_DTYPES)
    check_tensor(k, "k", dims=3)
    if k.dtype != q.dtype:
        raise fail("k.dtype", k.dtype, f"q's dtype ({q.dtype})")
    tokens, _, head_dim = q.shape
    if k.shape[0] != tokens or k.shape[2] != head_dim:
        raise fail("k.shape", tuple(k.shape), f"({tokens}, kv_heads, {head_dim}): q's tokens and head_dim")
    check_same_device("k", k, "q", q)
    if q.stride(-1) != 1:
        raise fail("q.stride", q.stride(), "unit stride in the last (head_dim) dim")
    if k.stride(-1) != 1:
        raise fail("k.stride", k.stride(), "unit stride in the last (head_dim) dim")
    check_tensor(positions, "positions", dims=1, dtypes=POSITION_DTYPES)
    if positions.shape[0] != tokens:
        raise fail("positions.shape", tuple(positions.shape), f"({tokens},): one position per token of q")
    check_same_device("positions", positions, "q", q)


def _check_rotary_dim(rotary_dim: int, head_dim: int, name: str = "rotary_dim") -> None:
    if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, int) or not (
            0 < rotary_dim <= head_dim and rotary_dim % 2 == 0):
        raise fail(name, rotary_dim, f"an even int in [2, head_dim={head_dim}]")


def _problem(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, rotary_dim: int, interleaved: bool,
             inplace: bool) -> RopeProblem:
    dev, cc = device_key(q)
    features = graph_features(dev)
    if inplace:
        features = features | {"in_place"}
    return RopeProblem(dev, cc, q.dtype, q.shape[2], rotary_dim, "interleaved" if interleaved else "neox",
                       q.shape[1], k.shape[1], bucket(q.shape[0]), positions.dtype, features)


def _scaling_to_list(scaling: Llama3Scaling | None) -> list[float] | None:
    if scaling is None:
        return None
    return [scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor, float(scaling.original_max_position)]


def _scaling_from_list(values: list[float] | None) -> Llama3Scaling | None:
    if values is None:
        return None
    return Llama3Scaling(values[0], values[1], values[2], int(values[3]))


# -- apply ---------------------------------------------------------------------------------------------
def apply(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, *, theta: float = 1e4,
          rotary_dim: int | None = None, interleaved: bool = False, scaling: Llama3Scaling | None = None,
          inplace: bool = False, backend: BackendArg = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q (T, Hq, D) and k (T, Hk, D) by their token's position (T,) int32/int64.

    ``rotary_dim`` (default D) even, <= D: only the first ``rotary_dim`` dims rotate. ``interleaved``: GPT-J
    pairs (2i, 2i+1), else NeoX halves. ``scaling``: :class:`Llama3Scaling` or None. ``inplace``: write q and
    k and return them; else return new contiguous tensors. fp16/bf16/fp32, computed in float32.
    The inv_freq table is cached per (theta, rotary_dim, scaling, device); its first build is a host-to-device
    copy, so call once before CUDA-graph capture.
    """
    if torch.compiler.is_compiling():
        _check_theta_scaling(theta, scaling)
        args = (q, k, positions, float(theta), rotary_dim, bool(interleaved), scaling, backend)
        if inplace:
            APPLY_INPLACE.compiled(*args)
            return q, k
        return APPLY.compiled(*args)  # type: ignore[no-any-return]
    return _apply_eager(q, k, positions, theta, rotary_dim, bool(interleaved), scaling, bool(inplace), backend)


def apply_call(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float = 1e4,
               rotary_dim: int | None = None, interleaved: bool = False, scaling: Llama3Scaling | None = None,
               inplace: bool = False) -> tuple[RopeProblem, int]:
    """Validate an :func:`apply` call: its problem and rotary dim."""
    _check_theta_scaling(theta, scaling)
    _check_qk(q, k, positions)
    rot = q.shape[2] if rotary_dim is None else rotary_dim
    _check_rotary_dim(rot, q.shape[2])
    return _problem(q, k, positions, rot, bool(interleaved), bool(inplace)), rot


def _apply_eager(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, theta: float, rotary_dim: int | None,
                 interleaved: bool, scaling: Llama3Scaling | None, inplace: bool,
                 backend: BackendArg) -> tuple[torch.Tensor, torch.Tensor]:
    problem, rot = apply_call(q, k, positions, theta, rotary_dim, interleaved, scaling, inplace)
    freq = _cached_inv_freq(float(theta), rot, scaling, q.device, "cuda_graph" in problem.features)
    kernel = select("rope.apply", problem, backend).kernel
    out = kernel.run(q, k, positions, freq, interleaved, inplace)
    return (q, k) if inplace else out


# -- apply_cos_sin_cache -----------------------------------------------------------------------------------
def apply_cos_sin_cache(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor, *,
                        interleaved: bool = False, inplace: bool = False, check_positions: bool = True,
                        backend: BackendArg = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rope from a precomputed table (vLLM's form; build one with :func:`cos_sin_cache`).

    cos_sin_cache: (max_position, rotary_dim) float32, rows ``[cos | sin]``; rotary_dim even, <= D.
    Positions must lie in [0, max_position): ``check_positions`` checks this with one device-to-host copy of their
    min and max (a sync on a GPU), skipped while a CUDA graph is being captured. Unchecked (``check_positions=False``,
    as engines whose scheduler bounds the positions call it, or in a capture), a token whose position lies outside
    the table comes out NaN in its rotated dims (its pass-through dims are kept); nothing outside the table is read.
    """
    if torch.compiler.is_compiling():
        args = (q, k, positions, cos_sin_cache, bool(interleaved), bool(check_positions), backend)
        if inplace:
            APPLY_COS_SIN_CACHE_INPLACE.compiled(*args)
            return q, k
        return APPLY_COS_SIN_CACHE.compiled(*args)  # type: ignore[no-any-return]
    return _cache_eager(q, k, positions, cos_sin_cache, bool(interleaved), bool(inplace), bool(check_positions),
                        backend)


def _check_positions_in_range(positions: torch.Tensor, limit: int) -> None:
    """positions in [0, limit); one device-to-host copy (a sync on a GPU)."""
    if positions.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(positions)).tolist()
    if lo < 0 or hi >= limit:
        raise fail("positions", f"values in [{lo}, {hi}]", f"values in [0, {limit}): rows of cos_sin_cache")


def apply_cos_sin_cache_call(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                             interleaved: bool = False, inplace: bool = False,
                             check_positions: bool = True) -> tuple[RopeProblem]:
    """Validate an :func:`apply_cos_sin_cache` call (``check_positions``: positions in range, one host read, none in
    a capture); its problem."""
    cache = cos_sin_cache
    _check_qk(q, k, positions)
    check_tensor(cache, "cos_sin_cache", dims=2, dtypes=frozenset({torch.float32}))
    check_same_device("cos_sin_cache", cache, "q", q)
    if cache.stride(-1) != 1:
        raise fail("cos_sin_cache.stride", cache.stride(), "unit stride in the last dim")
    rot = cache.shape[1]
    _check_rotary_dim(rot, q.shape[2], "cos_sin_cache.shape[1]")
    problem = _problem(q, k, positions, rot, bool(interleaved), bool(inplace))
    if check_positions and "cuda_graph" not in problem.features:
        _check_positions_in_range(positions, cache.shape[0])
    return problem,


def _cache_eager(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, interleaved: bool,
                 inplace: bool, check_positions: bool, backend: BackendArg) -> tuple[torch.Tensor, torch.Tensor]:
    problem, = apply_cos_sin_cache_call(q, k, positions, cache, interleaved, inplace, check_positions)
    kernel = select("rope.apply_cos_sin_cache", problem, backend).kernel
    out = kernel.run(q, k, positions, cache, interleaved, inplace)
    return (q, k) if inplace else out


# -- specs ---------------------------------------------------------------------------------------------------
def _fake_pair(q: torch.Tensor, k: torch.Tensor, *_: object) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _rope_specs(name: str, function: Any, prepare: Any, reference: str, op: str,
                args: tuple[Arg, ...]) -> tuple[OpSpec, OpSpec]:
    """The spec of ``rope.<name>`` (its custom op returns new q and k) and of its in-place custom op."""
    qk = (Arg("q"), Arg("k"))
    spec = define(OpSpec(f"rope.{name}", function, RopeProblem, prepare, reference=reference, cases="rope", op=op,
                         args=(*qk, *args), returns="(Tensor, Tensor)", fake=_fake_pair))
    inplace = define(OpSpec(f"rope.{name}", function, RopeProblem, prepare, reference=reference, cases="rope",
                            op=f"{op}_inplace", args=(Arg("q", mutated=True), Arg("k", mutated=True), *args),
                            returns="()", fake=lambda *_: None, outputs=lambda _: None, const={"inplace": True}),
                     second_op=True)
    return spec, inplace


APPLY, APPLY_INPLACE = _rope_specs(
    "apply", apply, apply_call, "rope", "rope_apply",
    (Arg("positions"), Arg("theta", "float"), Arg("rotary_dim", "int?"), Arg("interleaved", "bool"),
     Arg("scaling", "float[]?", encode=_scaling_to_list, decode=_scaling_from_list), Arg("backend", "backend")))
APPLY_COS_SIN_CACHE, APPLY_COS_SIN_CACHE_INPLACE = _rope_specs(
    "apply_cos_sin_cache", apply_cos_sin_cache, apply_cos_sin_cache_call, "rope_cos_sin_cache",
    "rope_apply_cos_sin_cache",
    (Arg("positions"), Arg("cos_sin_cache"), Arg("interleaved", "bool"), Arg("check_positions", "bool"),
     Arg("backend", "backend")))
