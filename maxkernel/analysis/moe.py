"""Which argument of a mixture-of-experts reference plays which part: read once, used by every kernel of it.

Two forms are read:
- a task of x, router and the three stacked expert weights, in any order and under any names, with the
  router matmul inside (``10p_Sparse_MoE``); the number of experts each token keeps is the program's top-k,
  held by an integer static argument where one holds it;
- the expert region of a model layer (``maxkernel extract``): the normed tokens [T, H], the stacked gate
  and up [E, H, I] and down [E, I, H], the routing inputs the region's router reads (the router's f32
  logits, or what the layer computed of its router before the cut: a softmax's parts, a selection bias)
  and, where the region adds the experts' sum to it, the residual [..., H] of the tokens' rows.
The gate is told from the up weight by what its product feeds (the sigmoid of ``silu(gate) * up``); in the
region form the top-k's k is read from the reference's program at each size (no static argument gives it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from maxkernel.analysis.program import Program, Var, arg_names, input_shapes, static_args, trace_program

if TYPE_CHECKING:
    from jaxbench.task import Task


@dataclass
class MoePlan:
    """Which argument plays which part, and the extents at one size."""

    x: str  # the tokens [..., hidden] (the normed ones in the region form)
    router: str  # the router [hidden, experts], or in the region form its one routing input (else "")
    gate: str
    up: str
    down: str
    top_k: str  # the static argument holding the number of experts each token keeps ("" when a literal)
    tokens: int
    hidden: int
    intermediate: int
    experts: int
    k: int
    names: tuple[str, ...] = ()  # the arguments in the reference's order
    residual: str = ""  # the region form: the input [..., hidden] the experts' sum is added to
    from_logits: bool = False  # the region form: routing reads what the layer's router computed, not x @ router
    routing: tuple[str, ...] = ()  # the region form: every argument the routing reads (logits, bias, ...)


def feeds_logistic(program: Program, name: str) -> bool:
    """Whether a matmul reading argument ``name`` alone (through slices, casts and reshapes) feeds a sigmoid
    through layout ops: the gate of silu(gate) * up."""
    users = program.users()
    frontier = [n.outs[0] for n in program.nodes if n.prim == "dot_general"
                and any(isinstance(op, Var) and program.reads(op) == {name} for op in n.ins)]
    while frontier:
        for node in users.get(frontier.pop(), []):
            if node.prim == "logistic":
                return True
            if node.prim in ("transpose", "reshape", "convert_element_type"):
                frontier.extend(node.outs)
    return False


def _reads_with(program: Program, weight: str) -> set[str]:
    """The arguments a matmul reading argument ``weight`` multiplies it with."""
    inputs = {v: v.name for v in program.inputs}
    found: set[str] = set()
    for node in program.nodes:
        if node.prim == "dot_general" and any(inputs.get(op) == weight for op in node.ins):
            found.update(inputs[op] for op in node.ins if op in inputs and inputs[op] != weight)
    return found


def region_roles(task: "Task", size: str) -> MoePlan | str:
    """The region form by shape: two stacked weights [E, H, I] (the gate is the one whose product feeds the
    sigmoid), one [E, I, H], the tokens [T, H] they multiply, at most one residual [..., H] of T rows in the
    tokens' dtype, and the routing inputs (every other argument, floating point)."""
    shapes = input_shapes(task, size)
    names = arg_names(task)
    if len(shapes) != len(names) or len(shapes) < 5:
        return "not the arguments of an expert region (tokens, gate, up, down and the routing's inputs)"
    cubes = [i for i, s in enumerate(shapes) if len(s.shape) == 3]  # a residual [1, T, H] is one too
    leading = [n for n in {shapes[i].shape[0] for i in cubes} if sum(shapes[i].shape[0] == n for i in cubes) == 3]
    if len(leading) != 1:
        return "not three stacked expert weights [experts, ...]"
    e = leading[0]
    stacked = [i for i in cubes if shapes[i].shape[0] == e]
    # gate and up multiply an argument (the tokens), down multiplies what they made: shapes alone cannot tell
    # them apart where hidden = intermediate
    program = trace_program(task, size)
    multiplied = {i: _reads_with(program, names[i]) for i in stacked}
    square = [i for i in stacked if multiplied[i]]
    downs = [i for i in stacked if not multiplied[i]]
    if len(square) != 2 or len(downs) != 1 or shapes[square[0]].shape != shapes[square[1]].shape:
        return "no two expert weights [experts, hidden, intermediate] beside one [experts, intermediate, hidden]"
    _, h, inter = shapes[square[0]].shape
    if shapes[downs[0]].shape != (e, inter, h):
        return "the down weight is not [experts, intermediate, hidden]"
    dtype = np.dtype(shapes[square[0]].dtype)
    multiplied_by = multiplied[square[0]] | multiplied[square[1]]
    tokens = [i for i, s in enumerate(shapes) if i not in stacked and len(s.shape) == 2 and s.shape[1] == h
              and np.dtype(s.dtype) == dtype and names[i] in multiplied_by]
    if len(tokens) != 1:
        return "no one tokens argument [tokens, hidden] that the expert weights multiply"
    t = shapes[tokens[0]].shape[0]
    rest = [i for i in range(len(shapes)) if i not in stacked and i != tokens[0]]
    residual = [i for i in rest if np.dtype(shapes[i].dtype) == dtype and shapes[i].shape
                and shapes[i].shape[-1] == h and int(np.prod(shapes[i].shape[:-1])) == t]
    if len(residual) > 1:
        return "more than one residual [..., hidden] of the tokens' rows"
    routing = [i for i in rest if i not in residual]
    if not routing or any(not np.issubdtype(np.dtype(shapes[i].dtype), np.floating) for i in routing):
        return "no floating-point routing inputs beside the tokens and the expert weights"
    gates = [i for i in square if feeds_logistic(program, names[i])]
    if len(gates) != 1:
        return "no one expert weight whose product feeds the sigmoid (silu(gate) * up)"
    ks = {int(n.params["k"]) for n in program.nodes if n.prim == "top_k"}
    k = ks.pop() if len(ks) == 1 else None
    if k is None or not 1 <= k <= e:
        return "no one top-k over the experts"
    up = [i for i in square if i != gates[0]][0]
    router = names[routing[0]] if len(routing) == 1 else ""
    return MoePlan(names[tokens[0]], router, names[gates[0]], names[up], names[downs[0]], "", int(t), int(h),
                   int(inter), int(e), k, tuple(names), names[residual[0]] if residual else "", True,
                   tuple(names[i] for i in routing))


