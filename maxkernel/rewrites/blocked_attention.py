"""Softmax attention under a static mask, computed only on the key columns each query block can see.

A reference writes causal, sliding-window or block-sparse attention densely: it scores every query
against every key and then masks. When the mask depends only on positions (iota and constants), it is
known when the candidate is generated, so each block of query rows can be scored against just the key
spans it can see. Everything between the score matmul and the softmax is replayed per block: constant
scales, additive terms computed from other inputs (a relative-position bias table, say), and the mask
itself, each sliced to the block's rows and visible columns.

Recognised: inputs q [b, hq, s, d], k and v [b, hk, s, d] (hk dividing hq, plus any inputs that only
feed additive terms), two matmuls (scores, then probabilities times values), a softmax over keys and an
output shaped like q. The candidate reads batch and sequence from its arguments: the terms of positions
alone are computed while it is traced, and the plan (query blocks and the key spans they see) is made
from them then, so one function serves every sequence length at the traced head counts.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jax.numpy as jnp
import numpy as np

from maxkernel.analysis.program import Const, Node, Operand, Program, Var, arg_names, trace_program
from maxkernel.rewrites.numeric import TooLargeToEvaluate, evaluate_any, evaluate_nodes, evaluate_reduced
from maxkernel.rewrites.emit import Emitter, EmitError, dtype_expr, emit_function, scalar_text
from maxkernel.rewrites.structural import candidate_header
from maxkernel.rewrites.source import size_dispatch
from maxkernel.templates.base import TemplateSpace, divisors, sizes_for

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

# A masked score filled with this or less weighs exactly nothing in a float32 softmax of a row that sees a
# key (exp underflows to 0), as -inf does; rows that see no key are refused.
MASK_FLOOR = -1e9
CHAIN = ("mul", "div", "add", "sub", "select_n", "convert_element_type", "tanh")
PASS_BACK = ("convert_element_type", "reshape", "copy")


@dataclass
class ChainStep:
    prim: str
    operand: Operand | None = None  # the other operand (a scalar, a static array, or a side term)
    scores_first: bool = True  # the running scores are the left operand
    kind: str = "scalar"  # scalar | static | side | mask | none | unary (tanh: a logit soft cap)
    name: str = ""  # for static/side operands: the function computing it


@dataclass
class AttentionPlan:
    q: Var
    k: Var
    v: Var
    score_shape: tuple[int, ...]
    q_factor: float
    steps: list[ChainStep]
    mask: np.ndarray  # [sq, sk], True where a key is visible
    side_inputs: list[Var] = field(default_factory=list)
    out_dtype: Any = None
    pv_out: Var | None = None  # linear attention (no softmax): the scores-times-values result ...
    tail: list[Node] = field(default_factory=list)  # ... and the reference's nodes that follow it


def _visible_keys(program: Program, var: Var, score_shape: tuple[int, ...], hides: Callable[[Any], Any]) -> np.ndarray:
    """[q, k]: whether any score row of any batch and head keeps each key, where ``hides(var)`` is True for
    hidden entries of the (input-free) mask or factor ``var``. Only [q, k] slices are ever materialized."""
    sq, sk = score_shape[-2:]
    lead = int(np.prod(score_shape[:-2]))

    def kept(value: Any) -> Any:
        return jnp.broadcast_to(jnp.logical_not(hides(value)), score_shape).reshape(lead, sq, sk)

    return evaluate_any(program.ancestors(var), var, kept, lead)


def evaluate_static(program: Program, var: Var) -> np.ndarray:
    """The value of a var that depends on no input (iota, constants), computed now.

    A trailing broadcast (a [seq, seq] mask widened to [batch, heads, seq, seq]) is returned as a
    read-only broadcast view, so the widened array is never materialised.
    """
    node = program.producers().get(var)
    if node is not None and node.prim == "broadcast_in_dim" and isinstance(node.ins[0], Var):
        inner = evaluate_static(program, node.ins[0])
        shape = [1] * len(var.shape)
        for axis, dim in zip(node.params["broadcast_dimensions"], inner.shape):
            shape[axis] = dim
        return np.broadcast_to(inner.reshape(shape), var.shape)
    return np.asarray(evaluate_nodes(program.ancestors(var), {})[var])


def _adds_unit_axes(node: Any) -> bool:
    """A broadcast that only inserts axes of length one (an argument given back the axis of one the
    reference maps over: ``attention_layout`` moves it out for the kernel)."""
    if node.prim != "broadcast_in_dim" or not isinstance(node.ins[0], Var):
        return False
    dims = [int(d) for d in node.params["broadcast_dimensions"]]
    shape = [int(d) for d in node.params["shape"]]
    return dims == sorted(dims) and all(shape[d] == int(n) for d, n in zip(dims, node.ins[0].shape)) and \
        all(shape[a] == 1 for a in range(len(shape)) if a not in dims)


def _scalar_factor(program: Program, var: Var, stop: Var, moved: bool = False) -> float:
    """Constant factors applied to input ``stop`` on the way to ``var`` (through casts and reshapes; with
    ``moved``, through transposes and a head repeat too)."""
    from maxkernel.templates.attention_layout import repeat_axis

    producers = program.producers()
    factor = 1.0
    while var is not stop:
        node = producers.get(var)
        if node is None:
            return factor
        if moved and node.prim == "reshape" and node.ins[0] in producers and \
                repeat_axis(producers[node.ins[0]], node) is not None:  # type: ignore[index]
            var = producers[node.ins[0]].ins[0]  # type: ignore[index,assignment]
            continue
        if node.prim in PASS_BACK or (moved and (node.prim == "transpose" or _adds_unit_axes(node))):
            var = node.ins[0]  # type: ignore[assignment]
            continue
        consts = [op for op in node.ins if isinstance(op, Const) and op.scalar() is not None]
        vars_ = [op for op in node.ins if isinstance(op, Var)]
        if node.prim in ("mul", "div") and len(consts) == 1 and len(vars_) == 1:
            c = float(consts[0].scalar())  # type: ignore[arg-type]
            factor = factor * c if node.prim == "mul" else factor / c
            var = vars_[0]
            continue
        raise EmitError(f"{node.prim} between an input and the score matmul")
    return factor


def match_attention(program: Program, moved: bool = False) -> AttentionPlan | str:
    """The attention plan of ``program``, or why it has none (also when its masks are too large to evaluate
    in this process). ``moved``: the program's inputs were moved to ``[batch, heads, seq, head_dim]``
    (``templates.attention_layout``), so transposes and a head repeat may lie between them and the matmuls."""
    try:
        return _match_attention(program, moved)
    except TooLargeToEvaluate as exc:
        return f"mask not evaluated: {exc}"


def _match_attention(program: Program, moved: bool = False) -> AttentionPlan | str:
    rank4 = [v for v in program.inputs if len(v.shape) == 4]
    if len(rank4) < 3:
        return "no q, k, v inputs of rank 4"
    q, k, v = rank4[:3]
    if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:] or q.shape[1] % k.shape[1]:
        return "q, k, v are not [batch, heads, seq, head_dim] with kv heads dividing q heads"
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 2:
        return "not two matmuls (scores, then scores times values)"
    if len(program.outputs) != 1 or tuple(program.outputs[0].shape) != (*q.shape[:3], v.shape[3]):
        return "output is not shaped like q (with the values' head dimension)"
    score = dots[0].out
    sq, sk = q.shape[2], k.shape[2]
    if tuple(score.shape[-2:]) != (sq, sk) or int(np.prod(score.shape[:-2])) != q.shape[0] * q.shape[1]:
        return "scores are not [..., q_seq, k_seq]"
    try:
        dep = [program.reads(op) if isinstance(op, Var) else set() for op in dots[0].ins]
        if dep != [{q.name}, {k.name}]:
            return "score matmul does not read q and k alone"
        q_factor = (_scalar_factor(program, dots[0].ins[0], q, moved)  # type: ignore[arg-type]
                    * _scalar_factor(program, dots[0].ins[1], k, moved))  # type: ignore[arg-type]
    except EmitError as exc:
        return str(exc)
    users = program.users()
    steps: list[ChainStep] = []
    mask = np.ones((sq, sk), bool)
    side_inputs: set[str] = set()
    current = score
    while True:
        readers = users.get(current, [])
        if len(readers) != 1:
            break
        node = readers[0]
        if node.prim not in CHAIN:
            break
        others = [op for op in node.ins if op is not current]
        if node.prim == "convert_element_type":
            steps.append(ChainStep("convert_element_type", kind="none"))
        elif node.prim == "tanh":
            steps.append(ChainStep("tanh", kind="unary"))
        elif node.prim == "select_n":
            pred, *cases = node.ins
            fill = next((c for c in cases if c is not current), None)
            if not isinstance(pred, Var) or len(cases) != 2 or program.reads(pred):
                return "a mask that depends on inputs"
            fill_value = fill.scalar() if isinstance(fill, Const) else _uniform(program, fill)
            if fill_value is None or not fill_value <= MASK_FLOOR:
                return "a mask that fills with something other than -inf or a large negative value"
            keeps = cases[1] is current
            mask &= _visible_keys(program, pred, tuple(score.shape),
                                  jnp.logical_not if keeps else (lambda hidden: hidden))
            steps.append(ChainStep("select_n", pred, keeps, "mask", f"_term_{len(steps)}"))
        else:
            other = others[0] if others else None
            first = node.ins[0] is current
            if isinstance(other, Const) and other.scalar() is not None:
                steps.append(ChainStep(node.prim, other, first, "scalar"))
            elif isinstance(other, Var) and not program.reads(other) and not other.shape and \
                    _uniform(program, other) is not None:  # a scale computed from constants (sqrt(d))
                value = np.asarray(_uniform(program, other), dtype=other.dtype)
                steps.append(ChainStep(node.prim, Const(value, (), np.dtype(other.dtype), False), first, "scalar"))
            elif isinstance(other, Var):
                names = program.reads(other)
                if names & {q.name, k.name, v.name}:
                    return "a score term that reads q, k or v"
                kind = "side" if names else "static"
                side_inputs |= names
                if kind == "static" and node.prim == "mul":  # a static factor that is zero hides the key
                    mask &= _visible_keys(program, other, tuple(score.shape), lambda factor: factor == 0)
                steps.append(ChainStep(node.prim, other, first, kind, f"_term_{len(steps)}"))
            else:
                return f"{node.prim} with an array constant"
        current = node.out
    readers = users.get(current, [])
    tail: list[Node] = []
    pv_out: Var | None = None
    if readers and readers[0].prim == "reduce_max":
        if not {"exp", "reduce_sum"} <= set(program.primitives()):
            return "a row max without a softmax"
    elif len(readers) == 1 and readers[0] is dots[1] and dots[1].ins[0] is current:
        if program.reads(dots[1].ins[1]) != {v.name}:  # type: ignore[arg-type]
            return "second matmul does not read v"
        pv_out = dots[1].out
        tail = program.nodes[program.nodes.index(dots[1]) + 1:]
        known = {pv_out, *program.inputs, *(o for n in tail for o in n.outs)}
        if any(isinstance(op, Var) and op not in known for n in tail for op in n.ins):
            return "what follows the attention reads its intermediate values"
    else:
        return "neither a softmax nor a matmul with v right after the masked scores"
    if not mask.any(axis=1).all():
        return "a query row that sees no key"
    ordered = [p for p in program.inputs if p.name in side_inputs]
    return AttentionPlan(q, k, v, tuple(score.shape), q_factor, steps, mask, ordered, program.outputs[0].dtype,
                         pv_out, tail)


def compact(value: np.ndarray) -> np.ndarray:
    """A broadcast view with its broadcast axes cut to length one (same values, broadcastable back)."""
    value = np.asarray(value)
    return value[tuple(slice(0, 1) if stride == 0 else slice(None) for stride in value.strides)]


def _uniform(program: Program, var: Var) -> float | None:
    if program.reads(var):
        return None
    if not var.size:
        return None

    def first_if_uniform(value: Any) -> Any:
        flat = value.reshape(-1)
        return flat[0], jnp.all(flat == flat[0])

    first, uniform = evaluate_reduced(program.ancestors(var), var, first_if_uniform)
    return float(first) if bool(uniform) else None


def block_plan(mask: np.ndarray, block_q: int) -> list[tuple[int, int, tuple[tuple[int, int], ...]]]:
    """Per query block: its rows and the contiguous key spans any of its rows can see."""
    plan = []
    for q0 in range(0, mask.shape[0], block_q):
        q1 = min(q0 + block_q, mask.shape[0])
        cols = np.flatnonzero(mask[q0:q1].any(axis=0))
        spans: list[tuple[int, int]] = []
        for c in cols.tolist():
            if spans and spans[-1][1] == c:
                spans[-1] = (spans[-1][0], c + 1)
            else:
                spans.append((c, c + 1))
        plan.append((q0, q1, tuple(spans)))
    return plan


def _term_program(program: Program, var: Var, inputs: list[Var]) -> Program:
    return Program(list(inputs), program.ancestors(var), [var])


SLICE_HELPERS = '''
def _rows_cols(term, rows, spans, q_len, k_len):
    """A score-shaped term cut to one query block's rows and visible key spans (broadcast axes kept)."""
    if term.ndim >= 2 and term.shape[-2] == q_len:
        term = term[..., rows[0]:rows[1], :]
    if term.ndim >= 1 and term.shape[-1] == k_len:
        term = jnp.concatenate([term[..., a:e] for a, e in spans], axis=-1) if len(spans) > 1 else term[..., spans[0][0]:spans[0][1]]
    return term


