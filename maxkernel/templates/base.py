"""What a Pallas template is: a generator of readable candidate source with declared tunable parameters.

A template says whether it applies to a task, which parameter values are legal on a target (TPU blocks
aligned to 8x128 and within the VMEM budget; on CPU any divisor), and renders a candidate file for one
choice of values. It never sets ``interpret=``: the evaluator decides how Pallas runs.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from pydantic import BaseModel

from maxkernel.tuning.table import block_for

if TYPE_CHECKING:
    from jaxbench.task import Task
    from maxkernel.analysis import TaskAnalysis

Shape = TypeVar("Shape")

# VMEM a template plans to use on TPU (leaves headroom under v5e's 16 MiB scoped default).
TPU_VMEM_BUDGET = 12 * 2**20
# Primitives no Mosaic kernel holds: a kernel body with one of them does not lower for TPU.
NO_MOSAIC = ("scan", "while", "cond", "random_bits", "random_wrap", "gather", "scatter", "scatter-add",
             "scatter_add", "sort", "conv_general_dilated", "dynamic_slice", "dynamic_update_slice", "top_k",
             "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "argsort")

# Emitted into shape-generic candidates: a named block constant, shrunk only to divide a smaller extent.
FIT_SOURCE = '''def _fit(block, extent):
    """The block, halved until it divides the extent (the whole extent when that is smaller)."""
    block = min(block, extent)
    while extent % block:
        block //= 2
    return block'''

# Emitted into shape-generic candidates: the tuned table's block rule (largest legal divisor under the tuned
# block, a multiple of the chip's tiling), refusing by name an extent it cannot serve.
BLOCK_FOR_SOURCE = inspect.getsource(block_for).rstrip()


class TemplateSpace(BaseModel):
    """Tunable parameters with their default and their legal values for one task and target."""

    defaults: dict[str, Any]
    space: dict[str, list[Any]]


class Template(Protocol):
    name: str
    description: str

    def applies(self, task: "Task", analysis: "TaskAnalysis") -> str | None:
        """None when the template can render this task, else why not."""

    def space(self, task: "Task", analysis: "TaskAnalysis", target: str) -> TemplateSpace:
        """Legal parameter values on ``target``."""

    def render(self, task: "Task", params: dict[str, Any], sizes: tuple[str, ...]) -> str:
        """The candidate source for these parameters, specialized for each size."""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def tpu_target(target: str) -> bool:
    return target.startswith("tpu")


def sizes_for(target: str) -> tuple[str, ...]:
    """Sizes a candidate must run at: CPU measures at ``cpu``; TPU also lowers at ``full``."""
    return ("cpu", "full") if tpu_target(target) else ("cpu",)


def block_pair_space(extent: int, blocks_q: list[int], blocks_k: list[int],
                     fits: Callable[[int, int], bool]) -> tuple[tuple[int, int], dict[str, list[int]]] | None:
    """For a query-block x key-block grid over one sequence ``extent``: the legal pairs (both divide it and
    ``fits`` admits them), the default among them (the largest square-ish pair: fewest steps whose diagonal
    waste stays small) and the space of each axis; None when no pair is legal."""
    legal = [(bq, bk) for bq in blocks_q for bk in blocks_k if extent % bq == 0 and extent % bk == 0 and fits(bq, bk)]
    if not legal:
        return None
    default = max(legal, key=lambda f: (min(f), f[0] * f[1]))
    return default, {"block_q": sorted({f[0] for f in legal}), "block_k": sorted({f[1] for f in legal})}


def pick_block(extent: int, options: list[int], preferred: int) -> int:
    """The legal block closest to ``preferred`` from below (or the smallest legal one)."""
    fitting = [o for o in options if o <= preferred and extent % o == 0]
    return max(fitting) if fitting else min(options)


def analysed_at(task: "Task", sizes: tuple[str, ...], analyse: Callable[["Task", str], "Shape | str"],
                consistent: Callable[["Shape"], Any]) -> list["Shape"]:
    """``analyse`` at every rendered size, whose ``consistent`` key (argument roles, dtypes) must not change
    with size; EmitError with the first reason the template does not apply."""
    from maxkernel.rewrites.emit import EmitError

    found = []
    for size in sizes:
        shape = analyse(task, size)
        if isinstance(shape, str):
            raise EmitError(shape)
        found.append(shape)
    if len({consistent(shape) for shape in found}) > 1:
        raise EmitError("argument roles or dtypes that change with size")
    return found


def check_extent(full: int, floor: int, block: int, steps_of: Callable[[int], int]) -> int:
    """The smallest halving of ``full`` (not below ``floor``) that the kernel still tiles by ``block`` with
    at least two steps where ``full`` has two: what the twin check keeps for this dimension."""
    need_two = steps_of(full) >= 2
    chosen, current = full, full
    while current % 2 == 0 and current // 2 >= floor:
        current //= 2
        if current % block or current < block or (need_two and steps_of(current) < 2):
            break
        chosen = current
    return chosen


def check_floor(task: "Task", at_full: int, at_cpu: int) -> int:
    """How far the check size may shrink the dimension that is ``at_full`` at ``full`` and ``at_cpu`` at
    ``cpu``: to a free size parameter's declared minimum, else to its ``cpu`` value."""
    full, cpu = task.size("full"), task.size("cpu")
    name = next((n for n, v in full.items() if v == at_full and cpu.get(n) == at_cpu), None)
    free = task.spec.free.get(name) if name is not None else None
    return max(free.min, free.multiple_of) if free is not None else at_cpu
