"""Our optimizer against JAX's own expert Pallas TPU kernels, on the same cost model (a benchmark, not a test).

    python benchmarks/tpu_vs_expert.py [--targets tpu-v5e,tpu-v6e] [--tasks 1p,6p] [--budget S]
                                       [--experts-only] [--json FILE]
    python benchmarks/tpu_vs_expert.py --suite [--tasks ...] [--budget S] [--json FILE]
    python benchmarks/tpu_vs_expert.py --merge A.json,B.json [--markdown] [--json FILE]
    python benchmarks/tpu_vs_expert.py --margin WRAPPER.py --tasks T [--targets X] [--seeds N]

For every suite task that an expert kernel covers, ``benchmarks/experts/<task>.py`` is a candidate
(our wrapper around a kernel of ``jax.experimental.pallas.ops.tpu``) that the evaluator checks and prices
exactly like ours; beside it, our optimizer's best for the same target. The table gives both modelled
speedups over the reference and ours/expert. An expert that JAX's TPU interpret mode cannot run under
the pinned JAX cannot be proven correct here: its row says "not provable here" and is left out of the
summary (our optimizer is not run for it either).

``--merge``: the rows of earlier runs' JSON files (one task or target each, when a whole run is too slow
for a loaded machine) as one table and summary; ``--markdown`` prints the table as Markdown.

``--margin``: one wrapper configuration's check size, modelled speedup and worst error on shifted inputs as
a share of the tolerance, so that configurations can be compared before one is made the expert.

``--suite``: the whole suite on tpu-v6e instead: per task our best, its label (pallas-kernel or jax) and
modelled speedup; how many Pallas winners are modelled faster than the reference; the geometric mean
(a task whose best is the reference counts 1.0x).
"""

from __future__ import annotations

import json
import math
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import typer
from pydantic import BaseModel, Field
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from jaxbench.evaluate import Evaluator
    from jaxbench.report import EvalReport
    from jaxbench.task import Task

EXPERTS_DIR = Path(__file__).resolve().parent / "experts"
DEFAULT_TARGETS = "tpu-v5e,tpu-v6e"
SUITE_TARGET = "tpu-v6e"
NOT_PROVABLE = "not provable here"
# Our optimizer runs in its own process, bounded: some of its renders allocate without limit at full size.
OURS_MEMORY_BYTES = 12 << 30
OURS_WALL_FACTOR = 6  # the optimizer overruns its budget by the evaluations it has started
OURS_GRACE_S = 300
FIRST_SEED = 1000  # --margin's draws are seeds 1000, 1001, ...: the same inputs every time it is run


class Expert(BaseModel):
    """One expert baseline: the task it covers, the JAX kernel it wraps, and what stops it running here."""

    task: str
    kernel: str
    interpret_limit: str | None = Field(
        default=None, description="why the pinned JAX's TPU interpret mode cannot run this kernel, if it cannot")

    @property
    def path(self) -> Path:
        return EXPERTS_DIR / f"{self.task}.py"


EXPERTS: tuple[Expert, ...] = (
    Expert(task="1p_Flash_Attention", kernel="flash_attention, causal, blocks 1024/1024/512"),
    Expert(task="2p_GQA_Attention", kernel="flash_attention, kv heads repeated per group, blocks 1024/1024/512"),
    Expert(task="3p_MLA_Attention", kernel="XLA projections + splash MHA, causal, blocks 512"),
    Expert(task="4p_Sparse_Attention", kernel="splash MHA with the task's block mask, blocks 512, scaled q as bf16 hi+lo"),
    Expert(task="5p_Flex_Attention", kernel="flash_attention with the bias as ab, blocks 1024/1024/512, scaled q as bf16 hi+lo"),
    Expert(task="6p_Paged_Attention", kernel="paged_attention, 64 pages a compute block"),
    Expert(task="7p_Ragged_Paged_Attention", kernel="ragged_paged_attention, 128 kv pages / 32 queries a block",
           interpret_limit="JAX 0.10.2's TPU interpret mode fails on the kernel's ref.reshape "
                           "('ReshapeTransform' object has no attribute 'indices')"),
    Expert(task="8p_GEMM", kernel="Pallas TPU matmul (the guide's), blocks 512x1024, k 1024"),
    Expert(task="11p_Megablox_GMM", kernel="megablox gmm, tiles (512, 1024, 1024)"),
    Expert(task="14p_Ragged_Dot", kernel="megablox gmm, tiles (512, 1024, 1024)"),
)


