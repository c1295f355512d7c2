"""The op families: one module each, with its problem types, specs and public functions."""

#: every op family, in the order the reference backend registers them
FAMILIES = ("attention", "kv_cache", "sampling", "norm", "rope", "activation", "gemm", "moe", "comm")
