"""Routed experts in a model layer's expert region: the region's own routing and epilogue, its dense experts
replaced by each token run through its chosen experts only.

An expert region (``maxkernel extract``) holds whatever its layer routes with (a softmax before or after the
top-k, sigmoid affinities with a selection bias, a scale), then the experts written densely: gate, up and
down over every expert for every token, and one matmul summing the experts' outputs [E, T, H] with the
combine weights [T, E], which are zero but for the top-k choice. Routing is not re-implemented here: the
reference's own nodes that compute the top-k indices and the combine weights are emitted as they are, and
so are the nodes after the weighted sum (a residual, a cast). Only the dense experts and their sum are
replaced, by :data:`maxkernel.rewrites.grouped.EXPERTS_LOOP` or ``EXPERTS_PAIRS`` fed the top-k indices and
each choice's weight read from the combine weights. The k and every extent are the reference's at each
size the candidate is rendered for; a size traced otherwise gets functions of its own, picked by shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import jax

from maxkernel.analysis.moe import MoePlan, region_roles
from maxkernel.analysis.program import Node, Program, Var, arg_names, trace_program
from maxkernel.rewrites.emit import EmitError, dtype_expr, emit_function
from maxkernel.rewrites.source import size_dispatch
from maxkernel.rewrites.structural import candidate_header

if TYPE_CHECKING:
    from jaxbench.task import Task

# What the dense experts may compute between the tokens and weights and their outputs [E, T, H].
EXPERT_PRIMS = frozenset({"dot_general", "transpose", "logistic", "mul", "convert_element_type", "reshape"})


@dataclass
class ExpertRegion:
    """One size's region cut around its dense experts."""

    plan: MoePlan
    routing: Program  # the region's inputs -> (top-k indices [T, k], combine weights [T, E])
    epilogue: Program  # the region's inputs and the experts' weighted sum [T, H] -> the region's outputs
    expert_dtype: Any  # the dtype of the experts' outputs [E, T, H]
    sum_dtype: Any  # the dtype of the weighted sum


def _through_converts(program: Program, var: Var) -> tuple[Var, Node | None]:
    """``var`` with the dtype casts that made it walked back, and the node that made what is left."""
    producers = program.producers()
    node = producers.get(var)
    while node is not None and node.prim == "convert_element_type" and isinstance(node.ins[0], Var):
        var = node.ins[0]
        node = producers.get(var)
    return var, node


def _one_hot_of(program: Program, weights: Var, indices: Var) -> bool:
    """Whether ``weights`` [T, E] is sum over the k choices of one_hot(indices) * a weight per choice: zero
    for every expert a token did not choose."""
    producers = program.producers()
    _, total = _through_converts(program, weights)
    if total is None or total.prim != "reduce_sum" or tuple(total.params.get("axes", ())) != (1,):
        return False
    spread = producers.get(total.ins[0]) if isinstance(total.ins[0], Var) else None
    if spread is None or spread.prim != "mul":
        return False
    for factor in spread.ins:
        if not isinstance(factor, Var):
            continue
        _, eq = _through_converts(program, factor)
        if eq is None or eq.prim != "eq":
            continue
        sides = [_broadcast_source(program, op) for op in eq.ins]
        kinds = {producers[s].prim if s in producers else "input" for s in sides if isinstance(s, Var)}
        if indices in sides and "iota" in kinds:
            return True
    return False


def _broadcast_source(program: Program, op: Any) -> Any:
    node = program.producers().get(op) if isinstance(op, Var) else None
    while node is not None and node.prim in ("broadcast_in_dim", "reshape") and isinstance(node.ins[0], Var):
        op = node.ins[0]
        node = program.producers().get(op)
    return op


def _combines(program: Program, plan: MoePlan) -> list[Node]:
    """Matmuls summing outputs [E, T, H] over the experts with weights [T, E] into [T, H]."""
    e, t, h = plan.experts, plan.tokens, plan.hidden
    found = []
    for node in program.nodes:
        if node.prim != "dot_general" or len(node.ins) != 2 or not all(isinstance(op, Var) for op in node.ins):
            continue
        (lc, rc), (lb, rb) = node.params["dimension_numbers"]
        outs, weights = node.ins
        if (outs.shape == (e, t, h) and weights.shape == (t, e) and tuple(lc) == (0,) and tuple(rc) == (1,)
                and tuple(lb) == (1,) and tuple(rb) == (0,)):
            found.append(node)
    return found


