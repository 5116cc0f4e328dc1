"""Code that runs at every size: each extent the emitted code writes (a shape's dimension, a slice
bound, ``top_k``'s k, a scalar such as RoPE's ``/ head_dim``, the softmax scale ``sqrt(head_dim)`` or a
window) is written from what it really follows, an input's axis (``wo.shape[0]``, half of
``q_norm.shape[0]``) or integer size parameters (``heads``, ``heads // kv_heads``), chosen as the one
expression that gives its value at every size the computation was traced at. Sizes only traced to tell
coincidences apart (a task's ``cpu`` size with each free parameter moved by its own number of steps, where a
batch of one is two and a chunk count no longer equals the groups; a layer's ``cpu`` size with one parameter
doubled) take part in the choice too, so an extent that merely equals another at the sizes that matter is not written from the wrong
one. Layer regions (:mod:`maxkernel.extract`) and rewritten references (:mod:`maxkernel.rewrites.source`)
are emitted this way."""

from __future__ import annotations

from itertools import permutations
from typing import Any

import numpy as np

from maxkernel.analysis.program import Const, Node, Program, Var
from maxkernel.rewrites.emit import EmitError, Emitter, dtype_expr, input_dims

Key = tuple[Any, ...]
"""A candidate expression: ``("axes", ((input, axis), ...))`` (their product), ``("half", (input, axis))``,
``("part", (input, axis, divisor))`` (an axis cut into chunks of a power of two: ``seq // 128``),
``("static", text)``, or ``("literal", value)`` (an extent the same at every size that no axis gives); a
float scalar's key is ``(transform, candidate key)``, transform one of :data:`SCALES`."""

SCALES = {"same": lambda v: v, "sqrt": lambda v: v ** 0.5, "rsqrt": lambda v: 1 / v ** 0.5}
SCALE_TEXT = {"same": "{}", "sqrt": "{} ** 0.5", "rsqrt": "1 / {} ** 0.5"}


class _EverySize(dict):
    """Input dimensions by size that claim every size: the plain emitter then asks :meth:`SizedEmitter.dim`
    for every extent (a mean's count too), so each size writes the same sites whatever coincides there."""

    def __contains__(self, size: object) -> bool:
        return True


