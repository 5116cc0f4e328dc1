"""Softmax attention inside a larger computation (its projections, norms and RoPE before it, an output
projection after it): the flash kernel on the attention core, the reference's own code around it in XLA.

The core is found as ``maxkernel extract`` finds it in a model layer: the scores' products, the softmax and
the values' product, cut where the core's operands are the queries, keys and values (or the parts of scores
written as a sum of products, see ``attention_joined``), the cut moved back over layout ops (a kv-head
repeat) only as far as the flash template still reads the core. What comes before the core (the task's
inputs to its operands) and after it (its result to the task's outputs) is the reference's own code.
"""

from __future__ import annotations

from maxkernel.analysis.program import Program
from maxkernel.extract.layer import _core_cuts, attention_order, kernel_ready
from maxkernel.extract.regions import Span, _attention_spans
from maxkernel.extract.subprogram import region_program
from maxkernel.templates.around import Around, cut_around


def cut_attention(program: Program) -> tuple[Program, Around] | str:
    """The attention core of ``program`` (its operands as arguments, its result as output) and the code
    around it, or why there is none to cut."""
    spans = [s for s in _attention_spans(program) if s.core is not None]
    if len(spans) != 1:
        return f"{len(spans)} softmax attentions (a cut takes exactly one)"
    span = spans[0]
    cuts = _core_cuts(program, span)
    if not cuts:
        return "no attention core whose operands are queries, keys and values (or their parts)"
    start = kernel_ready(program, span, cuts)
    _, values = span.core  # type: ignore[misc]
    end = values + 1
    result = program.nodes[values].out
    readers = program.users().get(result, [])
    if end < len(program.nodes) and len(readers) == 1 and readers[0] is program.nodes[end] \
            and readers[0].prim == "convert_element_type":  # the result's one cast goes with the kernel
        end += 1
    core = attention_order(region_program(program, Span(start, end, "attention")))
    if len(core.outputs) != 1:
        return "an attention core whose intermediate values are read after it"
    around = cut_around(program, start, end, list(core.inputs), list(core.outputs))  # type: ignore[arg-type]
    if isinstance(around, str):
        return around
    return core, around
