"""One fingerprint for a traced program, so the judge can tell that the program it checks is the one priced.

The fingerprint is a canonical rendering of the program: every equation with its primitive, its operands
(numbered in order of definition, so names do not matter), its output types and its parameters, every
sub-program written out in full where it is used (JAX's printer names shared sub-programs in the order it
meets them, which differs between two traces of the same code), Pallas grid mappings field by field (block
shapes and index maps included), and the values of constants. The one parameter the evaluator itself sets
after choosing how Pallas runs here (``interpret``) is left out. Two traces with the same fingerprint
compile to the same computation. A sharding over one device is written as no sharding: the pricing
stage traces under a one-device abstract TPU mesh, the checking worker under none, and on one device the
two compute the same.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from typing import Any

import numpy as np
from jax._src import core

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_SET_BY_THE_EVALUATOR = frozenset({"interpret"})


def program_fingerprint(closed: Any) -> str:
    """The fingerprint of a ``ClosedJaxpr`` (see the module docstring)."""
    digest = hashlib.sha256()
    digest.update(_jaxpr_text(closed.jaxpr, closed.consts, digest).encode())
    return digest.hexdigest()[:32]


def _jaxpr_text(jaxpr: core.Jaxpr, consts: Any, digest: Any) -> str:
    names: dict[core.Var, str] = {}
    counter = iter(range(1 << 62))

    def name(atom: Any) -> str:
        if isinstance(atom, core.Literal):
            return f"lit({_value(atom.val, digest)}:{atom.aval})"
        if atom not in names:
            names[atom] = f"v{next(counter)}"
        return names[atom]

    parts = ["consts(" + ",".join(f"{name(v)}:{v.aval}" for v in jaxpr.constvars) + ")",
             "values(" + ",".join(_value(c, digest) for c in consts) + ")",
             "in(" + ",".join(f"{name(v)}:{v.aval}" for v in jaxpr.invars) + ")"]
    for eqn in jaxpr.eqns:
        if _placement_only(eqn):  # the same value, placed on the one device there is: no equation
            names[eqn.outvars[0]] = name(eqn.invars[0])
            continue
        params = ",".join(f"{k}={_param(v, digest)}" for k, v in sorted(eqn.params.items())
                          if k not in _SET_BY_THE_EVALUATOR)
        ins = ",".join(name(v) for v in eqn.invars)
        outs = ",".join(f"{name(v)}:{v.aval}" for v in eqn.outvars)
        parts.append(f"{outs}={eqn.primitive.name}[{params}]({ins})")
    parts.append("out(" + ",".join(name(v) for v in jaxpr.outvars) + ")")
    return "{" + ";".join(parts) + "}"


def _param(value: Any, digest: Any) -> str:
    if _one_device_sharding(value):
        return "None"
    if isinstance(value, core.ClosedJaxpr):
        return _jaxpr_text(value.jaxpr, value.consts, digest)
    if isinstance(value, core.Jaxpr):
        return _jaxpr_text(value, (), digest)
    if isinstance(value, (tuple, list)):
        return "(" + ",".join(_param(v, digest) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_param(v, digest)}" for k, v in sorted(value.items(), key=repr)) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ",".join(f"{f.name}={_param(getattr(value, f.name), digest)}" for f in dataclasses.fields(value)
                          if f.name not in _SET_BY_THE_EVALUATOR and f.name != "debug_info")
        return f"{type(value).__name__}({fields})"
    if isinstance(value, (np.ndarray, np.generic)):
        return _value(value, digest)
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if callable(value) and not isinstance(value, type):
        return f"fn:{getattr(value, '__qualname__', type(value).__name__)}"
    return _ADDRESS.sub("", repr(value))


_PLACEMENT = frozenset({"reshard", "sharding_constraint", "mesh_cast"})


def _placement_only(eqn: core.JaxprEqn) -> bool:
    """An equation that only places one value (JAX adds ``reshard`` under a mesh) on one device or none."""
    if eqn.primitive.name not in _PLACEMENT or len(eqn.invars) != 1 or len(eqn.outvars) != 1:
        return False
    shardings = [v for k, v in eqn.params.items() if "sharding" in k]
    return all(v is None or _one_device_sharding(v) for v in shardings)


def _one_device_sharding(value: Any) -> bool:
    """A sharding over a mesh of one device (the cost model traces under one such abstract TPU device): it
    places nothing anywhere else, so it computes what no sharding computes."""
    mesh = getattr(value, "mesh", None)
    return mesh is not None and hasattr(value, "spec") and getattr(mesh, "size", None) == 1


def _value(value: Any, digest: Any) -> str:
    """A constant: small ones written out, large ones by the hash of their bytes (also fed to ``digest``)."""
    try:
        array = np.asarray(value)
    except Exception:  # an opaque constant (a typed key, a ref): its type and shape stand for it
        return f"{type(value).__name__}{getattr(value, 'shape', '')}"
    if array.dtype == object:
        return _ADDRESS.sub("", repr(value))
    data = np.ascontiguousarray(array).tobytes()
    if len(data) <= 64:
        return f"{array.dtype}{list(array.shape)}:{data.hex()}"
    return f"{array.dtype}{list(array.shape)}:{hashlib.sha256(data).hexdigest()[:16]}"
