"""gemm ops (being written)."""
