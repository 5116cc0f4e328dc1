"""Algebraic rewrites at the jaxpr level, each emitted as readable JAX source for a candidate.

``propose_rewrites(task)`` traces the reference, applies every rewrite that finds a site (alone, and all
together), and returns the programs that differ from the reference. Nothing here is trusted: a rewrite
becomes a candidate only after the evaluator has checked it on fresh inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from maxkernel.analysis.program import Program, trace_probes, trace_program
from maxkernel.rewrites.activations import CHEAPER_ACTIVATIONS
from maxkernel.rewrites.base import Rewrite
from maxkernel.rewrites.conv_matmul import CONV_AS_MATMUL
from maxkernel.rewrites.dead_code import DEAD_CODE
from maxkernel.rewrites.emit import EmitError, emittable
from maxkernel.rewrites.numeric import IDLE_SUBGRAPHS
from maxkernel.rewrites.one_hot import ONE_HOT_INDEXING
from maxkernel.rewrites.pool_fold import POOL_INTO_WEIGHTS
from maxkernel.rewrites.scalar_fold import SCALAR_CHAINS
from maxkernel.rewrites.size_one import SIZE_ONE_REDUCTIONS
from maxkernel.rewrites.source import jax_candidate
from maxkernel.rewrites.sum_pushdown import SUM_AFTER_MATMUL
from maxkernel.rewrites.vectorize import VECTORIZE_MAPS
from maxkernel.rewrites.widen import WIDEN_MATMULS

if TYPE_CHECKING:
    from jaxbench.task import Task

# Order matters: removing idle work first exposes sums that sit right after a matmul.
REWRITES: tuple[Rewrite, ...] = (DEAD_CODE, VECTORIZE_MAPS, SIZE_ONE_REDUCTIONS, IDLE_SUBGRAPHS, SUM_AFTER_MATMUL, POOL_INTO_WEIGHTS,
                                 SCALAR_CHAINS,
                                 CONV_AS_MATMUL, WIDEN_MATMULS, CHEAPER_ACTIVATIONS, ONE_HOT_INDEXING)
BY_NAME = {r.name: r for r in REWRITES}

__all__ = ["REWRITES", "RewrittenProgram", "apply_rewrites", "propose_rewrites", "render_rewrite", "EmitError"]


@dataclass
class RewrittenProgram:
    names: list[str]  # the rewrites that changed something, in order
    program: Program
    sites: dict[str, int] = field(default_factory=dict)
    work_ratio: float | None = None  # its work (``program_work``) over the reference's


def program_work(program: Program) -> float:
    """The arithmetic a program does by its shapes: 2·M·N·K a matmul, one operation per output element
    for everything else; what tells a rewrite that removes work from one that only rewrites it."""
    total = 0.0
    for node in program.nodes:
        if node.prim == "dot_general":
            (lc, _), _ = node.params["dimension_numbers"]
            lhs = node.ins[0]
            total += 2.0 * float(np.prod(node.out.shape, dtype=np.float64)) * float(
                np.prod([lhs.shape[a] for a in lc], dtype=np.float64))
        else:
            total += sum(float(np.prod(o.shape, dtype=np.float64)) for o in node.outs)
    return total


def apply_rewrites(program: Program, names: list[str]) -> RewrittenProgram:
    """Apply the named rewrites in the canonical order to a copy of ``program``."""
    out = program.copy()
    sites: dict[str, int] = {}
    for rewrite in REWRITES:
        if rewrite.name in names:
            before = _reads(out)
            n = rewrite.apply(out)
            out.dce() if rewrite is not DEAD_CODE else None
            if n:
                sites[rewrite.name] = n
                _state(out, before, f"{rewrite.name}: {rewrite.description}")
    return RewrittenProgram([n for n in names if n in sites], out, sites)


def _reads(program: Program) -> dict[int, tuple[int, ...]]:
    """What each node reads, by identity: after a rewrite, a node missing here is new and a node whose
    reads differ was rewired."""
    return {id(node): tuple(id(op) for op in node.ins) for node in program.nodes} | \
        {0: tuple(id(op) for op in program.outputs)}


def _state(program: Program, before: dict[int, tuple[int, ...]], note: str) -> None:
    """Note the rewrite on every node it made or rewired, so the emitted code says where it acted (on the
    outputs when it acted nowhere else: dropped work leaves no node of its own)."""
    marked = False
    for node in program.nodes:
        if before.get(id(node)) != tuple(id(op) for op in node.ins):
            node.notes = (*node.notes, note)
            marked = True
    if not marked:
        program.notes.append(note)


def propose_rewrites(task: "Task", size: str = "cpu", target: str = "cpu") -> list[RewrittenProgram]:
    """Every single rewrite that fires (and pays on ``target``), then all of them together."""
    program = trace_program(task, size)
    if emittable(program.copy().dce()) is not None:
        return []
    offered = [r for r in REWRITES if r.offered_on(target)]
    found: list[RewrittenProgram] = []
    for rewrite in offered:
        result = apply_rewrites(program, [rewrite.name])
        if result.sites:
            found.append(result)
    if found:  # one rewrite can open the way for another (a flattened loop exposes its matmuls)
        combined = apply_rewrites(program, [r.name for r in offered])
        if all(combined.names != f.names for f in found):
            found.insert(0, combined)
    unique: dict[str, RewrittenProgram] = {}
    work = program_work(program.copy().dce()) or 1.0
    for f in found:
        if emittable(f.program) is None:
            f.work_ratio = program_work(f.program) / work
            unique.setdefault(jax_candidate({size: f.program}, ""), f)
    return list(unique.values())


def render_rewrite(task: "Task", names: list[str], sizes: tuple[str, ...] = ("cpu",)) -> str:
    """Candidate source for the named rewrites, specialized for each size."""
    programs = {}
    applied: list[str] = []
    for size in sizes:
        result = apply_rewrites(trace_program(task, size), names)
        programs[size] = result.program
        applied = applied or result.names
    probes = [apply_rewrites(probe, names).program for probe in trace_probes(task, sizes[0])]
    doc = (f"{task.id}: the reference rewritten by {', '.join(applied) or 'no rewrite'} "
           f"({'; '.join(BY_NAME[n].description for n in applied)}).\n\nGenerated by MaxKernel's rules brain; "
           "plain JAX, checked by the evaluator.")
    return jax_candidate(programs, doc, probes)
