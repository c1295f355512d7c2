"""Every CUTLASS kernel against the reference on the core's conformance cases inside its declared
capability (skipped with the reason when the backend is unavailable: no Hopper GPU, nvcc or headers)."""

from kernel_switchboard.testing import conformance_test

test_conformance = conformance_test("cutlass")
