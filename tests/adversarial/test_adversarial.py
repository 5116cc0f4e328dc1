"""Every hack in hacks/ is caught with the reason it deserves, and honest candidates all pass.

Each hack file declares in its header the task it attacks and the verdict it must earn, with the static
scan on (``# expect:``) and, where the sandbox is the next line of defence, with the scan off
(``# expect-unscanned:``), which proves that layer holds on its own.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from support import EXAMPLES, reference_candidate

HACKS = Path(__file__).parent / "hacks"


@dataclass
class Hack:
    name: str
    source: str
    task: str
    expect: tuple[str, str]
    expect_unscanned: tuple[str, str] | None


def _parse(path: Path) -> Hack:
    text = path.read_text()
    header = dict(re.findall(r"^# (task|expect|expect-unscanned|hack): (.+)$", text, re.M))

    def verdict(line: str | None) -> tuple[str, str] | None:
        if line is None:
            return None
        status, _, fragment = line.partition("|")
        return status.strip(), fragment.strip()

    assert "hack" in header and "task" in header and "expect" in header, f"{path.name}: incomplete header"
    return Hack(path.stem, text, header["task"], verdict(header["expect"]), verdict(header.get("expect-unscanned")))  # type: ignore[arg-type]


ALL_HACKS = [_parse(p) for p in sorted(HACKS.glob("*.py"))]


@pytest.fixture(scope="module")
def strict() -> Iterator[object]:
    from jaxbench.evaluate import EvalConfig, Evaluator

    with Evaluator(config=EvalConfig(timing=False, timeout_s=20)) as ev:
        yield ev


@pytest.fixture(scope="module")
def impatient() -> Iterator[object]:
    """A short wall-clock limit for the hacks that never finish."""
    from jaxbench.evaluate import EvalConfig, Evaluator

    with Evaluator(config=EvalConfig(timing=False, timeout_s=8)) as ev:
        yield ev


@pytest.fixture(scope="module")
def unscanned() -> Iterator[object]:
    from jaxbench.evaluate import EvalConfig, Evaluator

    with Evaluator(config=EvalConfig(timing=False, timeout_s=20, static_checks=False)) as ev:
        yield ev


def test_the_suite_has_at_least_twenty_distinct_hacks():
    assert len(ALL_HACKS) >= 20
    assert len({h.source for h in ALL_HACKS}) == len(ALL_HACKS)


@pytest.mark.parametrize("hack", ALL_HACKS, ids=[h.name for h in ALL_HACKS])
@pytest.mark.slow
def test_hack_is_caught(strict, impatient, hack):
    evaluator = impatient if hack.expect[0] == "timeout" else strict
    report = evaluator.evaluate(hack.task, hack.source, filename=f"{hack.name}.py")
    status, fragment = hack.expect
    assert not report.correct
    assert report.status == status, f"{hack.name}: {report.status}: {report.reason}"
    assert fragment in report.reason, f"{hack.name}: {report.reason}"


SANDBOXED = [h for h in ALL_HACKS if h.expect_unscanned]


@pytest.mark.parametrize("hack", SANDBOXED, ids=[h.name for h in SANDBOXED])
@pytest.mark.slow
def test_hack_is_caught_by_the_sandbox_alone(unscanned, hack):
    planted = Path("/tmp/maxkernel_planted.txt")
    report = unscanned.evaluate(hack.task, hack.source, filename=f"{hack.name}.py")
    status, fragment = hack.expect_unscanned  # type: ignore[misc]
    assert not report.correct
    assert report.status == status, f"{hack.name}: {report.status}: {report.reason}"
    assert fragment in report.reason, f"{hack.name}: {report.reason}"
    assert not planted.exists()
    assert os.getpid() > 0  # still here: the judge was not killed


@pytest.mark.slow
def test_honest_example_kernels_are_accepted(strict):
    for task_id, file in (("12p_RMSNorm", "rmsnorm_12p.py"), ("41k_Gemm_Add_ReLU", "gemm_add_relu_41k.py")):
        report = strict.evaluate(task_id, (EXAMPLES / file).read_text())
        assert report.status == "ok" and report.correct, report.reason


@pytest.mark.slow
def test_a_hundred_hostile_candidates_in_a_row_leave_the_pool_working(unscanned):
    """Cycle the sandbox-level hacks (static scan off) until 100 have run, then evaluate an honest one."""
    from jaxbench.evaluate import EvalConfig, Evaluator
    from jaxbench.task import load_task

    cheap = [h for h in SANDBOXED if h.expect_unscanned and h.expect_unscanned[0] != "timeout"]
    tiny = _tiny_task()
    with Evaluator(config=EvalConfig(timing=False, timeout_s=20, static_checks=False)) as ev:
        verdicts = []
        for i in range(100):
            hack = cheap[i % len(cheap)]
            report = ev.evaluate(tiny, hack.source.replace("12p_RMSNorm", tiny.id))
            verdicts.append(report.status)
            assert not report.correct, hack.name
        assert "ok" not in verdicts
        honest = ev.evaluate(tiny, reference_candidate_for(tiny))
        assert honest.status == "ok", honest.reason


def _tiny_task():
    """A small RMSNorm task folder outside the suite, so a hundred evaluations stay quick."""
    import shutil
    import tempfile

    from jaxbench.task import load_task

    src = load_task("12p_RMSNorm").path
    folder = Path(tempfile.mkdtemp(prefix="tiny_task_")) / "tiny_rmsnorm"
    shutil.copytree(src, folder)
    yaml_text = (folder / "task.yaml").read_text()
    yaml_text = re.sub(r"cpu: \{[^}]*\}", "cpu: {batch: 2, seq: 64, hidden: 256}", yaml_text)
    yaml_text = yaml_text.replace("id: 12p_RMSNorm", "id: tiny_rmsnorm")
    (folder / "task.yaml").write_text(yaml_text)
    return load_task(folder)


def reference_candidate_for(task) -> str:
    return task.reference_path.read_text() + "\n\nkernel = reference\n"
