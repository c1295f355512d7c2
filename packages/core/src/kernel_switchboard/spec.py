"""Op specs: one declarative record per op, from which its torch.library custom op and fake are made.

An :class:`OpSpec` names the op and its problem type, says how to validate a call and build its problem
(``prepare``: what :func:`~kernel_switchboard.explain` ranks), how each public argument crosses torch.library
(:class:`Arg`), the fake that gives the compiler the outputs' shapes, the reference kernel and the module of its
conformance cases. Adding an op is: its spec and public function (``ops/<family>.py``), its reference kernel
(``reference/<family>.py``), its conformance cases (``testing/cases/<family>.py``) and one backend kernel; see
docs/adding-an-op.md.

The custom op (``torch.ops.ksb.<op>``) is made from the spec the first time it is looked up, which a public
function does only while torch.compile traces it: importing the switchboard and calling its ops eagerly registers
nothing and imports no compiler. Inside the custom op the public function runs eagerly, so compiled calls take
exactly the eager path (its validation, selection and launch).
"""

from __future__ import annotations

import importlib
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import NoEligibleKernelError
from .paged import FP8_DTYPES, PagedKVCache, PageTable

#: torch.library namespace of every switchboard custom op
NAMESPACE = "ksb"

#: the kinds of :class:`Arg` and the custom-op parameters each becomes: (name suffix or "" for the argument's own
#: name, schema type); "backend" is a ``backend=`` preference (one string: a comma-separated list)
KINDS: dict[str, tuple[tuple[str, str], ...]] = {
    "Tensor": (("", "Tensor"),),
    "Tensor?": (("", "Tensor?"),),
    "float": (("", "float"),),
    "float?": (("", "float?"),),
    "int": (("", "SymInt"),),
    "int?": (("", "SymInt?"),),
    "bool": (("", "bool"),),
    "str": (("", "str"),),
    "str?": (("", "str?"),),
    "dtype": (("", "ScalarType"),),
    "float[]?": (("", "float[]?"),),
    "backend": (("", "str?"),),
    "int|rows": (("", "SymInt"), ("_rows", "Tensor?")),
    "float|rows": (("", "float"), ("_rows", "Tensor?")),
    "cache": (("k_pages", "Tensor"), ("v_pages", "Tensor"), ("layout", "str"), ("k_scale", "float?"),
              ("v_scale", "float?"), ("k_scale_tensor", "Tensor?"), ("v_scale_tensor", "Tensor?")),
    "table": (("block_table", "Tensor"), ("seq_lens", "Tensor"), ("max_seq_len", "SymInt?")),
}


@dataclass(frozen=True)
class Arg:
    """One public argument of an op and the custom-op parameters it becomes (see :data:`KINDS`).

    - ``cache``: a :class:`~kernel_switchboard.PagedKVCache` as its pages, layout and scales (each a float, or a
      tensor in the ``*_scale_tensor`` parameter: an fp8 cache whose scales are device tensors crosses the custom op
      with them);
    - ``table``: a :class:`~kernel_switchboard.PageTable` as its two tensors and host bound;
    - ``int|rows`` / ``float|rows``: a number or a per-row tensor as two parameters, the number (``neutral``
      standing for None or a tensor) and the tensor (or None); ``neutral`` comes back as None;
    - ``encode`` / ``decode``: a value's custom-op form and back, for a kind that needs one (e.g. a scaling record
      as ``float[]?``).

    ``mutated``: the op writes this tensor (a cache: its pages) in place.
    """

    name: str
    kind: str = "Tensor"
    mutated: bool = False
    neutral: Any = None
    encode: Callable[[Any], Any] | None = None
    decode: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Arg {self.name!r}: kind {self.kind!r} is not one of {sorted(KINDS)}")

    def parameters(self) -> list[tuple[str, str]]:
        """(name, schema type) of the custom-op parameters this argument becomes; a cache or table argument not named
        after its kind prefixes them (``decode_table``: ``decode_block_table``...), so an op may take two tables."""
        kind = self.kind
        if kind in ("cache", "table"):
            if self.name == kind:
                prefix = ""
            else:
                prefix = self.name.removesuffix(kind) if self.name.endswith("_" + kind) else self.name + "_"
            return [(prefix + name, schema) for name, schema in KINDS[kind]]
        return [(self.name + suffix, schema) for suffix, schema in KINDS[kind]]

    def flatten(self, value: Any) -> tuple[Any, ...]:
        """The custom-op parameters of ``value`` (traced by torch.compile: plain attribute reads only)."""
        kind = self.kind
        if kind == "cache":
            ks, vs = value.k_scale, value.v_scale
            k_t, v_t = isinstance(ks, torch.Tensor), isinstance(vs, torch.Tensor)
            return (value.k_pages, value.v_pages, value.layout, None if k_t else ks, None if v_t else vs,
                    ks if k_t else None, vs if v_t else None)
        if kind == "table":
            return value.block_table, value.seq_lens, value.max_seq_len
        if kind == "backend":
            return (value if value is None or isinstance(value, str) else ",".join(value)),
        if kind in ("int|rows", "float|rows"):
            if isinstance(value, torch.Tensor):
                return self.neutral, value
            return (self.neutral if value is None else value), None
        return (value if self.encode is None else self.encode(value)),

    def unflatten(self, values: list[Any]) -> Any:
        """The public value of this argument's custom-op parameters ``values``."""
        kind = self.kind
        if kind == "cache":
            return cache_of(*values)
        if kind == "table":
            return table_of(*values)
        if kind == "backend":
            value = values[0]
            return tuple(value.split(",")) if isinstance(value, str) and "," in value else value
        if kind in ("int|rows", "float|rows"):
            scalar, rows = values
            return rows if rows is not None else (None if scalar == self.neutral else scalar)
        return values[0] if self.decode is None else self.decode(values[0])