def split_region(program: Program, plan: MoePlan) -> ExpertRegion | str:
    """The region's routing and epilogue around its dense experts, or why it is not cut that way."""
    tops = [n for n in program.nodes if n.prim == "top_k"]
    if len(tops) != 1:
        return "not one top-k choosing the experts"
    indices = tops[0].outs[1]
    combines = _combines(program, plan)
    if len(combines) != 1:
        return "no one matmul summing the experts' outputs [experts, tokens, hidden] with weights [tokens, experts]"
    combine = combines[0]
    outs, weights = combine.ins
    assert isinstance(outs, Var) and isinstance(weights, Var)
    experts = {plan.x, plan.gate, plan.up, plan.down}
    if program.reads(outs) != experts:
        return "the experts' outputs read more than the tokens and the gate, up and down weights"
    dense = [n.prim for n in program.ancestors(outs)]
    if not set(dense) <= EXPERT_PRIMS or dense.count("dot_general") != 3 or dense.count("logistic") != 1:
        return "the experts are not one SwiGLU (three matmuls and a sigmoid) per expert"
    if not _one_hot_of(program, weights, indices):
        return "the combine weights are not the top-k choice one-hot times its weights"
    weights_reads = program.reads(weights)
    if weights_reads & {plan.gate, plan.up, plan.down}:
        return "the routing reads the expert weights"

    routing = program.copy()
    routing.outputs = [indices, weights]
    routing.out_tree = jax.tree_util.tree_structure((0, 0))
    routing.dce()

    epilogue = program.copy()
    taken = {v.name for v in program.inputs}
    summed = Var(next(n for n in ("moe", "experts_sum", "routed_sum") if n not in taken), combine.out.shape,
                 combine.out.dtype)
    epilogue.substitute(combine.out, summed)
    epilogue.inputs = [*epilogue.inputs, summed]
    epilogue.dce()
    if any(epilogue.reads(o) & {plan.gate, plan.up, plan.down} for o in epilogue.outputs if isinstance(o, Var)):
        return "the region's outputs read the experts otherwise than through their weighted sum"
    return ExpertRegion(plan, routing, epilogue, outs.dtype, combine.out.dtype)


def _size_regions(task: "Task", sizes: tuple[str, ...]) -> dict[str, ExpertRegion] | str:
    found: dict[str, ExpertRegion] = {}
    for size in sizes:
        plan = region_roles(task, size)
        if isinstance(plan, str):
            return f"{plan} (at the {size} size)"
        region = split_region(trace_program(task, size), plan)
        if isinstance(region, str):
            return f"{region} (at the {size} size)"
        found[size] = region
    return found


def expert_region(task: "Task", sizes: tuple[str, ...]) -> dict[str, ExpertRegion] | str:
    """The region cut at each of ``sizes`` the task has, or why it is not an expert region."""
    known = tuple(s for s in sizes if s in task.spec.sizes) or ("cpu",)
    return _size_regions(task, known)


def _computation(region: ExpertRegion, names: list[str], suffix: str) -> str:
    args = ", ".join(names)
    p = region.plan
    return (f"def _computation{suffix}({args}):\n"
            f"    top_idx, gates = _routing{suffix}({args})\n"
            "    weights = jnp.take_along_axis(gates, top_idx, axis=1)  # each choice's weight (the rest are zero)\n"
            f"    summed = _routed_experts({p.x}, {p.gate}, {p.up}, {p.down}, top_idx, weights, TILE, WIDEN, "
            f"{dtype_expr(region.expert_dtype)})\n"
            f"    return _epilogue{suffix}({args}, summed.astype({dtype_expr(region.sum_dtype)}))\n")


def render_region(task: "Task", params: dict[str, Any], sizes: tuple[str, ...], description: str) -> str:
    """The candidate: the region's routing and epilogue as the reference writes them, routed experts between."""
    from maxkernel.rewrites.grouped import experts_constants, experts_source

    regions = expert_region(task, sizes)
    if isinstance(regions, str):
        raise EmitError(regions)
    names = arg_names(task)
    texts: dict[str, tuple[str, str]] = {}
    for size_names in (True, False):
        texts = {size: (emit_function(r.routing, "_routing", "the reference's routing: top-k indices and combine "
                                      "weights", size_names),
                        emit_function(r.epilogue, "_epilogue", "what the reference does with the experts' "
                                      "weighted sum", size_names))
                 for size, r in regions.items()}
        if len(set(texts.values())) == 1:
            break
    ks = sorted({r.plan.k for r in regions.values()})
    doc = (f"{task.id}: {description}.\n\nform={params.get('form', 'loop')}, tile={params['tile']} token copies per "
           f"expert step, widen={bool(params.get('widen', False))}; top-k {', '.join(map(str, ks))} "
           f"at the sizes {', '.join(regions)}.")
    parts = [candidate_header(doc), experts_constants(params), experts_source(params.get("form", "loop"))]
    if len(set(texts.values())) == 1:
        routing, epilogue = next(iter(texts.values()))
        first = next(iter(regions.values()))
        parts += ["\n" + routing + "\n", "\n" + epilogue + "\n", "\n" + _computation(first, names, "") + "\n",
                  "\n" + size_dispatch({"any": ("_computation", ())}, names) + "\n"]
        return "\n".join(parts)
    functions: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {}
    for size, region in regions.items():
        routing, epilogue = texts[size]
        parts += ["\n" + routing.replace("def _routing(", f"def _routing_{size}(", 1) + "\n",
                  "\n" + epilogue.replace("def _epilogue(", f"def _epilogue_{size}(", 1) + "\n",
                  "\n" + _computation(region, names, f"_{size}") + "\n"]
        functions[size] = (f"_computation_{size}", tuple(tuple(int(d) for d in v.shape) for v in region.routing.inputs))
    parts.append("\n" + size_dispatch(functions, names) + "\n")
    return "\n".join(parts)