def _keys(t, spans):
    return jnp.concatenate([t[:, :, a:e] for a, e in spans], axis=2) if len(spans) > 1 else t[:, :, spans[0][0]:spans[0][1]]
'''


class BlockedAttentionRewrite:
    name = "blocked_attention"
    description = "softmax attention scored only on the key spans a static mask leaves visible"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = match_attention(trace_program(task, "cpu").dce())
        if isinstance(found, str):
            return found
        if found.v.shape[3] != found.q.shape[3]:
            return "values of another head dimension than the queries"
        dense = found.mask.size
        if found.mask.sum() > 0.9 * dense:
            return "the mask hides less than a tenth of the scores"
        return None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        seq = trace_program(task, "cpu").dce().inputs[0].shape[2]
        options = [d for d in divisors(seq) if 32 <= d <= 512] or [seq]
        return TemplateSpace(defaults={"block_q": 128 if 128 in options else options[-1]}, space={"block_q": options})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        names = arg_names(task)
        block_q = int(params["block_q"])
        parts = [candidate_header(f"{task.id}: {self.description}.\n\nBLOCK_Q query rows per block (the last may be "
                                  "partial); f32 scores, the reference's own score terms and mask. Batch and sequence "
                                  "are read from the arguments; the key spans are planned from the mask while tracing."),
                 "import numpy as np\n",
                 f"BLOCK_Q = {block_q}  # query rows per block\n", SLICE_HELPERS, "\n" + inspect.getsource(block_plan),
                 VISIBLE_SOURCE]
        rendered: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {}
        for size in sizes:
            program = trace_program(task, size).dce()
            plan = match_attention(program)
            if isinstance(plan, str):
                raise EmitError(plan)
            rendered[size] = (self._render_generic(program, plan), tuple(v.shape for v in program.inputs))
        texts = {text for text, _ in rendered.values()}
        if len(texts) == 1:  # every size emits the same code: one function serves them all
            parts.append(texts.pop())
            parts.append("\n" + size_dispatch({"any": ("_attention", ())}, names) + "\n")
            return "\n".join(parts)
        for size, (text, _) in rendered.items():
            parts.append(text.replace("_attention(", f"_attention_{size}(").replace("_score_term_", f"_score_{size}_term_"))
        dispatch = {size: (f"_attention_{size}", shapes) for size, (_, shapes) in rendered.items()}
        parts.append("\n" + size_dispatch(dispatch, names) + "\n")
        return "\n".join(parts)

    def _render_generic(self, program: Program, plan: AttentionPlan) -> str:
        """The attention for any batch and sequence at the traced heads and head size: the score terms read
        the sequence from q and k, and the block plan is made from the mask when the kernel is traced."""
        b, hq, sq, d = plan.q.shape
        hk = plan.k.shape[1]
        lead = tuple(plan.score_shape[:-2])
        lead_text = {(b, hk, hq // hk): None, (b, hq): "(batch, q_heads)", (b * hq,): "(batch * q_heads,)"}
        if lead not in lead_text:
            raise EmitError(f"scores laid out as {plan.score_shape} (not [batch, heads, q, k] or a split of it)")
        carriers = [plan.q, plan.k]
        lines: list[str] = []
        terms: list[tuple[ChainStep, str]] = []
        for step in plan.steps:
            if step.kind in ("static", "side", "mask"):
                inputs = carriers + (plan.side_inputs if step.kind == "side" else [])
                lines.append(emit_function(_term_program(program, step.operand, inputs), f"_score{step.name}",  # type: ignore[arg-type]
                                           "A score term; q and k give it the sequence lengths.") + "\n")
                terms.append((step, f"_score{step.name}({', '.join(v.name for v in inputs)})"))
        args = ", ".join(v.name for v in program.inputs)
        q, k, v = plan.q.name, plan.k.name, plan.v.name
        served = f"q_heads={hq}, kv_heads={hk}, head_dim={d}"
        body = [f"def _attention({args}):",
                f"    batch, q_heads, seq_q, head_dim = {q}.shape",
                f"    kv_heads, seq_k = {k}.shape[1], {k}.shape[2]",
                f"    if (q_heads, kv_heads, head_dim) != {(hq, hk, d)}:  # the score terms were traced with these",
                f"        raise ValueError(f'serves {served} (any batch and sequence) only, not '",
                "                         f'q_heads={q_heads}, kv_heads={kv_heads}, head_dim={head_dim}')",
                "    group = q_heads // kv_heads",
                f"    qf = ({q}.astype(jnp.float32) * {plan.q_factor!r}).reshape(batch, kv_heads, group, seq_q, head_dim)",
                f"    kf = {k}.astype(jnp.float32)",
                f"    vf = {v}.astype(jnp.float32)"]
        for step, call in terms:
            if step.kind == "side":
                body.append(f"    {step.name} = {call}")
        fixed = [(step, call) for step, call in terms if step.kind != "side"]
        body.append("    visible = np.ones((seq_q, seq_k), bool)")
        if fixed:
            # Terms of positions alone (masks, decays) are constants: computed once while tracing, and what
            # they hide decides which key spans each query block scores.
            body.append("    with jax.ensure_compile_time_eval():")
            body += [f"        {step.name} = {call}" for step, call in fixed]
            for step, _ in fixed:
                if step.kind == "mask":
                    hidden = "" if step.scores_first else "~"
                    body.append(f"    visible = visible & _seen({hidden}np.asarray({step.name}), seq_q, seq_k)")
                elif step.prim == "mul":
                    body.append(f"    visible = visible & _seen(np.asarray({step.name}) != 0, seq_q, seq_k)")
        body += ["    outs = []",
                 "    for q0, q1, spans in block_plan(visible, BLOCK_Q):",
                 "        rows = (q0, q1)",
                 "        kb, vb = _keys(kf, spans), _keys(vf, spans)",
                 "        n = kb.shape[2]",
                 "        s = jnp.einsum('bhgqd,bhkd->bhgqk', qf[:, :, :, q0:q1], kb)"]
        if lead_text[lead] is not None:
            body.append(f"        s = s.reshape({lead_text[lead]} + (q1 - q0, n))")
        for step in plan.steps:
            body.append("        " + _step_line(step))
        if plan.pv_out is None:
            body += ["        m = jnp.max(s, axis=-1, keepdims=True)",
                     "        p = jnp.exp(s - m)",
                     "        denom = jnp.sum(p, axis=-1, keepdims=True)",
                     "        o = jnp.einsum('bhgqk,bhkd->bhgqd', p.reshape(batch, kv_heads, group, q1 - q0, n), vb)",
                     "        outs.append(o.reshape(batch, q_heads, q1 - q0, head_dim) / denom.reshape(batch, q_heads, q1 - q0, 1))",
                     f"    return jnp.concatenate(outs, axis=2).astype({dtype_expr(plan.out_dtype)})\n"]
        else:
            if tuple(plan.pv_out.shape) != tuple(plan.q.shape):
                raise EmitError(f"scores times values shaped {plan.pv_out.shape}, not like q")
            body += ["        o = jnp.einsum('bhgqk,bhkd->bhgqd', s.reshape(batch, kv_heads, group, q1 - q0, n), vb)",
                     "        outs.append(o.reshape(batch, q_heads, q1 - q0, head_dim))",
                     f"    {plan.pv_out.name} = jnp.concatenate(outs, axis=2)",
                     "    # What the reference does with the attention output, as it does it:"]
            tail = Program([plan.pv_out], plan.tail, program.outputs, program.out_tree)
            emitter = Emitter(tail)
            body += emitter.body()
            body.append(f"    return {emitter.returns()}\n")
        lines.append("\n".join(body))
        return "\n".join(lines)


VISIBLE_SOURCE = '''

