"""What the paged-KV attention wrappers (decode, paged prefill) share: the state ``plan`` settles, the switchboard
plans made from it (one per set of run-time parameters, kept while the step lasts), and the run path.

``plan`` does the host work once: it validates, builds the page table (:meth:`PageTable.from_csr`, or the
:class:`~kernel_switchboard.flashinfer._common.GraphTable` of a CUDA-graph wrapper) and makes the switchboard plan.
``run`` resolves the pages into a :class:`PagedKVCache`, looks the switchboard plan up and calls its ``run``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import fail
from ..paged import FP8_DTYPES, PageTable
from ._common import (
    GraphTable,
    check_backend,
    check_jit_args,
    check_layout,
    check_pos_encoding,
    check_workspace,
    scale_value,
    soft_cap_of,
    to_dtype,
    window_of,
)
from ._kv import KVForms

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Step:
    """What ``plan`` settled for the runs of one step."""

    table: PageTable | None  # None for ragged K/V
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    head_dim_v: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    out_shape: tuple[int, ...]
    max_kv_len: int | None = None  # the bound a CUDA-graph table serves; None: the table's lengths now
    qo_indptr: torch.Tensor | None = None  # prefill (and multi-token decode): queries per request
    kv_indptr: torch.Tensor | None = None  # ragged prefill: K/V rows per request

    @functools.cached_property
    def fp8(self) -> bool:
        return self.kv_dtype in FP8_DTYPES

    @functools.cached_property
    def signature(self) -> tuple[Any, ...]:
        return (self.num_qo_heads, self.num_kv_heads, self.head_dim, self.head_dim_v, self.page_size, self.q_dtype,
                self.kv_dtype, self.out_shape)


def plan_dtypes(q_data_type: Any, kv_data_type: Any, o_data_type: Any, data_type: Any = None
                ) -> tuple[torch.dtype, torch.dtype]:
    """(q dtype, kv dtype) from FlashInfer's plan arguments; the output is always in q's dtype."""
    if data_type is not None:
        q_data_type = data_type if q_data_type is None else q_data_type
        kv_data_type = data_type if kv_data_type is None else kv_data_type
    q_dtype = to_dtype("float16" if q_data_type is None else q_data_type, "q_data_type")
    if q_dtype not in _FLOATS:
        raise fail("q_data_type", q_dtype, "torch.float16, torch.bfloat16 or torch.float32 (fp8 queries are not served)")
    kv_dtype = q_dtype if kv_data_type is None else to_dtype(kv_data_type, "kv_data_type")
    if kv_dtype != q_dtype and kv_dtype not in FP8_DTYPES:
        raise fail("kv_data_type", kv_dtype, f"q_data_type ({q_dtype}) or an fp8 dtype")
    if o_data_type is not None and to_dtype(o_data_type, "o_data_type") != q_dtype:
        raise fail("o_data_type", o_data_type, f"None or q_data_type ({q_dtype}): outputs have q's dtype")
    return q_dtype, kv_dtype


def check_heads(num_qo_heads: Any, num_kv_heads: Any, head_dim: Any) -> None:
    for name, value in (("num_qo_heads", num_qo_heads), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim)):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise fail(name, value, "a positive int")
    if num_qo_heads % num_kv_heads:
        raise fail("num_qo_heads", num_qo_heads, f"a multiple of num_kv_heads ({num_kv_heads})")


def _factor(value: Any, name: str) -> float | None:
    """A run-time scale, None when it changes nothing (None or 1.0): the common case costs one comparison."""
    if value is None or (type(value) is float and value == 1.0):
        return None
    return scale_value(value, name)


class PagedWrapper:
    """Base of the paged-KV wrappers: FlashInfer's wrapper state and the run path over switchboard plans."""

    #: the switchboard plans kept by a wrapper that is not captured (a new table clears them)
    _MAX_PLANS = 32

    def __init__(self, float_workspace_buffer: Any, kv_layout: str, use_cuda_graph: bool, backend: str,
                 jit_args: Any) -> None:
        self._float_workspace_buffer = check_workspace(float_workspace_buffer)
        check_layout(kv_layout)
        check_backend(backend)
        check_jit_args(jit_args)
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = bool(use_cuda_graph)
        self._backend = backend
        self._kv = KVForms(kv_layout)
        self._step: Step | None = None
        self._graph: GraphTable | None = None
        self._plans: dict[tuple[Any, ...], Any] = {}
        #: the plans of the current step and parameters, by (scale factor, return_lse, LSE in base 2, scale tensors):
        #: the run path's lookup
        self._current: dict[tuple[float | None, bool, bool, bool], Any] = {}
        # FlashInfer's per-plan state, read by engines (vLLM checks _sm_scale, _window_left, _logits_soft_cap)
        self._pos_encoding_mode = "NONE"
        self._window_left = -1
        self._logits_soft_cap = 0.0
        self._sm_scale: float | None = None
        self._rope_scale: float | None = None
        self._rope_theta: float | None = None
        self._causal = False
        self._params: tuple[Any, ...] = (None, None, None, False)

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor) -> None:
        """Take a new float workspace (the int workspace is FlashInfer's own scheduling memory: not used here)."""
        self._float_workspace_buffer = check_workspace(float_workspace_buffer)

    def end_forward(self) -> None:
        """Deprecated by FlashInfer; does nothing."""

    # -- parameters ----------------------------------------------------------------------------------------------
    def _set_params(self, pos_encoding_mode: Any, window_left: Any, logits_soft_cap: Any, sm_scale: Any,
                    rope_scale: Any, rope_theta: Any, causal: bool) -> None:
        """Record the attention parameters (``plan``, or the deprecated ``forward``) as FlashInfer stores them."""
        check_pos_encoding(pos_encoding_mode)
        window = window_of(window_left)
        cap = soft_cap_of(logits_soft_cap)
        if sm_scale is not None and not (isinstance(sm_scale, (int, float)) and 0 < sm_scale < math.inf):
            raise fail("sm_scale", sm_scale, "a positive float or None (1/sqrt(head_dim))")
        self._pos_encoding_mode, self._window_left = pos_encoding_mode, window_left
        self._logits_soft_cap = 0.0 if logits_soft_cap is None else logits_soft_cap
        self._sm_scale, self._rope_scale, self._rope_theta, self._causal = sm_scale, rope_scale, rope_theta, causal
        params = (sm_scale, cap, window, bool(causal))
        if params != self._params:
            self._params = params
            self._current = {}

    def _start_step(self, step: Step) -> None:
        """Adopt a new step; switchboard plans of the previous one go, except in CUDA-graph mode, where captured graphs
        still run them (they read the same buffers, so they stay valid)."""
        self._step = step
        self._current = {}
        if not self._use_cuda_graph:
            self._plans.clear()
        self._plan_for(None, False)  # the plan the step's runs use: made now, outside any capture

    def _native(self, step: Step, sm_scale: float, cap: float | None, window: int | None, causal: bool,
                return_lse: bool, lse_base2: bool, kv_scale_tensor: bool) -> Any:
        """The switchboard plan of ``step`` with these parameters (decode or prefill); ``lse_base2``: the LSE in base
        2 (FlashInfer's); ``kv_scale_tensor``: for caches whose fp8 scales are tensors."""
        raise NotImplementedError

    def _plan_for(self, factor: float | None, return_lse: bool, base2: bool = False, scale_tensors: bool = False
                  ) -> Any:
        step = self._step
        assert step is not None
        key = (step.signature, self._params, factor, return_lse, base2, scale_tensors)
        plan = self._plans.get(key)
        if plan is None:
            sm_scale, cap, window, causal = self._params
            sm = (1.0 / math.sqrt(step.head_dim) if sm_scale is None else float(sm_scale)) * (factor or 1.0)
            plan = self._native(step, sm, cap, window, causal, return_lse, base2, scale_tensors)
            if len(self._plans) >= self._MAX_PLANS and not self._use_cuda_graph:
                self._plans.clear()
            self._plans[key] = plan
        self._current[(factor, return_lse, base2, scale_tensors)] = plan
        return plan

    # -- run -------------------------------------------------------------------------------------------------------
    def _attend(self, q: torch.Tensor, paged_kv_cache: Any, q_scale: Any, k_scale: Any, v_scale: Any,
                out: torch.Tensor | None, lse: torch.Tensor | None, return_lse: bool,
                base2: bool = True) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The attention of one run: FlashInfer's scale handling (k/q scales fold into the softmax scale; fp8 pages
        dequantise by their scales, which may be tensors; v_scale multiplies the output), LSE in base 2 (from a plan
        made with ``lse_base2``) unless ``base2`` is False. ``out`` / ``lse`` are checked by the switchboard plan
        (shape, dtype, device) and here for a unit last stride."""
        step = self._step
        if step is None:
            raise fail("plan", "not called", "plan() before run()")
        if q_scale is None and k_scale is None and v_scale is None:  # the common call: no scales
            factor = post = None
            tensors = False
            cache = self._kv.cache(paged_kv_cache)
        else:
            factor, post, cache, tensors = self._scaled(step, paged_kv_cache, q_scale, k_scale, v_scale)
        base2 = base2 and return_lse
        plan = self._current.get((factor, return_lse, base2, tensors))
        if plan is None:
            plan = self._plan_for(factor, return_lse, base2, tensors)
        if self._graph is not None:
            self._graph.refresh()
        if out is not None and not (isinstance(out, torch.Tensor) and out.stride(-1) == 1):
            _check_out(out, "out", step.out_shape, step.q_dtype, q)
        if return_lse:
            if lse is not None and not (isinstance(lse, torch.Tensor) and lse.stride(-1) == 1):
                _check_out(lse, "lse", step.out_shape[:2], torch.float32, q)
            o, s = plan.run(q, cache, out=out, lse=lse)
            if post is not None:
                o.mul_(post)
            return o, s
        o = plan.run(q, cache, out=out)
        if post is not None:
            o.mul_(post)
        return o

    def _scaled(self, step: Step, paged_kv_cache: Any, q_scale: Any, k_scale: Any, v_scale: Any
                ) -> tuple[float | None, float | None, Any, bool]:
        """(softmax scale factor, output factor, cache, whether its scales are tensors) of a run given scales."""
        factor, post = _factor(q_scale, "q_scale"), None
        if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):  # carried by the fp8 cache
            scales = [s if isinstance(s, torch.Tensor) else _factor(s, name)
                      for s, name in ((k_scale, "k_scale"), (v_scale, "v_scale"))]
            return factor, None, self._kv.with_scale_tensors(self._kv.cache(paged_kv_cache), *scales), True
        if step.fp8:
            ks, vs = _factor(k_scale, "k_scale"), _factor(v_scale, "v_scale")
            return factor, None, self._kv.cache(paged_kv_cache, ks or 1.0, vs or 1.0), False
        ks, post = _factor(k_scale, "k_scale"), _factor(v_scale, "v_scale")
        if ks is not None:
            factor = ks * (factor or 1.0)
        return factor, post, self._kv.cache(paged_kv_cache), False


def _check_out(t: Any, name: str, shape: tuple[int, ...], dtype: torch.dtype, q: torch.Tensor) -> None:
    """Raise naming ``t`` unless it is a tensor of this shape, dtype and q's device with a unit last stride."""
    if not (isinstance(t, torch.Tensor) and t.shape == shape and t.dtype == dtype and t.stride(-1) == 1
            and t.get_device() == q.get_device()):
        got = f"{tuple(t.shape)} {t.dtype} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise fail(name, got, f"{shape} {dtype} on {q.device} with unit last stride")


def check_run_extras(args: tuple[Any, ...], **unserved: Any) -> None:
    """Refuse run-time features FlashInfer has and this layer does not serve (custom-kernel args, sinks, NVFP4)."""
    if args:
        raise fail("*args", f"{len(args)} positional arguments", "none: FlashInfer JIT-variant arguments are not served")
    for name, value in unserved.items():
        if value is not None:
            raise fail(name, value if not isinstance(value, torch.Tensor) else f"a tensor of shape {tuple(value.shape)}",
                       "None: not served by kernel_switchboard.flashinfer")
