"""Every trtllm kernel against the reference on the core's conformance cases inside its declared
capability (skipped with the reason when unavailable: no GPU, no flashinfer, no tensorrt_llm,
or a GPU the kernel is not built for)."""

from kernel_switchboard.testing import conformance_test

test_conformance = conformance_test("trtllm")