def _seen(kept, seq_q, seq_k):
    """[seq_q, seq_k]: whether any batch and head keeps each key under one mask term."""
    if kept.ndim > 2:
        kept = kept.reshape((-1,) + kept.shape[-2:]).any(axis=0)
    return np.broadcast_to(kept, (seq_q, seq_k))
'''


def _step_line(step: ChainStep) -> str:
    if step.kind == "none":
        return "s = s.astype(jnp.float32)"
    if step.kind == "unary":
        return f"s = jnp.{step.prim}(s)"
    if step.kind == "mask":
        cut = f"_rows_cols({step.name}, rows, spans, seq_q, seq_k)"
        return f"s = jnp.where({cut}, s, -jnp.inf)" if step.scores_first else f"s = jnp.where({cut}, -jnp.inf, s)"
    op = {"mul": "*", "div": "/", "add": "+", "sub": "-"}[step.prim]
    if step.kind == "scalar":
        value = scalar_text(step.operand.scalar())  # type: ignore[union-attr]
        return f"s = s {op} {value}" if step.scores_first else f"s = {value} {op} s"
    term = f"_rows_cols({step.name}, rows, spans, seq_q, seq_k)"
    return f"s = s {op} {term}" if step.scores_first else f"s = {term} {op} s"


BLOCKED_ATTENTION = BlockedAttentionRewrite()
