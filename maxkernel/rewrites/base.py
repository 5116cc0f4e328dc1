"""What a rewrite is: a named, semantics-preserving transformation of a Program.

A rewrite only proposes; a candidate built from it counts only after the evaluator has proven it
correct on fresh inputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from maxkernel.analysis.program import Program


@dataclass(frozen=True)
class Rewrite:
    name: str
    description: str
    apply: Callable[[Program], int]  # mutates the program; returns how many sites it changed
    targets: tuple[str, ...] | None = None  # the targets where it can pay (None: everywhere)

    def offered_on(self, target: str) -> bool:
        return self.targets is None or target in self.targets


def single_use(program: Program, var: object) -> bool:
    """True when exactly one node reads ``var`` and it is not itself an output."""
    readers = sum(1 for n in program.nodes for op in n.ins if op is var)
    return readers == 1 and not any(op is var for op in program.outputs)