def _identity(result: Any) -> Any:
    return result


@dataclass(frozen=True, eq=False)
class OpSpec:
    """Everything the switchboard knows about one op besides its kernels.

    - ``name``: the op, ``family.name``; ``function``: its public function (the eager path); ``kernels``: the op
      whose kernels it selects, where that is another (``moe.experts`` runs ``moe.fused_moe``'s experts kernels);
    - ``problem``: its problem type; ``prepare(*args, **kwargs)``: validates a call's public arguments (without
      ``backend``) and returns a tuple whose first item is the problem (the rest is what the public function
      launches with);
    - ``reference``: the name of its kernel in the ``reference`` backend; ``cases``: the module under
      :mod:`kernel_switchboard.testing.cases` with its conformance cases;
    - ``op``: the custom op's name under ``torch.ops.ksb`` (None: the op has none of its own, e.g. one the public
      function composes from others); ``args``: the public arguments in custom-op order; ``returns``: the
      schema of its outputs; ``fake(*parameters)``: outputs of the right shape on fake tensors; ``outputs``: the
      public function's result as the custom op returns it (no None, no view); ``const``: keyword arguments the
      custom op passes the public function; ``tags``: torch.Tag values (e.g. ``nondeterministic_seeded``).
    """

    name: str
    function: Callable[..., Any]
    problem: type
    prepare: Callable[..., tuple[Any, ...]]
    reference: str
    cases: str
    op: str | None = None
    args: tuple[Arg, ...] = ()
    returns: str = "Tensor"
    fake: Callable[..., Any] | None = None
    outputs: Callable[[Any], Any] = _identity
    const: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[Any, ...] = ()
    kernels: str | None = None

    @property
    def kernel_op(self) -> str:
        """The registry op whose kernels a call of this op is ranked among."""
        return self.kernels or self.name

    @property
    def schema(self) -> str:
        """The custom op's schema, e.g. ``(Tensor x, str? backend) -> Tensor``."""
        params, alias = [], 0
        for arg in self.args:
            for i, (name, schema) in enumerate(arg.parameters()):
                if arg.mutated and schema == "Tensor" and (arg.kind != "cache" or i < 2):
                    schema = f"Tensor(a{alias}!)"
                    alias += 1
                params.append(f"{schema} {name}")
        return f"({', '.join(params)}) -> {self.returns}"

    def compiled(self, *args: Any) -> Any:
        """The op under torch.compile: the public arguments ``args`` (in :attr:`args` order) as one custom-op call."""
        flat: list[Any] = []
        for arg, value in zip(self.args, args):
            flat.extend(arg.flatten(value))
        return getattr(getattr(torch.ops, NAMESPACE), self.op).default(*flat)  # type: ignore[arg-type]

    def _impl(self, *flat: Any) -> Any:
        """The custom op's implementation: the public function, run eagerly on the unflattened arguments."""
        kwargs, i = dict(self.const), 0
        for arg in self.args:
            n = len(arg.parameters())
            kwargs[arg.name] = arg.unflatten(list(flat[i:i + n]))
            i += n
        return self.outputs(self.function(**kwargs))


# -- the specs ---------------------------------------------------------------------------------------------
_SPECS: dict[str, OpSpec] = {}
_BY_OP: dict[str, OpSpec] = {}
_registered: set[str] = set()
_lock = threading.RLock()


def define(spec: OpSpec, *, second_op: bool = False) -> OpSpec:
    """Record ``spec`` (at the import of its op family's module); its custom op is made on first lookup.

    ``second_op``: the spec only adds a second custom op to an op already defined (e.g. the in-place form of
    ``rope.apply``, whose mutations make it another schema); the first spec stays the op's spec.
    """
    if spec.op is not None and spec.fake is None:
        raise ValueError(f"{spec.name}: a spec with a custom op needs its fake")
    if not second_op:
        _SPECS[spec.name] = spec
    if spec.op is not None:
        _BY_OP[spec.op] = spec
        if not _LAZY:
            _register(spec)
    return spec


