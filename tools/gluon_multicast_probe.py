"""Can this Triton's Gluon express a Hopper TMA multicast across a 2-CTA cluster? (No GPU needed.)

Compiles, for sm_90, a kernel whose (64, 64) bf16 tile has a broadcast CGA layout (both CTAs of the cluster hold
it) and is loaded with ``tma.async_load(..., multicast=True)``, then prints the PTX lines that show the cluster and
the multicast copy. The lever left for MLA decode (notes/gpu-runs.md runs 23-24): the two head-block programs of a
request read every latent tile from L2; one multicast load would feed both.

    python3 tools/gluon_multicast_probe.py     # Triton 3.9: `.reqnctapercluster 2`, `cp.async.bulk.tensor...multicast::cluster`
"""

from __future__ import annotations

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma


@gluon.jit
def multicast_kernel(desc, out_ptr):
    smem = gl.allocate_shared_memory(desc.dtype, desc.block_type.shape, desc.layout)
    bar = gl.allocate_shared_memory(gl.int64, [2], mbarrier.MBarrierLayout.multicta(2))  # one barrier per CTA
    mbarrier.init(bar, count=1)
    fence_async_shared()
    mbarrier.expect(bar, desc.block_type.nbytes)
    tma.async_load(desc, [gl.program_id(0) * 64, 0], bar, smem, multicast=True)
    mbarrier.wait(bar, 0)
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]])
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, layout))
    gl.store(out_ptr + rows[:, None] * 64 + cols[None, :], smem.load(layout))


def main() -> int:
    layout = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16, cga_layout=[[0, 0]])  # both CTAs
    signature = {"desc": f"tensordesc<bf16[64, 64],{layout!r}>", "out_ptr": "*bf16"}
    kernel = triton.compile(GluonASTSource(multicast_kernel, signature, {}), target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": 4, "num_ctas": 2})
    keys = (".reqnctapercluster", "multicast::cluster", "cluster_ctarank", "expect_tx")
    print(f"triton {triton.__version__}")
    for line in kernel.asm["ptx"].splitlines():
        if any(k in line for k in keys):
            print("  " + line.strip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