class SizedEmitter(Emitter):
    """Records every extent it writes (a site), and writes the chosen expression for each."""

    def __init__(self, program: Program, choices: list[Key | None] | None = None, size_names: bool = True,
                 statics: bool = False) -> None:
        super().__init__(program, size_names=size_names, rename_inputs=True, statics=statics)
        for var in program.inputs:  # an axis of one here may be two at another size: read it the same way
            for axis, size in enumerate(var.shape):
                if int(size) == 1 and (var.name, axis) not in self.hoisted:
                    self.hoisted[(var.name, axis)] = f"{var.name}_dim{axis}"
                    self.name.fixed.add(self.hoisted[(var.name, axis)])
        order = {(v.name, axis): (i, axis) for i, v in enumerate(program.inputs) for axis in range(len(v.shape))}
        self.hoisted = dict(sorted(self.hoisted.items(), key=lambda item: order[item[0]]))  # the same at every size
        self.known = input_dims(program)
        self.dims = _EverySize(self.known)
        self.choices = choices
        self.sites: list[tuple[str, float, Any]] = []

    def _chosen(self, kind: str, value: float, dtype: Any = None) -> str | None:
        """Record a site; the text of its chosen expression, or None (no choice: the plain emitter's)."""
        call = len(self.sites)
        self.sites.append((kind, value, dtype))
        if self.choices is None:
            return None
        choice = self.choices[call] if call < len(self.choices) else None
        return None if choice is None else self.text(choice)

    def text(self, key: Key) -> str:
        kind, what = key
        if kind in SCALE_TEXT:
            inner = self.text(what)
            return SCALE_TEXT[kind].format(f"({inner})" if " " in inner else inner)
        if kind == "static":
            self.used_statics.update(part for part in what.split() if part.isidentifier())
            return what
        if kind == "literal":
            return str(what)
        names = [v.name for v in self.program.inputs]
        if kind in ("half", "part"):
            pos, axis, divisor = (*what, 2) if kind == "half" else what
            self.used.add((names[pos], axis))
            return f"{self.hoisted[(names[pos], axis)]} // {divisor}"
        axes = [(names[pos], axis) for pos, axis in what]
        self.used.update(axes)
        return " * ".join(self.hoisted[a] for a in axes)

    def dim(self, size: int) -> str:
        text = self._chosen("dim", size)
        if text is not None:
            return text
        return str(size) if self.choices is not None else super().dim(size)

    def operand(self, op: Any, partner: Any = None) -> str:
        if self.statics and isinstance(op, Const) and op.static is not None:  # the argument, at every size
            return self.static_operand(op, partner is not None and isinstance(partner, Var) and partner.dtype == op.dtype)
        numeric = isinstance(op, Const) and not op.shape and np.dtype(op.dtype) != np.bool_ and (
            np.issubdtype(np.dtype(op.dtype), np.floating) or np.issubdtype(np.dtype(op.dtype), np.integer))
        if numeric:
            text = self._chosen("scale", float(np.asarray(op.value)), np.dtype(op.dtype))
            if text is not None:
                bare = partner is not None and isinstance(partner, Var) and partner.dtype == op.dtype
                return (f"({text})" if " " in text else text) if bare else f"jnp.asarray({text}, dtype={dtype_expr(op.dtype)})"
        return super().operand(op, partner)

    def line(self, node: Node) -> str:
        if node.prim == "slice":
            return self._slice(node)
        if node.prim == "reshape":
            return self._reshape(node)
        if node.prim == "broadcast_in_dim":
            return self._broadcast(node)
        if node.prim == "top_k":
            text = super().line(node)
            k = int(node.params["k"])
            return text[: text.rindex(",")] + f", {self._chosen('index', k) or k})"
        return super().line(node)

    def _reshape(self, n: Node) -> str:
        """A reshape whose one extent no expression gives is ``-1`` (it follows from the others at any size)."""
        if n.params.get("dimensions") is not None:
            raise EmitError("reshape with dimensions")
        sizes = [int(d) for d in n.params["new_sizes"]]
        chosen = [self._chosen("dim", d) for d in sizes]
        if self.choices is None:  # as the plain emitter: the one size no input has is -1
            open_ = [i for i, d in enumerate(sizes) if d > 1 and d not in self.known]
            chosen = [super(SizedEmitter, self).dim(d) if d in self.known or d <= 1 else str(d) for d in sizes]
        else:
            open_ = [i for i, (d, c) in enumerate(zip(sizes, chosen)) if d > 1 and c is None]
            chosen = [c if c is not None else str(d) for d, c in zip(sizes, chosen)]
        if len(open_) == 1:
            chosen[open_[0]] = "-1"
        return f"{self.operand(n.ins[0])}.reshape({_tuple(chosen)})"

    def _broadcast(self, n: Node) -> str:
        """A broadcast whose axis taken from the operand is the operand's own (``x.shape[0]``) where it is as
        long as the result's at every size, and an extent like any other where it is widened (a length-one
        axis widened to a batch that is one at some size)."""
        operand, shape = n.ins[0], [int(d) for d in n.params["shape"]]
        dims = tuple(int(d) for d in n.params["broadcast_dimensions"])
        source = {target: axis for axis, target in enumerate(dims)} if isinstance(operand, Var) else {}
        parts = []
        for i, d in enumerate(shape):
            if i not in source:
                parts.append(self.dim(d))
                continue
            axis = source[i]
            same = int(operand.shape[axis]) == d
            call = len(self.sites)
            self.sites.append(("kept", 1.0 if same else 0.0, None))
            widened = self.dim(d)
            kept = same if self.choices is None or call >= len(self.choices) else self.choices[call] == ("kept", True)
            parts.append(f"{self.name(operand)}.shape[{axis}]" if kept else widened)
        return f"jax.lax.broadcast_in_dim({self.operand(operand)}, {_tuple(parts)}, {dims})"

    def _slice(self, n: Node) -> str:
        """A static slice whose bounds are sites (RoPE's half-width); a bound at an axis' end reads that end."""
        operand = n.ins[0]
        starts = [self._chosen("index", int(d)) or str(int(d)) for d in n.params["start_indices"]]
        ends = []
        for axis, d in enumerate(int(d) for d in n.params["limit_indices"]):
            if isinstance(operand, Var) and d == int(operand.shape[axis]):  # to the end, at every size
                self._chosen("end", d)
                ends.append(f"{self.name(operand)}.shape[{axis}]")
            else:
                ends.append(self._chosen("index", d) or str(d))
        strides = n.params.get("strides")
        extra = f", {tuple(int(s) for s in strides)}" if strides is not None else ""
        return f"jax.lax.slice({self.operand(operand)}, {_tuple(starts)}, {_tuple(ends)}{extra})"


