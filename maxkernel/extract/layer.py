"""``extract_task``: split a task's reference into region tasks and say where its time goes."""

from __future__ import annotations

import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import jax
from pydantic import BaseModel, Field

from jaxbench.task import Task, load_task
from maxkernel.analysis.program import Program, doubled_sizes, static_args, trace_program
from maxkernel.extract.constants import fold_constant_scalars
from maxkernel.extract.regions import Span, find_regions, merge_routed
from maxkernel.rewrites.sized import integer_statics
from maxkernel.extract.subprogram import prefix_program, region_program
from maxkernel.extract.tasks import float_first, region_source, write_region_task
from maxkernel.logging import get_logger
from maxkernel.targets.check_size import check_ladder

log = get_logger(__name__)

SIZES = ("cpu", "full")
LAYOUT = {"broadcast_in_dim", "reshape", "transpose", "convert_element_type", "squeeze", "expand_dims", "copy"}


class ExtractError(Exception):
    """The task's reference cannot be split into region tasks (said in one line)."""


class RegionInfo(BaseModel):
    """One region task: where it sits in the layer, what it reads and makes, what it costs."""

    index: int
    task_id: str
    kind: str
    path: str
    nodes: tuple[int, int]
    inputs: list[str]
    outputs: list[str]
    primitives: list[str]
    ms: float | None = None
    share: float = 0.0
    basis: str = "measured"
    flops: float = 0.0
    bytes: float = 0.0


class Extraction(BaseModel):
    """A layer split into regions that together compute it."""

    layer: str
    layer_path: str
    target: str
    inputs: list[str]
    outputs: list[str]
    regions: list[RegionInfo]
    sizes: dict[str, dict[str, Any]] = Field(default_factory=dict, description="the layer's sizes the regions "
                                             "hold programs for: cpu, full and the check ladder between")
    layer_ms: float | None = None
    seconds: float = 0.0


def program_fn(program: Program) -> Any:
    """A callable that binds the program's nodes (jittable): the region computed without any source."""
    from maxkernel.analysis.program import read

    def run(*args: Any) -> tuple[Any, ...]:
        env: dict[Any, Any] = dict(zip(program.inputs, args))
        for node in program.nodes:
            out = node.primitive.bind(*[read(env, op) for op in node.ins], **node.params)
            env.update(zip(node.outs, out if node.primitive.multiple_results else [out]))
        return tuple(read(env, op) for op in program.outputs)

    return run


def _merge_integer_only(program: Program, spans: list[Span]) -> list[Span]:
    """A region that hands on no floating value (indices only) joins the next: a task needs a float output."""
    merged: list[Span] = []
    pending: Span | None = None
    for span in spans:
        if pending is not None:
            span = Span(pending.start, span.end, pending.kind if pending.kind != "elementwise" else span.kind)
            pending = None
        sub = float_first(region_program(program, span))
        if not sub.outputs or not jax.numpy.issubdtype(sub.outputs[0].dtype, jax.numpy.floating):
            pending = span
            continue
        merged.append(span)
    if pending is not None:
        if not merged:
            raise ExtractError("the reference has no floating output to split on")
        last = merged.pop()
        merged.append(Span(last.start, pending.end, last.kind))
    return merged


def _label(program: Program, spans: list[Span]) -> list[Span]:
    """Matmuls over a batch of experts after a routing step are the experts."""
    routed = False
    for span in spans:
        routed = routed or span.kind == "routing"
        if span.kind == "matmul" and routed:
            dots = [n for n in program.nodes[span.start:span.end] if n.prim == "dot_general"]
            if any(n.params["dimension_numbers"][1][0] for n in dots):
                span.kind = "experts"
    return spans


def _fold_norms(spans: list[Span]) -> list[Span]:
    """A normalization that feeds a matmul, an attention or a routing step is its prologue, not a region."""
    folded: list[Span] = []
    for span in reversed(spans):
        if span.kind == "norm" and folded and folded[-1].kind != "norm":
            folded[-1] = Span(span.start, folded[-1].end, folded[-1].kind, folded[-1].core)
        else:
            folded.append(span)
    return list(reversed(folded))


def _core_cuts(program: Program, span: Span) -> list[int]:
    """Where an attention core may start: from the score matmul back over layout ops only (a kv-head
    repeat), each a cut that leaves the core rank-4 inputs (three, or the query and key parts of scores
    written as a sum of products, and the values) and one output; latest first."""
    from maxkernel.templates.attention_joined import find_joined

    scores, values = span.core  # type: ignore[misc]
    cuts: list[int] = []
    for c in range(scores, span.start - 1, -1):
        if c < scores and program.nodes[c].prim not in LAYOUT:
            break
        sub = region_program(program, Span(c, values + 1, "attention"))
        if len(sub.outputs) == 1 and all(len(v.shape) == 4 for v in sub.inputs) and \
                (len(sub.inputs) == 3 or not isinstance(find_joined(sub), str)):
            cuts.append(c)
    return cuts


