"""Conformance of the Triton attention and KV-cache kernels: every core case inside their declared
capability, against the reference (interpreter on the CPU, real sizes on a GPU)."""

from __future__ import annotations

import pytest
import torch

from kernel_switchboard.availability import triton_interpreting
from kernel_switchboard.testing import conformance_test

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and not triton_interpreting(),
                                reason="Triton kernels need a CUDA GPU or TRITON_INTERPRET=1")

test_conformance = conformance_test("triton", ops=(
    "attention.decode", "attention.prefill", "attention.prefill_ragged", "attention.mla_decode", "attention.mla_prefill",
    "attention.pod", "attention.merge_states", "attention.dense", "kv_cache.append", "kv_cache.append_mla",
))
