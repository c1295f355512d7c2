"""Reference kernels: the pure-torch definition of every op (float32 accumulation, CPU and GPU).

They are registered like any other kernel under backend ``reference`` and are the oracle of
every conformance test. Each family module exposes ``KERNELS: list[Kernel]``.
"""
