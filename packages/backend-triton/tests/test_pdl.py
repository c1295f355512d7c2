"""Programmatic dependent launch (``_gdc``): where it is used, and that the kernels launched with it wait for the kernel
before them ahead of their first memory access (compiled for sm_90 without a GPU; the GPU tests run them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernel_switchboard_triton._common import pdl_launch

_COMPILE = textwrap.dedent("""
    import importlib, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, signature, constexprs = json.loads(sys.argv[1])
    fn = getattr(importlib.import_module(module), kernel)
    out = {}
    for pdl in (True, False):
        consts = dict(constexprs, PDL=pdl)
        sig = dict(signature, **{name: "constexpr" for name in consts})
        compiled = triton.compile(ASTSource(fn, sig, consts), target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4, "launch_pdl": pdl})
        out[str(pdl)] = {"ptx": compiled.asm["ptx"], "launch_pdl": compiled.metadata.launch_pdl}
    print(json.dumps(out))
""")

_NORM = {"x_ptr": "*bf16", "y_ptr": "*bf16", "w_ptr": "*bf16", "rows": "i32", "N": "i32", "stride_x": "i32",
         "stride_y": "i32", "eps": "fp32"}
_MERGE = {"po_ptr": "*bf16", "plse_ptr": "*fp32", "o_ptr": "*bf16", "lse_ptr": "*fp32",
          **{name: "i32" for name in ("stride_pb", "stride_ph", "stride_ps", "stride_plb", "stride_plh", "stride_ob",
                                      "stride_oh", "stride_lb", "stride_lh")}}


def test_no_pdl_off_the_gpu() -> None:
    assert pdl_launch(torch.device("cpu")) == {"PDL": False}


@pytest.mark.parametrize(("module", "kernel", "signature", "constexprs"), [
    ("_norm_kernels", "_rms_norm_block", _NORM, {"GEMMA": False, "BLOCK_M": 1, "BLOCK_N": 4096}),
    ("_decode", "_merge_splits_kernel", _MERGE, {"HEAD_DIM_V": 512, "BLOCK_DV": 512, "NUM_SPLITS": 4, "BLOCK_S": 4,
                                                 "LSE_BASE2": False}),
])
def test_kernels_wait_for_the_prior_kernel_before_touching_memory(module: str, kernel: str, signature: dict[str, str],
                                                                  constexprs: dict[str, object]) -> None:
    """With PDL the sm_90 code waits (``griddepcontrol.wait``) before its first global load or store and lets the next
    kernel launch; without it, neither instruction is there."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    args = json.dumps([f"kernel_switchboard_triton.{module}", kernel, signature, constexprs])
    done = subprocess.run([sys.executable, "-c", _COMPILE, args], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    ptx, plain = out["True"]["ptx"], out["False"]["ptx"]
    first_access = min(i for i in (ptx.find("ld.global"), ptx.find("st.global")) if i >= 0)
    assert 0 <= ptx.find("griddepcontrol.wait") < first_access
    assert ptx.find("griddepcontrol.launch_dependents") >= 0 and out["True"]["launch_pdl"]
    assert "griddepcontrol" not in plain and not out["False"]["launch_pdl"]
