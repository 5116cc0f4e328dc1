"""Hacks against the modelled targets (TPU generations priced by the cost model): each is caught.

Every file in ``modelled/`` names in its header the task it attacks (a folder of ``modelled_tasks/``), its
honest twin, and the verdict it must earn: a status and a fragment of the reason (``rejected | ...``), or
``priced``: a modelled speedup at most ``TWIN_MARGIN`` times its honest twin's (or not ``ok`` at all).
Honest files (``expect: ok``) must be accepted with a modelled speedup. A hack that uses TPU-only
primitives is not ``ok`` on a GPU target (it does not lower), which its ``priced`` verdict allows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from jaxbench.report import EvalReport
from jaxbench.task import Task, load_task

HERE = Path(__file__).parent
FILES = HERE / "modelled"
TASKS = HERE / "modelled_tasks"
TWIN_MARGIN = 1.2

def _gpu_plugin() -> bool:
    from maxkernel.targets.gpu_lowering import plugin_available

    return plugin_available()


# The gpu-h100 half lowers through the CUDA plugin (the optional ``.[gpu]`` extra): skipped without it.
TARGETS = ("tpu-v5e", "tpu-v6e", pytest.param("gpu-h100", marks=pytest.mark.skipif(
    not _gpu_plugin(), reason='needs the CUDA plugin: pip install -e ".[gpu]"')))


@dataclass(frozen=True)
class Entry:
    name: str
    task: str
    expect: str
    twin: str | None
    tpu_only: bool  # written with TPU primitives (pltpu): the GPU half leaves it out


def _parse(path: Path) -> Entry:
    text = path.read_text()
    header = dict(re.findall(r"^# (hack|task|expect|twin): (.+)$", text, re.M))
    assert {"hack", "task", "expect"} <= set(header), f"{path.name}: incomplete header"
    return Entry(path.stem, header["task"].strip(), header["expect"].strip(), header.get("twin", "").strip() or None,
                 "pltpu" in text)


ENTRIES = [_parse(p) for p in sorted(FILES.glob("*.py"))]


def _cases(honest: bool) -> list:  # type: ignore[type-arg]
    chosen = [e for e in ENTRIES if (e.expect == "ok") == honest]
    cases = []
    for e in chosen:
        for t in TARGETS:
            if isinstance(t, str):
                cases.append(pytest.param(e, t, id=f"{e.name}-{t}"))
            elif not e.tpu_only:  # the GPU target carries its skip mark onto each case
                cases.append(pytest.param(e, t.values[0], marks=t.marks, id=f"{e.name}-{t.values[0]}"))
    return cases


@cache
def _task(name: str) -> Task:
    return load_task(TASKS / name)


_reports: dict[tuple[str, str], EvalReport] = {}


def _evaluate(name: str, task: str, target: str, evaluator) -> EvalReport:  # type: ignore[no-untyped-def]
    from maxkernel.evaluation import evaluate_candidate

    key = (name, target)
    if key not in _reports:
        _reports[key] = evaluate_candidate(_task(task), (FILES / f"{name}.py").read_text(), target=target,
                                           evaluator=evaluator)
    return _reports[key]


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "target"), _cases(honest=True))
def test_honest_twin_is_accepted(entry: Entry, target: str, evaluator) -> None:  # type: ignore[no-untyped-def]
    report = _evaluate(entry.name, entry.task, target, evaluator)
    assert report.status == "ok" and report.correct, f"{entry.name}: {report.status}: {report.reason}"
    assert report.basis == "modelled" and report.speedup is not None and report.speedup > 0


@pytest.mark.slow
@pytest.mark.parametrize(("entry", "target"), _cases(honest=False))
def test_hack_is_caught(entry: Entry, target: str, evaluator) -> None:  # type: ignore[no-untyped-def]
    report = _evaluate(entry.name, entry.task, target, evaluator)
    if entry.expect == "priced":
        assert entry.twin is not None, f"{entry.name}: a priced hack names its honest twin"
        if report.status != "ok":
            return
        twin = _evaluate(entry.twin, entry.task, target, evaluator)
        assert twin.status == "ok", f"twin {entry.twin}: {twin.status}: {twin.reason}"
        assert report.speedup is not None and twin.speedup is not None
        assert report.speedup <= TWIN_MARGIN * twin.speedup, (
            f"{entry.name}: modelled {report.speedup:.2f}x against its honest twin's {twin.speedup:.2f}x "
            f"({report.model and report.model['candidate'].get('notes')})")
        return
    status, _, fragment = entry.expect.partition("|")
    statuses = {"not-ok": {"incorrect", "rejected", "compile_error", "runtime_error", "timeout"}}.get(
        status.strip(), {status.strip()})
    assert report.status in statuses, f"{entry.name}: {report.status}: {report.reason} (speedup {report.speedup})"
    assert fragment.strip() in report.reason, f"{entry.name}: {report.reason}"