class Ours(BaseModel):
    """What our optimizer returned for one task and target."""

    strategy: str
    params: dict[str, Any] = Field(default_factory=dict)
    label: str | None = None
    status: str
    speedup: float | None = Field(description="modelled speedup of the returned candidate; 1.0 for the reference")
    beat_reference: bool
    seconds: float
    note: str = ""
    trials: list[str] = Field(default_factory=list, description="every trial: strategy, status and speedup or reason")


class ExpertRow(BaseModel):
    task: str
    target: str
    kernel: str
    status: str
    reason: str = ""
    label: str | None = None
    speedup: float | None = None
    ref_ms: float | None = None
    kernel_ms: float | None = None
    flags: list[str] = Field(default_factory=list)
    provable: bool = True
    seconds: float = 0.0
    measured: str | None = Field(default=None, description="when the expert was evaluated (UTC, to the minute)")
    ours: Ours | None = None

    @property
    def priced(self) -> bool:
        return self.provable and self.status == "ok" and self.speedup is not None

    @property
    def ratio(self) -> float | None:
        """ours/expert on modelled speedups, where both exist."""
        if not self.priced or self.ours is None or not self.ours.speedup:
            return None
        return self.ours.speedup / float(self.speedup)  # type: ignore[arg-type]


class SuiteRow(BaseModel):
    task: str
    ours: Ours


def our_best(task: "Task", target: str, budget_s: float, evaluator: "Evaluator") -> Ours:
    """Our optimizer's best candidate for ``target``: one session of the one engine (the actors' Auto run)."""
    from orchestrators.api import optimize

    del evaluator  # the session owns its evaluator pool, as every optimization does
    started = time.monotonic()
    result = optimize(str(task.path), target=target, budget_s=budget_s)
    report = result.best_report
    speedup = float(result.confirmed_speedup) if result.beat_reference and result.confirmed_speedup else 1.0
    params = {k: v for k, v in result.best_params.items() if k != "rewrites"}
    trials = [f"{t.strategy} {t.params}: {t.status} " + (f"{t.speedup:.2f}x" if t.speedup else t.reason[:160])
              for t in result.trials]
    return Ours(strategy=result.best_strategy or "reference", params=params, label=report.label if report else None,
                status=report.status if report else "none", speedup=speedup, beat_reference=result.beat_reference,
                seconds=round(time.monotonic() - started, 1), note=result.note, trials=trials)


def _ours_or_error(task: "Task", target: str, budget_s: float, evaluator: "Evaluator") -> Ours:
    """``our_best``, with an optimizer crash on one task kept as that task's row instead of ending the run."""
    started = time.monotonic()
    try:
        return our_best(task, target, budget_s, evaluator)
    except Exception as exc:  # a long benchmark reports a broken task and goes on
        return Ours(strategy="error", status="error", speedup=None, beat_reference=False,
                    seconds=round(time.monotonic() - started, 1), note=f"{type(exc).__name__}: {exc}"[:300])


def _ours_in_child(task_id: str, target: str, budget_s: float, memory_bytes: int, conn: "Connection") -> None:
    """The optimizer in a process whose address space is bounded: what it renders must not take the machine."""
    import resource

    from jaxbench.evaluate import Evaluator
    from jaxbench.task import load_task
    from maxkernel.logging import configure

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, hard))  # soft only: sandboxed stages set their own
    configure("warning")
    with Evaluator() as evaluator:
        ours = _ours_or_error(load_task(task_id), target, budget_s, evaluator)
    conn.send(ours.model_dump_json())
    conn.close()


