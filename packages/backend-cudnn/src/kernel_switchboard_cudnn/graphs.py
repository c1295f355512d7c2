"""cuDNN SDPA graphs: built from an :class:`~.convert.SdpaSpec`, cached, executed.

The cache key is the spec (shapes, strides, dtypes, masks, scale), the device and the cuDNN
backend and frontend versions; an LRU keeps the newest :data:`CACHE_SIZE` graphs. Executing a
built graph does no host synchronisation and allocates nothing in cuDNN (the caller passes the
workspace), so it can be captured in a CUDA graph. Handles are per device; each execute sets the
handle's stream to torch's current stream.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from kernel_switchboard.availability import import_vendor
from kernel_switchboard.device import is_capturing, package_version
from kernel_switchboard.errors import KernelUnavailableError

from .convert import SdpaSpec, TensorSpec, int_specs
from .support import FRONTEND, INSTALL, Support, library_version, version_text

CACHE_SIZE = 256

_lock = threading.RLock()
_cache: OrderedDict[tuple[Any, ...], Built] = OrderedDict()
_handles: dict[int, Any] = {}
#: counters for tests and ``explain``-style diagnostics
stats = {"builds": 0, "hits": 0, "build_seconds": 0.0}


@dataclass
class Built:
    """A built graph: the graph, its tensors by role, and its workspace size in bytes."""

    graph: Any
    tensors: dict[str, Any]
    workspace_size: int
    spec: SdpaSpec
    ones: dict[int, torch.Tensor] = field(default_factory=dict)  # decode's seq_q per device

    def seq_ones(self, device: torch.device) -> torch.Tensor:
        """(B, 1, 1, 1) int32 ones (the query lengths of a decode), made once per device."""
        key = device.index or 0
        t = self.ones.get(key)
        if t is None:
            t = self.ones[key] = torch.ones((self.spec.batch, 1, 1, 1), dtype=torch.int32, device=device)
        return t


@functools.lru_cache(maxsize=1)
def versions() -> tuple[int, str | None]:
    """(cuDNN backend version, cudnn-frontend version), read once: the first call imports the frontend (the first
    cuDNN kernel to run) and checks the library it loaded against the one the kernels were declared for."""
    cudnn = import_vendor("cudnn", INSTALL)
    loaded = int(cudnn.backend_version())
    check_declared(loaded, library_version())
    return loaded, package_version(FRONTEND)


def check_declared(loaded: int, declared: int | None) -> None:
    """Raise when the cuDNN the frontend loaded runs other problems than the one the capabilities were declared
    for at discovery (read without the frontend: :func:`.support.library_version`)."""
    if declared is None or declared == loaded or not torch.cuda.is_available():
        return
    cc = torch.cuda.get_device_capability()
    if Support(loaded, cc).declarations() != Support(declared, cc).declarations():
        raise KernelUnavailableError(
            f"cudnn-frontend loaded cuDNN {version_text(loaded)}, but the cuDNN kernels were declared for cuDNN "
            f"{version_text(declared)} (the library torch loaded), which runs other problems: install one cuDNN for "
            f"both (the nvidia-cudnn wheel torch depends on)")


def handle(device: torch.device) -> Any:
    """This device's cuDNN handle, its stream set to torch's current stream."""
    import cudnn

    index = device.index if device.index is not None else torch.cuda.current_device()
    h = _handles.get(index)
    if h is None:
        with _lock, torch.cuda.device(index):
            h = _handles.get(index)
            if h is None:
                h = _handles[index] = cudnn.create_handle()
    cudnn.set_stream(h, torch.cuda.current_stream(index).cuda_stream)
    return h


def get(spec: SdpaSpec, device: torch.device) -> Built:
    """The built graph of ``spec`` on ``device`` (built on first use, then cached)."""
    key = (spec, device.index if device.index is not None else torch.cuda.current_device(), versions())
    with _lock:
        built = _cache.get(key)
        if built is not None:
            _cache.move_to_end(key)
            stats["hits"] += 1
            return built
    start = time.perf_counter()
    try:
        built = _build(spec, device)
    except Exception as exc:
        hint = (" (the graph was being built during CUDA-graph capture: run the call once before capturing, "
                "or use a plan)") if is_capturing() else ""
        raise RuntimeError(f"cuDNN {versions()} could not build the SDPA graph{hint} for {describe(spec)}: "
                           f"{type(exc).__name__}: {exc}") from exc
    with _lock:
        stats["builds"] += 1
        stats["build_seconds"] += time.perf_counter() - start
        _cache[key] = built
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return built


def describe(spec: SdpaSpec) -> str:
    """One line naming what a graph is built for (error messages)."""
    def t(ts: TensorSpec) -> str:
        return f"{list(ts.dims)}/{list(ts.strides)}{' ragged' if ts.ragged else ''}"

    mask = ("causal" if spec.causal else "no causal") + (f", left_bound {spec.left_bound}" if spec.left_bound else "") \
        + ("" if spec.padding else ", no padding mask")
    paged = f"paged (table {list(spec.table.dims)}, max_seq_len_kv {spec.max_seq_len_kv})" if spec.table else "ragged K/V"
    return (f"q {t(spec.q)} k {t(spec.k)} v {t(spec.v)} o {t(spec.o)} {str(spec.q.dtype)[6:]}, {paged}, {mask}, "
            f"stats {'yes' if spec.stats else 'no'}")


def clear() -> None:
    """Forget every built graph (tests)."""
    with _lock:
        _cache.clear()


def execute(built: Built, feeds: dict[str, torch.Tensor], workspace: torch.Tensor, device: torch.device) -> None:
    """Run a built graph on torch's current stream. ``feeds`` maps roles to tensors."""
    pack = {built.tensors[role]: t for role, t in feeds.items() if role in built.tensors}
    built.graph.execute(pack, workspace, handle=handle(device))