def _tuple(parts: list[str]) -> str:
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def integer_statics(static: dict[str, Any], minimum: int = 2) -> dict[str, int]:
    """The layer's static arguments that are size parameters (integers of at least ``minimum``: a count of
    one is left out where nothing moves it, since it would match every axis of one)."""
    return {k: v for k, v in static.items() if isinstance(v, int) and not isinstance(v, bool) and v >= minimum}


def candidates(program: Program, statics: dict[str, int]) -> dict[Key, int]:
    """Every expression an extent may be written as, with its value at this program's size, in the order
    preferred: an input's axis, a product of two adjacent axes (a flattening reshape), half an axis, a size
    parameter, a quotient, product or sum of two (MLA's ``nope_dim + rope_dim``), half of one."""
    found: dict[Key, int] = {}
    shapes = [tuple(int(d) for d in v.shape) for v in program.inputs]
    for pos, shape in enumerate(shapes):  # an axis of one too: a batch of one at one size is two at another
        for axis, size in enumerate(shape):
            found[("axes", ((pos, axis),))] = size
    for pos, shape in enumerate(shapes):
        for axis in range(len(shape) - 1):
            if shape[axis] * shape[axis + 1] > 1:
                found[("axes", ((pos, axis), (pos, axis + 1)))] = shape[axis] * shape[axis + 1]
    for pos, shape in enumerate(shapes):
        for axis, size in enumerate(shape):
            if size > 2 and size % 2 == 0:
                found[("half", (pos, axis))] = size // 2
    names = sorted(statics)
    for n in names:
        found[("static", n)] = statics[n]
    for a, b in permutations(names, 2):
        if statics[a] % statics[b] == 0:
            found[("static", f"{a} // {b}")] = statics[a] // statics[b]
    for a, b in permutations(names, 2):
        if a < b:
            found[("static", f"{a} * {b}")] = statics[a] * statics[b]
    for a, b in permutations(names, 2):
        if a < b:
            found[("static", f"{a} + {b}")] = statics[a] + statics[b]
    for n in names:
        if statics[n] > 2 and statics[n] % 2 == 0:
            found[("static", f"{n} // 2")] = statics[n] // 2
    for pos, shape in enumerate(shapes):  # a sequence in chunks: the chunk count
        for axis, size in enumerate(shape):
            for divisor in (2 ** k for k in range(2, 13)):
                if size >= divisor and size % divisor == 0:
                    found[("part", (pos, axis, divisor))] = size // divisor
    return found


Site = tuple[str, float, Any]
Record = tuple[list[Site], dict[Key, int]]


def record(program: Program, statics: dict[str, int], static_args: bool = False) -> Record:
    """The sites of ``program`` in the order the emitter writes them, and the candidates at its size
    (``static_args``: as an emitter that writes static literals as their names sees them)."""
    em = SizedEmitter(program, statics=static_args)
    em.body()
    em.returns()
    return em.sites, candidates(program, statics)


def _fits(kind: str, dtype: Any, values: list[float], cands: list[dict[Key, int]], axes_for_constants: bool = False) -> Key | None:
    """The first candidate (of the first size's order) that gives the site's value at every size
    (``axes_for_constants``: an extent that is the same at every size is read only from an input's axis, as
    that tensor's own dimension; a product or a part of axes would be a coincidence, and its literal reads
    better)."""
    if kind in ("dim", "index"):
        if not all(float(v).is_integer() and v >= 1 for v in values) or max(values) == 1:
            return None
        constant = axes_for_constants and len(set(values)) == 1
        for key in cands[0]:
            if constant and (key[0] != "axes" or len(key[1]) > 1):
                continue
            if all(c.get(key) == v for c, v in zip(cands, values)):
                return key
        return ("literal", int(values[0])) if constant else None
    if len(set(values)) == 1:  # a scalar that is the same at every size is a literal of the layer's
        return None
    integer = np.issubdtype(dtype, np.integer)
    for transform, f in SCALES.items() if not integer else [("same", SCALES["same"])]:
        for key in cands[0]:
            if all(key in c and float(np.asarray(f(c[key]), dtype)) == v for c, v in zip(cands, values)):
                return (transform, key)
    return None