def spec_of(op: str) -> OpSpec:
    """The spec of ``op`` (importing its family's module); raises naming the known ops when there is none."""
    spec = _SPECS.get(op)
    if spec is None:
        from .ops import FAMILIES

        family = op.partition(".")[0]
        if family in FAMILIES:
            importlib.import_module(f"kernel_switchboard.ops.{family}")
            spec = _SPECS.get(op)
    if spec is None:
        raise NoEligibleKernelError(f"unknown op {op!r}; known ops: {', '.join(sorted(all_specs()))}")
    return spec


def all_specs() -> dict[str, OpSpec]:
    """Every op's spec, by op name (imports every family)."""
    from .ops import FAMILIES

    for family in FAMILIES:
        importlib.import_module(f"kernel_switchboard.ops.{family}")
    return dict(_SPECS)


def _register(spec: OpSpec) -> None:
    """Make ``torch.ops.ksb.<spec.op>`` from the spec (once)."""
    with _lock:
        if spec.op in _registered:
            return
        _registered.add(spec.op)  # type: ignore[arg-type]
        mutated = [name for arg in spec.args if arg.mutated
                   for name, schema in arg.parameters() if schema == "Tensor"]
        op = torch.library.custom_op(f"{NAMESPACE}::{spec.op}", spec._impl, mutates_args=tuple(mutated),
                                     schema=spec.schema, tags=spec.tags or None)
        op.register_fake(spec.fake)  # type: ignore[arg-type]  # define() requires one for a spec with an op


class _Namespace(torch._ops._OpNamespace):
    """``torch.ops.ksb``: a switchboard custom op is registered from its spec the first time it is looked up (by a
    public function under torch.compile, or by name), so that importing the switchboard registers nothing."""

    #: where torch's own namespaces say they live: compilers find an op again through its namespace's module
    __module__ = torch._ops._OpNamespace.__module__

    def __getattr__(self, name: str) -> Any:
        spec = _BY_OP.get(name)
        if spec is not None:
            _register(spec)
        return super().__getattr__(name)


def _install_namespace() -> bool:
    """Put the lazy namespace at ``torch.ops.ksb``; False where this torch has no such namespace class."""
    try:
        setattr(torch.ops, NAMESPACE, _Namespace(NAMESPACE))
    except (AttributeError, TypeError):
        return False
    return True


#: custom ops are made on first lookup (else at import, where torch.ops has no namespace class to extend)
_LAZY = _install_namespace()


# -- custom-op arguments back to the switchboard's records ----------------------------------------------------
_REBUILT: dict[tuple[Any, ...], tuple[Any, ...]] = {}


def _versions(*tensors: torch.Tensor) -> tuple[int, ...] | None:
    """The tensors' in-place write counters; None for inference tensors (they have none)."""
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:
        return None


def _reuse(key: tuple[Any, ...], tensors: tuple[torch.Tensor, ...], build: Callable[[], Any]) -> Any:
    """The record ``build()`` made for these very tensors (same objects, unchanged since), else a new one: the
    custom op of a compiled call gets the tensors of a cache or table, not the record, and a record keeps the
    checks done on it (a table's page-range check reads the device once)."""
    versions = _versions(*tensors)
    if versions is None:
        return build()
    hit = _REBUILT.get(key)
    if hit is not None and hit[1] == versions and all(ref() is t for ref, t in zip(hit[0], tensors)):
        return hit[2]
    record = build()
    if len(_REBUILT) >= 16:
        _REBUILT.clear()
    _REBUILT[key] = (tuple(weakref.ref(t) for t in tensors), versions, record)
    return record


def table_of(block_table: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int | None) -> PageTable:
    """The :class:`PageTable` of these tensors inside a custom op, reused while the same tensors are unchanged (same
    version counters), so its one-time device checks are not repeated at every compiled call."""
    key = ("table", id(block_table), id(seq_lens), max_seq_len)
    return _reuse(key, (block_table, seq_lens), lambda: PageTable(block_table, seq_lens, max_seq_len))  # type: ignore[no-any-return]


def cache_of(k_pages: torch.Tensor, v_pages: torch.Tensor, layout: str, k_scale: float | None,
             v_scale: float | None, k_scale_tensor: torch.Tensor | None = None,
             v_scale_tensor: torch.Tensor | None = None) -> PagedKVCache:
    """The :class:`PagedKVCache` of these pages inside a custom op, reused like :func:`table_of` (a scale tensor, when
    given, stands for its float)."""
    fp8 = k_pages.dtype in FP8_DTYPES
    ks = k_scale_tensor if k_scale_tensor is not None else k_scale
    vs = v_scale_tensor if v_scale_tensor is not None else v_scale
    scales = (ks, vs) if fp8 else (None, None)
    key = ("cache", id(k_pages), id(v_pages), layout, *(id(s) if isinstance(s, torch.Tensor) else s for s in scales))
    return _reuse(key, (k_pages, v_pages), lambda: PagedKVCache(k_pages, v_pages, layout, *scales))  # type: ignore[no-any-return]
