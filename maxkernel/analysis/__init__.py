"""Static analysis of reference computations (jaxpr-level), shared by planning and memory.

``analyze_task(task, target)`` traces the reference, describes it as an op graph with its compound
patterns, and prices it with XLA's cost analysis: FLOPs, bytes, arithmetic intensity and the bound on
the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from maxkernel.analysis.models import OpNode, RowLayout

if TYPE_CHECKING:
    from jaxbench.task import Task

__all__ = ["OpNode", "RowLayout", "TaskAnalysis", "analyze_task"]


class TaskAnalysis(BaseModel):
    task: str
    category: str
    target: str
    size: str
    ops: list[OpNode]
    patterns: list[str]
    primitives: list[str]
    flops: float
    bytes: float
    arithmetic_intensity: float
    machine_balance: float
    bound: Literal["compute", "memory"]
    rows: RowLayout | None = None

    def summary(self) -> str:
        """Human text: what the reference does and what limits it."""
        lines = [f"{self.task} ({self.category}) on {self.target}, {self.size} size",
                 f"  patterns: {', '.join(self.patterns) or '-'}",
                 f"  {self.flops / 1e9:.3f} GFLOP, {self.bytes / 1e6:.2f} MB moved, "
                 f"intensity {self.arithmetic_intensity:.2f} FLOP/byte vs balance {self.machine_balance:.1f} "
                 f"-> {self.bound}-bound"]
        if self.rows is not None:
            lines.append(f"  rows: {self.rows.rows} over {self.rows.row_dims} leading axes, "
                         f"{'independent' if self.rows.independent else 'coupled'}")
        lines.append("  op graph:")
        for op in self.ops:
            text = f"    {op.kind:<13} {' > '.join(op.primitives[:12])}{' ...' if len(op.primitives) > 12 else ''}"
            text += f"  -> {op.shapes[0] if op.shapes else ''}"
            if op.prologue:
                text += f"  prologue [{', '.join(op.prologue)}]"
            if op.epilogue:
                text += f"  epilogue [{', '.join(op.epilogue)}]"
            if op.detail:
                text += f"  ({op.detail})"
            lines.append(text)
        return "\n".join(lines)


def analyze_task(task: "Task", target: str = "cpu", size: str = "cpu") -> TaskAnalysis:
    from maxkernel.analysis.cost import bound, machine_balance, xla_cost
    from maxkernel.analysis.graph import detect_patterns, op_graph
    from maxkernel.analysis.program import trace_program
    from maxkernel.analysis.rows import row_layout

    program = trace_program(task, size).dce()
    flops, nbytes = xla_cost(task, size)
    intensity = flops / nbytes if nbytes else 0.0
    return TaskAnalysis(
        task=task.id, category=task.spec.category, target=target, size=size, ops=op_graph(program),
        patterns=detect_patterns(program), primitives=sorted(set(program.primitives())), flops=flops,
        bytes=nbytes, arithmetic_intensity=intensity, machine_balance=machine_balance(target),
        bound=bound(intensity, target), rows=row_layout(task, size) if size == "cpu" else None,
    )
