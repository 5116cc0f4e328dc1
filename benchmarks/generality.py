"""Generality: the one engine on computations nobody tuned it for (a benchmark, not a test).

    python benchmarks/generality.py --seed S --count N [--target tpu-v6e] [--evals 20] [--json FILE]
    python benchmarks/generality.py --variants [--seed S]      # 2 metamorphic variants of each suite task
    python benchmarks/generality.py --tasks DIR                 # every task folder under DIR
    python benchmarks/generality.py --peer [--calibration DIR]  # the peer's plain-JAX starting programs
    python benchmarks/generality.py --resume RUN_DIR            # finish a killed run

Tasks are drawn fresh by ``jaxbench.generate`` (the seed is printed; without ``--seed`` it comes from the
clock), derived by ``jaxbench.variants``, read from a folder, or built from the calibration traces (parsed,
never executed, never copied into the repository). Each task is one session of the one engine
(``orchestrators.api.optimize``, what ``maxkernel optimize`` runs) with an evaluation budget, in a process
of its own with a fresh data dir (nothing recalled from another task), two tasks at a time.

Per task: the winner's label (pallas: a Pallas kernel beat the reference; jax: a plain-JAX rewrite did;
reference: the reference was returned), its modelled speedup (1.0x for a returned reference), and the
reference's and the winner's share of the roofline bound: max(bytes of inputs and outputs / HBM bandwidth,
MXU flops / the peak of the MXU class the reference uses) over the modelled time. Per family and in total;
with the failed sessions and the template trace errors counted, and the cost-model version named.

Everything lands in RUN_DIR (the tasks, ``run.json`` with the configuration, ``rows.jsonl`` one row per
finished task); ``--json FILE`` gets the rows and summary after every task.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_CALIBRATION = ROOT.parent / "shared" / "calibration"
SESSION_MEMORY_BYTES = 12 << 30  # a session's address space: what a render allocates must not take the machine
SESSION_WALL_S = 3600  # a guard against a hung session only; the budget is evaluations
COST_MODEL_FILES = ("config/targets.yaml", "maxkernel/targets/model.py", "maxkernel/targets/ops.py",
                    "maxkernel/targets/work.py", "maxkernel/targets/xla_cost.py", "maxkernel/targets/specs.py",
                    "maxkernel/targets/xla_tpu.py")
TEMPLATE_ERROR_STATUSES = ("compile_error", "runtime_error")


class UsageError(Exception):
    """Bad input: one line, exit code 2."""


def code_commit() -> str:
    """The checkout's short commit ("" outside a git checkout)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cost_model_version() -> str:
    """The cost model's identity: a digest of its constants and code, with the commit they came from."""
    h = hashlib.sha256()
    for rel in COST_MODEL_FILES:
        path = ROOT / rel
        h.update(rel.encode())
        h.update(path.read_bytes() if path.is_file() else b"")
    commit = code_commit()
    from maxkernel.targets.xla_tpu import compiler_used

    # XLA code is priced by XLA:TPU's own compiled program where libtpu is installed, by a fallback
    # roofline elsewhere: two models, named apart
    pricing = "+xla-tpu" if compiler_used() else "+fallback"
    return f"model-{h.hexdigest()[:10]}{pricing}" + (f" (commit {commit})" if commit else "")


# ---------------------------------------------------------------- building the task folders

def build_generated(run_dir: Path, seed: int, count: int) -> list[dict[str, Any]]:
    """The ``count`` tasks of ``seed``; each folder is written under ``run_dir/tasks`` just before its session
    (:func:`materialize`), so that sessions start while later tasks are still unwritten."""
    from jaxbench.generate import draw, task_id

    entries = []
    for slot, draft in draw(seed, count):
        tid = task_id(seed, slot, draft)
        entries.append({"task": tid, "path": str(run_dir / "tasks" / tid), "family": draft.family,
                        "dtype": draft.dtype, "decode": draft.decode, "slot": slot.model_dump()})
    return entries


def materialize(entry: dict[str, Any]) -> None:
    """Write a generated entry's task folder if it is not there yet (its tolerance measured as it is written)."""
    if "slot" not in entry or (Path(entry["path"]) / "task.yaml").is_file():
        return
    from jaxbench.generate.draw import Slot, draft_of
    from jaxbench.generate.write import write_task

    write_task(draft_of(Slot.model_validate(entry["slot"])), Path(entry["path"]), entry["task"])