def ours_bounded(task_id: str, target: str, budget_s: float, memory_bytes: int = OURS_MEMORY_BYTES) -> Ours:
    """``our_best`` in a fresh process with at most ``memory_bytes`` of address space and a wall-clock bound."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_ours_in_child, args=(task_id, target, budget_s, memory_bytes, send), daemon=False)
    started = time.monotonic()
    proc.start()
    send.close()
    limit_s = OURS_WALL_FACTOR * budget_s + OURS_GRACE_S
    reply: str | None = None
    timed_out = not receive.poll(limit_s)
    if not timed_out:
        try:
            reply = receive.recv()
        except EOFError:
            reply = None  # the process died before it answered
    if proc.is_alive() and reply is None:
        proc.kill()
    proc.join(30)
    if reply is not None:
        return Ours.model_validate_json(reply)
    why = (f"no answer within {limit_s:.0f} s" if timed_out
           else f"the optimizer's process ended with exit code {proc.exitcode} (address space bounded at "
                f"{memory_bytes / (1 << 30):g} GiB)")
    seconds = round(time.monotonic() - started, 1)
    return Ours(strategy="error", status="error", speedup=None, beat_reference=False, seconds=seconds, note=why)


def evaluate_expert(expert: Expert, task: "Task", target: str, evaluator: "Evaluator") -> ExpertRow:
    """Check and price the expert candidate exactly as any candidate of ours is checked and priced."""
    from maxkernel.evaluation import evaluate_candidate

    started = time.monotonic()
    report = evaluate_candidate(task, expert.path.read_text(), target=target, filename=expert.path.name,
                                evaluator=evaluator)
    row = _expert_row(expert, target, report, time.monotonic() - started)
    row.measured = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    return row


def _expert_row(expert: Expert, target: str, report: "EvalReport", seconds: float) -> ExpertRow:
    ran = report.status == "ok" and report.correct
    # A declared interpret-mode limit counts only while the kernel really does not run; if it ever
    # passes, the row is priced like any other.
    provable = ran or expert.interpret_limit is None
    reason = report.reason if provable else f"{expert.interpret_limit}; here: {report.status}: {report.reason}"
    return ExpertRow(task=expert.task, target=target, kernel=expert.kernel, status=report.status, reason=reason,
                     label=report.label, speedup=report.speedup, ref_ms=report.ref_ms, kernel_ms=report.kernel_ms,
                     flags=list(report.flags), provable=provable, seconds=round(seconds, 1))


def tolerance_share(task: "Task", source: str, values: dict[str, Any], seed: int) -> float:
    """The largest |error| / (atol + rtol |expected|) of ``source`` on the evaluator's shifted inputs drawn
    from ``seed`` at size ``values``: under 1 passes that check, and what is left below 1 is the margin a
    random draw cannot take away. The Pallas kernels run in the plain interpreter, the arithmetic of TPU
    interpret mode without its simulated memory system (seconds, not minutes), with matmuls computed as a
    TPU computes them (``jaxbench.tpu_numerics``), as the evaluator's TPU check does. ``source`` runs in this
    process: our own wrappers only, never an untrusted candidate."""
    from functools import partial

    import jax
    import numpy as np
    from jax._src import config as jax_config

    from jaxbench.evaluate import shifted
    from jaxbench.tpu_numerics import computed_as_on_tpu

    sized = task.with_size("margin", values)
    args, static = sized.get_inputs(jax.random.key(seed), "margin")
    inputs = shifted([np.asarray(a) for a in args])
    namespace: dict[str, Any] = {}
    exec(compile(source, f"{task.id}_candidate.py", "exec"), namespace)  # as the worker loads a candidate
    expected = np.asarray(jax.jit(partial(sized.reference, **static))(*inputs)).astype(np.float32)
    interpret = jax_config.pallas_tpu_interpret_mode_context_manager
    previous = interpret.swap_local(True)  # any truthy value but TPU InterpretParams: the plain interpreter
    try:
        fn = partial(namespace["kernel"], **static)
        fn, _ = computed_as_on_tpu(fn, jax.make_jaxpr(fn)(*inputs), inputs)  # the numerics the check uses
        actual = np.asarray(jax.jit(fn)(*inputs)).astype(np.float32)
    finally:
        interpret.set_local(previous)
    tol = sized.spec.tolerance
    return float((np.abs(actual - expected) / (tol.atol + tol.rtol * np.abs(expected))).max())


def print_margins(console: Console, task: "Task", source: str, target: str, seeds: int) -> None:
    """A wrapper's check size and modelled speedup on ``target`` (as the evaluator derives them), then its
    tolerance share on the shifted inputs of ``seeds`` draws there: how to compare wrapper configurations."""
    from maxkernel.targets.model import model_reference
    from maxkernel.targets.names import parse_target
    from maxkernel.targets.sandboxed import run_tpu_stage

    generation = parse_target(target)[1]
    assert generation is not None
    stage = run_tpu_stage(task.path, source, generation)
    if stage.failure or stage.check is None or stage.check.refusal:
        why = stage.failure or (stage.check.refusal if stage.check else (stage.lowering or {}).get("reason"))
        console.print(f"{task.id} {target}: no check size: {why}", markup=False)
        return
    speedup = "not priced"
    if stage.model:
        speedup = f"{model_reference(task, generation).time_ms / stage.model['time_ms']:.2f}x"
    console.print(f"{task.id} {target}: modelled {speedup}; checked at {stage.check.name}", markup=False)
    shares = []
    for seed in range(FIRST_SEED, FIRST_SEED + seeds):
        shares.append(tolerance_share(task, source, stage.check.values, seed))
        console.print(f"  shifted inputs of seed {seed}: worst error {shares[-1]:.3f} of the tolerance", markup=False)
    console.print(f"  worst over {seeds} draws: {max(shares):.3f} of the tolerance", markup=False)


def _experts_for(names: list[str] | None) -> list[Expert]:
    if not names:
        return list(EXPERTS)
    chosen = []
    for name in names:
        match = [e for e in EXPERTS if e.task == name or e.task.startswith(f"{name}_")]
        if not match:
            raise ValueError(f"no expert baseline for task {name!r}: covered are {', '.join(e.task for e in EXPERTS)}")
        chosen += match
    return chosen


def _suite_tasks(names: list[str] | None) -> list["Task"]:
    from jaxbench.task import list_tasks, load_task

    if not names:
        return list_tasks()
    by_prefix = {t.id.split("_")[0]: t.id for t in list_tasks()}
    return [load_task(by_prefix.get(name, name)) for name in names]


def _targets(text: str) -> list[str]:
    from maxkernel.targets.names import TargetError, parse_target

    targets = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not targets:
        raise TargetError("no target given")
    for target in targets:
        if parse_target(target)[0] != "tpu":
            raise TargetError(f"target {target!r} is not a TPU: the experts are TPU kernels")
    return targets


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=console, transient=True)


def run_experts(experts: list[Expert], targets: list[str], budget_s: float, with_ours: bool,
                evaluator: "Evaluator", console: Console,
                on_row: Callable[[list[ExpertRow]], None] | None = None) -> list[ExpertRow]:
    """Every expert on every target, each followed by our optimizer's best there (unless experts only).

    ``on_row`` sees the rows so far after each one, so a long run keeps what it has measured."""
    from jaxbench.task import load_task

    rows: list[ExpertRow] = []
    with _progress(console) as progress:
        bar = progress.add_task("experts", total=len(experts) * len(targets))
        for target in targets:
            for expert in experts:
                progress.update(bar, description=f"{expert.task} on {target}: expert")
                task = load_task(expert.task)
                row = evaluate_expert(expert, task, target, evaluator)
                if with_ours and row.provable:
                    progress.update(bar, description=f"{expert.task} on {target}: ours ({budget_s:g} s)")
                    row.ours = ours_bounded(task.id, target, budget_s)
                rows.append(row)
                progress.console.print(f"{row.task} {target}: expert {_expert_cell(row)[:120]}; ours {_ours_cell(row.ours)}",
                                       markup=False, highlight=False)
                if on_row:
                    on_row(rows)
                progress.advance(bar)
    return rows


def run_suite(tasks: list["Task"], budget_s: float, console: Console,
              on_row: Callable[[list[SuiteRow]], None] | None = None) -> list[SuiteRow]:
    rows: list[SuiteRow] = []
    with _progress(console) as progress:
        bar = progress.add_task("suite", total=len(tasks))
        for task in tasks:
            progress.update(bar, description=f"{task.id} on {SUITE_TARGET}")
            rows.append(SuiteRow(task=task.id, ours=ours_bounded(task.id, SUITE_TARGET, budget_s)))
            progress.console.print(f"{task.id}: {_ours_cell(rows[-1].ours)}", markup=False, highlight=False)
            if on_row:
                on_row(rows)
            progress.advance(bar)
    return rows


def geomean(values: list[float]) -> float | None:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _miss(row: ExpertRow) -> str | None:
    """Why this covered row misses the target (expert accepted and priced, ours >= expert), or None."""
    if row.status != "ok":
        return f"expert not accepted: {row.status}: {row.reason[:160]}"
    if row.speedup is None:
        return "expert accepted but not priced: " + ("; ".join(row.flags)[:160] or "no model figures")
    if row.ours is None or not row.ours.speedup:
        return "ours not run" if row.ours is None else f"ours failed: {row.ours.note[:160]}"
    ratio = row.ratio
    if ratio is not None and ratio < 1.0:
        return f"ours {row.ours.speedup:.2f}x below the expert's {row.speedup:.2f}x (ours/expert {ratio:.2f})"
    return None


def expert_summary(rows: list[ExpertRow]) -> dict[str, dict[str, Any]]:
    """Per target, what the target counts over the covered rows (expert provable here): how many experts
    are accepted (ok and correct), how many are priced, on how many ours >= expert, each miss and why; and
    whether the target holds (every covered expert accepted and priced, ours >= expert on every one)."""
    out: dict[str, dict[str, Any]] = {}
    for target in dict.fromkeys(r.target for r in rows):
        mine = [r for r in rows if r.target == target]
        covered = [r for r in mine if r.provable]
        ratios = [r.ratio for r in covered if r.ratio is not None]
        misses = {r.task: why for r in covered if (why := _miss(r)) is not None}
        out[target] = {
            "covered": len(covered),
            "not_provable": [r.task for r in mine if not r.provable],
            "expert_accepted": sum(1 for r in covered if r.status == "ok"),
            "expert_priced": sum(1 for r in covered if r.priced),
            "expert_not_ok": {r.task: f"{r.status}: {r.reason}" for r in covered if r.status != "ok"},
            "expert_unpriced": {r.task: "; ".join(r.flags) for r in covered if r.status == "ok" and r.speedup is None},
            "compared": len(ratios),
            "ours_at_least_expert": sum(1 for x in ratios if x >= 1.0),
            "geomean_ratio": geomean(ratios),
            "misses": misses,
            "target_met": bool(covered) and not misses,
        }
    return out


def suite_summary(rows: list[SuiteRow]) -> dict[str, Any]:
    speedups = [max(r.ours.speedup or 1.0, 1e-9) for r in rows]  # a crashed task counts as the reference
    pallas = [r for r in rows if r.ours.label == "pallas-kernel" and r.ours.beat_reference and (r.ours.speedup or 0) > 1.0]
    return {"target": SUITE_TARGET, "tasks": len(rows), "pallas_faster": len(pallas), "geomean": geomean(speedups)}


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _expert_cell(row: ExpertRow) -> str:
    if not row.provable:
        return NOT_PROVABLE
    if row.status != "ok":
        return f"{row.status}: {row.reason[:90]}"
    if row.speedup is None:
        return "ok, not priced: " + ("; ".join(row.flags)[:80] or "no model figures")
    return _x(row.speedup)


def _ours_cell(ours: Ours | None) -> str:
    if ours is None:
        return "-"
    if ours.status == "error":
        return f"optimizer failed: {ours.note[:100]}"
    shown = {k: v for k, v in ours.params.items() if k != "source"}  # a recalled kernel carries its source
    params = f" {shown}" if shown else ""
    return f"{ours.strategy}{params} [{ours.label or '-'}] {_x(ours.speedup)}"


def print_experts(console: Console, rows: list[ExpertRow], budget_s: float) -> None:
    table = Table(title=f"expert kernels vs ours (modelled at full size; ours: --budget {budget_s:g})")
    for col in ("task", "target", "expert kernel", "expert", "ours (strategy [label] speedup)", "ours/expert"):
        table.add_column(escape(col), justify="right" if col in ("ours/expert",) else "left", overflow="fold")
    for row in rows:
        table.add_row(row.task, row.target, row.kernel, escape(_expert_cell(row)), escape(_ours_cell(row.ours)),
                      "-" if row.ratio is None else f"{row.ratio:.2f}")
    console.print(table)
    for line in summary_lines(rows):
        console.print(line, markup=False)


def summary_lines(rows: list[ExpertRow]) -> list[str]:
    """Per target, the counts the target is judged on, then one line for each covered row that misses it."""
    lines = []
    for target, s in expert_summary(rows).items():
        lines.append(f"{target}: experts accepted {s['expert_accepted']}/{s['covered']} covered "
                     f"(priced {s['expert_priced']}; not provable here: {', '.join(s['not_provable']) or 'none'}); "
                     f"ours >= expert on {s['ours_at_least_expert']}/{s['covered']}; "
                     f"geomean ours/expert {_x(s['geomean_ratio'])} over {s['compared']}; "
                     f"target {'met' if s['target_met'] else 'not met'}")
        lines += [f"  {target} misses {task}: {why}" for task, why in s["misses"].items()]
    return lines


def print_suite(console: Console, rows: list[SuiteRow], budget_s: float) -> None:
    table = Table(title=f"whole suite on {SUITE_TARGET} (modelled; --budget {budget_s:g})")
    for col in ("task", "best", "label", "speedup"):
        table.add_column(col, justify="right" if col == "speedup" else "left", overflow="fold")
    for row in rows:
        params = f" {row.ours.params}" if row.ours.params else ""
        table.add_row(row.task, escape(row.ours.strategy + params), row.ours.label or "-", _x(row.ours.speedup))
    console.print(table)
    s = suite_summary(rows)
    console.print(f"Pallas kernels modelled faster than the reference: {s['pallas_faster']}/{s['tasks']}   "
                  f"geomean: {_x(s['geomean'])}", markup=False)


def merge_rows(paths: list[Path]) -> list[ExpertRow]:
    """The expert rows of earlier runs' JSON files, in the order given (a later file's row for the same task
    and target replaces an earlier one). A row without its own time takes its file's ``measured``, if any."""
    rows: dict[tuple[str, str], ExpertRow] = {}
    for path in paths:
        payload = json.loads(path.read_text())
        for raw in payload.get("rows", []):
            row = ExpertRow.model_validate({k: v for k, v in raw.items() if k not in ("ratio", "priced")})
            row.measured = row.measured or payload.get("measured")
            rows[(row.task, row.target)] = row
    return list(rows.values())


