"""The TPU cost model against real TPU measurements: optimization traces of measured programs (a benchmark).

    python benchmarks/tpu_calibration.py --traces DIR [--generation v6e] [--json FILE] [--skip-guide]

Every ``*_trace.py`` in DIR is read as data (:mod:`maxkernel.targets.trace_nodes`: parsed, never executed);
its first program becomes the task (its inputs at the published shapes) and each program is priced as a
candidate in the evaluator's sandbox (:mod:`maxkernel.targets.price_stage`), with the API shims it needed
named beside its figure. The measured times are device times (host dispatch excluded), so the modelled
figure compared is the model's time less its dispatch term.

Printed: per node measured, modelled and modelled/measured; per trace the Spearman rank correlation along
the trace, whether the model's fastest node is the measured fastest, and final-over-start speedup modelled
and measured; then the calibration targets, each met or not:

- Spearman >= 0.9 on every trace of 6 or more nodes whose measured times spread by 20% or more; on the
  others, the model's fastest node is the measured fastest;
- final-over-start speedup in the measured direction and within 1.35x of it, on every trace;
- median modelled/measured in [0.8, 1.25], and at least 35 of every 39 nodes within 1.5x;
- the Pallas TPU matmul guide's table (``maxkernel.targets.calibration``) within its stated error.

``--json FILE`` writes every figure. Exit code 2 (one line) when DIR holds no readable trace.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from pydantic import BaseModel, Field
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from maxkernel.targets.price_stage import run_price_stage  # noqa: E402
from maxkernel.targets.specs import load_model_constants  # noqa: E402
from maxkernel.targets.trace_nodes import TraceError, TraceNode, candidate_source, find_traces, read_trace, write_task  # noqa: E402

SPEARMAN_TARGET = 0.9
SPREAD_FOR_SPEARMAN = 1.2  # slowest / fastest measured
MIN_NODES_FOR_SPEARMAN = 6
SPEEDUP_WITHIN = 1.35
MEDIAN_RANGE = (0.8, 1.25)
NODE_WITHIN = 1.5
NODES_WITHIN_SHARE = 35 / 39


class NodeResult(BaseModel):
    trace: str
    index: int
    measured_ms: float | None
    modelled_ms: float | None = None  # the model's time less its dispatch term
    kind: str | None = None  # pallas | xla
    bound: str | None = None
    shims: list[str] = []
    error: str | None = None
    notes: list[str] = []
    pieces: Optional[dict] = Field(default=None, exclude=True)  # with --fit: what the price is made of

    @property
    def ratio(self) -> float | None:
        if self.modelled_ms is None or not self.measured_ms:
            return None
        return self.modelled_ms / self.measured_ms


class TraceSummary(BaseModel):
    trace: str
    nodes: int
    priced: int
    spearman: float | None
    fastest_agree: bool | None
    speedup_modelled: float | None
    speedup_measured: float | None
    measured_spread: float | None


class Target(BaseModel):
    name: str
    met: bool
    detail: str


class CalibrationReport(BaseModel):
    date: str
    generation: str
    traces_dir: str
    dispatch_excluded_ms: float
    nodes: list[NodeResult]
    traces: list[TraceSummary]
    targets: list[Target]


def ranks(values: list[float]) -> np.ndarray:
    """Ranks from 1, ties given their average rank."""
    arr = np.asarray(values, dtype=float)
    order = np.argsort(arr, kind="mergesort")
    out = np.empty(len(arr))
    i = 0
    while i < len(arr):
        j = i
        while j + 1 < len(arr) and arr[order[j + 1]] == arr[order[i]]:
            j += 1
        out[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on average ranks); None below 3 points or for a constant side."""
    if len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])


def summarize(trace: str, nodes: list[NodeResult]) -> TraceSummary:
    priced = [n for n in nodes if n.modelled_ms is not None and n.measured_ms is not None]
    measured = [n.measured_ms for n in priced]
    modelled = [n.modelled_ms for n in priced]
    whole = len(priced) == len([n for n in nodes if n.measured_ms is not None]) and priced
    start, final = (nodes[0], nodes[-1]) if nodes else (None, None)
    both = start is not None and final is not None and start in priced and final in priced
    return TraceSummary(
        trace=trace, nodes=len(nodes), priced=len(priced),
        spearman=spearman(measured, modelled),  # type: ignore[arg-type]
        fastest_agree=(int(np.argmin(measured)) == int(np.argmin(modelled))) if whole else None,
        speedup_modelled=start.modelled_ms / final.modelled_ms if both else None,  # type: ignore[union-attr,operator]
        speedup_measured=start.measured_ms / final.measured_ms if both else None,  # type: ignore[union-attr,operator]
        measured_spread=max(measured) / min(measured) if measured else None,  # type: ignore[type-var,operator]
    )