def choose(records: dict[str, Record], probes: dict[str, Record] | None = None,
           axes_for_constants: bool = False) -> list[Key | None] | None:
    """For each site, the expression that gives its value at every size of ``records`` and of the probes
    that write the same site there; None where none does, or where the sizes write the site as different
    things. None overall when the sizes of ``records`` write different numbers of sites."""
    sizes = list(records)
    if not sizes:
        return None
    count = len(records[sizes[0]][0])
    if any(len(records[s][0]) != count for s in sizes):
        return None
    extra = [r for r in (probes or {}).values() if len(r[0]) == count]
    choices: list[Key | None] = []
    for call in range(count):
        kind, _, dtype = records[sizes[0]][0][call]
        if any(records[s][0][call][0::2] != (kind, dtype) for s in sizes) or kind == "end":
            choices.append(None)
            continue
        evidence = [records[s] for s in sizes] + [r for r in extra if r[0][call][0::2] == (kind, dtype)]
        if kind == "kept":  # an axis the broadcast keeps at every size, not one it widens at some
            choices.append(("kept", all(sites[call][1] == 1.0 for sites, _ in evidence)))
            continue
        choices.append(_fits(kind, dtype, [sites[call][1] for sites, _ in evidence], [c for _, c in evidence],
                             axes_for_constants))
    return choices


def emit_sized(program: Program, name: str, doc: str | None, choices: list[Key | None] | None,
               size_names: bool = True, statics: bool = False) -> tuple[str, set[str]]:
    """``def name(inputs..., *, statics):`` with the chosen expressions; the statics it reads
    (``statics``: float statics marked on its literals too, :mod:`maxkernel.analysis.statics`)."""
    em = SizedEmitter(program, choices, size_names, statics=statics)
    body = em.body()
    returns = em.returns()
    params = ", ".join(em.name(v) for v in program.inputs)
    head = em.header(name, params)
    return "\n".join([head, *([f'    """{doc}"""'] if doc else []), *body, f"    return {returns}"]), set(em.used_statics)


def keywords(source: str) -> list[str]:
    """The keyword-only arguments of the function ``source`` begins with: the statics an emitted function
    reads by name, which its caller passes."""
    head = source.partition("\n")[0]
    return [n.strip() for n in head.partition("*,")[2].rstrip("):").split(",") if n.strip()] if "*," in head else []


def emit_every_size(programs: list[Program], name: str, doc: str | None = None, statics: bool = False,
                    integers: list[dict[str, int]] | None = None,
                    probes: list[tuple[Program, dict[str, int]]] | None = None) -> str | None:
    """One function that is the code of every program (one computation traced at several sizes; the first
    names the dimensions), each extent read from the input axes that give it at all of them; None where
    the programs differ in structure or an extent that changes between them follows no input axis (a
    literal would be right at one size only). ``statics``: literals that are float statics are written as
    their names, keyword-only arguments of the function. ``integers``: each program's integer statics, which
    an extent may also be written as (by name: the caller puts them in scope). ``probes``: programs at sizes
    traced only to tell coincidences apart (with their integer statics), which take part in each choice where
    they write the same site."""
    if len(programs) < 2:
        return None
    records = {str(i): record(program, (integers or [{}] * len(programs))[i], statics) for i, program in enumerate(programs)}
    seen = {f"probe{i}": record(program, ints, statics) for i, (program, ints) in enumerate(probes or [])}
    choices = choose(records, seen, axes_for_constants=True)
    if choices is None:
        return None
    try:  # written with the axis names alone, the code is the same text at every size or it is not shared
        plain = {emit_sized(program, name, doc, choices, size_names=False, statics=statics)[0] for program in programs}
    except EmitError:
        return None
    if len(plain) != 1:
        return None
    return emit_sized(programs[0], name, doc, choices, statics=statics)[0]
