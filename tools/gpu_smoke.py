"""A one-minute GPU smoke test of the Triton attention kernels: decode, paged and ragged prefill,
MLA decode, with and without a custom variant, each against the reference (relative norm error).

    python3 tools/gpu_smoke.py
"""

from __future__ import annotations

import time
import traceback

import torch

import kernel_switchboard as ksb
from kernel_switchboard.testing.cases.attention import example

#: KSB_SMOKE_BACKEND=reference on a CPU checks the script itself
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKEND = __import__("os").environ.get("KSB_SMOKE_BACKEND", "triton")


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def check(op: str, extra: dict | None = None, **shape: object) -> None:
    t0 = time.time()
    try:
        case = example(op, DEVICE, **shape)
        kwargs = {**case.kwargs, **(extra or {})}
        got = case.function(*case.args, backend=BACKEND, **kwargs)
        want = case.function(*case.args, backend="reference", **kwargs)
        got = got[0] if isinstance(got, tuple) else got
        want = want[0] if isinstance(want, tuple) else want
        err = rel_err(got, want)
        print(f"{'ok ' if err < 2e-2 else 'BAD'} {op:<26} {shape} {list(extra or {})} rel err {err:.2e} "
              f"({time.time() - t0:.1f} s)", flush=True)
    except Exception:  # noqa: BLE001 - print and keep going
        print(f"ERR {op} {shape}: {traceback.format_exc()[-800:]}", flush=True)


def main() -> None:
    from kernel_switchboard import variants_lib

    for layout in ("NHD", "HND"):
        check("attention.decode", batch=16, kv_len=2048, page_size=16, layout=layout, dtype="bf16")
    check("attention.decode", batch=4, kv_len=1000, page_size=1, dtype="fp16", soft_cap=30.0, window=256, lse=True)
    check("attention.prefill", batch=2, q_len=512, kv_len=1024, page_size=16, dtype="bf16", causal=True)
    check("attention.prefill_ragged", batch=2, q_len=1024, kv_len=1024, dtype="bf16", causal=True)
    check("attention.prefill_ragged", batch=2, q_len=256, kv_len=256, head_dim=192, head_dim_v=128, dtype="bf16")
    check("attention.mla_decode", batch=8, kv_len=1024, num_heads=16, page_size=64, dtype="bf16")
    slopes = variants_lib.alibi_slopes(32, DEVICE)
    check("attention.decode", {"variant": variants_lib.ALIBI, "variant_args": (slopes,)},
          batch=16, kv_len=2048, page_size=16, dtype="bf16")
    check("attention.prefill_ragged", {"variant": variants_lib.ALIBI, "variant_args": (slopes,)},
          batch=2, q_len=512, kv_len=512, dtype="bf16", causal=True)
    print(ksb.explain("attention.decode", *example("attention.decode", DEVICE, batch=16, kv_len=2048).args))


if __name__ == "__main__":
    main()
