"""Everyday use of the command line: one id rule, one error style, the same flags and settings everywhere.

Most commands run in this process (``app(args=...)``, exactly what the ``maxkernel`` script calls), so
that walking every command with every kind of bad input takes seconds; a few run as real subprocesses
where the entry point itself is what is tested. No evaluation runs here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from support import EXAMPLES
from support import http_json as _http

ROOT = Path(__file__).resolve().parent.parent
RMS = "12p_RMSNorm"
CANDIDATE = str(EXAMPLES / "rmsnorm_12p.py")
LAYER = "llama31_8b_decoder"


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``maxkernel ARGS`` in this process: (exit code, stdout, stderr)."""
    from maxkernel.cli import app

    with pytest.raises(SystemExit) as info:
        app(args=list(args), prog_name="maxkernel")
    out = capsys.readouterr()
    code = info.value.code
    return (code if isinstance(code, int) else 1), out.out, out.err


def one_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The command must end in exactly one line on stderr and exit code 2; that line is returned."""
    code, _, err = cli(capsys, *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, code, err)
    return lines[0]


ABSL_NOISE = re.compile(r"^(WARNING: All log messages before absl::InitializeLog\(\)|[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] )")


def user_lines(stderr: str) -> list[str]:
    """What a command said on stderr, without the C++ start-up log lines of an installed CUDA plugin
    (printed by jaxlib itself on a machine without a GPU, before any MaxKernel code runs)."""
    return [line for line in stderr.splitlines() if line.strip() and not ABSL_NOISE.match(line)]


def subprocess_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = dict(os.environ, JAX_PLATFORMS="cpu", COLUMNS="80", **env)
    return subprocess.run([sys.executable, "-m", "maxkernel.cli", *args], capture_output=True, text=True,
                          timeout=120, env=environ, cwd=ROOT)


# Every command that reads the store, with arguments that get it as far as the store.
STORE_COMMANDS = [
    ("jobs",), ("daemon", "status"), ("report", "abcd1234"), ("submit", RMS), ("cancel", "abcd1234"),
    ("chat", RMS), ("search", RMS, "--evals", "1"), ("optimize", RMS, "--budget", "5"),
    ("memory", "stats"), ("memory", "list"), ("memory", "show", "abcd1234"),
    ("optimize-model", LAYER, "--budget", "5"),
]


def test_every_command_names_a_corrupt_store_in_one_line(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = tmp_path / "corrupt"
    data.mkdir()
    (data / "maxkernel.db").write_bytes(b"not a database" * 300)
    monkeypatch.setenv("MAXKERNEL_DATA_DIR", str(data))
    for args in STORE_COMMANDS:
        line = one_error(capsys, *args)
        assert "corrupt" in line and str(data / "maxkernel.db") in line, (args, line)
    assert (data / "maxkernel.db").read_bytes() == b"not a database" * 300


def test_every_command_names_a_store_it_cannot_open_in_one_line(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    monkeypatch.setenv("MAXKERNEL_STORE_URL", f"sqlite:///{blocker / 'maxkernel.db'}")
    for args in STORE_COMMANDS:
        assert str(blocker) in one_error(capsys, *args), args


def _insert_jobs(*ids: str) -> None:
    from maxkernel.config import load_settings
    from orchestrators.tables import ensure, jobs, utcnow

    engine = sa.create_engine(load_settings().resolved_store_url)
    ensure(engine)
    now = utcnow()
    with engine.begin() as conn:
        for job_id in ids:
            conn.execute(jobs.insert().values(id=job_id, task_id=RMS, priority=0, budget={}, brain="rules",
                                              target="cpu", status="queued", sessions=[], attempts=0,
                                              created_at=now, updated_at=now))
    engine.dispose()


def test_one_id_rule_every_command(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Any unique prefix of four characters or more; shorter is refused; ambiguity names the matches."""
    _insert_jobs("abcd1111" + "0" * 24, "abcd2222" + "0" * 24)
    for args in (("cancel", "ab"), ("report", "abc"), ("memory", "show", "abc"),
                 ("search", RMS, "--resume", "abc"), ("chat", RMS, "--resume", "abc")):
        assert "at least 4 characters" in one_error(capsys, *args), args
    for args in (("cancel", "zzzz"), ("report", "zzzz9"), ("memory", "show", "zzzz"),
                 ("search", RMS, "--resume", "zzzz"), ("chat", RMS, "--resume", "zzzz")):
        line = one_error(capsys, *args)
        assert line.startswith("error: ") and f"with id '{args[-1]}'" in line, (args, line)
    ambiguous = one_error(capsys, "cancel", "abcd")
    assert "ambiguous" in ambiguous and "abcd1111" in ambiguous and "abcd2222" in ambiguous
    code, out, err = cli(capsys, "cancel", "abcd1")  # the 12 characters a table shows work too
    assert code == 0 and "abcd1111" in out and "cancelled" in out, err
    page = tmp_path / "job.html"
    code, out, err = cli(capsys, "report", "abcd2", "--out", str(page))  # a job prefix finds the job
    assert code == 0 and page.is_file() and "abcd2222" in page.read_text(), err