def _partners(program: Program, name: str) -> list[set[str]]:
    """For every matmul one operand of which reads argument ``name`` alone (through slices, casts and
    reshapes): the arguments its other operand reads."""
    found = []
    for node in program.nodes:
        if node.prim != "dot_general":
            continue
        reads = [program.reads(op) if isinstance(op, Var) else set() for op in node.ins]
        found += [reads[1 - i] for i, r in enumerate(reads) if r == {name}]
    return found


def task_roles(task: "Task", size: str) -> MoePlan | str:
    """The task form, by shape and data flow, in any order and under any names: the tokens x [..., H] (what
    the router and the gate and up weights multiply), the router [H, E], the stacked gate and up
    [E, H, I] (the gate's product feeds the sigmoid) and down [E, I, H] (it multiplies what the gate and up
    made); nothing else. The experts each token keeps are the program's top-k; the integer static that
    holds that number, where one does, stays the kernel's argument."""
    shapes = dict(zip(arg_names(task), input_shapes(task, size)))
    names = list(shapes)
    program = trace_program(task, size)
    partners = {n: _partners(program, n) for n in names}
    tokens = [x for x in names if sum(any(p == {x} for p in partners[w]) for w in names if w != x) == 3]
    if len(tokens) != 1:
        return "no one tokens argument that three weights multiply (the router, the gate and the up)"
    x = tokens[0]
    h = shapes[x].shape[-1]
    direct = [w for w in names if w != x and any(p == {x} for p in partners[w])]
    routers = [w for w in direct if len(shapes[w].shape) == 2 and shapes[w].shape[0] == h]
    square = [w for w in direct if len(shapes[w].shape) == 3 and shapes[w].shape[1] == h]
    if len(routers) != 1 or len(square) != 2 or shapes[square[0]].shape != shapes[square[1]].shape:
        return "no router [hidden, experts] and two stacked weights [experts, hidden, intermediate] on the tokens"
    e, _, inter = shapes[square[0]].shape
    down = [w for w in names if w not in (x, *direct)]
    if len(down) != 1:
        return f"not one down weight beside the tokens, router, gate and up ({', '.join(down) or 'none'})"
    if shapes[routers[0]].shape != (h, e) or shapes[down[0]].shape != (e, inter, h):
        return "the router is not [hidden, experts] or the down weight not [experts, intermediate, hidden]"
    if not any(set(square) <= p for p in partners[down[0]]):
        return "the down weight does not multiply what the gate and up weights made"
    gates = [w for w in square if feeds_logistic(program, w)]
    if len(gates) != 1:
        return "no one expert weight whose product feeds the sigmoid (silu(gate) * up)"
    ks = {int(n.params["k"]) for n in program.nodes if n.prim == "top_k"}
    if len(ks) != 1 or not 1 <= next(iter(ks)) <= e:
        return "no one top-k over the experts"
    k = ks.pop()
    holders = [n for n, v in static_args(task, size).items() if isinstance(v, int) and not isinstance(v, bool) and v == k]
    up = next(w for w in square if w != gates[0])
    return MoePlan(x, routers[0], gates[0], up, down[0], holders[0] if len(holders) == 1 else "",
                   int(np.prod(shapes[x].shape[:-1])), int(h), int(inter), int(e), k, tuple(names))


def moe_roles(task: "Task", size: str) -> MoePlan | str:
    """The task form where it fits, else the region form (a reference of five arguments or fewer is told
    why the task form does not fit)."""
    task_form = task_roles(task, size)
    if not isinstance(task_form, str):
        return task_form
    region = region_roles(task, size)
    return region if not isinstance(region, str) or len(arg_names(task)) > 5 else task_form


def plan_sizes(task: "Task", sizes: tuple[str, ...]) -> list[MoePlan] | str:
    """The roles at every size, or why one size has none."""
    found: list[MoePlan] = []
    for size in sizes:
        p = moe_roles(task, size)
        if isinstance(p, str):
            return f"{p} (at the {size} size)"
        found.append(p)
    return found

