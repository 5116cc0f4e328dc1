"""Attention whose scores are a sum of products, read as one product of queries and keys joined along the
head dimension.

Latent attention (DeepSeek's MLA) scores each head with two products: its plain part, and a RoPE part whose
key is one per token, shared by every head. The sum of the products of parts equals the product of the
parts laid side by side (``q_nope @ k_nope.T + q_rope @ k_rope.T == [q_nope, q_rope] @ [k_nope, k_rope].T``),
so the flash kernel computes it from queries and keys joined in XLA before the kernel, each part broadcast
over the axes it lacks. The parts are found by data flow: the products whose results are added to make the
scores that the softmax and the values' product read; each operand is traced to the argument it reads
through exact casts, sums over axes of one and transposes. The reference is rewritten as a program of the
joined queries and keys (one product where it had the sum), which the flash template then matches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Node, Program, Var

PASSES = ("convert_element_type", "copy")
NOT_JOINED = "not a score written as a sum of products"
# A part's score axes: batch, heads, query, key (the scores' own order); "d" is the contracted head dim,
# "e" the values' head dim.
QUERY, KEY, DIM, VALUE = 2, 3, "d", "e"


@dataclass(frozen=True)
class Operand:
    """One part's queries or keys: the argument, and what each of its axes is (a score axis, ``DIM``, or
    ``None`` for an axis of one the reference sums away)."""

    arg: int
    roles: tuple[int | str | None, ...]

    def source(self, name: str) -> str:
        """The argument as ``[batch, heads, seq, dim]``, an axis it lacks as one (broadcast by ``_joined``)."""
        want = (0, 1, QUERY if QUERY in self.roles else KEY, VALUE if VALUE in self.roles else DIM)
        roles = list(self.roles)
        missing = [w for w in want if w not in roles]
        units = [i for i, r in enumerate(roles) if r is None]
        expr = name
        if len(units) == len(missing):  # each axis of one stands where an axis the part lacks goes
            for i, w in zip(units, missing):
                roles[i] = w
        elif units:
            expr = f"jnp.squeeze({expr}, {tuple(units) if len(units) > 1 else units[0]})"
            roles = [r for r in roles if r is not None]
        perm = tuple(roles.index(w) for w in want if w in roles)
        if perm != tuple(range(len(perm))):
            expr = f"jnp.transpose({expr}, {perm})"
        lacking = tuple(i for i, w in enumerate(want) if w not in roles)
        if lacking:
            expr = f"jnp.expand_dims({expr}, {lacking if len(lacking) > 1 else lacking[0]})"
        return expr


@dataclass(frozen=True)
class Joined:
    """Where the joined queries and keys come from, part by part, and which argument is the values."""

    queries: tuple[Operand, ...]
    keys: tuple[Operand, ...]
    values: int
    names: tuple[str, str]  # the joined queries' and keys' names in the emitted kernel
    value_roles: tuple[int | str | None, ...] = (0, 1, KEY, VALUE)  # the values argument's axes
    out_perm: tuple[int, ...] = (0, 1, 2, 3)  # the result's axes, as axes of the kernel's [b, h, q, e] result

    @property
    def parts(self) -> frozenset[int]:
        return frozenset(o.arg for o in self.queries + self.keys)


def _summands(program: Program, var: Var, dots: set[int], axes: tuple[int, ...],
              seen: list[Node]) -> list[tuple[Node, tuple[int, ...]]] | None:
    """The products ``var`` adds up (through exact casts and transposes), each with the score axis each of
    its output axes becomes (``axes``: those of ``var``), each read once; None for anything else."""
    producers, users = program.producers(), program.users()
    node = producers.get(var)
    if node is None or (seen and len(users.get(var, [])) > 1):
        return None
    seen.append(node)
    if id(node) in dots:
        return [(node, axes)]
    src = node.ins[0]
    if node.prim in PASSES and isinstance(src, Var) and _exact_cast(src, node.out):
        return _summands(program, src, dots, axes, seen)
    if node.prim == "transpose" and isinstance(src, Var):
        placed = [0] * len(axes)
        for out_axis, in_axis in enumerate(node.params["permutation"]):
            placed[int(in_axis)] = axes[out_axis]
        return _summands(program, src, dots, tuple(placed), seen)
    if node.prim == "add" and all(isinstance(op, Var) and tuple(op.shape) == tuple(var.shape) for op in node.ins):
        parts = [_summands(program, op, dots, axes, seen) for op in node.ins]  # type: ignore[arg-type]
        return None if any(p is None for p in parts) else [n for p in parts for n in p]  # type: ignore[union-attr]
    return None


def _exact_cast(src: Var, dst: Var) -> bool:
    """A cast that keeps every value: the same dtype, or a float widened."""
    a, b = np.dtype(src.dtype), np.dtype(dst.dtype)
    return a == b or (jnp.issubdtype(a, jnp.floating) and jnp.issubdtype(b, jnp.floating) and b.itemsize > a.itemsize)


def _traced(program: Program, operand: Any, roles: list[int | str]) -> Operand | str:
    """The argument ``operand`` reads and the roles of its axes, through exact casts, sums over axes of one
    and transposes."""
    producers = program.producers()
    inputs = {id(v): i for i, v in enumerate(program.inputs)}
    var: Any = operand
    axes: list[int | str | None] = list(roles)
    while isinstance(var, Var) and id(var) not in inputs:
        node = producers.get(var)
        if node is None:
            return "a part read from something other than an argument"
        src = node.ins[0]
        if not isinstance(src, Var):
            return "a part computed from a constant"
        if node.prim in PASSES:
            if not _exact_cast(src, var):
                return "a part rounded on its way to its product"
        elif node.prim in ("reduce_sum", "squeeze") and \
                all(int(src.shape[a]) == 1 for a in node.params.get("axes", node.params.get("dimensions", ()))):
            gone = sorted(int(a) for a in node.params.get("axes", node.params.get("dimensions", ())))
            kept = iter(axes)
            axes = [None if a in gone else next(kept) for a in range(len(src.shape))]
        elif node.prim == "transpose":
            perm = [int(p) for p in node.params["permutation"]]
            placed: list[int | str | None] = [None] * len(perm)
            for out_axis, in_axis in enumerate(perm):
                placed[in_axis] = axes[out_axis]
            axes = placed
        else:
            return f"{node.prim} between an argument and its score product"
        var = src
    if not isinstance(var, Var):
        return "a part that is not an argument"
    return Operand(inputs[id(var)], tuple(axes))


def _operand_roles(dot: Node, axes: tuple[int, ...]) -> tuple[list[int | str], list[int | str]]:
    """The score axis (or ``DIM``) each axis of a score product's operands becomes: its output's axes are
    the batch axes, then the left operand's free axes, then the right one's (as ``dot_general`` writes
    them), and ``axes`` says which score axis each of those is."""
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    ranks = [len(op.shape) for op in dot.ins]  # type: ignore[union-attr]
    left: list[int | str] = [DIM] * ranks[0]
    right: list[int | str] = [DIM] * ranks[1]
    for i, (a, b) in enumerate(zip(lb, rb)):
        left[a], right[b] = axes[i], axes[i]
    at = len(lb)
    for a in range(ranks[0]):
        if a not in lb and a not in lc:
            left[a], at = axes[at], at + 1
    for b in range(ranks[1]):
        if b not in rb and b not in rc:
            right[b], at = axes[at], at + 1
    return left, right


def _summed(program: Program, scores: Var, wanted: set[int]) -> tuple[Node, list[tuple[Node, tuple[int, ...]]]] | None:
    """The four-dimensional add that sums every product in ``wanted`` on the way to ``scores``, and them."""
    for node in program.ancestors(scores):
        if node.prim == "add" and len(node.out.shape) == 4:
            found = _summands(program, node.out, wanted, (0, 1, 2, 3), [])
            if found is not None and {id(n) for n, _ in found} == wanted:
                return node, found
    return None


def find_joined(program: Program) -> Joined | str:
    """The parts of scores written as a sum of products, or why the program has none."""
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) < 3:
        return NOT_JOINED
    values, score_dots = dots[-1], dots[:-1]
    wanted = {id(n) for n in score_dots}
    scores = next((op for op in values.ins if isinstance(op, Var) and any(d in program.ancestors(op) for d in score_dots)),
                  None)
    if scores is None:
        return "the last product does not read the scores"
    summed = _summed(program, scores, wanted)
    if summed is None:
        return "the scores are not one sum of every product before the last"
    if any(len(d.params["dimension_numbers"][0][0]) != 1 for d in score_dots):
        return "a score product contracting more than one axis"
    queries: list[Operand] = []
    keys: list[Operand] = []
    for dot, axes in summed[1]:
        left, right = _operand_roles(dot, axes)
        sides = [_traced(program, op, roles) for op, roles in zip(dot.ins, (left, right))]
        failed = next((s for s in sides if isinstance(s, str)), None)
        if failed is not None:
            return failed
        by_role = {QUERY: None, KEY: None}
        for side in sides:
            assert isinstance(side, Operand)
            for role in (QUERY, KEY):
                if role in side.roles:
                    by_role[role] = side
        q, k = by_role[QUERY], by_role[KEY]
        if q is None or k is None or q is k or KEY in q.roles or QUERY in k.roles:
            return "a score product that is not queries times keys"
        queries.append(q)
        keys.append(k)
    if not {0, 1, QUERY, DIM} <= {r for q in queries for r in q.roles}:
        return "queries without a batch or heads axis"
    if not {0, 1, KEY, DIM} <= {r for k in keys for r in k.roles}:
        return "every key part shared by all heads (or batches)"
    read = _values(program, values, scores)
    if isinstance(read, str):
        return read
    operand, out_perm = read
    taken = {v.name for v in program.inputs}
    names = tuple(n if n not in taken else f"{n}_joined" for n in ("q", "k"))
    return Joined(tuple(queries), tuple(keys), operand.arg, names, operand.roles, out_perm)  # type: ignore[arg-type]


def _values(program: Program, dot: Node, probs: Var) -> tuple[Operand, tuple[int, ...]] | str:
    """The values' argument and its axes, and the values product's output axes as axes of the kernel's
    ``[batch, heads, query, value dim]`` result: the probabilities are laid out as the scores."""
    at = 0 if dot.ins[0] is probs else 1
    (lc, rc), (lb, rb) = dot.params["dimension_numbers"]
    pc, vc, pb, vb = (lc, rc, lb, rb) if at == 0 else (rc, lc, rb, lb)
    if tuple(pc) != (3,) or sorted(int(a) for a in pb) != [0, 1]:
        return "a values product that does not sum the probabilities over the keys"
    v = dot.ins[1 - at]
    roles: list[int | str] = [VALUE] * len(v.shape)  # type: ignore[union-attr]
    for a, b in zip(pb, vb):
        roles[int(b)] = int(a)
    roles[int(vc[0])] = KEY
    if roles.count(VALUE) != 1:
        return "values with more than one free axis"
    traced = _traced(program, v, roles)
    if isinstance(traced, str):
        return f"{traced} (the values)"
    written = [int(a) for a in pb] + ([QUERY, VALUE] if at == 0 else [VALUE, QUERY])  # batch, then free axes
    canonical = [0, 1, QUERY, VALUE]
    return traced, tuple(canonical.index(r) for r in written)


def joined_program(program: Program, joined: Joined) -> Program | str:
    """The program with one product of the joined queries and keys where it adds the parts' products; its
    arguments: the joined queries, keys, the values, then the arguments the parts do not take."""
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    found = _summed(program, program.outputs[0], {id(d) for d in dots[:-1]})  # type: ignore[arg-type]
    if found is None:
        return "the scores are not one sum of every product before the last"
    summed, parts_found = found
    score = summed.out
    batch, heads, seq_q, seq_k = (int(d) for d in score.shape)

    def width(parts: tuple[Operand, ...]) -> int:
        return sum(int(program.inputs[p.arg].shape[p.roles.index(DIM)]) for p in parts)

    def dtype(parts: tuple[Operand, ...]) -> Any:
        return np.dtype(jnp.result_type(*(np.dtype(program.inputs[p.arg].dtype) for p in parts)))

    if width(joined.queries) != width(joined.keys):
        return "query and key parts of different widths"
    q = Var(joined.names[0], (batch, heads, seq_q, width(joined.queries)), dtype(joined.queries))
    k = Var(joined.names[1], (batch, heads, seq_k, width(joined.keys)), dtype(joined.keys))
    first = parts_found[0][0]
    params = dict(first.params)
    params["dimension_numbers"] = (((3,), (3,)), ((0, 1), (0, 1)))
    params["preferred_element_type"] = np.dtype(score.dtype)
    product = Node(first.primitive, [q, k], [score], params, first.source)
    nodes = [product if n is summed else n for n in program.nodes]
    parts = joined.parts
    rest = [v for i, v in enumerate(program.inputs) if i not in parts and i != joined.values]
    values = program.inputs[joined.values]
    outputs = list(program.outputs)
    if joined.value_roles != (0, 1, KEY, VALUE) or joined.out_perm != (0, 1, 2, 3):
        moved = _canonical_values(program, joined, nodes, dots[-1], summed)
        if isinstance(moved, str):
            return moved
        values, nodes, outputs = moved
    out = Program([q, k, values, *rest], nodes, outputs, program.out_tree,
                  program._counter, dict(program.dim_names), list(program.notes)).dce()
    gone = {id(program.inputs[i]) for i in parts}
    if any(isinstance(op, Var) and id(op) in gone for n in out.nodes for op in n.ins):
        return "a query or key part read beyond its score product"
    return out


def _canonical_values(program: Program, joined: Joined, nodes: list[Node], dot: Node,
                      summed: Node) -> tuple[Var, list[Node], list[Any]] | str:
    """The values product rewritten on values moved to ``[batch, heads, keys, dim]``, its result left in
    the kernel's ``[batch, heads, query, dim]`` (moved back by the wrapper, ``out_perm``); the program's
    output must then be that result, or one cast of it."""
    source = program.inputs[joined.values]
    roles = [r for r in joined.value_roles if r is not None]
    if len(roles) != 4:
        return "values without batch and heads axes"
    shape = [int(source.shape[joined.value_roles.index(r)]) for r in (0, 1, KEY, VALUE)]
    values = Var(source.name, tuple(shape), np.dtype(source.dtype))
    probs = next(op for op in dot.ins if isinstance(op, Var) and summed in program.ancestors(op))
    batch, heads, seq_q = (int(d) for d in probs.shape[:3])  # type: ignore[union-attr]
    result = Var(f"{dot.out.name}_bhqd", (batch, heads, seq_q, shape[3]), np.dtype(dot.out.dtype))
    params = dict(dot.params)
    params["dimension_numbers"] = (((3,), (2,)), ((0, 1), (0, 1)))
    rebuilt = Node(dot.primitive, [probs, values], [result], params, dot.source)
    users = program.users().get(dot.out, [])
    outputs: list[Any] = list(program.outputs)
    if outputs == [dot.out]:
        return values, [rebuilt if n is dot else n for n in nodes], [result]
    if len(users) == 1 and users[0].prim == "convert_element_type" and outputs == [users[0].out]:
        cast = users[0]
        done = Var(f"{cast.out.name}_bhqd", result.shape, np.dtype(cast.out.dtype))
        recast = Node(cast.primitive, [result], [done], dict(cast.params), cast.source)
        return values, [rebuilt if n is dot else recast if n is cast else n for n in nodes], [done]
    return "the attention's result read in another layout than the kernel writes"


JOINED_SOURCE = '''def _joined(parts):
    """Parts side by side along the head dimension, each broadcast over the axes it lacks (a key part one
    per token, shared by every head): their product is the sum of the parts' products."""
    lead = jnp.broadcast_shapes(*(p.shape[:-1] for p in parts))
    return jnp.concatenate([jnp.broadcast_to(p, (*lead, p.shape[-1])) for p in parts], axis=-1)