def judge(nodes: list[NodeResult], traces: list[TraceSummary], guide: tuple[bool, str] | None) -> list[Target]:
    """The calibration targets, each met or not, with the figures that decide it."""
    out = []
    ranked, fastest = [], []
    for t in traces:
        if t.nodes >= MIN_NODES_FOR_SPEARMAN and (t.measured_spread or 0) >= SPREAD_FOR_SPEARMAN:
            ranked.append(t)
        else:
            fastest.append(t)
    ok = all(t.spearman is not None and t.spearman >= SPEARMAN_TARGET for t in ranked) and all(
        t.fastest_agree for t in fastest)
    detail = "; ".join([*(f"{t.trace}: Spearman {_fmt(t.spearman, '.2f')}" for t in ranked),
                        *(f"{t.trace}: fastest agree {_yes(t.fastest_agree)}" for t in fastest)])
    out.append(Target(name=f"Spearman >= {SPEARMAN_TARGET} on traces of >= {MIN_NODES_FOR_SPEARMAN} nodes spread "
                           f">= 20%; elsewhere the fastest agree", met=ok, detail=detail))
    parts, ok = [], True
    for t in traces:
        if t.speedup_modelled is None or t.speedup_measured is None:
            ok = False
            parts.append(f"{t.trace}: not priced")
            continue
        right = (t.speedup_modelled > 1) == (t.speedup_measured > 1)
        off = max(t.speedup_modelled / t.speedup_measured, t.speedup_measured / t.speedup_modelled)
        ok = ok and right and off <= SPEEDUP_WITHIN
        parts.append(f"{t.trace}: {t.speedup_modelled:.2f}x vs {t.speedup_measured:.2f}x ({off:.2f}x off)")
    out.append(Target(name=f"final-over-start speedup in the right direction and within {SPEEDUP_WITHIN}x",
                      met=ok, detail="; ".join(parts)))
    ratios = [n.ratio for n in nodes if n.ratio is not None]
    measured = [n for n in nodes if n.measured_ms is not None]
    median = statistics.median(ratios) if ratios else float("nan")
    out.append(Target(name=f"median modelled/measured in [{MEDIAN_RANGE[0]}, {MEDIAN_RANGE[1]}]",
                      met=bool(ratios) and MEDIAN_RANGE[0] <= median <= MEDIAN_RANGE[1],
                      detail=f"median {median:.2f} over {len(ratios)} nodes (10th-90th percentile "
                             f"{_pct(ratios, 10)}-{_pct(ratios, 90)})"))
    within = sum(1 for r in ratios if max(r, 1 / r) <= NODE_WITHIN)
    need = math.ceil(NODES_WITHIN_SHARE * len(measured) - 1e-9)
    out.append(Target(name=f"at least 35 of every 39 nodes within {NODE_WITHIN}x", met=within >= need,
                      detail=f"{within} of {len(measured)} within (needs {need})"))
    if guide is not None:
        out.append(Target(name="the matmul guide's table within its stated error", met=guide[0], detail=guide[1]))
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("yes" if value else "no")


def _pct(values: list[float], q: float) -> str:
    return f"{np.percentile(values, q):.2f}" if values else "—"


def price_node(task_path: Path, node: TraceNode, generation: str, dispatch_ms: float, timeout_s: float,
               capture: bool = False) -> NodeResult:
    source, shims = candidate_source(node)
    result = NodeResult(trace=node.trace, index=node.index, measured_ms=node.measured_ms, shims=shims)
    stage = run_price_stage(task_path, source, generation, timeout_s, capture=capture)
    result.pieces = stage.pieces
    if stage.failure or stage.model_error:
        result.error = stage.failure or stage.model_error
        return result
    model = stage.model or {}
    result.modelled_ms = float(model["time_ms"]) - dispatch_ms
    result.kind, result.bound, result.notes = model.get("kind"), model.get("bound"), list(model.get("notes", []))
    return result


