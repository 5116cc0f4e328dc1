"""Everyday use, second pass: each defect a new user met, with the command that showed it.

Every test here ran against the code before its fix and failed there. Commands run in this process
(``app(args=...)``) unless the entry point itself is what is tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_everyday_cli import RMS, cli, one_error


# --- 7: output paths are checked before the work -------------------------------------------------------------

def test_analyze_refuses_an_unwritable_json_path_before_printing_anything(capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, err = cli(capsys, "analyze", RMS, "--json", "/nope/a.json")
    assert code == 2 and out == ""  # nothing analysed, nothing printed
    assert err.strip() == "error: --json /nope/a.json: folder /nope does not exist"


def test_extract_refuses_an_unwritable_json_path_before_writing_regions(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    regions = tmp_path / "regions"
    code, out, err = cli(capsys, "extract", RMS, "--out", str(regions), "--json", "/nope/a.json")
    assert code == 2 and out == "" and not regions.exists()
    assert err.strip() == "error: --json /nope/a.json: folder /nope does not exist"


def test_the_default_regions_folder_is_ignored_by_git() -> None:
    from test_everyday_cli import ROOT

    assert "regions/" in (ROOT / ".gitignore").read_text().split()


# --- 8: bad values are refused, whichever door they come by --------------------------------------------------

@pytest.mark.parametrize("flag,value", [("--width", "0"), ("--width", "-1"), ("--depth", "-2"), ("--branching", "0"),
                                        ("--lanes", "0"), ("--islands", "0")])
def test_search_refuses_shape_counts_below_one(capsys, flag: str, value: str) -> None:  # type: ignore[no-untyped-def]
    assert one_error(capsys, "search", RMS, flag, value) == f"error: {flag} {value}: must be at least 1"


def test_global_evals_is_named_as_itself(capsys) -> None:  # type: ignore[no-untyped-def]
    line = one_error(capsys, "search", RMS, "12p_RMSNorm", "--global-evals", "-1")
    assert line == "error: --global-evals -1: must be at least 1"


def test_memory_list_refuses_an_unknown_target(capsys) -> None:  # type: ignore[no-untyped-def]
    assert "tpu-v9" in one_error(capsys, "memory", "list", "--target", "tpu-v9")


def test_the_dashboard_form_refuses_a_negative_budget_and_queues_nothing() -> None:
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.dashboard import Dashboard
    from orchestrators.jobs import JobQueue

    with Store.open(load_settings().resolved_store_url) as store:
        queue = JobQueue(store.engine)
        before = len(queue.list(None))
        for field in ("budget=-5", "budget=0", "evals=-1"):
            page = Dashboard(queue, store).handle("POST", "/ui/jobs", f"task={RMS}&{field}".encode())
            assert page is not None and page.status == 400, field
            assert b"must be positive" in page.body, field
        assert len(queue.list(None)) == before


def test_a_stored_budget_is_never_negative() -> None:
    from pydantic import ValidationError

    from orchestrators.auto import AutoBudget

    for bad in ({"time_s": -1}, {"max_evaluations": 0}, {"tune_budget_s": -3}, {"patience": 0}):
        with pytest.raises(ValidationError):
            AutoBudget(**bad)


def test_the_python_api_refuses_a_negative_budget_before_anything_starts() -> None:
    import maxkernel

    with pytest.raises(ValueError, match="budget_s=-1: must be a positive number"):
        maxkernel.optimize(RMS, budget_s=-1)
    with pytest.raises(ValueError, match="evals=0: must be at least 1"):
        maxkernel.optimize(RMS, evals=0)


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])  # closed again when the block ends: nothing listens there


# --- 4: a worker pointed at no host ----------------------------------------------------------------------------

def test_a_worker_pointed_at_no_host_says_so_in_one_line() -> None:
    from test_everyday_cli import subprocess_cli, user_lines

    port = _closed_port()
    done = subprocess_cli("worker", "--host", f"127.0.0.1:{port}", "--roles", "planner")
    lines = user_lines(done.stderr)
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-2000:]
    assert lines[0].startswith(f"error: gRPC host 127.0.0.1:{port} cannot be reached")


# --- 9: the daemon's port is checked before it starts ----------------------------------------------------------

def test_daemon_start_refuses_a_port_out_of_range_or_taken(capsys) -> None:  # type: ignore[no-untyped-def]
    import socket

    assert one_error(capsys, "daemon", "start", "--port", "99999") == \
        "error: --port 99999: choose 1-65535, or 0 for any free port"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_error(capsys, "daemon", "start", "--port", str(port))
    assert line.startswith(f"error: --port {port}: ") and "cannot listen there" in line


# --- 6: a gpu-<chip> target without the optional GPU extra -----------------------------------------------------

def _without_gpu_plugin() -> None:
    from maxkernel.targets.gpu_lowering import plugin_available

    if plugin_available():
        pytest.skip("the CUDA plugin is installed here: --target gpu-* lowers")


@pytest.mark.parametrize("command", [("eval", RMS, "jaxbench/examples/rmsnorm_12p.py"), ("optimize", RMS),
                                     ("search", RMS), ("submit", RMS)])
def test_a_gpu_chip_target_without_the_plugin_is_refused_up_front(capsys, command: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    _without_gpu_plugin()
    line = one_error(capsys, *command, "--target", "gpu-h100")
    assert line == ('error: --target gpu-h100: lowering for GPU needs the optional CUDA plugin; install it with '
                    'pip install -e ".[gpu]"')


def test_the_http_door_refuses_a_gpu_chip_job_without_the_plugin() -> None:
    from orchestrators.jobs import BadJob, JobSpec, check_spec

    _without_gpu_plugin()
    with pytest.raises(BadJob, match=r'pip install -e "\.\[gpu\]"'):
        check_spec(JobSpec(task=RMS, target="gpu-h100"))


def test_an_eval_report_prints_brackets_as_written(capsys) -> None:  # type: ignore[no-untyped-def]
    from jaxbench.report import CheckResult, EvalReport
    from maxkernel.cli import print_report

    report = EvalReport(task=RMS, status="rejected", reason='needs the plugin: pip install -e ".[gpu]"',
                        checks=[CheckResult(name="plugin", passed=False, detail="x[0] and [bold]y[/bold]")],
                        flags=["[red]z"])
    print_report(report)
    out = capsys.readouterr().out
    assert '".[gpu]"' in out  # as markup, "[gpu]" would vanish
    assert "x[0] and [bold]y[/bold]" in out and "[red]z" in out


# --- 13: readable at 80 columns --------------------------------------------------------------------------------

def _render(renderable: object, width: int) -> list[str]:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    console.print(renderable)
    return console.export_text().splitlines()


def test_the_suite_list_is_readable_at_eighty_columns() -> None:
    from jaxbench.task import list_tasks
    from maxkernel.cli import suite_view

    suite = list_tasks()
    lines = _render(suite_view(suite, "JaxBench", 80), 80)
    assert max(len(line) for line in lines) <= 80
    assert len(lines) <= 4 * len(suite)  # not a column of letters stacked two by two
    assert {t.id for t in suite} <= {line.strip() for line in lines}  # each id whole, on a line of its own
    assert any("attention · bfloat16" in line for line in lines)  # the words themselves are not split
    wide = _render(suite_view(suite, "JaxBench", 200), 200)
    assert len(wide) < 2 * len(suite) + 6  # a wide terminal keeps the table, a row (or two) per task


def test_the_trials_table_keeps_its_words_whole_at_eighty_columns() -> None:
    from types import SimpleNamespace

    from maxkernel.commands.optimize import trials_table
    from orchestrators.trials import TrialRow

    trials = [TrialRow(strategy="reference", role="baseline", status="ok", speedup=1.0, speedup_ci=(0.98, 1.02),
                       label="reference-equivalent"),
              TrialRow(strategy="rows_block_fused_rmsnorm", role="tune", params={"block_rows": 256, "unroll": 2},
                       status="compile_error", label="pallas"),
              TrialRow(strategy="rows_block_fused_rmsnorm", role="confirm", params={"block_rows": 512},
                       status="ok", speedup=66.85, speedup_ci=(39.52, 82.16), label="pallas")]
    result = SimpleNamespace(task_id="12p_RMSNorm", target="cpu", brain="rules", session_id="d06eeb92b687aaaa",
                             trials=trials)
    lines = _render(trials_table(result), 80)
    text = "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    for word in ("reference-equivalent", "compile_error", "baseline", "confirm", "66.85x"):
        assert word in text, word


# --- 14: the Python API keeps its logs off stdout -------------------------------------------------------------

def test_importing_maxkernel_sends_no_log_line_to_stdout(tmp_path: Path) -> None:
    """A fresh interpreter, as a library user has it: a debug and an info line of ours go nowhere, a warning
    goes to stderr, and stdout holds only what the program printed."""
    import os
    import subprocess
    import sys

    from test_everyday_cli import ROOT

    program = ("import maxkernel, structlog\n"
               "log = structlog.get_logger('probe')\n"
               "log.debug('probe.debug'); log.info('probe.info'); log.warning('probe.warning')\n"
               "print('program output')\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=dict(os.environ, MAXKERNEL_DATA_DIR=str(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "program output\n"
    assert "probe.warning" in done.stderr and "probe.info" not in done.stderr and "probe.debug" not in done.stderr


# --- 2: a task folder is refused at the door when it does not load, and never shadows a suite task -----------

GEMM = "41k_Gemm_Add_ReLU"


def _copy(tmp_path: Path, name: str, *, task_id: str | None = None, broken: bool = False) -> Path:
    import shutil

    from jaxbench.task import load_task

    folder = tmp_path / name
    shutil.copytree(load_task(GEMM).path, folder)
    if task_id is not None:
        yaml_path = folder / "task.yaml"
        yaml_path.write_text(yaml_path.read_text().replace(f"id: {GEMM}", f"id: {task_id}"))
    if broken:
        (folder / "reference.py").write_text((folder / "reference.py").read_text() + "\ndef broken(:\n")
    return folder


def test_the_daemon_door_refuses_a_folder_that_does_not_load(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from orchestrators.jobs import BadJob, JobSpec, check_spec

    own = _copy(tmp_path, "own", task_id="my_gemm", broken=True)
    with pytest.raises(BadJob, match="import failed: SyntaxError"):
        check_spec(JobSpec(task=str(own)))
    line = one_error(capsys, "submit", str(own))
    assert str(own) in line and "SyntaxError" in line


def test_a_folder_never_shadows_a_suite_task(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from actors.config import ActorConfig
    from actors.services import Services
    from jaxbench.task import SUITE_DIR, TaskError
    from orchestrators.jobs import BadJob, JobSpec, check_spec

    shadow = _copy(tmp_path, "shadow", broken=True)  # the suite id, other files
    with pytest.raises(BadJob, match="give the folder an id of its own"):
        check_spec(JobSpec(task=str(shadow)))
    assert "give the folder an id of its own" in one_error(capsys, "submit", str(shadow))

    services = Services(ActorConfig())
    with pytest.raises(TaskError, match="id of a suite task"):
        services.task(str(shadow))
    assert services.task(GEMM).path == SUITE_DIR / GEMM  # the suite id is still the suite's task
    copy = _copy(tmp_path, "copy")  # an unchanged copy is that task: allowed, and the same task
    assert services.task(str(copy)).id == GEMM and services.task(GEMM).path == SUITE_DIR / GEMM

    first, second = _copy(tmp_path, "first", task_id="mine"), _copy(tmp_path, "second", task_id="mine", broken=True)
    assert services.task(str(first)).path == first
    with pytest.raises(TaskError, match="already names"):
        services.task(str(second))
    assert services.task("mine").path == first


# --- 5: a broken reference is one line before any session -----------------------------------------------------

def test_optimize_on_a_broken_reference_is_one_line_and_stores_nothing(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.config import load_settings
    from memory import Store

    broken = _copy(tmp_path, "broken", task_id="broken_gemm", broken=True)
    for command in (("optimize", str(broken), "--budget", "10", "--out", str(tmp_path / "k")),
                    ("search", str(broken), "--evals", "2"), ("chat", str(broken))):
        line = one_error(capsys, *command)
        assert f"{broken}/reference.py: import failed: SyntaxError" in line, line
    undrawable = _copy(tmp_path, "undrawable", task_id="undrawable_gemm")
    reference = undrawable / "reference.py"
    reference.write_text(reference.read_text().replace("def get_inputs(", "def get_inputs(*_a, **_k):\n    raise "
                                                                           "ValueError('no inputs')\n\n\ndef _old("))
    line = one_error(capsys, "optimize", str(undrawable), "--budget", "10", "--out", str(tmp_path / "k"))
    assert "cannot draw abstract inputs" in line and "no inputs" in line
    with Store.open(load_settings().resolved_store_url) as store:
        assert store.sessions() == []  # no failed session stored
    code, out, _ = cli(capsys, "memory", "list", "--kind", "notes")
    assert code == 0 and "broken_gemm" not in out and "undrawable_gemm" not in out  # and no note in the memory


def test_the_daemon_door_refuses_a_reference_that_does_not_trace(tmp_path: Path) -> None:
    from orchestrators.jobs import BadJob, JobSpec, check_spec

    undrawable = _copy(tmp_path, "undrawable", task_id="undrawable_gemm")
    reference = undrawable / "reference.py"
    reference.write_text(reference.read_text() + "\n\ndef reference(*args, **static):\n    raise ValueError('nope')\n")
    with pytest.raises(BadJob, match="nope"):
        check_spec(JobSpec(task=str(undrawable)))


# --- 3 and 10: Ctrl-C and SIGTERM end a run as interrupted, in the store and on screen --------------------------

def _interrupt_when(tmp_path: Path, args: list[str], table: str, signum: int) -> tuple[int, list[str], str]:
    """Run ``maxkernel ARGS`` with its own store, send ``signum`` once ``table`` holds a running row, and return
    (exit code, what it said on stderr, the row's status afterwards). SIGINT goes to the whole process group,
    as a terminal's Ctrl-C does; SIGTERM to the process alone, as ``kill`` does."""
    import os
    import signal
    import sqlite3
    import subprocess
    import sys
    import time

    from test_everyday_cli import ROOT, user_lines

    env = dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="80", MAXKERNEL_DATA_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "maxkernel.cli", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    db = tmp_path / "maxkernel.db"

    def status() -> str | None:
        try:
            with sqlite3.connect(db) as conn:
                row = conn.execute(f"select status from {table} order by created_at desc limit 1").fetchone()
        except sqlite3.OperationalError:  # not created yet
            return None
        return row[0] if row else None

    try:
        deadline = time.monotonic() + 240
        while status() != "running" and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        time.sleep(3)  # well inside the run: evaluations in flight
        if signum == signal.SIGINT:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, user_lines(err), str(status())


@pytest.mark.slow
def test_ctrl_c_during_optimize_is_one_line_and_the_session_is_interrupted(tmp_path: Path) -> None:
    import signal

    code, lines, status = _interrupt_when(tmp_path, ["optimize", RMS, "--budget", "120"], "sessions", signal.SIGINT)
    assert code == 130 and status == "interrupted"
    assert not any("Traceback" in line or "Error" in line for line in lines), lines
    assert lines[-1] == "interrupted (SIGINT): what ran is stored, marked interrupted" and len(lines) <= 3, lines


@pytest.mark.slow
def test_a_search_ended_by_sigterm_is_stored_as_interrupted(tmp_path: Path) -> None:
    import signal

    code, lines, status = _interrupt_when(tmp_path, ["search", RMS, "--evals", "8"], "orch_searches", signal.SIGTERM)
    assert code == 143 and status == "interrupted"  # resumable with --resume; never "running" for ever
    assert not any("Traceback" in line for line in lines), lines
    assert lines[-1] == "interrupted (SIGTERM): what ran is stored, marked interrupted"


# --- 1: accepting a kernel of the plan's second strategy -------------------------------------------------------

@pytest.mark.slow
def test_accepting_the_second_strategys_kernel_keeps_every_evaluation() -> None:
    import asyncio

    import sqlalchemy as sa

    from actors.config import ActorConfig
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.hitl import run_chat

    said: list[str] = []
    lines = iter(["plan", "a", "implement 2", "a", "test", "accept", "quit"])
    session = asyncio.run(run_chat(RMS, ActorConfig(brain="rules"), read=lambda _p: next(lines), write=said.append))
    out = "\n".join(said)
    assert "accept failed" not in out and "accepted: " in out, out[-3000:]
    with Store.open(load_settings().resolved_store_url) as store, store.engine.connect() as conn:
        candidates = conn.execute(sa.text("select count(*) from candidates where session_id = :s"), {"s": session})
        evaluations = conn.execute(sa.text("select count(*) from evaluations e join candidates c on "
                                           "e.candidate_id = c.id where c.session_id = :s"), {"s": session})
        assert candidates.scalar_one() >= 2  # the kernel and the reference judged as a candidate
        assert evaluations.scalar_one() >= 3  # its test, the reference's run, the re-measurement: none lost
        failures = [e for e in store.events(session_id=session) if e.message_type == "ActorFailed"]
        assert not failures, failures


# --- 12: wording -----------------------------------------------------------------------------------------------

def test_counts_agree_with_their_nouns_and_titles_say_what_each_word_is(capsys) -> None:  # type: ignore[no-untyped-def]
    from jaxbench.report import EvalReport
    from maxkernel.cli import print_report
    from orchestrators.feedback import Attempt

    one = Attempt(strategy="template:rowblock", step=0, evaluations=1, status="ok", speedup=1.2,
                  speedup_ci=(1.1, 1.3))
    assert one.line().endswith("(1 evaluation)")
    assert Attempt(strategy="x", step=0, evaluations=3, status="compile_error", reason="r").line().endswith(
        "(3 evaluations)")
    print_report(EvalReport(task=RMS, status="ok", correct=True))
    out = " ".join(capsys.readouterr().out.split())  # the title wraps over a narrow table
    assert f"{RMS} · target cpu · cpu size" in out and "· cpu · cpu" not in out


# --- 15: budgets are kept: no work begun that the time left cannot pay for ------------------------------------

def test_no_step_is_begun_that_the_time_left_cannot_pay_for() -> None:
    from types import SimpleNamespace

    from actors import policy
    from orchestrators.auto import AutoBudget, AutoRun

    assert policy.can_start(None, 5.0) and policy.can_start(16.0, 5.0) and not policy.can_start(14.0, 5.0)
    assert policy.can_start(3.0, None) and not policy.can_start(0.0, None)

    def stop(left: float, per: float, *, first: bool = False) -> str | None:
        run = SimpleNamespace(iterations=[] if first else [object()], history={} if first else {"template:x": 1},
                              budget=AutoBudget(time_s=20, max_evaluations=None), evaluations=4,
                              time_left=lambda: left, seconds_per_evaluation=lambda: per)
        return AutoRun.stop_reason(run)  # type: ignore[arg-type]

    assert stop(30.0, 5.0) is None  # room for one more evaluation and the re-measurements after it
    reason = stop(12.0, 5.0)
    assert reason is not None and reason.startswith("time budget of 20.0 s nearly spent: 12 s left")
    assert stop(12.0, 5.0, first=True) is None  # the first strategy is always worked on
    assert stop(-1.0, 5.0) == "time budget of 20.0 s spent"


def test_the_strategies_share_what_is_left_after_the_re_measurements() -> None:
    from types import SimpleNamespace

    from orchestrators.auto import AutoBudget, AutoRun

    run = SimpleNamespace(strategies_left=lambda: 2, time_left=lambda: 40.0, seconds_per_evaluation=lambda: 5.0,
                          evaluations_left=lambda: None, budget=AutoBudget(time_s=60, max_evaluations=None))
    budget = AutoRun.message_budget(run)  # type: ignore[arg-type]
    assert budget.tune_budget_s == pytest.approx((40.0 - 2 * 5.0) / 2)


# --- 11: one result, one figure ---------------------------------------------------------------------------------

def test_the_claimed_figure_is_a_re_measurement_never_the_lucky_first_reading() -> None:
    from actors import policy

    # the first reading (lower end 39.5) and its re-run (52.7): "lower of two runs" decides on the first, but
    # the figure claimed is the re-run's, and it clears the bar as the decision did
    runs = [39.52, 52.70]
    value = policy.confirmed(runs)
    assert value == 39.52 and policy.claimed_run(runs, value) == 1
    assert policy.claimed_run([3.0, 2.5], 2.5) == 1  # the re-run decided: it is the figure
    runs = [2.0, 1.5, 2.4]  # median of three is the first reading: the figure is the re-run above it
    assert policy.claimed_run(runs, policy.confirmed(runs)) == 2
    runs = [0.9, 1.3, 1.2]  # a first reading below the bar: the lower of the two re-runs
    assert policy.claimed_run(runs, policy.confirmed(runs)) == 2
    assert policy.claimed_run([1.7], 1.7) == 0  # modelled: one deterministic reading


def test_a_search_calls_a_reading_wholly_below_one_slower_not_at_par() -> None:
    from types import SimpleNamespace

    from orchestrators.search import claim_of

    assert claim_of(SimpleNamespace(interval=(0.84, 0.96), confirmed=None)) == "slower"  # type: ignore[arg-type]
    assert claim_of(SimpleNamespace(interval=(0.95, 1.04), confirmed=None)) == "at par"  # type: ignore[arg-type]
    assert claim_of(SimpleNamespace(interval=(1.2, 1.4), confirmed=None)) == "at par"  # type: ignore[arg-type]
    assert claim_of(SimpleNamespace(interval=(1.2, 1.4), confirmed=1.15)) == "faster"  # type: ignore[arg-type]


def test_an_export_says_the_kernels_speedup_with_its_interval_not_a_bare_lower_end(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.commands.export import Exported, Supports, _print

    supports = Supports(shapes="any batch", sizes=[{}], dtypes=["float32"], chips=["cpu"])
    done = [Exported(task_id=RMS, function="rms_norm", module="rms_norm.rms_norm", strategy="template:rowblock",
                     speedup=0.93, speedup_ci=(0.76, 1.10), supports=supports)]
    _print(tmp_path, done)
    out = capsys.readouterr().out
    assert "0.93x (0.76–1.10x)" in out and "0.76x\n" not in out


def test_a_recalled_kernel_is_named_by_the_strategy_that_made_it() -> None:
    from actors.brains.rules import recalled_name

    assert recalled_name("template:rowblock", "2fa10ac1aaaabbbbcccc") == "recall:template:rowblock"
    assert recalled_name("recall:recall:rewrite:a+b", "2fa10ac1") == "recall:rewrite:a+b"  # recalled again
    assert recalled_name("", "2fa10ac1aaaabbbbcccc") == "recall:2fa10ac1aaaa"  # nothing better to say


def test_optimize_says_its_verdict_once(capsys) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.commands.optimize import _print
    from orchestrators.auto import AutoResult

    note = "nothing beat the reference: the best candidate is the reference itself"
    result = AutoResult(session_id="s" * 32, task_id=RMS, target="cpu", brain="rules", status="scored",
                        stop_reason="time budget of 20.0 s spent", verdict=note, note=note, evaluations=1)
    _print(result, None)
    out = " ".join(capsys.readouterr().out.split())
    assert out.count("nothing beat the reference") == 1 and "1 evaluation," in out


def _reading(candidate_id: str, seq: int, speedup: float, ci: tuple[float, float], strategy: str = "template:a"):  # type: ignore[no-untyped-def]
    from orchestrators.graph import ROOT, Node

    return Node(candidate_id=candidate_id, session_id="s", parent_id=ROOT, edge=f"apply {strategy}", strategy=strategy,
                status="ok", passed=True, speedup=speedup, speedup_ci=ci, seq=seq)


def test_the_report_and_its_graph_name_one_reading_of_the_best_kernel() -> None:
    from jaxbench.report import format_interval
    from orchestrators import report_graph
    from orchestrators.report import ReportData, named_best

    # the winner read first 66.85x (39.52–82.16), then twice again when it was re-measured; another kernel between
    nodes = [_reading("win", 1, 66.85, (39.52, 82.16)), _reading("other", 2, 20.0, (15.0, 25.0), "template:b"),
             _reading("win", 3, 63.04, (52.70, 71.64)), _reading("win", 4, 58.0, (45.0, 70.0))]
    best_id, _ = named_best("optimize", [], nodes)
    data = ReportData(kind="session", id="s", task_id="t", title="optimize session", facts={}, nodes=nodes,
                      best_id=best_id)
    assert best_id == "win" and data.best is not None and data.best.interval == (52.70, 71.64)
    fig = report_graph.figure(nodes, best_id)
    labels = {t.get_gid(): t.get_text() for t in fig.axes[0].texts}
    assert len(labels) == 3  # the reference and two kernels: a re-measured kernel is one point
    assert format_interval(data.best.interval) in labels["label:win"] and "★ best" in labels["label:win"]


def test_a_note_names_the_parameters_the_chosen_kernel_was_written_at() -> None:
    from actors.policy import CONFIRM
    from maxkernel.config import load_settings
    from maxkernel.messages import EvalReport, KernelDraft, Plan, StrategyRef, TuneReport, TuneTrial, new_id
    from memory import Store
    from measured_sessions import report
    from orchestrators.report_data import contributions, session_nodes

    session, task = new_id(), RMS
    plan = Plan(session_id=session, task_id=task, target="cpu",
                strategies=[StrategyRef(name="template:rowblock", params={"block_rows": 8})])

    def judged(source: str, produced_by: str, speedup: float, ci: tuple[float, float]) -> EvalReport:
        draft = KernelDraft(session_id=session, task_id=task, candidate_id=new_id(), plan=plan, source=source,
                            produced_by=produced_by)
        result = report(task, "ok", speedup).model_copy(update={"speedup_ci": ci})
        return EvalReport(session_id=session, task_id=task, draft=draft, report=result)

    with Store.open(load_settings().resolved_store_url) as store:
        for message in (judged("# rows 8", "coder", 1.1, (1.0, 1.2)),  # the draft, at its plan's 8 rows
                        judged("# rows 64", "tuner:tool", 1.9, (1.7, 2.1)),  # tuning trials: the plan still says 8
                        judged("# rows 32", "tuner:tool", 1.5, (1.3, 1.6)),
                        TuneReport(session_id=session, task_id=task, best_source="# rows 64", strategy="template:rowblock",
                                   best_report=report(task, "ok", 1.9), best_params={"block_rows": 64},
                                   trials=[TuneTrial(params={"block_rows": 64}, status="ok", speedup=1.9)]),
                        judged("# rows 64", CONFIRM, 1.95, (1.8, 2.1))):  # the winner re-measured
            store.append_event(message, session_id=session, task_id=task)
        nodes = session_nodes(store, session)
    assert [n.params for n in nodes] == [{"block_rows": 8}, {"block_rows": 64}, {}, {"block_rows": 64}]
    (row,) = contributions(nodes)
    assert row.best is not None and row.best.interval == (1.8, 2.1)
    assert "at {'block_rows': 64}" in row.line() and "8" not in row.line().split(" at ")[1]


def test_every_measured_speedup_printed_comes_with_its_interval(capsys) -> None:  # type: ignore[no-untyped-def]
    from rich.console import Console

    from actors.librarian import scored_note
    from jaxbench.report import EvalReport as JudgeReport
    from jaxbench.task import load_task
    from maxkernel.commands.optimize import _print
    from maxkernel.commands.search import results_table
    from maxkernel.messages import CandidateScored
    from orchestrators.auto import AutoResult
    from orchestrators.model_opt import ModelResult, settle
    from orchestrators.search import SearchResult

    shown = "0.77x (0.70–0.85x)"
    # optimize: the reference itself as a candidate, beside a winner
    result = AutoResult(session_id="s" * 32, task_id=RMS, target="cpu", brain="rules", status="scored",
                        stop_reason="time budget of 20.0 s spent", verdict="faster: 1.40x (1.30–1.50x)",
                        beat_reference=True, baseline_speedup=0.77, baseline_speedup_ci=(0.70, 0.85), evaluations=5)
    _print(result, None)
    assert shown in " ".join(capsys.readouterr().out.split())
    # search: the same reading in the results table
    found = SearchResult(search_id="a" * 32, task_id=RMS, algorithm="beam", status="done", stop_reason="", evaluations=4,
                         expansions=2, nodes=4, best_speedup=1.4, best_speedup_ci=(1.3, 1.5), baseline_speedup=0.77,
                         baseline_speedup_ci=(0.70, 0.85))
    console = Console(width=400, record=True)
    console.print(results_table([found], "beam", 0))
    assert shown in console.export_text()
    # optimize-model: the re-joined layer's own reading when it is not faster
    judged = JudgeReport(task="layer", status="ok", correct=True, speedup=0.77, speedup_ci=(0.70, 0.85),
                         basis="measured", ref_ms=1.0, kernel_ms=1.3)
    layer = load_task("mamba2_block")
    model = ModelResult(layer=layer.id, target="cpu")
    settle(layer, None, {0: "def kernel(x):\n    return x\n"}, judged, model)  # type: ignore[arg-type]
    assert any(f"is slower ({shown})" in n for n in model.notes), model.notes
    # the note remembered with a scored kernel
    scored = CandidateScored(session_id="s", task_id=RMS, source="", report=judged, strategy="template:rowblock")
    assert shown in scored_note(scored)


# --- 15: optimize-model keeps time for judging the re-joined layer ---------------------------------------------

def test_the_regions_shares_and_the_layers_judgement_fit_the_budget() -> None:
    from types import SimpleNamespace

    from actors import policy
    from maxkernel.extract.layer import RegionInfo
    from orchestrators.model_opt import judgement_reserve_s, region_budget

    hot, warm, cold = (RegionInfo(index=i, task_id=str(i), kind="matmul", path="", nodes=(0, 0), inputs=[],
                                  outputs=[], primitives=[], share=s) for i, s in enumerate((0.6, 0.3, 0.1)))
    # the reserve is optimize's own rule, at the larger of the extraction's time and a region evaluation's
    assert judgement_reserve_s(3.0, []) == policy.reserve_s(3.0)
    ran = [SimpleNamespace(evaluations=4, seconds=20.0)]
    assert judgement_reserve_s(3.0, ran) == policy.reserve_s(5.0)  # type: ignore[arg-type]
    budget, extract_s = 40.0, 3.0
    left, given, pending = budget - extract_s, [], [hot, warm, cold]
    for info in (hot, warm, cold):  # each session spends all it is given
        reserve = judgement_reserve_s(extract_s, [])
        seconds, _ = region_budget(info, pending, left, None, reserve)
        pending.remove(info)
        given.append(seconds)
        left -= seconds
    assert extract_s + sum(given) + reserve == pytest.approx(budget)  # the regions leave the reserve whole
    assert given[0] == pytest.approx((budget - extract_s - reserve) * 0.6)


@pytest.mark.slow
def test_optimize_model_hands_its_regions_the_budget_less_the_layers_judgement(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each region's session is made to spend all it is given (on the run's clock, without waiting): what the
    regions were handed and the reserve for the layer's judgement add up to no more than the budget."""
    import asyncio
    import time
    from types import SimpleNamespace

    from orchestrators import model_opt
    from orchestrators.auto import AutoBudget, AutoResult

    spent = [0.0]
    monkeypatch.setattr(model_opt, "time", SimpleNamespace(perf_counter=lambda: time.perf_counter() + spent[0]))
    given: dict[str, float] = {}

    async def spends_it_all(info, budget: AutoBudget) -> AutoResult:  # type: ignore[no-untyped-def]
        given[info.task_id] = budget.time_s
        spent[0] += budget.time_s
        return AutoResult(session_id=info.task_id, task_id=info.task_id, target="cpu", brain="rules",
                          status="scored", stop_reason="nothing beat the reference")

    result = asyncio.run(model_opt.run_model("mamba2_block", out=tmp_path, budget=AutoBudget(time_s=120.0),
                                             target="cpu", run_region=spends_it_all, rules_planner=False))
    assert len(given) == len(result.regions) and result.judgement_reserve_s > 0
    assert sum(given.values()) + result.judgement_reserve_s <= 120.0  # what was handed out fits the budget
    assert sorted(r.budget_s for r in result.regions) == sorted(given.values())


# --- 16: a claimed interval holds when the kernel is measured again -----------------------------------------

def _paired_rounds(rng, offset: float, rounds: int = 10, noise: float = 0.05) -> tuple[list[float], list[float]]:  # type: ignore[no-untyped-def]
    """One evaluation's paired rounds of a kernel twice as fast as its reference, by workers whose speed
    is off by ``offset`` (a log factor on the candidate's side), each round with its own noise."""
    import numpy as np

    ref = np.exp(noise * rng.standard_normal(rounds))
    cand = 0.5 * np.exp(offset + noise * rng.standard_normal(rounds))
    return list(ref), list(cand)


def test_a_claimed_interval_covers_a_re_reading_by_fresh_workers() -> None:
    # What the issue saw: the same 21k kernel read 66.85x (39.5-82.2), 133.9x (124-143), 32.3x (27.2-33.1).
    # A re-reading carries its own rounds' noise and another worker's offset; here the workers differ by as
    # much as one run's median does (the benchmark's finding on an idle host). A confidence interval of one
    # run's median covered about three re-readings in four; the claimed interval must cover nine in ten.
    import numpy as np

    from jaxbench.timing import speedup_interval

    rng = np.random.default_rng(16)
    worker_sd = 0.05 * 1.25 / np.sqrt(10) * np.sqrt(2)  # the sd of one run's log ratio of medians
    covered, halves = 0, []
    for _ in range(300):
        first = _paired_rounds(rng, worker_sd * rng.standard_normal())
        again = _paired_rounds(rng, worker_sd * rng.standard_normal())
        low, high = speedup_interval(*first)
        point = float(np.median(again[0]) / np.median(again[1]))
        covered += low <= point <= high
        halves.append((high - low) / 2 / float(np.median(first[0]) / np.median(first[1])))
    assert covered >= 0.9 * 300
    assert float(np.median(halves)) < 0.25  # and the interval stays a claim worth making
