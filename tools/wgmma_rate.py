"""Hopper wgmma throughput by tile width N (issue 3: would 32-token MLA tiles pay for a deeper ring?).

One persistent program per SM issues back-to-back bf16 wgmma on operands resident in shared memory (SS: A and B
from shared memory; RS: A from registers), two consumer warpgroups of 64 rows each as in the MLA kernel, K=256 per
MMA and four MMAs between waits. Prints TFLOP/s per (N, mode) and the ratio to N=256 SS, the tensor cores' rate.
An m64nNk16 SS wgmma reads 2 KB of A and N * 32 bytes of B from shared memory in the N / 2 clocks its MACs take at
full rate, so at 128 B a clock per SM, N = 64 is the narrowest tile that shared memory can feed at full rate.

    python3 tools/wgmma_rate.py [--iters 2000]
"""

from __future__ import annotations

import argparse
import json

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def wgmma_rate_kernel(a_ptr, b_ptr, out_ptr, iters, N: gl.constexpr, K: gl.constexpr, RS: gl.constexpr,
                      num_warps: gl.constexpr):
    """a (128, K) and b (N, K) bf16 staged once into shared memory; ``iters`` rounds of four (128, N, K) MMAs
    into one float32 accumulator; its sum goes to out[program] (so nothing is optimised away)."""
    M: gl.constexpr = 128
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    rows = gl.arange(0, M, layout=gl.SliceLayout(1, ld))
    cols = gl.arange(0, K, layout=gl.SliceLayout(0, ld))
    a_smem = gl.allocate_shared_memory(gl.bfloat16, [M, K], gl.NVMMASharedLayout.get_default_for([M, K], gl.bfloat16))
    a_smem.store(gl.load(a_ptr + rows[:, None] * K + cols[None, :]))
    b_rows = gl.arange(0, N, layout=gl.SliceLayout(1, ld))
    b_smem = gl.allocate_shared_memory(gl.bfloat16, [N, K], gl.NVMMASharedLayout.get_default_for([N, K], gl.bfloat16))
    b_smem.store(gl.load(b_ptr + b_rows[:, None] * K + cols[None, :]))
    fence_async_shared()
    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                         instr_shape=[16, N, 16])
    acc = gl.zeros([M, N], gl.float32, layout=acc_layout)
    b = b_smem.permute((1, 0))
    if RS:
        a = a_smem.load(gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2))
        for _ in range(iters):
            for _j in gl.static_range(4):
                acc = warpgroup_mma(a, b, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    else:
        for _ in range(iters):
            for _j in gl.static_range(4):
                acc = warpgroup_mma(a_smem, b, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    gl.store(out_ptr + gl.program_id(0), gl.sum(gl.sum(acc, 1), 0))


def _best_ms(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, iters: int, rs: bool) -> float:
    """Best of five timed launches (one program per SM), after a compiling one."""
    launch = wgmma_rate_kernel[(out.numel(),)]
    launch(a, b, out, iters, N=b.shape[0], K=b.shape[1], RS=rs, num_warps=8)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(5):
        start.record()
        launch(a, b, out, iters, N=b.shape[0], K=b.shape[1], RS=rs, num_warps=8)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end))
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    k = 256
    a = (torch.randn(128, k, device=dev) / 16).to(torch.bfloat16)
    out = torch.empty(sms, device=dev)
    results: dict[tuple[int, bool], float] = {}
    for n in (256, 128, 64, 32):
        b = (torch.randn(n, k, device=dev) / 16).to(torch.bfloat16)
        for rs in (False, True):
            ms = _best_ms(a, b, out, args.iters, rs)
            results[n, rs] = 2.0 * sms * args.iters * 4 * 128 * n * k / ms / 1e9
            print(json.dumps({"n": n, "mode": "RS" if rs else "SS", "ms": round(ms, 3),
                              "tflop_s": round(results[n, rs], 1)}), flush=True)
    full = results[256, False]
    for (n, rs), tf in results.items():
        print(f"m64n{n}k16 {'RS' if rs else 'SS'}: {tf:7.1f} TFLOP/s  {tf / full:.2f}x of n256 SS")


if __name__ == "__main__":
    main()