def build_variants(run_dir: Path, seed: int) -> list[dict[str, Any]]:
    """Two variants of each suite task, the kinds drawn from ``seed``."""
    from jaxbench.task import list_tasks
    from jaxbench.variants import derive_for_benchmark

    entries = []
    for task in list_tasks():
        for kind, folder in derive_for_benchmark(task, run_dir / "tasks", seed):
            entries.append({"task": folder.name, "path": str(folder), "family": f"variant:{kind}",
                            "dtype": _spec_dtype(folder), "decode": False})
    return entries


def build_folder(directory: Path) -> list[dict[str, Any]]:
    """Every task folder under ``directory`` (a folder holding task.yaml), in name order."""
    from jaxbench.task import TaskError, load_task

    if not directory.is_dir():
        raise UsageError(f"--tasks {directory}: no such folder")
    folders = sorted(p.parent for p in directory.rglob("task.yaml"))
    if not folders:
        raise UsageError(f"--tasks {directory}: no task folder (task.yaml) under it")
    entries = []
    for folder in folders:
        try:
            task = load_task(folder)
        except TaskError as exc:
            raise UsageError(" ".join(str(exc).split())) from exc
        entries.append({"task": task.id, "path": str(folder), "family": task.spec.category,
                        "dtype": task.spec.dtype, "decode": False})
    return entries


def build_peer(run_dir: Path, calibration: Path) -> list[dict[str, Any]]:
    """The peer's plain-JAX starting programs as task folders (see ``benchmarks/peer_tasks.py``)."""
    from benchmarks.peer_tasks import peer_task_folders

    if not (calibration / "autocomp_v6e").is_dir():
        raise UsageError(f"--calibration {calibration}: no autocomp_v6e folder in it")
    return [{"task": folder.name, "path": str(folder), "family": "peer", "dtype": _spec_dtype(folder), "decode": False}
            for folder in peer_task_folders(calibration / "autocomp_v6e", run_dir / "tasks")]


def _spec_dtype(folder: Path) -> str:
    import yaml

    return str(yaml.safe_load((folder / "task.yaml").read_text()).get("dtype"))


# ---------------------------------------------------------------- one session

def roofline_bound_ms(task: Any, generation: str) -> tuple[float, str]:
    """The roofline bound of ``task`` at full size (ms) and the MXU class its reference uses."""
    import jax
    import numpy as np

    from jaxbench.task_check import full_shapes
    from maxkernel.targets.ops import count_ops
    from maxkernel.targets.specs import load_tpu_spec
    from functools import partial

    spec = load_tpu_spec(generation)
    arg_shapes, static, out_shapes = full_shapes(task, "full")
    closed = jax.make_jaxpr(partial(task.reference, **static))(*arg_shapes)
    counts = count_ops(closed.jaxpr)
    share = spec.cores_per_device / spec.cores_per_chip
    rates = {"bf16": spec.peak_bf16_flops, "f32_high": spec.peak_f32_flops * 2, "f32": spec.peak_f32_flops,
             "int8": spec.peak_int8_ops}
    compute = sum(flops / (rates[cls] * share) for cls, flops in counts.mxu.items())
    leaves = jax.tree_util.tree_leaves((arg_shapes, out_shapes))
    io_bytes = float(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize for x in leaves))
    memory = io_bytes / (spec.hbm_bandwidth * share)
    mxu_class = max(counts.mxu, key=counts.mxu.get) if counts.mxu else "none"
    return max(compute, memory) * 1e3, mxu_class