def test_cancel_of_a_finished_job_is_refused(capsys) -> None:  # type: ignore[no-untyped-def]
    job_id = "beef" + "1" * 28
    _insert_jobs(job_id)
    assert cli(capsys, "cancel", job_id[:6])[0] == 0
    line = one_error(capsys, "cancel", job_id[:6])
    assert "already cancelled" in line and "nothing to cancel" in line


def test_jobs_show_why_a_job_failed_and_write_json_to_a_file(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "200")
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.claims import Claimer
    from orchestrators.jobs import JobQueue

    job_id = "cafe" + "2" * 28
    _insert_jobs(job_id)
    with Store.open(load_settings().resolved_store_url) as store:
        claimer = Claimer(JobQueue(store.engine))
        assert claimer.claim() is not None
        claimer.finish(job_id, "failed", error="TaskError: reference.py vanished")
        done_id = "cafe" + "3" * 28
        _insert_jobs(done_id)
        assert claimer.claim() is not None
        claimer.finish(done_id, "done", result={"best_report": {"speedup": 1.23456, "speedup_ci": [1.1, 1.36]},
                                                               "best_strategy": "rowblock"})
    code, out, _ = cli(capsys, "jobs")
    assert code == 0 and "reference.py vanished" in out
    assert "1.23x (1.10–1.36x) rowblock" in out  # one precision everywhere, and the interval with it
    target = tmp_path / "jobs.json"
    code, out, _ = cli(capsys, "jobs", "--json", str(target))
    listed = {j["id"]: j for j in json.loads(target.read_text())}
    assert code == 0 and out == "" and listed[job_id]["error"].endswith("vanished")
    assert "does not exist" in one_error(capsys, "jobs", "--json", str(tmp_path / "no" / "jobs.json"))
    assert "choose one of" in one_error(capsys, "jobs", "--status", "finished")


@pytest.mark.parametrize("args, words", [
    (("optimize", RMS, "--budget", "-1"), "--budget"),
    (("optimize", RMS, "--evals", "0"), "--evals"),
    (("search", RMS, "--budget", "0"), "--budget"),
    (("search", RMS, "--evals", "0"), "--evals"),
    (("submit", RMS, "--budget", "0"), "--budget"),
    (("submit", RMS, "--evals", "0"), "--evals"),
    (("chat", RMS, "--budget", "0"), "--budget 0: must be a positive number of seconds"),
    (("chat", RMS, "--evals", "0"), "--evals 0: must be at least 1"),
    (("optimize-model", LAYER, "--budget", "0"), "--budget 0: must be a positive number of seconds"),
    (("optimize-model", LAYER, "--evals", "0"), "--evals 0: must be at least 1"),
    (("optimize-model", LAYER, "--target", "gpu"), "no GPU on this machine"),
    (("optimize-model", LAYER, "--json", "/no/such/folder/r.json"), "does not exist"),
    (("optimize", RMS, "--target", "tpu-v9"), "tpu-v9"),
    (("search", RMS, "--target", "tpu-v9"), "tpu-v9"),
    (("submit", RMS, "--target", "tpu-v9"), "tpu-v9"),
    (("chat", RMS, "--target", "tpu-v9"), "tpu-v9"),
    (("eval", RMS, CANDIDATE, "--target", "tpu-v9"), "tpu-v9"),
    (("analyze", RMS, "--target", "tpu-v9"), "tpu-v9"),
    (("optimize", RMS, "--target", "gpu"), "no GPU on this machine"),
    (("search", RMS, "--target", "gpu"), "no GPU on this machine"),
    (("eval", RMS, CANDIDATE, "--target", "gpu"), "no GPU on this machine"),
    (("chat", RMS, "--target", "gpu"), "no GPU on this machine"),
    (("submit", RMS, "--target", "gpu"), "no GPU on this machine"),
    (("optimize", RMS, "--json", "/no/such/folder/r.json"), "does not exist"),
    (("search", RMS, "--json", "/no/such/folder/r.json"), "does not exist"),
    (("eval", RMS, CANDIDATE, "--json", "/no/such/folder/r.json"), "does not exist"),
    (("bench", RMS, "--json", "/no/such/folder/r.json"), "does not exist"),
    (("bench", RMS, "--size", "huge"), "--size"),
    (("report", "abcd1234", "--out", "/no/such/folder/r.html"), "does not exist"),
    (("optimize", "no_such_task"), "no_such_task"),
    (("search", "no_such_task"), "no_such_task"),
    (("submit", "no_such_task"), "no_such_task"),
    (("chat", "no_such_task"), "no_such_task"),
    (("--log-level", "loud", "tasks"), "--log-level"),
])
def test_a_bad_flag_value_is_one_line_before_any_work(capsys, args: tuple[str, ...], words: str) -> None:  # type: ignore[no-untyped-def]
    if "gpu" in args:
        import jax

        if any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("this machine has a GPU: --target gpu runs")
    assert words in one_error(capsys, *args)