'''


def wrapper_source(names: list[str], joined: Joined, static: tuple[str, ...], entry: str, name: str = "kernel") -> str:
    """``name``: the reference's arguments, its query and key parts joined for ``entry``."""
    keywords = "".join(f", {s}" for s in static)
    passed = "".join(f", {s}={s}" for s in static)
    q, k = joined.names
    rest = [n for i, n in enumerate(names) if i not in joined.parts and i != joined.values]
    v = names[joined.values]
    moved = Operand(joined.values, joined.value_roles).source(v)
    lines = [JOINED_SOURCE, "",
             f"def {name}({', '.join(names)}{', *' + keywords if static else ''}):",
             '    """The score\'s parts joined: one product of q and k is the sum of the reference\'s products."""',
             f"    {q} = _joined([{', '.join(o.source(names[o.arg]) for o in joined.queries)}])",
             f"    {k} = _joined([{', '.join(o.source(names[o.arg]) for o in joined.keys)}])"]
    if moved != v:
        lines.append(f"    {v}_bhsd = {moved}")
        v = f"{v}_bhsd"
    result = f"{entry}({', '.join([q, k, v, *rest])}{passed})"
    if joined.out_perm != (0, 1, 2, 3):
        result = f"jnp.transpose({result}, {joined.out_perm})  # back to the reference's layout"
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"
