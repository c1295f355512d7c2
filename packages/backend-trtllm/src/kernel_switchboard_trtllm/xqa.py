"""TensorRT-LLM's XQA decode kernels as shipped in flashinfer-python: ``attention.decode`` (and
``attention.mla_decode`` on the GPUs where flashinfer offers XQA MLA: sm_120 / sm_121 only).

What the kernels accept was read from flashinfer 0.6.18.post1's sources (``flashinfer/xqa.py``,
``jit/xqa.py``, ``csrc/xqa``): fp16/bf16 queries; K/V in the query's dtype or float8_e4m3fn (one
scale each, folded into the two bmm scales); pages of 16, 32, 64 or 128 tokens, NHD or HND; head
dims multiples of 16 up to 512; a sliding window; no logits soft-cap, no LSE output. The limits on
the GQA group follow from the generic kernel keeping a group's queries in 16 KB of shared memory.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch

from kernel_switchboard import Capability, Kernel, empty_rows
from kernel_switchboard.availability import import_vendor
from kernel_switchboard.device import is_capturing

from . import jit, translate
from .providers import INSTALL, provider_tag

XQA_DTYPES = frozenset({torch.float16, torch.bfloat16})
XQA_KV_DTYPES = XQA_DTYPES | {torch.float8_e4m3fn}
PAGE_SIZES = frozenset({16, 32, 64, 128})
#: flashinfer compiles XQA for these compute-capability majors (sm_90, sm_100/103, sm_120/121)
XQA_MAJORS = (9, 10, 12)
#: bytes of workspace per (device, stream): 8 MB of semaphores + multi-block scratch
WORKSPACE_BYTES = 128 << 20
#: GPU time of XQA's paged decode as ``fixed + K/V bytes / rate``, fitted on the H200 (Llama-3-8B heads, bf16;
#: CUDA-graph replays over B 1-256, L 1024-8192, pages 16 and 128): 22 us + bytes / rate, rate by page size
#: (3.8 TB/s at 16, 4.22 at 128; 32 and 64 interpolated), within 10% of every point
DECODE_FIXED_S = 22e-6
DECODE_RATE = {16: 3.8e12, 32: 3.95e12, 64: 4.1e12}  # by page size; 4.22e12 for pages of 128 and more

_workspaces: dict[tuple[int, int], torch.Tensor] = {}
_ws_lock = threading.Lock()


def workspace(device: torch.device) -> torch.Tensor:
    """The zero-initialised XQA workspace of this device and current stream (allocated once, outside capture)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (index, torch.cuda.current_stream(index).cuda_stream)
    ws = _workspaces.get(key)
    if ws is None:
        if is_capturing():
            raise RuntimeError("trtllm XQA: no workspace for this stream yet; plan the decode "
                               "(ksb.attention.plan_decode) before CUDA-graph capture")
        with _ws_lock:
            ws = _workspaces.get(key)
            if ws is None:
                ws = _workspaces[key] = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=torch.device("cuda", index))
    return ws


def _padded_head(d: int) -> int:
    return 64 if d <= 64 else 128 if d <= 128 else 256 if d <= 256 else 512