def workspace(built: Built, device: torch.device) -> torch.Tensor:
    """A workspace buffer for ``built`` (at least one byte)."""
    return torch.empty(max(built.workspace_size, 1), dtype=torch.uint8, device=device)


# -- building ------------------------------------------------------------------------------------------
def _dtype(cudnn: Any, dtype: torch.dtype) -> Any:
    table = {torch.float16: cudnn.data_type.HALF, torch.bfloat16: cudnn.data_type.BFLOAT16,
             torch.float32: cudnn.data_type.FLOAT, torch.int32: cudnn.data_type.INT32}
    return table[dtype]


def _tensor(cudnn: Any, g: Any, name: str, ts: TensorSpec) -> Any:
    return g.tensor(name=name, dim=list(ts.dims), stride=list(ts.strides), data_type=_dtype(cudnn, ts.dtype))


def _build(spec: SdpaSpec, device: torch.device) -> Built:
    import cudnn

    io = _dtype(cudnn, spec.q.dtype)
    g = cudnn.pygraph(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle(device))
    t: dict[str, Any] = {role: _tensor(cudnn, g, role, ts) for role, ts in int_specs(spec).items()}
    for role in ("q", "k", "v"):
        ts: TensorSpec = getattr(spec, role)
        t[role] = _tensor(cudnn, g, role, ts)
        if ts.ragged is not None:
            t[role].set_ragged_offset(t[ts.ragged])
    kwargs: dict[str, Any] = dict(
        q=t["q"], k=t["k"], v=t["v"], attn_scale=spec.scale, generate_stats=spec.stats is not None,
        compute_data_type=cudnn.data_type.FLOAT, name="sdpa",
    )
    if spec.padding:
        kwargs.update(use_padding_mask=True, seq_len_q=t["seq_q"], seq_len_kv=t["seq_kv"])
    if spec.table is not None:
        t["k_table"] = _tensor(cudnn, g, "k_table", spec.table)
        t["v_table"] = _tensor(cudnn, g, "v_table", spec.table)
        kwargs.update(paged_attention_k_table=t["k_table"], paged_attention_v_table=t["v_table"],
                      paged_attention_max_seq_len_kv=spec.max_seq_len_kv)
    if spec.causal:
        kwargs.update(diagonal_alignment=cudnn.diagonal_alignment.BOTTOM_RIGHT, diagonal_band_right_bound=0)
    if spec.left_bound is not None:
        kwargs["diagonal_band_left_bound"] = spec.left_bound
    o, stats_t = g.sdpa(**kwargs)
    o.set_output(True).set_dim(list(spec.o.dims)).set_stride(list(spec.o.strides)).set_data_type(io)
    if spec.o.ragged is not None:
        o.set_ragged_offset(t[spec.o.ragged])
    t["o"] = o
    if spec.stats is not None:
        stats_t.set_output(True).set_dim(list(spec.stats.dims)).set_stride(list(spec.stats.strides))
        stats_t.set_data_type(cudnn.data_type.FLOAT)
        t["stats"] = stats_t
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return Built(g, t, int(g.get_workspace_size()), spec)