def kernel_ready(program: Program, span: Span, cuts: list[int]) -> int:
    """The cut to use: the earliest whose core the attention templates accept (a kv-head repeat the
    matcher does not read as grouped heads stays outside then, in the projection region before it), or
    the earliest of all when none is accepted."""
    from maxkernel.templates.attention import match_core

    _, values = span.core  # type: ignore[misc]
    for c in reversed(cuts):
        core = attention_order(region_program(program, Span(c, values + 1, "attention")))
        if not isinstance(match_core(core), str):
            return c
    return cuts[-1]


def _split_attention(program: Program, spans: list[Span], chosen: dict[int, int] | None = None) -> list[Span]:
    """Cut an attention into its projections, its core (q, k, v in, one output) and its output projection.

    The core is what attention kernels are written for; the projections around it are matmuls of their own.
    ``chosen`` maps an attention's first node to the core's start already picked at another size (regions
    cut every size the same way); the cuts picked are written into it.
    """
    chosen = {} if chosen is None else chosen
    out: list[Span] = []
    for span in spans:
        if span.kind != "attention" or span.core is None:
            out.append(span)
            continue
        _, values = span.core
        cuts = _core_cuts(program, span)
        if not cuts:
            out.append(span)
            continue
        best = chosen[span.start] if chosen.get(span.start) in cuts else kernel_ready(program, span, cuts)
        chosen[span.start] = best
        parts = [Span(span.start, best, "matmul"), Span(best, values + 1, "attention"), Span(values + 1, span.end, "matmul")]
        out.extend(p for p in parts if p.end > p.start)
    return out


def attention_order(sub: Program) -> Program:
    """An attention core's arguments as (q, k, v): the order attention kernels and templates expect."""
    dots = [n for n in sub.nodes if n.prim == "dot_general"]
    if len(dots) != 2 or len(sub.inputs) != 3:
        return sub
    names = [sub.reads(dots[0].ins[0]), sub.reads(dots[0].ins[1]), sub.reads(dots[1].ins[1])]
    if not all(len(n) == 1 for n in names) or len({next(iter(n)) for n in names}) != 3:
        return sub
    by_name = {v.name: v for v in sub.inputs}
    sub.inputs = [by_name[next(iter(n))] for n in names]
    return sub


def _region_at(program: Program, span: Span) -> Program:
    """A region's program as its task writes it (a floating output first, an attention core's arguments as
    q, k, v)."""
    sub = float_first(region_program(program, span))
    return attention_order(sub) if span.kind == "attention" else sub


def _cut(program: Program, chosen: dict[int, int]) -> list[Span]:
    return merge_routed(_label(program, _merge_integer_only(
        program, _split_attention(program, _fold_norms(find_regions(program)), chosen))))


def _traced(task: Task, size: str) -> Program:
    program = trace_program(task, size).dce()
    fold_constant_scalars(program)
    return program


def plan_regions(task: Task) -> tuple[dict[str, Program], list[Span], dict[str, dict[str, Any]], dict[int, int]]:
    """Programs at every size, the regions (which must cut ``cpu`` and ``full`` the same way), the sizes
    the regions are written for (``cpu``, ``full`` and the rungs of :func:`check_ladder` that cut the same)
    and where each attention's core was cut."""
    # A layer with attention keeps the seq rungs only: traced also with its head counts and widths shrunk
    # one at a time, llama's shared region code no longer runs at widths never traced (a reshape of the
    # kv heads fails), while the seq rungs suffice for its attention core's check.
    widths = not any(s.kind == "attention" for s in find_regions(trace_program(task, "cpu").dce()))
    sizes = {size: task.size(size) for size in SIZES} | check_ladder(task, widths)
    sized = {name: task if name in SIZES else task.with_size(name, values) for name, values in sizes.items()}
    programs: dict[str, Program] = {}
    for size in sizes:
        try:
            programs[size] = _traced(sized[size], size)
        except Exception:  # a rung the layer does not trace at (an extent it reads follows another there)
            if size in SIZES:
                raise
            log.debug("rung_does_not_trace", task=task.id, size=size)
    chosen: dict[int, int] = {}  # attention cores are picked at the first size (cpu) and kept at the others
    cuts = {size: _cut(p, chosen) for size, p in programs.items()}
    shapes = {size: [(s.start, s.end, s.kind) for s in spans] for size, spans in cuts.items()}
    if shapes["cpu"] != shapes["full"]:
        raise ExtractError(f"{task.id}: the reference's program differs between sizes cpu and full; "
                           "regions must cut both the same way")
    kept = [size for size in programs if shapes[size] == shapes["cpu"]]
    return {s: programs[s] for s in kept}, cuts["cpu"], {s: sizes[s] for s in kept}, chosen