def decode_check(problem: Any) -> list[str]:
    """What the capability fields cannot say: compute capability majors, head dim, group size."""
    out = []
    if problem.cc is not None and problem.cc[0] not in XQA_MAJORS:
        out.append(f"compute capability {problem.cc[0]}.{problem.cc[1]}: flashinfer builds XQA for sm_90, sm_100 "
                   "and sm_120 only")
    d, g = problem.head_dim, problem.group_size
    if d % 16 or not 16 <= d <= 512:
        out.append(f"head_dim={d}: XQA needs a multiple of 16 in [16, 512]")
    fp8_hopper = problem.kv_dtype == torch.float8_e4m3fn and problem.cc is not None and problem.cc[0] == 9 and d <= 256
    if d > 256 and g > 16:
        out.append(f"group_size={g} with head_dim={d}: XQA allows at most 16 query heads per KV head above 256")
    elif not fp8_hopper and -(-g // 16) * 16 * _padded_head(d) * 2 > 16384:
        limit = 16384 // (2 * _padded_head(d))
        out.append(f"group_size={g} with head_dim={d}: XQA keeps a group's queries in 16 KB of shared memory "
                   f"(at most {limit} query heads per KV head)")
    elif fp8_hopper and g > 64:
        out.append(f"group_size={g}: the Hopper fp8-KV XQA kernel is declared here for at most 64 query heads per KV head")
    return out


def _math_dtype(problem: Any) -> torch.dtype | None:
    """XQA's MMAs take the cache's element type: on an fp8 cache Q and P are quantised to fp8 as well."""
    return problem.kv_dtype if problem.kv_dtype == torch.float8_e4m3fn else None


def _decode_cost(problem: Any) -> float:
    """Seconds, from the K and V bytes read (estimates only rank kernels; same model as the cuDNN backend's)."""
    if problem.device != "cuda":
        return float("inf")
    kv_item = 1 if problem.kv_dtype == torch.float8_e4m3fn else 2
    nbytes = problem.batch * problem.max_kv_len * problem.num_kv_heads * (problem.head_dim + problem.head_dim_v) * kv_item
    return DECODE_FIXED_S + nbytes / DECODE_RATE.get(problem.page_size, 4.22e12)


#: a request with no cached tokens must give out = 0 (the op's contract). XQA writes NaN (bf16/fp16) or
#: garbage (fp8 KV: -1e17) for it (flashinfer 0.6.18 on the H200, tests/test_trtllm_gpu.py), and engines pad
#: CUDA-graph batches with such requests, so those rows are zeroed after the call by one launch, no host
#: sync (:func:`kernel_switchboard.empty_rows.zero_empty_requests`): 2.69 against 2.75 TB/s without it at
#: B=16 L=2048 page 64 in a CUDA graph on the H200.
#: ``KSB_TRTLLM_XQA_EMPTY_ROWS=trust`` skips that when the caller never passes an empty request.
ZERO_EMPTY_ROWS = os.environ.get("KSB_TRTLLM_XQA_EMPTY_ROWS", "zero") != "trust"


def _xqa_call(args: translate.XqaDecodeArgs, out: torch.Tensor, ws: torch.Tensor) -> None:
    trtllm_batch_decode_with_kv_cache = import_vendor("flashinfer.decode", INSTALL).trtllm_batch_decode_with_kv_cache
    trtllm_batch_decode_with_kv_cache(query=args.query, kv_cache=args.kv_cache, workspace_buffer=ws,
                                      block_tables=args.block_tables, seq_lens=args.seq_lens,
                                      max_seq_len=args.max_seq_len, bmm1_scale=args.bmm1_scale,
                                      bmm2_scale=args.bmm2_scale, window_left=args.window_left, out=out,
                                      kv_layout=args.kv_layout, backend="xqa")
    if ZERO_EMPTY_ROWS:
        empty_rows.zero_empty_requests(args.seq_lens, out)  # also replaces NaN


def decode(q: torch.Tensor, cache: Any, table: Any, p: Any) -> tuple[torch.Tensor, None]:
    """attention.decode: q (B, Hq, D) -> out (B, Hq, D) in q's dtype; no LSE."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    args = translate.xqa_decode_args(q, cache, table, p)
    _xqa_call(args, out, workspace(q.device))
    jit.note_xqa_run(q, cache, args.window_left)
    return out, None


class DecodePlan:
    """Built once per (problem, table, params), before any capture: the module is compiled and the plan
    holds the workspace it runs with (the current stream's), so a graph captured on another stream
    still finds it. Runs of one plan must not overlap on two streams."""

    def __init__(self, problem: Any, table: Any, p: Any) -> None:
        self.table, self.p = table, p
        self.workspace = workspace(table.block_table.device)
        jit.xqa_build(problem)
        if ZERO_EMPTY_ROWS:
            empty_rows.prepare(table.block_table.device, problem.dtype, (problem.num_q_heads, problem.head_dim_v), None)

    def run(self, q: torch.Tensor, cache: Any, out: torch.Tensor | None, lse: torch.Tensor | None
            ) -> tuple[torch.Tensor, None]:
        """Writes ``out`` (B, Hq, D) (a new tensor when None); XQA has no LSE (its capability says so)."""
        if out is None:
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _xqa_call(translate.xqa_decode_args(q, cache, self.table, self.p), out, self.workspace)
        return out, None


def plan(problem: Any, table: Any, p: Any, **static: Any) -> DecodePlan:
    return DecodePlan(problem, table, p)


DECODE_CAP = Capability(
    devices=frozenset({"cuda"}), min_cc=(9, 0), max_cc=(12, 1), dtypes=XQA_DTYPES, kv_dtypes=XQA_KV_DTYPES,
    page_sizes=PAGE_SIZES, layouts=frozenset({"NHD", "HND"}),
    features=frozenset({"paged", "sliding_window", "fp8_kv", "cuda_graph"}), check=decode_check,
)


# -- MLA (sm_120 / sm_121 only) ------------------------------------------------------------------------------
def mla_check(problem: Any) -> list[str]:
    out = []
    if (problem.head_dim, problem.head_dim_pe) != (512, 64):
        out.append(f"head dims {problem.head_dim}+{problem.head_dim_pe}: XQA MLA is built for DeepSeek's 512+64")
    if problem.num_q_heads != 128:
        out.append(f"num_q_heads={problem.num_q_heads}: XQA MLA is built for 128 query heads")
    return out


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_pages: torch.Tensor, kpe_pages: torch.Tensor, table: Any,
               p: Any) -> tuple[torch.Tensor, None]:
    """attention.mla_decode through flashinfer's XQA MLA (bf16); out (B, H, 512)."""
    xqa_batch_decode_with_kv_cache_mla = import_vendor("flashinfer.mla", INSTALL).xqa_batch_decode_with_kv_cache_mla
    a = translate.xqa_mla_args(q_nope, q_pe, ckv_pages, kpe_pages, table, p)
    out = torch.empty(q_nope.shape, dtype=q_nope.dtype, device=q_nope.device)
    xqa_batch_decode_with_kv_cache_mla(a.query, a.kv_cache, workspace(out.device), a.qk_nope_head_dim,
                                       a.kv_lora_rank, a.qk_rope_head_dim, a.block_tables, a.seq_lens,
                                       a.max_seq_len, out=out, bmm1_scale=a.bmm1_scale, bmm2_scale=a.bmm2_scale)
    return out, None


MLA_CAP = Capability(
    devices=frozenset({"cuda"}), min_cc=(12, 0), max_cc=(12, 1), dtypes=frozenset({torch.bfloat16}),
    kv_dtypes=frozenset({torch.bfloat16}), page_sizes=PAGE_SIZES, features=frozenset({"paged"}), check=mla_check,
)


def kernels(version: str | None) -> list[Kernel]:
    v = version or ""
    return [
        Kernel("attention.decode", provider_tag("trtllm-xqa", version), "trtllm", DECODE_CAP, decode, version=v,
               plan=plan, cost=_decode_cost, needs_build=jit.compiled(jit.xqa_spec, jit.xqa_record),
               build=jit.xqa_build,
               math_dtype=_math_dtype, reads_stale_slots=True,
               doc="TensorRT-LLM XQA paged decode (flashinfer-python JIT; first build ~10 s per configuration); "
                   "on an fp8 cache it quantises Q and P to fp8 too (relative error ~2e-2, measured on the H200)"),
        Kernel("attention.mla_decode", provider_tag("trtllm-xqa-mla", version), "trtllm", MLA_CAP, mla_decode,
               version=v, needs_build=jit.compiled(jit.xqa_mla_spec, jit.xqa_mla_record), build=jit.xqa_mla_build,
               doc="TensorRT-LLM XQA MLA decode, sm_120/sm_121 only (flashinfer); never run here: no such GPU"),
    ]
