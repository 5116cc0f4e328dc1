"""Decode attention over a paged KV cache, reading only the pages each sequence's length reaches.

A reference written densely gathers every sequence's whole page list (``pages_per_seq * page_size``
keys), scores the query against all of them and masks the positions at or past the sequence's
length. Keys there cannot reach the output (their softmax weight is exactly zero), so the candidate
walks each sequence's pages in chunks of ``chunk_pages`` with an online softmax and stops after the
chunk holding its last key: the gathered bytes and the FLOPs follow the lengths, not the page
table's width. The same contract as a paged-attention kernel: queries [batch, q_heads, head_dim],
pages [kv_heads, total_pages, page_size, head_dim], a page table [batch, pages_per_seq] and lengths
[batch].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from maxkernel.analysis.program import Const, Program, Var, arg_names, trace_program
from maxkernel.rewrites.emit import dtype_expr
from maxkernel.rewrites.structural import candidate_header
from maxkernel.templates.base import TemplateSpace

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

PAGED = '''
def _paged_decode(q, k_pages, v_pages, page_table, lengths, scale, chunk_pages):
    """Per sequence, an online softmax over its pages, chunk by chunk, up to the chunk holding its last key."""
    batch, q_heads, head_dim = q.shape
    kv_heads, _, page_size, _ = k_pages.shape
    group = q_heads // kv_heads
    keys = chunk_pages * page_size
    table = jnp.pad(page_table, ((0, 0), (0, (-page_table.shape[1]) % chunk_pages)))

    def one(b):
        qf = q[b].astype(jnp.float32).reshape(kv_heads, group, head_dim) * scale
        length = lengths[b]

        def chunk(c, carry):
            m, l, acc = carry
            pages = jax.lax.dynamic_slice_in_dim(table[b], c * chunk_pages, chunk_pages)
            k = k_pages[:, pages].reshape(kv_heads, keys, head_dim).astype(jnp.float32)
            v = v_pages[:, pages].reshape(kv_heads, keys, head_dim).astype(jnp.float32)
            s = jnp.einsum("ngd,ntd->ngt", qf, k)
            s = jnp.where((c * keys + jnp.arange(keys) < length)[None, None, :], s, -jnp.inf)
            m_new = jnp.maximum(m, jnp.max(s, axis=-1))
            p = jnp.exp(s - m_new[..., None])
            alpha = jnp.exp(m - m_new)
            return m_new, l * alpha + jnp.sum(p, axis=-1), acc * alpha[..., None] + jnp.einsum("ngt,ntd->ngd", p, v)

        start = (jnp.full((kv_heads, group), -jnp.inf), jnp.zeros((kv_heads, group)),
                 jnp.zeros((kv_heads, group, head_dim)))
        m, l, acc = jax.lax.fori_loop(0, (length + keys - 1) // keys, chunk, start)
        return (acc / l[..., None]).reshape(q_heads, head_dim)

    return jax.lax.map(one, jnp.arange(batch))
'''

CHUNKS = (4, 8, 16)


@dataclass
class PagedRoles:
    q: str
    k_pages: str
    v_pages: str
    page_table: str
    lengths: str
    scale: float
    out_dtype: Any


def _score_scale(program: Program, score: Var) -> tuple[float, Var] | str:
    """Constant factors applied to the scores before the mask, and the var the mask reads."""
    users = program.users()
    factor, current = 1.0, score
    while True:
        readers = users.get(current, [])
        if len(readers) != 1:
            return "the scores feed more than one operation before the mask"
        node = readers[0]
        consts = [op for op in node.ins if isinstance(op, Const) and op.scalar() is not None]
        if node.prim in ("mul", "div") and len(consts) == 1 and node.ins[0] is current:
            value = float(consts[0].scalar())  # type: ignore[arg-type]
            factor = factor * value if node.prim == "mul" else factor / value
        elif node.prim == "convert_element_type":
            pass
        elif node.prim == "select_n":
            return factor, node.ins[0]  # type: ignore[return-value]
        else:
            return f"{node.prim} between the scores and the mask"
        current = node.out


def match_paged(program: Program) -> PagedRoles | str:
    floats3 = [v for v in program.inputs if len(v.shape) == 3 and not v.integer]
    floats4 = [v for v in program.inputs if len(v.shape) == 4 and not v.integer]
    tables = [v for v in program.inputs if len(v.shape) == 2 and v.integer]
    lengths = [v for v in program.inputs if len(v.shape) == 1 and v.integer]
    if len(program.inputs) != 5 or not (len(floats3) == 1 and len(floats4) == 2 and len(tables) == 1 and len(lengths) == 1):
        return "inputs are not (q, k pages, v pages, page table, lengths)"
    q, (k, v), table, length = floats3[0], floats4, tables[0], lengths[0]
    batch, q_heads, head_dim = q.shape
    if k.shape != v.shape or k.shape[3] != head_dim or q_heads % k.shape[0]:
        return "pages are not [kv_heads, pages, page_size, head_dim] with kv heads dividing q heads"
    if table.shape[0] != batch or length.shape[0] != batch:
        return "page table and lengths are not one row per sequence"
    if len(program.outputs) != 1 or tuple(program.outputs[0].shape) != tuple(q.shape):
        return "output is not shaped like q"
    dots = [n for n in program.nodes if n.prim == "dot_general"]
    if len(dots) != 2 or not {"reduce_max", "exp", "reduce_sum", "gather"} <= set(program.primitives()):
        return "not a softmax between two matmuls over gathered pages"
    reads = [[program.reads(op) if isinstance(op, Var) else set() for op in d.ins] for d in dots]
    if reads[0] != [{q.name}, {k.name, table.name}]:
        if reads[0] == [{q.name}, {v.name, table.name}]:
            k, v = v, k
        else:
            return "the score matmul does not read the query and the pages through the page table"
    if reads[1][1] != {v.name, table.name}:
        return "the second matmul does not read the value pages through the page table"
    from maxkernel.templates.attention_tail import split_after_attention  # the templates import this package

    after = split_after_attention(program)
    if isinstance(after, str):
        return after
    if after[1] is not None:
        return f"{'/'.join(sorted(set(after[1].primitives())))} after the attention (the paged kernel ends at its result)"
    found = _score_scale(program, dots[0].out)
    if isinstance(found, str):
        return found
    scale, pred = found
    producer = program.producers().get(pred)
    while producer is not None and producer.prim in ("broadcast_in_dim", "reshape", "convert_element_type"):
        producer = program.producers().get(producer.ins[0])  # type: ignore[arg-type]
    if producer is None or producer.prim != "lt" or program.reads(producer.ins[0]) \
            or program.reads(producer.ins[1]) != {length.name}:  # type: ignore[arg-type]
        return "the mask is not key position < the sequence's length"
    return PagedRoles(q.name, k.name, v.name, table.name, length.name, scale, program.outputs[0].dtype)


class PagedDecodeRewrite:
    name = "paged_decode"
    description = "paged decode attention that reads only the pages below each sequence's length"

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        found = match_paged(trace_program(task, "cpu").dce())
        return found if isinstance(found, str) else None

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        program = trace_program(task, "cpu").dce()
        per_seq = next(v.shape[1] for v in program.inputs if len(v.shape) == 2)
        options = [c for c in CHUNKS if c <= per_seq] or [per_seq]
        default = 8 if 8 in options else options[-1]
        return TemplateSpace(defaults={"chunk_pages": default}, space={"chunk_pages": options})

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        scales: dict[tuple[int, ...], float] = {}
        roles: PagedRoles | None = None
        for size in sizes:
            program = trace_program(task, size).dce()
            found = match_paged(program)
            if isinstance(found, str):
                raise ValueError(f"{size}: {found}")
            roles = found
            q = next(v for v in program.inputs if v.name == found.q)
            scales[tuple(int(d) for d in q.shape)] = found.scale
        assert roles is not None
        chunk = int(params["chunk_pages"])
        doc = (f"{task.id}: {self.description}.\n\nchunk_pages={chunk} pages per step of each sequence's loop; "
               "f32 scores and online softmax, then the reference's output dtype.")
        names = arg_names(task)
        return (candidate_header(doc) + "\n" + PAGED + "\n\n"
                f"# The reference's score scale, per query shape.\n_SCALES = {tuple(scales.items())!r}\n\n\n"
                f"def kernel({', '.join(names)}, **static):\n"
                f"    scale = dict(_SCALES)[tuple({roles.q}.shape)]\n"
                f"    out = _paged_decode({roles.q}, {roles.k_pages}, {roles.v_pages}, {roles.page_table}, "
                f"{roles.lengths}, scale, {chunk})\n"
                f"    return out.astype({dtype_expr(roles.out_dtype)})\n")


PAGED_DECODE = PagedDecodeRewrite()