def guide_check() -> tuple[bool, str]:
    from maxkernel.targets.calibration import calibration_rows

    rows = calibration_rows("v5e")
    bad = [f"{r.program} {r.blocks} {r.size}" for r in rows if not r.within]
    return not bad, f"{len(rows) - len(bad)} of {len(rows)} rows within" + (f" (outside: {', '.join(bad)})" if bad else "")


def calibrate(traces_dir: Path, generation: str = "v6e", timeout_s: float = 300, guide: bool = True,
              console: Console | None = None, capture: bool = False) -> CalibrationReport:
    """Price every node of every trace in ``traces_dir``; raises TraceError when a trace cannot be read."""
    paths = find_traces(traces_dir)
    chains = [read_trace(p) for p in paths]
    dispatch_ms = load_model_constants().dispatch_overhead_s.value * 1e3
    nodes: list[NodeResult] = []
    summaries = []
    with tempfile.TemporaryDirectory(prefix="tpu_calib_") as tmp:
        for chain in chains:
            task_path = write_task(Path(tmp) / chain[0].trace, chain[0])
            done = []
            for node in chain:
                started = time.monotonic()
                done.append(price_node(task_path, node, generation, dispatch_ms, timeout_s, capture))
                if console is not None:
                    r = done[-1]
                    console.log(f"{r.trace}[{r.index}] {_fmt(r.modelled_ms, '.4f')} ms modelled, "
                                f"{_fmt(r.measured_ms, '.3f')} measured ({time.monotonic() - started:.1f} s)"
                                + (f": {r.error}" if r.error else ""))
            nodes.extend(done)
            summaries.append(summarize(chain[0].trace, done))
    return CalibrationReport(
        date=datetime.now(timezone.utc).isoformat(timespec="seconds"), generation=generation,
        traces_dir=str(traces_dir), dispatch_excluded_ms=dispatch_ms, nodes=nodes, traces=summaries,
        targets=judge(nodes, summaries, guide_check() if guide else None))


def print_report(report: CalibrationReport, console: Console) -> None:
    table = Table(title=f"nodes (tpu-{report.generation}; modelled less its {report.dispatch_excluded_ms:.4f} ms "
                        "dispatch term)")
    for col in ("trace", "node", "measured ms", "modelled ms", "modelled/measured", "kind", "shims / error"):
        table.add_column(col)
    for n in report.nodes:
        table.add_row(n.trace, str(n.index), _fmt(n.measured_ms, ".3f"), _fmt(n.modelled_ms, ".4f"),
                      _fmt(n.ratio, ".2f"), n.kind or "—", n.error or ", ".join(n.shims) or "—")
    console.print(table)
    table = Table(title="traces")
    for col in ("trace", "nodes", "priced", "Spearman", "fastest agree", "speedup modelled", "speedup measured"):
        table.add_column(col)
    for t in report.traces:
        table.add_row(t.trace, str(t.nodes), str(t.priced), _fmt(t.spearman, ".2f"), _yes(t.fastest_agree),
                      _fmt(t.speedup_modelled, ".2f"), _fmt(t.speedup_measured, ".2f"))
    console.print(table)
    for target in report.targets:
        console.print(f"[{'green' if target.met else 'red'}]{'MET' if target.met else 'NOT MET'}[/]  "
                      f"{target.name}: {target.detail}")
    console.print(f"targets met: {sum(t.met for t in report.targets)} of {len(report.targets)}")


class FoldResult(BaseModel):
    held_out: str
    params: dict[str, float]
    train_log_error: float


class FitReport(BaseModel):
    folds: list[FoldResult]
    held_out: CalibrationReport  # every node priced by the fold that did not see its trace
    shipped: dict[str, float]  # fitted on all traces
    shipped_guide_within: str
    shipped_report: CalibrationReport  # all traces under the shipped constants (in-sample)


def _under(report: CalibrationReport, predictions: dict[tuple[str, int], float], guide: tuple[bool, str] | None,
           ) -> CalibrationReport:
    nodes = [n.model_copy(update={"modelled_ms": predictions.get((n.trace, n.index))}) for n in report.nodes]
    summaries = [summarize(t.trace, [n for n in nodes if n.trace == t.trace]) for t in report.traces]
    return report.model_copy(update={"nodes": nodes, "traces": summaries,
                                     "targets": judge(nodes, summaries, guide)})


