"""Dead computation: work whose result never reaches an output is dropped."""

from __future__ import annotations

from maxkernel.analysis.program import Program
from maxkernel.rewrites.base import Rewrite


def drop_dead(program: Program) -> int:
    before = len(program.nodes)
    program.dce()
    return before - len(program.nodes)


DEAD_CODE = Rewrite("dead_code", "computation whose result does not reach the output removed", drop_dead)
