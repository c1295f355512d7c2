"""The Triton backend's kernel records: capabilities, checks and cost estimates, one module per op family.

Nothing here imports Triton. Each record's ``run`` (and ``plan``) is a :class:`~kernel_switchboard.lazy.Launcher`
naming the function in the module that holds the Triton kernel (``norm.py``, ``_decode.py``...): discovery,
ranking and running another backend's kernel leave Triton unimported; the first call of one of these kernels
imports Triton and that module, after pointing Triton's cache at the switchboard's compiled-artefact directory
for this environment (:func:`kernel_switchboard.artefacts.prepare_triton`), where ``switchboard build`` puts them.
"""

from __future__ import annotations

from kernel_switchboard.artefacts import prepare_triton
from kernel_switchboard.lazy import Launcher

#: the op families, one module each
FAMILIES = ("attention", "kv_cache", "sampling", "norm", "rope", "activation", "gemm", "moe", "comm")
INSTALL = 'pip install "kernel-switchboard[triton]"'


def launcher(target: str) -> Launcher:
    """The launcher of ``module:function`` in this package (``"norm:rms_norm"``)."""
    return Launcher(f"kernel_switchboard_triton.{target}", install=INSTALL, prepare=prepare_triton)
