"""Compile a Gluon kernel for sm_90 on a machine without a GPU (ptxas included), for the tests of the experimental
Gluon kernels. Runs in a subprocess without ``TRITON_INTERPRET``: under the interpreter Triton's own jit helpers
(the reductions' combine functions) are interpreted functions, which the Gluon compiler rejects."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from typing import Any

_SCRIPT = textwrap.dedent("""
    import importlib, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon._runtime import GluonASTSource

    module, kernel, signature, descriptors, constexprs, options, aligned = json.loads(sys.argv[1])
    for name, (dtype, block, *cga) in descriptors.items():
        layout = gl.NVMMASharedLayout.get_default_for(block, getattr(gl, dtype), **({"cga_layout": cga[0]} if cga else {}))
        short = {"bfloat16": "bf16", "float16": "fp16", "float8e4nv": "fp8e4nv", "float32": "fp32"}[dtype]
        signature[name] = f"tensordesc<{short}[{block[0]}, {block[1]}],{layout!r}>"
    for name in constexprs:
        signature[name] = "constexpr"
    fn = getattr(importlib.import_module(module), kernel)
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    compiled = triton.compile(GluonASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", 90, 32),
                              options=options)
    print(json.dumps({"ptx": compiled.asm["ptx"], "shared": compiled.metadata.shared}))
""")
#: ptxas's report (Triton prints it with TRITON_DUMP_PTXAS_LOG=1): registers and spilled bytes of the kernel
_USED = re.compile(r"Used (\d+) registers")
_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def spill_limit(through_3_7: int, newer: int) -> int:
    """The spilled bytes a compile test allows: as measured with Triton 3.6 (the GPU image's) and 3.7 (torch 2.13's
    CUDA pin), or with newer Triton, whose ptxas runs with ``--regAllocOptLevel=2`` (a workaround for a ptxas 13
    bug) and spills in the warp-specialised kernels where the older ones do not."""
    import triton

    return through_3_7 if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 8) else newer


def compile_for_hopper(module: str, kernel: str, signature: dict[str, str], descriptors: dict[str, Any],
                       constexprs: dict[str, Any], num_warps: int, maxnreg: int | None = None,
                       num_ctas: int = 1, aligned: tuple[str, ...] = ()) -> dict[str, Any]:
    """{"ptx": str, "shared": bytes, "registers": n, "spill_stores": bytes, "spill_loads": bytes} of
    ``module.kernel`` compiled for sm_90 (registers and spills as ptxas reports them). ``descriptors``: name -> (Gluon dtype
    name, block shape[, CGA bases]) of each TMA descriptor argument (default NVMMA shared layout); ``maxnreg`` and
    ``num_ctas`` (the CTAs of a cluster) as at launch; ``aligned``: arguments specialised as divisible by 16 (as
    Triton's launcher specialises 16-byte-aligned pointers and integers divisible by 16)."""
    # compiled afresh (TRITON_ALWAYS_COMPILE): a cached kernel does not pass through ptxas, whose report is read here
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {
        "TRITON_DUMP_PTXAS_LOG": "1", "TRITON_ALWAYS_COMPILE": "1"}
    options = ({"num_warps": num_warps} | ({"maxnreg": maxnreg} if maxnreg else {})
               | ({"num_ctas": num_ctas} if num_ctas > 1 else {}))
    args = json.dumps([module, kernel, signature, descriptors, constexprs, options, list(aligned)])
    done = subprocess.run([sys.executable, "-c", _SCRIPT, args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    used, spills = _USED.findall(done.stdout), _SPILLS.findall(done.stdout)
    assert used and spills, f"no ptxas report in the compile's output: {done.stdout[-2000:]}"
    result |= {"registers": int(used[-1]), "spill_stores": int(spills[-1][0]), "spill_loads": int(spills[-1][1])}
    return result
