"""Program → readable JAX source: the shared back end of rewrites and Pallas template bodies.

Each primitive is written as the ``jnp``/``jax.lax`` call a person would write, with its static
parameters spelled out, so the emitted candidate can be read and edited. A primitive without a
faithful spelling raises ``EmitError``: such tasks get no source-level rewrite rather than a wrong one.

Shapes are written from the inputs (``x.shape[0]``, ``x.shape[0] * x.shape[1]`` for a flattened pair)
wherever a traced dimension equals one of theirs, so the function serves other sizes than the one it was
traced at; the evaluator's unseen-size check is what proves a given candidate does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from maxkernel.analysis.program import Const, Node, Operand, Program, Var
from maxkernel.analysis.statics import static_text
from maxkernel.rewrites.names import Namer


class EmitError(Exception):
    """The program holds something that cannot be written as candidate source."""


INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
         "eq": "==", "ne": "!=", "and": "&", "or": "|", "rem": "%"}
BINARY_CALLS = {"max": "jnp.maximum", "min": "jnp.minimum", "pow": "jax.lax.pow", "atan2": "jnp.arctan2",
                "nextafter": "jnp.nextafter", "shift_right_logical": "jax.lax.shift_right_logical",
                "shift_left": "jax.lax.shift_left", "xor": "jnp.bitwise_xor"}
UNARY_CALLS = {"exp": "jnp.exp", "exp2": "jnp.exp2", "log": "jnp.log", "log1p": "jnp.log1p", "expm1": "jnp.expm1",
               "tanh": "jnp.tanh", "logistic": "jax.nn.sigmoid", "rsqrt": "jax.lax.rsqrt", "sqrt": "jnp.sqrt",
               "abs": "jnp.abs", "sign": "jnp.sign", "square": "jnp.square", "erfc": "jax.lax.erfc", "erf": "jax.lax.erf",
               "erf_inv": "jax.lax.erf_inv", "is_finite": "jnp.isfinite", "sin": "jnp.sin", "cos": "jnp.cos",
               "tan": "jnp.tan", "floor": "jnp.floor", "ceil": "jnp.ceil", "round": "jnp.round", "not": "jnp.logical_not",
               "cbrt": "jnp.cbrt", "reciprocal": "jnp.reciprocal", "stop_gradient": "jax.lax.stop_gradient",
               "real": "jnp.real", "imag": "jnp.imag", "asin": "jnp.arcsin", "acos": "jnp.arccos", "atan": "jnp.arctan",
               "sinh": "jnp.sinh", "cosh": "jnp.cosh", "asinh": "jnp.arcsinh", "acosh": "jnp.arccosh", "atanh": "jnp.arctanh",
               "lgamma": "jax.lax.lgamma", "digamma": "jax.lax.digamma", "population_count": "jax.lax.population_count"}
REDUCTIONS = {"reduce_sum": "jnp.sum", "reduce_max": "jnp.max", "reduce_min": "jnp.min", "reduce_prod": "jnp.prod",
              "reduce_and": "jnp.all", "reduce_or": "jnp.any"}


def dtype_expr(dtype: Any) -> str:
    name = np.dtype(dtype).name
    return "jnp.bool_" if name == "bool" else f"jnp.{name}"


def scalar_text(value: Any) -> str:
    """A Python literal for a scalar (inf and nan spelled through jnp)."""
    value = np.asarray(value).item()
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "jnp.nan"
        if math.isinf(value):
            return "jnp.inf" if value > 0 else "-jnp.inf"
        return repr(value)
    return repr(value)


def const_expr(c: Const, bare: bool) -> str:
    """A constant: a bare literal where JAX's weak typing keeps the partner's dtype, else typed."""
    uniform = c.scalar()
    if not c.shape:
        text = scalar_text(c.value)
        return text if bare else f"jnp.asarray({text}, dtype={dtype_expr(c.dtype)})"
    if uniform is not None:
        return f"jnp.full({tuple(c.shape)}, {scalar_text(uniform)}, dtype={dtype_expr(c.dtype)})"
    if c.size <= 256:
        values = np.asarray(c.value).tolist()
        return f"jnp.asarray({values!r}, dtype={dtype_expr(c.dtype)})"
    raise EmitError(f"a captured constant array of shape {c.shape} is too large to write out")


def input_dims(program: Program) -> dict[int, tuple[tuple[str, int], ...]]:
    """Each dimension size (above 1) of the inputs, as the input axes whose product it is: single axes
    first, then products of adjacent axes (what flattening reshapes produce)."""
    found: dict[int, tuple[tuple[str, int], ...]] = {}
    for var in program.inputs:
        for axis, size in enumerate(var.shape):
            if int(size) > 1:
                found.setdefault(int(size), ((var.name, axis),))
    for var in program.inputs:
        for axis in range(len(var.shape) - 1):
            a, b = int(var.shape[axis]), int(var.shape[axis + 1])
            if a > 1 and b > 1:
                found.setdefault(a * b, ((var.name, axis), (var.name, axis + 1)))
    return found


def dim_name(program: Program, name: str, axis: int, size: int, size_names: bool) -> str:
    """The local that holds an input's dimension: the task's size parameter where its value says which
    (``batch``), else the input and axis (``x_dim1``)."""
    if size_names and size in program.dim_names:
        return program.dim_names[size]
    return f"{name}_dim{axis}"


class Emitter:
    """Writes the nodes of one program as assignment lines."""

    def __init__(self, program: Program, size_names: bool = True, rename_inputs: bool = False,
                 slice_extents: bool = False, statics: bool = False) -> None:
        self.program = program
        self.statics = statics  # a literal that is a static argument is written as its name
        self.used_statics: set[str] = set()
        self.slice_extents = slice_extents  # a slice as long as an input dimension follows that dimension
        self.dims = input_dims(program)
        shapes = {v.name: tuple(int(d) for d in v.shape) for v in program.inputs}
        # Every input dimension a shape may read, as the local it is read into once, at the top.
        self.hoisted: dict[tuple[str, int], str] = {}
        for name, shape in shapes.items():
            for axis, size in enumerate(shape):
                if size > 1:
                    local = dim_name(program, name, axis, size, size_names)
                    if local in self.hoisted.values() or local in shapes:
                        local = f"{name}_dim{axis}"
                    self.hoisted[(name, axis)] = local
        self.used: set[tuple[str, int]] = set()
        self.name = Namer(program, fixed=self.hoisted.values(), rename_inputs=rename_inputs)
        self.producers = program.producers()

    def shape(self, dims: Any) -> str:
        """A shape tuple whose dimensions are read from the inputs where one of theirs matches."""
        parts = [self.dim(int(d)) for d in dims]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"

    def dim(self, size: int) -> str:
        axes = self.dims.get(size)
        if axes is None:
            return str(size)
        self.used.update(axes)
        return " * ".join(self.hoisted[a] for a in axes)

    def operand(self, op: Operand, partner: Operand | None = None) -> str:
        if isinstance(op, Var):
            return self.name(op)
        bare = partner is not None and isinstance(partner, Var) and partner.dtype == op.dtype and not op.shape
        if self.statics and op.static is not None:
            return self.static_operand(op, bare)
        return const_expr(op, bare)

    def static_operand(self, op: Const, bare: bool) -> str:
        """A literal that is a static argument, as the expression of its name (weakly typed where bare, as
        the reference's own Python float is)."""
        assert op.static is not None
        self.used_statics.add(op.static[0])
        text = static_text(op.static)
        if bare:
            return f"({text})" if " " in text or text.startswith("-") else text
        return f"jnp.asarray({text}, dtype={dtype_expr(op.dtype)})"

    def header(self, name: str, params: str) -> str:
        """``def name(params):``, with the statics the body read as keyword-only arguments."""
        used = sorted(self.used_statics)
        keywords = "*, " + ", ".join(used) if used else ""
        return f"def {name}({', '.join(part for part in (params, keywords) if part)}):"

    def line(self, node: Node) -> str:
        emit = _EMITTERS.get(node.prim)
        if emit is None:
            if node.prim in ("div", "rem") and not np.issubdtype(node.out.dtype, np.floating):
                a, b = node.ins  # integer division truncates in lax; Python's // and % floor
                return f"jax.lax.{node.prim}({self.operand(a)}, {self.operand(b)})"
            count = self.counted(node)
            if count is not None:  # a mean: divided by how many it summed, at whatever size it runs
                return f"{self.operand(node.ins[0])} / {count}"
            if node.prim == "rem":
                return f"jax.lax.rem({self.operand(node.ins[0])}, {self.operand(node.ins[1])})"
            if node.prim in ("lt_to", "le_to") and all(np.issubdtype(np.dtype(op.dtype), np.integer) for op in node.ins):
                a, b = node.ins  # total-order comparisons equal the plain ones on integers
                return f"{self.operand(a, b)} {'<' if node.prim == 'lt_to' else '<='} {self.operand(b, a)}"
            if node.prim in INFIX:
                a, b = node.ins
                return f"{self.operand(a, b)} {INFIX[node.prim]} {self.operand(b, a)}"
            if node.prim in BINARY_CALLS:
                a, b = node.ins
                if BINARY_CALLS[node.prim].startswith("jax.lax."):  # lax does not promote a bare literal
                    return f"{BINARY_CALLS[node.prim]}({self.operand(a)}, {self.operand(b)})"
                return f"{BINARY_CALLS[node.prim]}({self.operand(a, b)}, {self.operand(b, a)})"
            if node.prim in UNARY_CALLS:
                return f"{UNARY_CALLS[node.prim]}({self.operand(node.ins[0])})"
            if node.prim in REDUCTIONS:
                axes = tuple(int(a) for a in node.params["axes"])
                return f"{REDUCTIONS[node.prim]}({self.operand(node.ins[0])}, axis={axes})"
            raise EmitError(f"no source spelling for primitive {node.prim!r}")
        return emit(self, node)

    def counted(self, node: Node) -> str | None:
        """For ``sum / n`` where ``n`` is the number of elements the sum reduced (how ``jnp.mean`` and
        ``jnp.var`` divide), those extents as the input dimensions they are (``hidden``, ``batch * seq``);
        None for any other division, or when an extent is no input's dimension."""
        if node.prim != "div" or len(node.ins) != 2:
            return None
        a, b = node.ins
        if not isinstance(b, Const) or b.shape or not isinstance(a, Var) or (self.statics and b.static):
            return None
        if not np.issubdtype(np.dtype(b.dtype), np.floating):
            return None
        producers = self.producers
        source = producers.get(a)
        while source is not None and source.prim in ("broadcast_in_dim", "reshape", "convert_element_type",
                                                     "expand_dims", "squeeze"):
            source = producers.get(source.ins[0]) if isinstance(source.ins[0], Var) else None
        if source is None or source.prim != "reduce_sum" or not isinstance(source.ins[0], Var):
            return None
        sizes = [int(source.ins[0].shape[axis]) for axis in source.params["axes"]]
        sizes = [size for size in sizes if size > 1]
        if not sizes or float(np.prod(sizes)) != float(b.value) or any(size not in self.dims for size in sizes):
            return None
        parts = [self.dim(size) for size in sizes]
        return parts[0] if len(parts) == 1 else "(" + " * ".join(parts) + ")"

    def body(self, indent: str = "    ") -> list[str]:
        """The assignments, after the input dimensions they read; each rewrite is stated in a comment at
        the first line it made or changed."""
        lines = []
        stated: set[str] = set()
        for index, node in enumerate(self.program.nodes):
            for note in node.notes:
                if note not in stated:
                    stated.add(note)
                    lines.append(f"{indent}# {note}")
            target = ", ".join(self.name(o) for o in node.outs)
            if node.prim == "scan":
                lines.extend(self.scan(node, f"_step_{index}", indent))
                continue
            if len(node.outs) == 1 and not node.primitive.multiple_results:
                lines.append(f"{indent}{target} = {self.line(node)}")
            else:
                lines.append(f"{indent}{target}{',' if len(node.outs) == 1 else ''} = {self.line(node)}")
        lines.extend(f"{indent}# {note}" for note in self.program.notes if note not in stated)
        self.returns()  # the outputs' shapes may read dimensions too
        shown = {v.name: self.name(v) for v in self.program.inputs}
        hoists = [f"{indent}{local} = {shown[name]}.shape[{axis}]" for (name, axis), local in self.hoisted.items()
                  if (name, axis) in self.used]
        return hoists + lines

    def scan(self, node: Node, name: str, indent: str) -> list[str]:
        """A ``lax.scan``: its body as a nested function of (consts, carry, xs) returning (carry, ys)."""
        from maxkernel.analysis.program import ProgramBuilder

        p = node.params
        consts, carries = int(p["num_consts"]), int(p["num_carry"])
        closed = p["jaxpr"]
        count = len(closed.jaxpr.invars)
        names = [f"k{i}" for i in range(consts)] + [f"c{i}" for i in range(carries)] + \
                [f"x{i}" for i in range(count - consts - carries)]
        body = ProgramBuilder().build(closed, names)
        body.out_tree = jax.tree_util.tree_structure(tuple(range(len(body.outputs))))
        nested = emit_function(body, name).splitlines()
        ops = [self.operand(op) for op in node.ins]
        fixed, init, xs = ops[:consts], ops[consts:consts + carries], ops[consts + carries:]
        call = (f"jax.lax.scan(lambda c, x: (lambda r: (r[:{carries}], r[{carries}:]))({name}("
                f"{''.join(a + ', ' for a in fixed)}*c, *x)), ({''.join(a + ', ' for a in init)}), "
                f"({''.join(a + ', ' for a in xs)}), length={self.dim(int(p['length']))}, reverse={bool(p['reverse'])})")
        targets = ", ".join(self.name(o) for o in node.outs)
        return [indent + line for line in nested] + [
            f"{indent}{name}_out = {call}",
            f"{indent}{targets}{',' if len(node.outs) == 1 else ''} = (*{name}_out[0], *{name}_out[1])"]

    def returns(self) -> str:
        outs = [self.operand(o) for o in self.program.outputs]
        tree = self.program.out_tree
        if tree is None or tree.num_leaves == 1 and tree == jax.tree_util.tree_structure(0):
            if len(outs) != 1:
                raise EmitError("expected a single output")
            return outs[0]
        if tree == jax.tree_util.tree_structure(tuple(range(len(outs)))):
            return "(" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")"
        raise EmitError(f"output structure {tree} is not an array or a flat tuple")


def emit_function(program: Program, name: str, doc: str | None = None, size_names: bool = True,
                  slice_extents: bool = False, statics: bool = False) -> str:
    """``def name(inputs...):`` computing the program's outputs (``size_names``: input dimensions held
    in locals named after the task's size parameters where their values tell them apart;
    ``slice_extents``: a slice whose length is an input dimension is written as that dimension, so one
    body serves every size of it — the evaluator proves the reading at the sizes it draws; ``statics``:
    the literals that are static arguments (:mod:`maxkernel.analysis.statics`) written as their names,
    which become keyword-only arguments, ``def name(inputs..., *, scaling_factor):``)."""
    em = Emitter(program, size_names, rename_inputs=True, slice_extents=slice_extents, statics=statics)
    params = ", ".join(em.name(v) for v in program.inputs)
    body = em.body()
    returns = em.returns()
    lines = [em.header(name, params)]
    if doc:
        lines.append(f'    """{doc}"""')
    lines.extend(body)
    lines.append(f"    return {returns}")
    return "\n".join(lines)


# --- primitives with structured parameters ---------------------------------------------------------


def _broadcast(em: Emitter, n: Node) -> str:
    dims = tuple(int(d) for d in n.params["broadcast_dimensions"])
    operand, shape = n.ins[0], [int(d) for d in n.params["shape"]]
    kept: dict[int, str] = {}
    if isinstance(operand, Var):  # a kept dimension is the operand's own: read it there, never by its size
        for axis, target in enumerate(dims):  # (a size-1 batch too: it follows the operand at any other batch)
            if int(operand.shape[axis]) == shape[target]:
                kept[target] = f"{em.name(operand)}.shape[{axis}]"
    parts = [kept[i] if i in kept else em.dim(d) for i, d in enumerate(shape)]
    text = "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
    return f"jax.lax.broadcast_in_dim({em.operand(operand)}, {text}, {dims})"


def _reshape(em: Emitter, n: Node) -> str:
    if n.params.get("dimensions") is not None:
        raise EmitError("reshape with dimensions")
    sizes = [int(d) for d in n.params["new_sizes"]]
    unread = [i for i, d in enumerate(sizes) if d > 1 and d not in em.dims]
    parts = ["-1" if len(unread) == 1 and i == unread[0] else em.dim(d) for i, d in enumerate(sizes)]
    # (the one size no input names follows from the others, whatever the size)
    return f"{em.operand(n.ins[0])}.reshape(({', '.join(parts)}{',' if len(parts) == 1 else ''}))"


def _convert(em: Emitter, n: Node) -> str:
    return f"{em.operand(n.ins[0])}.astype({dtype_expr(n.params['new_dtype'])})"


def _precision(p: Any) -> str:
    if p is None:
        return "None"
    if isinstance(p, tuple):
        return "(" + ", ".join(_precision(x) for x in p) + ")"
    if isinstance(p, jax.lax.Precision):
        return f"jax.lax.Precision.{p.name}"
    raise EmitError(f"precision {p!r}")


def _dot(em: Emitter, n: Node) -> str:
    (lc, rc), (lb, rb) = n.params["dimension_numbers"]
    dn = ((tuple(lc), tuple(rc)), (tuple(lb), tuple(rb)))
    pet = n.params.get("preferred_element_type")
    extra = f", preferred_element_type={dtype_expr(pet)}" if pet is not None else ""
    return (f"jax.lax.dot_general({em.operand(n.ins[0])}, {em.operand(n.ins[1])}, {dn}, "
            f"precision={_precision(n.params.get('precision'))}{extra})")


def _transpose(em: Emitter, n: Node) -> str:
    return f"jnp.transpose({em.operand(n.ins[0])}, {tuple(int(p) for p in n.params['permutation'])})"


def _squeeze(em: Emitter, n: Node) -> str:
    return f"jax.lax.squeeze({em.operand(n.ins[0])}, {tuple(int(d) for d in n.params['dimensions'])})"


def _expand(em: Emitter, n: Node) -> str:
    return f"jax.lax.expand_dims({em.operand(n.ins[0])}, {tuple(int(d) for d in n.params['dimensions'])})"


def _iota(em: Emitter, n: Node) -> str:
    return f"jax.lax.broadcasted_iota({dtype_expr(n.params['dtype'])}, {em.shape(n.params['shape'])}, {int(n.params['dimension'])})"


def _select(em: Emitter, n: Node) -> str:
    ops = ", ".join(em.operand(o, n.ins[1] if i == 0 else next((x for x in n.ins[1:] if isinstance(x, Var)), None))
                    for i, o in enumerate(n.ins))
    return f"jax.lax.select_n({ops})"


def _slice(em: Emitter, n: Node) -> str:
    start = tuple(int(d) for d in n.params["start_indices"])
    limit = [int(d) for d in n.params["limit_indices"]]
    operand = n.ins[0]
    # A slice that runs to the end of an axis runs to the end at every size: say so, not the traced length.
    ends = [f"{em.name(operand)}.shape[{axis}]" if isinstance(operand, Var) and d == int(operand.shape[axis]) > 1 else str(d)
            for axis, d in enumerate(limit)]
    if em.slice_extents:
        ends = [f"{s} + {em.dim(d - s)}" if e == str(d) and d - s > 1 and d - s in em.dims else e
                for e, s, d in zip(ends, start, limit)]
    strides = n.params.get("strides")
    extra = f", {tuple(int(s) for s in strides)}" if strides is not None else ""
    limit_text = "(" + ", ".join(ends) + ("," if len(ends) == 1 else "") + ")"
    return f"jax.lax.slice({em.operand(operand)}, {start}, {limit_text}{extra})"


def _dynamic_slice(em: Emitter, n: Node) -> str:
    idx = ", ".join(em.operand(o) for o in n.ins[1:])
    sizes = tuple(int(d) for d in n.params["slice_sizes"])
    return f"jax.lax.dynamic_slice({em.operand(n.ins[0])}, ({idx},), {sizes})"


def _concat(em: Emitter, n: Node) -> str:
    return f"jax.lax.concatenate([{', '.join(em.operand(o) for o in n.ins)}], {int(n.params['dimension'])})"


def _split(em: Emitter, n: Node) -> str:
    cuts = [int(c) for c in np.cumsum([int(size) for size in n.params["sizes"]])[:-1]]
    return f"jnp.split({em.operand(n.ins[0])}, {cuts}, axis={int(n.params['axis'])})"


def _stack(em: Emitter, n: Node) -> str:
    return f"jnp.stack([{', '.join(em.operand(o) for o in n.ins)}], axis={int(n.params['axis'])})"


def _copy(em: Emitter, n: Node) -> str:
    return em.operand(n.ins[0])


def _neg(em: Emitter, n: Node) -> str:
    return f"-{em.operand(n.ins[0])}"


def _integer_pow(em: Emitter, n: Node) -> str:
    return f"jax.lax.integer_pow({em.operand(n.ins[0])}, {int(n.params['y'])})"


def _cumulative(name: str) -> Callable[[Emitter, Node], str]:
    def emit(em: Emitter, n: Node) -> str:
        return f"jax.lax.{name}({em.operand(n.ins[0])}, axis={int(n.params['axis'])}, reverse={bool(n.params['reverse'])})"

    return emit


def _argminmax(name: str) -> Callable[[Emitter, Node], str]:
    def emit(em: Emitter, n: Node) -> str:
        (axis,) = n.params["axes"]
        return f"jax.lax.{name}({em.operand(n.ins[0])}, {int(axis)}, {dtype_expr(n.params['index_dtype'])})"

    return emit


def _conv(em: Emitter, n: Node) -> str:
    p = n.params
    dn = p["dimension_numbers"]
    dn_text = (f"jax.lax.ConvDimensionNumbers(lhs_spec={tuple(dn.lhs_spec)}, rhs_spec={tuple(dn.rhs_spec)}, "
               f"out_spec={tuple(dn.out_spec)})")
    pad = tuple((int(a), int(b)) for a, b in p["padding"])
    pet = p.get("preferred_element_type")
    extra = f", preferred_element_type={dtype_expr(pet)}" if pet is not None else ""
    return (f"jax.lax.conv_general_dilated({em.operand(n.ins[0])}, {em.operand(n.ins[1])}, "
            f"window_strides={tuple(p['window_strides'])}, padding={pad}, lhs_dilation={tuple(p['lhs_dilation'])}, "
            f"rhs_dilation={tuple(p['rhs_dilation'])}, dimension_numbers={dn_text}, "
            f"feature_group_count={int(p['feature_group_count'])}, batch_group_count={int(p['batch_group_count'])}, "
            f"precision={_precision(p.get('precision'))}{extra})")


def _gather(em: Emitter, n: Node) -> str:
    p = n.params
    dn = p["dimension_numbers"]
    fields = ["offset_dims", "collapsed_slice_dims", "start_index_map", "operand_batching_dims", "start_indices_batching_dims"]
    dn_text = ", ".join(f"{f}={tuple(int(x) for x in getattr(dn, f))}" for f in fields)
    fill = p.get("fill_value")
    return (f"jax.lax.gather({em.operand(n.ins[0])}, {em.operand(n.ins[1])}, "
            f"dimension_numbers=jax.lax.GatherDimensionNumbers({dn_text}), "
            f"slice_sizes={tuple(int(s) for s in p['slice_sizes'])}, indices_are_sorted={bool(p['indices_are_sorted'])}, "
            f"unique_indices={bool(p['unique_indices'])}, mode=jax.lax.GatherScatterMode.{p['mode'].name}, "
            f"fill_value={None if fill is None else scalar_text(fill)})")


SCATTERS = {"scatter": "jax.lax.scatter", "scatter-add": "jax.lax.scatter_add", "scatter_add": "jax.lax.scatter_add",
            "scatter-mul": "jax.lax.scatter_mul", "scatter-min": "jax.lax.scatter_min", "scatter-max": "jax.lax.scatter_max"}


def _scatter(em: Emitter, n: Node) -> str:
    p = n.params
    if p.get("update_consts"):
        raise EmitError("a scatter whose update reads constants")
    dn = p["dimension_numbers"]
    fields = ["update_window_dims", "inserted_window_dims", "scatter_dims_to_operand_dims", "operand_batching_dims",
              "scatter_indices_batching_dims"]
    dn_text = ", ".join(f"{f}={tuple(int(x) for x in getattr(dn, f))}" for f in fields)
    operand, indices, updates = (em.operand(op) for op in n.ins)
    return (f"{SCATTERS[n.prim]}({operand}, {indices}, {updates}, "
            f"dimension_numbers=jax.lax.ScatterDimensionNumbers({dn_text}), "
            f"indices_are_sorted={bool(p['indices_are_sorted'])}, unique_indices={bool(p['unique_indices'])}, "
            f"mode=jax.lax.GatherScatterMode.{p['mode'].name})")


def _top_k(em: Emitter, n: Node) -> str:
    axis = n.params.get("axis", -1)
    if axis not in (-1, len(n.ins[0].shape) - 1):
        raise EmitError("top_k over a non-minor axis")
    return f"jax.lax.top_k({em.operand(n.ins[0])}, {int(n.params['k'])})"


def _clamp(em: Emitter, n: Node) -> str:
    lo, x, hi = n.ins
    return f"jax.lax.clamp({em.operand(lo, x)}, {em.operand(x)}, {em.operand(hi, x)})"


def _rev(em: Emitter, n: Node) -> str:
    return f"jax.lax.rev({em.operand(n.ins[0])}, {tuple(int(d) for d in n.params['dimensions'])})"


def _pad(em: Emitter, n: Node) -> str:
    cfg = tuple(tuple(int(v) for v in c) for c in n.params["padding_config"])
    return f"jax.lax.pad({em.operand(n.ins[0])}, {em.operand(n.ins[1], n.ins[0])}, {cfg})"


def _bitcast(em: Emitter, n: Node) -> str:
    return f"jax.lax.bitcast_convert_type({em.operand(n.ins[0])}, {dtype_expr(n.params['new_dtype'])})"


def _random_wrap(em: Emitter, n: Node) -> str:
    return f"jax.random.wrap_key_data({em.operand(n.ins[0])}, impl={n.params['impl'].name!r})"


def _random_unwrap(em: Emitter, n: Node) -> str:
    return f"jax.random.key_data({em.operand(n.ins[0])})"


def _random_bits(em: Emitter, n: Node) -> str:
    width = int(n.params["bit_width"])
    return f"jax.random.bits({em.operand(n.ins[0])}, {em.shape(n.params['shape'])}, jnp.uint{width})"


_EMITTERS: dict[str, Callable[[Emitter, Node], str]] = {
    "broadcast_in_dim": _broadcast, "reshape": _reshape, "convert_element_type": _convert, "dot_general": _dot,
    "transpose": _transpose, "squeeze": _squeeze, "expand_dims": _expand, "iota": _iota, "select_n": _select,
    "slice": _slice, "dynamic_slice": _dynamic_slice, "concatenate": _concat, "split": _split, "stack": _stack, "copy": _copy, "copy_p": _copy,
    "neg": _neg, "integer_pow": _integer_pow, "cumsum": _cumulative("cumsum"), "cummax": _cumulative("cummax"),
    "cumprod": _cumulative("cumprod"), "cummin": _cumulative("cummin"), "argmax": _argminmax("argmax"),
    "argmin": _argminmax("argmin"), "conv_general_dilated": _conv, "gather": _gather, "top_k": _top_k,
    "clamp": _clamp, "rev": _rev, "pad": _pad, "random_wrap": _random_wrap, "random_unwrap": _random_unwrap,
    "random_bits": _random_bits, "bitcast_convert_type": _bitcast, **{name: _scatter for name in SCATTERS},
}


def emittable(program: Program) -> str | None:
    """None when every node can be written out, else the reason it cannot."""
    em = Emitter(program)
    try:
        em.body()
        em.returns()
    except EmitError as exc:
        return str(exc)
    return None