def run_session(entry: dict[str, Any], target: str, evals: int, seed: int) -> dict[str, Any]:
    """One optimization session of the one engine on ``entry``'s folder, and its row."""
    from jaxbench.task import load_task
    from maxkernel.targets.names import parse_target
    from orchestrators.api import optimize

    started = time.monotonic()
    row: dict[str, Any] = {**entry}
    task = load_task(entry["path"])
    result = optimize(entry["path"], target=target, budget_s=None, evals=evals, seed=seed,
                      data_dir=os.environ["MAXKERNEL_DATA_DIR"])
    report = result.best_report
    won = bool(result.beat_reference and result.confirmed_speedup)
    label = report.label if (won and report) else None
    row.update({
        "status": result.status, "stop_reason": result.stop_reason[:300], "note": result.note[:300],
        "winner": ("pallas" if label == "pallas-kernel" else "jax") if won else "reference",
        "strategy": result.best_strategy if won else "reference",
        "speedup": float(result.confirmed_speedup) if won else 1.0, "evaluations": result.evaluations,
        "template_errors": template_errors(result),
        "baseline_speedup": result.baseline_speedup,
        "report": f"{report.status}: {report.reason}"[:300] if report else None,
        "iterations": [f"{it.status}: {it.reason}"[:200] for it in result.iterations],
        "baseline": [f"{t.status}: {t.reason}"[:300] for t in result.trials if t.role == "baseline"],
        "trials": [f"{t.strategy}: {t.status}" + (f" {t.speedup:.2f}x" if t.speedup else f" {t.reason[:120]}")
                   for t in result.trials if t.role in ("draft", "fix", "tune")],
    })
    kind, generation = parse_target(target)
    if kind == "tpu" and generation:
        from maxkernel.targets.model import model_reference

        bound_ms, mxu_class = roofline_bound_ms(task, generation)
        ref_ms = model_reference(task, generation).time_ms
        row.update({"bound_ms": bound_ms, "mxu_class": mxu_class, "ref_model_ms": ref_ms,
                    "ref_roofline": bound_ms / ref_ms, "winner_roofline": min(1.0, bound_ms / ref_ms * row["speedup"])})
    row["seconds"] = round(time.monotonic() - started, 1)
    return row


def template_errors(result: Any) -> list[str]:
    """Template strategies whose kernel failed to trace, compile or run (compile or runtime error)."""
    errors = []
    for t in result.trials:
        if t.strategy.startswith("template") and t.status in TEMPLATE_ERROR_STATUSES:
            errors.append(f"{t.strategy}: {t.status}: {t.reason[:160]}")
    for a in result.attempts:
        if a.strategy.startswith("template") and a.status in TEMPLATE_ERROR_STATUSES:
            errors.append(f"{a.strategy}: {a.status}: {a.reason[:160]}")
    return sorted(set(errors))


def _session_in_child(entry: dict[str, Any], target: str, evals: int, seed: int, conn: Any) -> None:
    import resource

    from maxkernel.logging import configure

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (SESSION_MEMORY_BYTES, hard))
    data_dir = tempfile.mkdtemp(prefix="generality_session_")
    os.environ["MAXKERNEL_DATA_DIR"] = data_dir  # nothing recalled; the row is what the run keeps
    configure("warning")
    try:
        row = run_session(entry, target, evals, seed)
    except Exception as exc:  # a broken session is that task's row, never the end of the run
        row = {**entry, "status": "error", "winner": "reference", "speedup": 1.0, "template_errors": [],
               "note": f"{type(exc).__name__}: {exc}"[:300]}
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    conn.send(json.dumps(row))
    conn.close()


LIVE_SESSIONS: set[Any] = set()  # the session processes running now, ended with the run


def stop_sessions(signum: int, _frame: Any = None) -> None:
    """A run told to stop (SIGTERM) ends its sessions' processes too, then itself: nothing keeps running
    for a run that is gone (``--resume`` picks up from the rows written)."""
    for proc in list(LIVE_SESSIONS):
        proc.kill()
    os._exit(128 + signum)


def bounded_session(entry: dict[str, Any], target: str, evals: int, seed: int,
                    wall_s: float = SESSION_WALL_S) -> dict[str, Any]:
    """``run_session`` in a process of its own (spawned: a fresh JAX), answered or killed after the wall guard."""
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_session_in_child, args=(entry, target, evals, seed, send))
    started = time.monotonic()
    proc.start()
    LIVE_SESSIONS.add(proc)
    send.close()
    reply, killed = None, False
    try:
        if receive.poll(wall_s):
            try:
                reply = receive.recv()
            except EOFError:
                reply = None
        if reply is None and proc.is_alive():
            proc.kill()
            killed = True
        proc.join(30)
    finally:
        LIVE_SESSIONS.discard(proc)
    if reply is not None:
        return json.loads(reply)
    why = (f"no answer within the wall guard ({wall_s:.0f} s, --session-wall): killed" if killed or proc.exitcode is None
           else f"the session's process ended with exit code {proc.exitcode}")
    return {**entry, "status": "error", "winner": "reference", "speedup": 1.0, "template_errors": [], "note": why,
            "seconds": round(time.monotonic() - started, 1)}