def fit_report(report: CalibrationReport, console: Console | None = None) -> FitReport:
    """Leave-one-trace-out: fit on every other trace (and the guide's table), price the held-out one; then the
    fit on all traces, the one to ship."""
    from maxkernel.targets.calibration_fit import Pieces, Prepared, current_params, fit, guide_pieces, guide_within, log_error

    prepared = {(n.trace, n.index): (Prepared(Pieces.model_validate(n.pieces)), n.measured_ms / 1e3)
                for n in report.nodes if n.pieces is not None and n.measured_ms}
    guide = [(Prepared(row.pieces), row) for row in guide_pieces()]
    start = current_params(report.generation)
    folds, held = [], {}
    for trace in [t.trace for t in report.traces]:
        train = [v for k, v in prepared.items() if k[0] != trace]
        params = fit(train, guide, start)
        folds.append(FoldResult(held_out=trace, params=params.model_dump(), train_log_error=log_error(params, train)))
        for key, (p, _) in prepared.items():
            if key[0] == trace:
                held[key] = p.seconds(params) * 1e3
        if console is not None:
            console.log(f"fold without {trace}: {params.model_dump()}")
    shipped = fit(list(prepared.values()), guide, start)
    within, _ = guide_within(guide, shipped)
    guide_line = (within == len(guide), f"{within} of {len(guide)} rows within (fitted constants)")
    fold_guides = [guide_within(guide, FitParams_of(f.params))[0] == len(guide) for f in folds]
    fold_guide = (all(fold_guides), f"every fold's constants keep the table within: {all(fold_guides)}")
    all_in = {k: p.seconds(shipped) * 1e3 for k, (p, _) in prepared.items()}
    return FitReport(folds=folds, held_out=_under(report, held, fold_guide), shipped=shipped.model_dump(),
                     shipped_guide_within=guide_line[1], shipped_report=_under(report, all_in, guide_line))


def FitParams_of(values: dict[str, float]):  # noqa: N802 - a constructor by another name
    from maxkernel.targets.calibration_fit import FitParams

    return FitParams(**values)


def main(
    traces: Path = typer.Option(..., "--traces", help="folder of *_trace.py files"),
    generation: str = typer.Option("v6e", help="TPU generation the traces were measured on"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write every figure to this file"),
    skip_guide: bool = typer.Option(False, "--skip-guide", help="leave out the matmul guide's table"),
    timeout_s: float = typer.Option(300.0, help="seconds one node's pricing may take"),
    pieces: Optional[Path] = typer.Option(None, "--pieces", help="with --fit: keep the priced pieces in this "
                                          "file, or refit from it when it exists"),
    refit: bool = typer.Option(False, "--fit", help="also fit the Pallas constants: leave-one-trace-out "
                               "figures and the constants fitted on all traces"),
) -> None:
    console = Console()
    if pieces is not None and pieces.exists():  # priced before: refit without pricing again
        saved = json.loads(pieces.read_text())
        report = CalibrationReport.model_validate(saved["report"])
        for node, kept in zip(report.nodes, saved["pieces"]):
            node.pieces = kept
    else:
        try:
            report = calibrate(traces, generation, timeout_s, guide=not skip_guide, console=console, capture=refit)
        except TraceError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2)
        if pieces is not None:
            pieces.write_text(json.dumps({"report": report.model_dump(mode="json"),
                                          "pieces": [n.pieces for n in report.nodes]}))
    console.rule("the model as configured")
    print_report(report, console)
    out: dict = {"as_configured": report.model_dump(mode="json")}
    if refit:
        fitted = fit_report(report, console)
        console.rule("leave-one-trace-out: each trace priced by constants fitted on the others")
        print_report(fitted.held_out, console)
        for fold in fitted.folds:
            console.print(f"without {fold.held_out}: " + ", ".join(f"{k}={v:.4g}" for k, v in fold.params.items()))
        console.rule("fitted on all traces (the constants to ship; in-sample)")
        console.print(", ".join(f"{k}={v:.4g}" for k, v in fitted.shipped.items()))
        console.print(f"matmul guide: {fitted.shipped_guide_within}")
        out["fit"] = fitted.model_dump(mode="json")
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    typer.run(main)