def test_optimize_output_folder_that_is_a_file_is_refused_first(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "kernels"
    blocker.write_text("")
    assert "not a folder" in one_error(capsys, "optimize", RMS, "--out", str(blocker))


@pytest.mark.parametrize("variable, value, words", [
    ("MAXKERNEL_EVAL_TIMEOUT_S", "abc", "MAXKERNEL_EVAL_TIMEOUT_S='abc'"),
    ("MAXKERNEL_EVAL_TIMEOUT_S", "0", "greater than 0"),
    ("MAXKERNEL_EVAL_WORKERS", "many", "MAXKERNEL_EVAL_WORKERS"),
    ("MAXKERNEL_EVAL_WORKERS", "[x]", "MAXKERNEL_EVAL_WORKERS='[x]'"),  # printed as given, not as markup
    ("MAXKERNEL_HOME", "/tmp/x", "unknown variable MAXKERNEL_HOME"),
])
def test_a_bad_setting_is_refused_the_same_way_by_every_command(capsys, monkeypatch, variable: str, value: str,  # type: ignore[no-untyped-def]
                                                                 words: str) -> None:
    monkeypatch.setenv(variable, value)
    for args in (("tasks",), ("jobs",), ("memory", "stats"), ("eval", RMS, CANDIDATE), ("optimize", RMS)):
        assert words in one_error(capsys, *args), args
    if variable == "MAXKERNEL_HOME":
        assert "MAXKERNEL_DATA_DIR" in one_error(capsys, "tasks")  # the refusal names the known ones


def test_a_broken_settings_file_is_named_with_its_line(capsys, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    broken = tmp_path / "settings.yaml"
    broken.write_text("eval_workers: 2\nstore_url: [unclosed\n")
    monkeypatch.setenv("MAXKERNEL_CONFIG", str(broken))
    line = one_error(capsys, "jobs")
    assert str(broken) in line and "line 3" in line and "not valid YAML" in line
    broken.write_text("eval_wrokers: 2\n")
    assert "unknown setting 'eval_wrokers'" in one_error(capsys, "tasks")


def test_eval_honours_the_evaluator_settings(capsys, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``MAXKERNEL_EVAL_TIMEOUT_S`` and friends reach the evaluator ``eval`` uses, as they do for optimize."""
    import maxkernel.evaluation as evaluation
    from jaxbench.report import EvalReport

    seen: dict[str, Any] = {}

    def fake(task: Any, source: str, *, evaluator: Any, **kwargs: Any) -> EvalReport:
        seen.update(timeout=evaluator.config.timeout_s, rounds=evaluator.config.timing_rounds)
        return EvalReport(task=task.id, target="cpu", size="cpu", status="ok", correct=True)

    monkeypatch.setattr(evaluation, "evaluate_candidate", fake)
    monkeypatch.setenv("MAXKERNEL_EVAL_TIMEOUT_S", "0.5")
    monkeypatch.setenv("MAXKERNEL_EVAL_TIMING_ROUNDS", "3")
    code, _, err = cli(capsys, "eval", RMS, CANDIDATE)
    assert code == 0, err
    assert seen == {"timeout": 0.5, "rounds": 3}


def test_usage_errors_are_one_line(capsys, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """What Typer finds before a command runs: no boxed panel, one line, exit 2 (and so from the real script)."""
    for args, words in ((("eval",), "Missing argument"), (("search", RMS, "--evals", "many"), "--evals"),
                        (("no-such-command",), "No such command"), (("memory", "show"), "Missing argument"),
                        (("jobs", "--status"), "requires an argument")):
        assert words in one_error(capsys, *args), args
    proc = subprocess_cli("tasks", "--bogus", MAXKERNEL_DATA_DIR=str(tmp_path))
    lines = user_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1 and "No such option: --bogus" in lines[0], proc.stderr


def test_version_and_the_whole_suite_at_eighty_columns(tmp_path: Path) -> None:
    from jaxbench.task import list_tasks

    version = subprocess_cli("--version", MAXKERNEL_DATA_DIR=str(tmp_path))
    assert version.returncode == 0 and version.stdout.strip().startswith("maxkernel ")
    assert version.stdout.split()[1][0].isdigit()
    tasks = subprocess_cli("tasks", MAXKERNEL_DATA_DIR=str(tmp_path))
    assert tasks.returncode == 0, tasks.stderr
    words = set(tasks.stdout.split())
    missing = [t.id for t in list_tasks() if t.id not in words]
    assert not missing, missing  # no id is cut or split over lines


def test_task_check_names_a_bad_task_in_one_line() -> None:
    proc = subprocess.run([sys.executable, "-m", "jaxbench.task_check", "no_such_task"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"), cwd=ROOT)
    lines = user_lines(proc.stderr)
    assert proc.returncode == 2 and len(lines) == 1 and "no_such_task" in lines[0], proc.stderr


def test_the_static_check_says_syntax_error() -> None:
    from jaxbench.evaluate import Evaluator
    from jaxbench.static_checks import scan

    findings, _ = scan("import jax\n\ndef kernel(x:\n    return x\n")
    assert findings and findings[0].rule == "syntax" and "syntax error at line 3" in str(findings[0])
    evaluator = Evaluator()
    try:
        report = evaluator.evaluate(RMS, "def kernel(x, weight, *, eps)\n    return x\n")
    finally:
        evaluator.close()
    static = next(c for c in report.checks if c.name == "static")
    assert report.status == "compile_error" and not static.passed and "syntax error at line 1" in static.detail
    assert [c.name for c in report.checks] == ["static"]  # said at the static stage, nothing compiled


def test_the_http_api_validates_at_the_door_with_the_cli_messages(capsys) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.config import load_settings
    from memory import Store
    from orchestrators.httpapi import ApiServer
    from orchestrators.jobs import JobQueue

    with Store.open(load_settings().resolved_store_url) as store:
        queue = JobQueue(store.engine)
        api = ApiServer(queue, lambda: {})
        api.start()
        try:
            code, body = _http(api.port, "POST", "/jobs", {"task": "no_such_task"})
            assert code == 400 and "no_such_task" in body["error"]
            assert body["error"] in one_error(capsys, "submit", "no_such_task")  # the CLI's own words
            code, body = _http(api.port, "POST", "/jobs", {"task": RMS, "target": "tpu-v9"})
            assert code == 400 and "tpu-v9" in body["error"]
            code, body = _http(api.port, "POST", "/jobs", {"task": RMS, "brain": "replay"})
            assert code == 400 and "rules, gemini or openai" in body["error"]
            code, body = _http(api.port, "POST", "/jobs", {"task": RMS, "budget": {"time_s": 0}})
            assert code == 400 and "--budget" in body["error"]
            assert queue.list() == []  # nothing bad was queued
            code, body = _http(api.port, "GET", "/jobs/zzzz")
            assert code == 404 and "no job with id 'zzzz'" in body["error"]
            code, job = _http(api.port, "POST", "/jobs", {"task": RMS})
            assert code == 201 and job["task_id"] == RMS
            assert _http(api.port, "GET", f"/jobs/{job['id'][:8]}")[1]["id"] == job["id"]
            assert _http(api.port, "POST", f"/jobs/{job['id']}/cancel")[0] == 200
            code, body = _http(api.port, "POST", f"/jobs/{job['id']}/cancel")
            assert code == 409 and "already cancelled" in body["error"]
        finally:
            api.stop()


def test_project_metadata_allows_newer_pythons_and_ignores_outputs() -> None:
    from packaging.specifiers import SpecifierSet

    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert all(v in spec for v in ("3.11", "3.12", "3.13"))
    ignored = (ROOT / ".gitignore").read_text().split()
    assert "kernels/" in ignored and "reports/" in ignored


def test_model_presets_follow_the_current_lists_and_every_cloud_model_has_a_price() -> None:
    from maxkernel.llm.presets import read_models

    table = read_models()
    assert table.default == "gemini-3.1-pro-preview"
    assert table.preset(table.default).model == "gemini-3.1-pro-preview"
    cloud = [p for p in table.presets.values() if p.provider != "replay" and p.base_url is None]
    assert cloud and all(table.price(p.model).output > table.price(p.model).input > 0 for p in cloud)
    assert table.preset("openai").model == "gpt-5.5"  # the flagship of OpenAI's current list


def test_every_price_names_its_source_and_the_date_it_was_read() -> None:
    lines = (ROOT / "config" / "models.yaml").read_text().split("\nprices:\n", 1)[1].splitlines()
    cited, comment = [], ""
    for line in lines:
        if line.strip().startswith("#"):
            comment += line
        elif ":" in line and line.strip():
            cited.append((line.split(":")[0].strip(), comment))
        else:
            comment = ""
    assert cited
    for model, source in cited:
        assert "https://" in source and re.search(r"read 20\d\d-\d\d-\d\d", source), model


def test_host_and_worker_refuse_bad_addresses_roles_and_busy_ports(capsys) -> None:  # type: ignore[no-untyped-def]
    import socket

    code, out, _ = cli(capsys, "host", "--help")
    assert code == 0 and "HOST:PORT" in out  # help, not an address called --help
    assert "expected HOST:PORT" in one_error(capsys, "host", "nowhere")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert "cannot listen there" in one_error(capsys, "host", f"127.0.0.1:{port}")
    assert "--host" in one_error(capsys, "worker", "--roles", "tester")
    assert "unknown role bogus" in one_error(capsys, "worker", "--host", "127.0.0.1:50051", "--roles", "bogus")
    assert "expected HOST:PORT" in one_error(capsys, "worker", "--host", "nohost", "--roles", "tester")
    assert "only with --supervise" in one_error(capsys, "worker", "--host", "127.0.0.1:50051", "--roles", "tester",
                                                "--spares", "1")


def test_the_search_table_fits_eighty_columns_with_ids_whole() -> None:
    import io

    from rich.console import Console

    from maxkernel.commands.search import results_table
    from orchestrators.search import SearchResult

    result = SearchResult(search_id="f9cded9a28bd" + "0" * 20, task_id="50k_Matmul_GELU_Softmax", algorithm="beam",
                          status="scored", stop_reason="", evaluations=30, expansions=30, nodes=30,
                          best_strategy="template:matmul_epilogue_softmax", best_params={"block_m": 256},
                          best_speedup=1.234, best_speedup_ci=(1.1, 1.35), confirmed=True, claim="faster",
                          first_correct_at=3)
    buffer = io.StringIO()
    Console(file=buffer, width=80).print(results_table([result], "beam", 0))
    lines = buffer.getvalue().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in lines[1:]), "the table was cropped at the right"
    row = next(line for line in lines if "f9cded9a28bd" in line)
    assert "50k_Matmul_GELU_Softmax" in row  # ids whole, on one line
    folded = "".join(line.split("│")[-2].strip() for line in lines if line.startswith("│"))
    assert "template:matmul_epilogue_softmax" in folded  # the strategy folded, never cut


def test_a_search_resumes_only_as_the_search_of_its_own_task(capsys) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.config import load_settings
    from orchestrators.search import SearchConfig
    from orchestrators.tables import ensure, searches, utcnow

    engine = sa.create_engine(load_settings().resolved_store_url)
    ensure(engine)
    with engine.begin() as conn:
        conn.execute(searches.insert().values(id="5ea7c4" + "0" * 26, task_id=RMS, algorithm="beam",
                                              config=SearchConfig().model_dump(), status="done",
                                              created_at=utcnow(), updated_at=utcnow()))
    engine.dispose()
    line = one_error(capsys, "search", "41k_Gemm_Add_ReLU", "--resume", "5ea7c4")
    assert f"a search of {RMS}, not of 41k_Gemm_Add_ReLU" in line


def test_every_variable_the_code_reads_is_one_the_settings_accept() -> None:
    """A ``MAXKERNEL_*`` variable read somewhere but unknown to the settings would refuse every command."""
    from maxkernel.config import check_environment

    root = Path(__file__).resolve().parents[1]
    read = {m for folder in ("maxkernel", "jaxbench", "actors", "memory", "orchestrators", "benchmarks")
            for path in (root / folder).rglob("*.py")
            for m in re.findall(r"[\"'](MAXKERNEL_[A-Z0-9_]+)[\"']", path.read_text())}
    assert "MAXKERNEL_NO_TPU_COMPILER" in read and "MAXKERNEL_DATA_DIR" in read
    for name in sorted(read):
        check_environment({name: "1"})  # raises ConfigError for a variable no setting names