def markdown_table(rows: list[ExpertRow]) -> str:
    """One line a task, the targets side by side: expert, ours, ours/expert (a failed expert by its status
    and the first part of its reason: the check that failed), and when its first row was measured."""
    targets = list(dict.fromkeys(r.target for r in rows))
    head = ["task", "expert kernel"] + [f"{col} {t.removeprefix('tpu-')}" for t in targets
                                          for col in ("expert", "ours", "ours/expert")] + ["measured (UTC)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task in dict.fromkeys(r.task for r in rows):
        mine = {r.target: r for r in rows if r.task == task}
        first = next(iter(mine.values()))
        cells = [task.split("_")[0], first.kernel]
        for target in targets:
            row = mine.get(target)
            if row is None:
                cells += ["not run", "not run", "-"]
                continue
            expert = (f"{row.status} ({row.reason.split(':')[0][:40]})" if row.provable and row.status != "ok"
                      else _expert_cell(row))
            cells += [expert.replace("|", "/"), _ours_cell(row.ours).replace("|", "/"),
                      "-" if row.ratio is None else f"{row.ratio:.2f}"]
        cells.append(min((r.measured for r in mine.values() if r.measured), default="-"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


app = typer.Typer(add_completion=False)


@app.command()
def main(
    targets: str = typer.Option(DEFAULT_TARGETS, help="comma-separated TPU targets"),
    tasks: Optional[str] = typer.Option(None, help="comma-separated task ids or prefixes (1p, 6p_Paged_Attention)"),
    budget: float = typer.Option(60.0, help="seconds of optimizer budget per task and target"),
    experts_only: bool = typer.Option(False, "--experts-only", help="price the experts only; do not run our optimizer"),
    suite: bool = typer.Option(False, "--suite", help=f"the whole suite on {SUITE_TARGET} (our best per task)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write every figure as JSON"),
    merge: Optional[str] = typer.Option(None, help="comma-separated JSON files of earlier runs: one table of their rows"),
    markdown: bool = typer.Option(False, "--markdown", help="with --merge: print the table as Markdown"),
    margin: Optional[Path] = typer.Option(None, help="a wrapper file for the one task of --tasks: its check size, "
                                                     "modelled speedup (first of --targets) and tolerance share"),
    seeds: int = typer.Option(3, help="with --margin: how many shifted-input draws"),
) -> None:
    """Our optimizer against JAX's expert Pallas TPU kernels, both priced by the cost model."""
    from jaxbench.evaluate import Evaluator
    from jaxbench.task import TaskError
    from maxkernel.logging import configure
    from maxkernel.targets.names import TargetError

    configure("warning")
    console = Console(width=200)
    if merge:
        paths = [Path(p.strip()) for p in merge.split(",") if p.strip()]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing or not paths:
            Console(stderr=True).print(f"error: no such JSON file: {', '.join(missing) or merge}", markup=False)
            raise typer.Exit(2)
        merged = merge_rows(paths)
        if json_path:
            json_path.write_text(json.dumps({"merged_from": [str(p) for p in paths],
                                             "rows": [dict(r.model_dump(), ratio=r.ratio, priced=r.priced) for r in merged],
                                             "summary": expert_summary(merged)}, indent=2))
        if markdown:
            print(markdown_table(merged) + "\n\n" + "\n".join(summary_lines(merged)))
        else:
            print_experts(console, merged, budget)
        return
    names = [n.strip() for n in tasks.split(",") if n.strip()] if tasks else None
    try:
        chosen_targets = _targets(targets)
        experts = [] if suite else _experts_for(names)
        suite_tasks = _suite_tasks(names) if suite else []
    except (TargetError, TaskError, ValueError) as exc:
        Console(stderr=True).print(f"error: {exc}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    if margin is not None:
        if suite or not margin.is_file() or len(experts) != 1 or seeds < 1:
            Console(stderr=True).print("error: --margin takes an existing wrapper file, one task in --tasks and "
                                       "--seeds of at least 1", markup=False)
            raise typer.Exit(2)
        from jaxbench.task import load_task

        print_margins(console, load_task(experts[0].task), margin.read_text(), chosen_targets[0], seeds)
        return
    if budget <= 0 and not experts_only:
        Console(stderr=True).print("error: --budget must be positive (or pass --experts-only)", markup=False)
        raise typer.Exit(2)

    payload: dict[str, Any] = {"budget_s": budget}

    def save() -> None:
        if json_path:
            json_path.write_text(json.dumps(payload, indent=2))

    def keep_suite(rows: list[SuiteRow]) -> None:
        payload["suite"] = {"rows": [r.model_dump() for r in rows], "summary": suite_summary(rows)}
        save()

    def keep_experts(rows: list[ExpertRow]) -> None:
        payload.update(targets=chosen_targets, experts_only=experts_only,
                       rows=[dict(r.model_dump(), ratio=r.ratio, priced=r.priced) for r in rows],
                       summary=expert_summary(rows))
        save()

    if suite:
        print_suite(console, run_suite(suite_tasks, budget, console, keep_suite), budget)
        return
    with Evaluator() as evaluator:
        rows = run_experts(experts, chosen_targets, budget, not experts_only, evaluator, console, keep_experts)
    print_experts(console, rows, budget)


if __name__ == "__main__":
    app()