# ---------------------------------------------------------------- the run

def failed(row: dict[str, Any]) -> bool:
    """A session that failed, or one whose agent raised (its planner, say) and so ended before its work:
    it may still have scored the reference, but it tried less than it would have."""
    return row.get("status") in ("failed", "error") or " failed on " in str(row.get("stop_reason") or "")


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family and in total: tasks, Pallas / JAX winners, geomean speedup, roofline shares, failures."""
    def part(group: list[dict[str, Any]]) -> dict[str, Any]:
        n = len(group)
        speed = [max(float(r.get("speedup") or 1.0), 1e-9) for r in group]
        ref_roof = [r["ref_roofline"] for r in group if r.get("ref_roofline") is not None]
        win_roof = [r["winner_roofline"] for r in group if r.get("winner_roofline") is not None]
        return {"tasks": n, "pallas": sum(r.get("winner") == "pallas" for r in group),
                "jax": sum(r.get("winner") == "jax" for r in group),
                "reference": sum(r.get("winner") == "reference" for r in group),
                "geomean": math.exp(sum(map(math.log, speed)) / n) if n else None,
                "ref_roofline": _mean(ref_roof), "winner_roofline": _mean(win_roof),
                "failed": sum(failed(r) for r in group),
                "template_errors": sum(len(r.get("template_errors") or []) for r in group)}

    families = sorted({str(r.get("family")) for r in rows})
    return {"families": {f: part([r for r in rows if str(r.get("family")) == f]) for f in families},
            "total": part(rows)}


def device_roofline(row: dict[str, Any], which: str, dispatch_ms: float) -> float | None:
    """``which`` ("ref" or "winner")'s share of the roofline bound on device time: the modelled time less the
    model's host dispatch term, which every program pays once and no kernel can shorten (the calibration's
    device times leave it out the same way)."""
    bound, ref_ms = row.get("bound_ms"), row.get("ref_model_ms")
    if bound is None or ref_ms is None:
        return None
    ms = ref_ms if which == "ref" else ref_ms / max(float(row.get("speedup") or 1.0), 1e-9)
    return min(1.0, bound / max(ms - dispatch_ms, 1e-9))


def fusion_targets(rows: list[dict[str, Any]], dispatch_ms: float) -> list[str]:
    """The general fusion generator's targets on a run of generated tasks, each as one line: a Pallas winner
    where the reference is below 70% of its roofline bound (75% needed), winners at 70% or more (60% needed),
    both read with the dispatch term and on device time; the geometric mean (1.8x needed), failed sessions
    (none)."""
    priced = [r for r in rows if r.get("ref_roofline") is not None]
    if not priced:
        return []
    low = [r for r in priced if r["ref_roofline"] < 0.7]
    won = sum(r.get("winner") == "pallas" for r in low)
    low_device = [r for r in priced if (device_roofline(r, "ref", dispatch_ms) or 0.0) < 0.7]
    won_device = sum(r.get("winner") == "pallas" for r in low_device)
    high = sum(r["winner_roofline"] >= 0.7 for r in priced)
    high_device = sum((device_roofline(r, "winner", dispatch_ms) or 0.0) >= 0.7 for r in priced)
    speed = [max(float(r.get("speedup") or 1.0), 1e-9) for r in rows]
    geo = math.exp(sum(map(math.log, speed)) / len(speed))
    n = len(priced)

    def share(k: int, of: int) -> str:
        return f"{k} of {of} ({100 * k / of:.0f}%)" if of else "none"

    return [f"Pallas faster than the reference where the reference is below 70% of roofline: {share(won, len(low))}; "
            f"where it is below 70% on device time: {share(won_device, len(low_device))} (needs 75%)",
            f"winner at 70% of roofline or more: {share(high, n)}; on device time (less the {dispatch_ms:.4g} ms "
            f"dispatch term): {share(high_device, n)} (needs 60%)",
            f"geometric mean {geo:.2f}x over {len(rows)} tasks (needs 1.8x); failed sessions: "
            f"{sum(failed(r) for r in rows)} (needs 0)"]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def print_tables(config: dict[str, Any], rows: list[dict[str, Any]], markdown: bool = False) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=220)
    summary = summarize(rows)
    title = (f"{config['mode']} (seed {config.get('seed')}), {config['target']}, {config['evals']} evaluations a task, "
             f"cost model {config['cost_model']}")
    per_task = Table(title=title)
    for col in ("task", "family", "dtype", "winner", "speedup", "ref roofline", "winner roofline", "status", "template errors", "s"):
        per_task.add_column(col, overflow="fold")
    for r in rows:
        per_task.add_row(str(r["task"]), str(r.get("family")), str(r.get("dtype")), str(r.get("winner")),
                         f"{float(r.get('speedup') or 1.0):.2f}x", _pct(r.get("ref_roofline")),
                         _pct(r.get("winner_roofline")), str(r.get("status")) + (f": {r['note'][:60]}" if r.get("status") == "error" else ""),
                         str(len(r.get("template_errors") or [])), str(r.get("seconds", "")))
    fam = Table(title="per family")
    for col in ("family", "tasks", "pallas", "jax", "reference", "geomean", "ref roofline", "winner roofline", "failed", "template errors"):
        fam.add_column(col)
    for name, s in [*summary["families"].items(), ("TOTAL", summary["total"])]:
        fam.add_row(name, str(s["tasks"]), str(s["pallas"]), str(s["jax"]), str(s["reference"]),
                    f"{s['geomean']:.2f}x" if s["geomean"] else "-", _pct(s["ref_roofline"]), _pct(s["winner_roofline"]),
                    str(s["failed"]), str(s["template_errors"]))
    from maxkernel.targets.specs import load_model_constants

    targets = fusion_targets(rows, load_model_constants().dispatch_overhead_s.value * 1e3)
    if markdown:
        print(markdown_tables(config, rows, summary))
        print("\n".join(["", *(f"- {line}" for line in targets)]) if targets else "")
    else:
        console.print(per_task)
        console.print(fam)
        for line in targets:
            console.print(line)


def markdown_tables(config: dict[str, Any], rows: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = [f"{config['mode']}, seed {config.get('seed')}, {config['target']}, {config['evals']} evaluations a task, "
             f"cost model {config['cost_model']}, started {config.get('started')}, {config.get('machine')}", "",
             "| task | family | dtype | winner | strategy | speedup | ref roofline | winner roofline | status | template errors | commit |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r.get('family')} | {r.get('dtype')} | {r.get('winner')} | {r.get('strategy') or 'reference'} | "
                     f"{float(r.get('speedup') or 1.0):.2f}x | {_pct(r.get('ref_roofline'))} | {_pct(r.get('winner_roofline'))} | "
                     f"{r.get('status')} | {len(r.get('template_errors') or [])} | {r.get('commit') or '-'} |")
    lines += ["", "| family | tasks | pallas | jax | reference | geomean | ref roofline | winner roofline | failed | template errors |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in [*summary["families"].items(), ("**total**", summary["total"])]:
        lines.append(f"| {name} | {s['tasks']} | {s['pallas']} | {s['jax']} | {s['reference']} | "
                     f"{s['geomean']:.2f}x | {_pct(s['ref_roofline'])} | {_pct(s['winner_roofline'])} | {s['failed']} | "
                     f"{s['template_errors']} |")
    return "\n".join(lines)


def family(row: dict[str, Any]) -> str:
    """A winner's strategy family: its name up to its parameters, without its kind (``template:tpu_gemm`` and a
    rewrite then the same template are one family), ``reference`` for a returned reference."""
    strategy = str(row.get("strategy") or "reference")
    return strategy.split(":", 1)[-1] if strategy != "reference" else "reference"


def against_originals(rows: list[dict[str, Any]], originals: list[dict[str, Any]], original_model: str,
                      variant_model: str) -> str:
    """Markdown: each variant beside its original's session, with what the generality targets ask of it: a
    variant that keeps the work keeps the original's family, within 10% of its speedup; one that changes the
    work gets a winner within 10% of the original's share of roofline. Variants whose original did not run
    in ``originals`` are counted apart."""
    from jaxbench.variants import KEEP

    by_task = {r["task"]: r for r in originals}
    lines = [f"originals: {original_model}; variants: {variant_model}", "",
             "| variant | keeps the work | original | variant | same family | within 10% |", "|---|---|---|---|---|---|"]
    counts = {"keep": 0, "kept": 0, "close": 0, "change": 0, "change_close": 0, "unmatched": 0}
    for row in rows:
        base, _, kind = str(row["task"]).partition("__")
        original = by_task.get(base)
        if original is None:
            counts["unmatched"] += 1
            continue
        keeps = kind in KEEP
        o_speed, v_speed = float(original.get("speedup") or 1.0), float(row.get("speedup") or 1.0)
        same = family(row) == family(original)
        if keeps:
            close = same and abs(v_speed / o_speed - 1.0) <= 0.10
            counts["keep"] += 1
            counts["kept"] += same
            counts["close"] += close
        else:
            o_roof, v_roof = original.get("winner_roofline"), row.get("winner_roofline")
            close = o_roof is not None and v_roof is not None and abs(v_roof / o_roof - 1.0) <= 0.10
            counts["change"] += 1
            counts["change_close"] += close
        lines.append(f"| {row['task']} | {'yes' if keeps else 'no'} | {family(original)} {o_speed:.2f}x | "
                     f"{family(row)} {v_speed:.2f}x | {'yes' if same else 'no'} | {'yes' if close else 'no'} |")
    lines += ["", f"Keeping the work: the original's family on {counts['kept']} of {counts['keep']}, within 10% of its "
              f"speedup on {counts['close']}. Changing the work: within 10% of the original's share of roofline on "
              f"{counts['change_close']} of {counts['change']}. Variants whose original is not in the run: "
              f"{counts['unmatched']}."]
    return "\n".join(lines)


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "rows.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill: that task runs again
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--count", type=int, help="draw this many fresh tasks")
    mode.add_argument("--variants", action="store_true", help="two variants of each of the 50 suite tasks")
    mode.add_argument("--tasks", type=Path, metavar="DIR", help="every task folder under DIR")
    mode.add_argument("--peer", action="store_true", help="the peer's plain-JAX starting programs")
    mode.add_argument("--resume", type=Path, metavar="RUN_DIR", help="finish the run in RUN_DIR")
    mode.add_argument("--report", type=Path, metavar="RUN_DIR", help="print the tables of RUN_DIR (no run)")
    parser.add_argument("--against", type=Path, metavar="ORIGINALS_RUN_DIR",
                        help="with --report of a variants run: each variant beside its original's session in this run "
                             "(the suite tasks run with --tasks on the same model)")
    parser.add_argument("--seed", type=int, help="default: drawn from the clock and printed")
    parser.add_argument("--target", default="tpu-v6e")
    parser.add_argument("--evals", type=int, default=20, help="evaluations per session")
    parser.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION)
    parser.add_argument("--run-dir", type=Path, help="where the run keeps its tasks and rows (default: a new folder)")
    parser.add_argument("--workers", type=int, default=2, help="sessions at once")
    parser.add_argument("--limit", type=int, help="run at most this many of the run's tasks (the rest: --resume)")
    parser.add_argument("--json", type=Path, help="rows and summary, rewritten after every task")
    parser.add_argument("--session-wall", type=float, default=SESSION_WALL_S, metavar="SECONDS",
                        help="kill a session after this long (a guard against a hung one; a loaded 2-core host "
                             "can take over an hour on a session that compiles its reference for XLA:TPU often)")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, stop_sessions)
    from maxkernel.targets.names import TargetError, parse_target

    if args.report:
        config = _read_config(args.report)
        rows = _ordered(config, read_rows(args.report))
        print_tables(config, rows, markdown=args.markdown)
        if args.against:
            originals = _read_config(args.against)
            print(against_originals(rows, read_rows(args.against), originals["cost_model"], config["cost_model"]))
        return 0
    if args.against:
        raise UsageError("--against goes with --report RUN_DIR of a variants run")
    if args.resume:
        run_dir = args.resume
        config = _read_config(run_dir)
    else:
        if not (args.count or args.variants or args.tasks or args.peer):
            raise UsageError("say what to run: --count N, --variants, --tasks DIR, --peer or --resume RUN_DIR")
        if args.count is not None and args.count < 1:
            raise UsageError("--count must be at least 1")
        if args.evals < 1:
            raise UsageError("--evals must be at least 1")
        try:
            parse_target(args.target)
        except TargetError as exc:
            raise UsageError(str(exc)) from exc
        from jaxbench.generate.__main__ import fresh_seed

        seed = fresh_seed() if args.seed is None else args.seed
        mode = "generated" if args.count else "variants" if args.variants else "peer" if args.peer else "folder"
        run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"generality_{mode}_"))
        if (run_dir / "run.json").exists():
            raise UsageError(f"--run-dir {run_dir}: already holds a run (finish it with --resume {run_dir})")
        run_dir.mkdir(parents=True, exist_ok=True)
        config = {"mode": mode, "seed": seed, "count": args.count, "tasks_dir": str(args.tasks) if args.tasks else None,
                  "calibration": str(args.calibration), "target": args.target, "evals": args.evals,
                  "cost_model": cost_model_version(), "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "machine": f"{os.cpu_count()}-core CPU host"}
        (run_dir / "run.json").write_text(json.dumps(config, indent=2))
    print(f"run {run_dir}: {config['mode']}, seed {config['seed']}, target {config['target']}, "
          f"{config['evals']} evaluations a task, cost model {config['cost_model']}", flush=True)
    entries = _entries(config, run_dir)
    (run_dir / "entries.json").write_text(json.dumps(entries, indent=2))
    done = {r["task"] for r in read_rows(run_dir)}
    todo = [e for e in entries if e["task"] not in done]
    if args.limit is not None:
        todo = todo[: args.limit]
    print(f"{len(entries)} tasks, {len(done)} done before, {len(todo)} to run now", flush=True)
    lock = threading.Lock()
    commit = code_commit()  # each row says which code ran it: a resumed run may span commits

    def one(entry: dict[str, Any]) -> None:
        try:
            materialize(entry)
        except Exception as exc:  # a draw that cannot be written is a failed task of the generator: say so
            row = {**entry, "status": "error", "winner": "reference", "speedup": 1.0, "template_errors": [],
                   "note": f"task not written: {type(exc).__name__}: {exc}"[:300]}
        else:
            row = bounded_session(entry, config["target"], config["evals"], int(config["seed"]) % (2**31),
                                  args.session_wall)
        row.pop("slot", None)
        row["commit"] = commit
        with lock:
            with (run_dir / "rows.jsonl").open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(f"{row['task']}: {row.get('winner')} {float(row.get('speedup') or 1.0):.2f}x "
                  f"[{row.get('status')}] ({row.get('seconds', '?')}s)", flush=True)
            _write_json(args.json, config, run_dir)

    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        list(pool.map(one, todo))
    rows = _ordered(config, read_rows(run_dir))
    _write_json(args.json, config, run_dir)
    print_tables(config, rows, markdown=args.markdown)
    left = len(entries) - len(rows)
    if left:
        print(f"{left} tasks not run yet: python benchmarks/generality.py --resume {run_dir}")
    return 0


def _read_config(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{run_dir}: not a generality run folder (run.json: {type(exc).__name__})") from exc


def _entries(config: dict[str, Any], run_dir: Path) -> list[dict[str, Any]]:
    if config["mode"] == "generated":
        return build_generated(run_dir, int(config["seed"]), int(config["count"]))
    if config["mode"] == "variants":
        return build_variants(run_dir, int(config["seed"]))
    if config["mode"] == "peer":
        return build_peer(run_dir, Path(config["calibration"]))
    return build_folder(Path(config["tasks_dir"]))


def _ordered(config: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted({r["task"]: r for r in rows}.values(), key=lambda r: r["task"])


def _write_json(path: Path | None, config: dict[str, Any], run_dir: Path) -> None:
    rows = _ordered(config, read_rows(run_dir))
    payload = json.dumps({"config": config, "rows": rows, "summary": summarize(rows)}, indent=2)
    (run_dir / "results.json").write_text(payload)
    if path:
        path.write_text(payload)


if __name__ == "__main__":
    sys.exit(main())