def plan_probes(task: Task, spans: list[Span], chosen: dict[int, int]) -> dict[str, tuple[Program, dict[str, Any]]]:
    """The layer's program at each of :func:`maxkernel.analysis.program.doubled_sizes` that traces and cuts as ``spans`` do (attention
    cores cut where ``chosen`` says), with the size's static arguments; a size the layer does not accept,
    or whose program reads otherwise (a group of one kv head), is left out."""
    want = [(s.start, s.end, s.kind) for s in spans]
    found: dict[str, tuple[Program, dict[str, Any]]] = {}
    for name, values in doubled_sizes(task).items():
        probe = task.with_size(name, values)
        try:
            program = _traced(probe, name)
            static = static_args(probe, name)
        except Exception:  # noqa: BLE001 - a size the layer's code rejects tells nothing
            continue
        if [(s.start, s.end, s.kind) for s in _cut(program, dict(chosen))] == want:
            found[name] = (program, static)
    return found


def extract_task(task: Task | str | Path, out: Path, target: str = "cpu", timing: bool = True) -> Extraction:
    """Write one region task per region under ``out/<layer id>/`` and return where the layer's time goes."""
    started = time.perf_counter()
    task = task if isinstance(task, Task) else load_task(task)
    programs, spans, sizes, chosen = plan_regions(task)
    root = out / task.id
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("r[0-9][0-9]_*"):  # regions of an earlier extraction would mislead a reader
        if (stale / "task.yaml").is_file():
            shutil.rmtree(stale)
    layer_source = task.reference_path.read_text()
    statics = {size: integer_statics(static_args(task if size in SIZES else task.with_size(size, values), size))
               for size, values in sizes.items()}
    probes = plan_probes(task, spans, chosen)
    infos: list[RegionInfo] = []
    for index, span in enumerate(spans):
        regions = {size: _region_at(programs[size], span) for size in sizes}
        prefixes = {size: prefix_program(programs[size], regions[size].inputs) for size in sizes}
        evidence = {name: (_region_at(program, span), integer_statics(static)) for name, (program, static) in probes.items()}
        cpu = regions["cpu"]
        name = f"r{index:02d}_{span.kind}"
        task_id = f"{task.id}__{name}"
        prims = sorted({n.prim for n in cpu.nodes})
        description = (f"Region {index} ({span.kind}) of {task.id}: nodes {span.start}-{span.end} of its program, "
                       f"{len(cpu.inputs)} inputs, {len(cpu.outputs)} outputs; primitives {', '.join(prims)}.")
        source = region_source(f"Region {index} ({span.kind}) of {task.id}.", task.id, sizes, regions, prefixes,
                               layer_source, statics, evidence, keywords=span.kind == "attention")
        folder = write_region_task(root / name, task_id=task_id, name=f"{task.spec.name}: {name}", kind=span.kind,
                                   description=description, dtype=str(cpu.outputs[0].dtype),
                                   tolerance=task.spec.tolerance.model_dump(), source=source,
                                   sizes={size: sizes[size] for size in SIZES})
        infos.append(RegionInfo(index=index, task_id=task_id, kind=span.kind, path=str(folder),
                                nodes=(span.start, span.end), inputs=[v.name for v in cpu.inputs],
                                outputs=[v.name for v in cpu.outputs], primitives=prims))
    cpu_program = programs["cpu"]
    extraction = Extraction(layer=task.id, layer_path=str(task.path), target=target,
                            inputs=[v.name for v in cpu_program.inputs],
                            outputs=[getattr(o, "name", "") for o in cpu_program.outputs], regions=infos,
                            sizes=sizes)
    if timing:
        _cost(extraction, target)
    extraction.seconds = time.perf_counter() - started
    return extraction


def _cost(extraction: Extraction, target: str) -> None:
    """Each region's time (measured on cpu, modelled on tpu-*), FLOPs and bytes; shares of their sum."""
    from jaxbench.task_check import median_ms
    from maxkernel.targets.names import parse_target

    kind, generation = parse_target(target)
    for info in extraction.regions:
        region = load_task(info.path)
        args, static = region.get_inputs(jax.random.key(0), "cpu")
        fn = jax.jit(partial(region.reference, **static))
        cost = fn.lower(*args).compile().cost_analysis()
        cost = (cost[0] if isinstance(cost, (list, tuple)) and cost else cost) or {}
        info.flops, info.bytes = float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0))
        if kind == "tpu" and generation is not None:
            from maxkernel.targets.model import model_reference

            info.ms, info.basis = model_reference(region, generation).time_ms, "modelled"
        else:
            info.ms = median_ms(fn, args, repeats=5)
    total = sum(info.ms or 0.0 for info in extraction.regions)
    for info in extraction.regions:
        info.share = (info.ms or 0.0) / total if total else 0.0
    extraction.layer_ms = total
