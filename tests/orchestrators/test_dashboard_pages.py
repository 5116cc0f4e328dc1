"""The dashboard's pages read from a real store (sessions recorded as the recorder writes them, a job the
daemon's claimer finished, a remembered kernel and note): speedups in their own column, the chart's points,
the best kernel beside the reference, memory searched, the form's refusals, the static folder kept shut; and
the token rule, in a real browser, for a dashboard bound beyond loopback."""

from __future__ import annotations

import json
import re
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
from measured_sessions import record_session

from jaxbench.report import EvalReport as JudgeReport
from maxkernel.messages import StrategyRef
from memory import Store
from memory.models import NewKernel
from orchestrators.claims import Claimer
from orchestrators.dashboard import Dashboard
from orchestrators.jobs import JobQueue, JobSpec

TASK = "12p_RMSNorm"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture
def filled(tmp_path: Path) -> Iterator[tuple[Store, Dashboard, str, str]]:
    """A store with one finished Auto session (a correct draft at 2.5x and an incorrect one), a job that ran
    it, a remembered kernel and a note."""
    with Store.open(f"sqlite:///{tmp_path / 'dash.db'}") as store:
        strategies = [StrategyRef(name="template:rowblock", params={"block_rows": 64}), StrategyRef(name="reference")]
        session = record_session(store, TASK, strategies, {"template:rowblock": ("ok", 2.5), "reference": ("incorrect", None)})
        store.create_session(id=session, mode="daemon", brain="rules", target="cpu", task_id=TASK, status="done")
        queue = JobQueue(store.engine)
        queue.submit(JobSpec(task=TASK))
        claims = Claimer(queue)
        job = claims.claim()
        assert job is not None
        queue.started(job.id, session)
        claims.finish(job.id, "done", {"speedup": 2.5, "speedup_ci": [2.3, 2.7], "claim": "faster",
                                       "best_strategy": "template:rowblock", "stop_reason": "the budget's evaluations"})
        report = JudgeReport(task=TASK, target="cpu", status="ok", correct=True, speedup=2.5, speedup_ci=(2.3, 2.7),
                             basis="measured", kernel_ms=0.4, ref_ms=1.0)
        store.ensure_task(TASK)
        with store.write("remembering") as tx:
            tx.add_kernels([NewKernel(task_id=TASK, code="def kernel(x, w):\n    return rowblock(x, w)\n",
                                      report=report, strategy="template:rowblock", session_id=session)])
        store.add_note("template:rowblock beat the reference on this norm", outcome="worked", task_id=TASK, target="cpu")
        yield store, Dashboard(queue, store, tmp_path), session, job.id


def _get(dash: Dashboard, path: str) -> str:
    page = dash.handle("GET", path)
    assert page is not None and page.status == 200, path
    return page.body.decode()


def test_the_jobs_page_gives_the_speedup_its_own_column_and_the_progress_from_the_event_log(filled) -> None:  # type: ignore[no-untyped-def]
    _, dash, _, job_id = filled
    html = _get(dash, "/")
    row = re.search(rf'<tr class="job" data-status="done" data-job="{job_id}">(.*?)</tr>', html, re.S)
    assert row is not None
    speedup = re.search(r'<td class="speedup[^"]*">(.*?)</td>', row.group(1), re.S)
    assert speedup is not None and "2.50x (2.30–2.70x)" in speedup.group(1) and "faster" in speedup.group(1)
    assert "2/60 evaluations" in row.group(1)  # the draft and the failed one; the job's cap is the default 60
    assert "the budget&#39;s evaluations" in row.group(1)  # the reason has its own column too


def test_a_sessions_page_has_its_chart_points_best_kernel_and_reference(filled) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.messages import EvalReport, KernelDraft, Plan, new_id

    store, dash, session, _ = filled
    listing = _get(dash, "/ui/sessions")
    row = re.search(rf'data-session="{session}">(.*?)</tr>', listing, re.S)
    assert row is not None and "2.50x" in row.group(1) and "template:rowblock" in row.group(1)
    # a reading judged since the list was shown moves the session's best (nothing stale is kept between polls)
    plan = Plan(session_id=session, task_id=TASK, target="cpu", strategies=[StrategyRef(name="template:faster")])
    draft = KernelDraft(session_id=session, task_id=TASK, candidate_id=new_id(), plan=plan, source="# template:faster",
                        produced_by="coder")
    judged = JudgeReport(task=TASK, target="cpu", status="ok", correct=True, speedup=4.0, speedup_ci=(3.9, 4.1))
    store.append_event(EvalReport(session_id=session, task_id=TASK, draft=draft, report=judged), session_id=session,
                       task_id=TASK)
    row = re.search(rf'data-session="{session}">(.*?)</tr>', _get(dash, "/ui/sessions"), re.S)
    assert row is not None and "4.00x (3.90–4.10x)" in row.group(1) and "template:faster" in row.group(1)
    page = _get(dash, f"/ui/sessions/{session}")
    points = json.loads(re.search(r'<script type="application/json" id="chart-data" data-live>(.*?)</script>',
                                  page, re.S).group(1))  # type: ignore[union-attr]
    assert [(p["n"], p["passed"], p["speedup"]) for p in points] == [(1, True, 2.5), (2, False, None), (3, True, 4.0)]
    assert points[1]["best_low"] == points[0]["best_low"]  # a rejected candidate never moves the best
    assert points[2]["best_low"] == 3.9  # the best lower end so far
    seconds = [p["t"] for p in points]  # when each was recorded, from the session's first message (its plan)
    assert all(t is not None and t >= 0 for t in seconds) and seconds == sorted(seconds)
    assert "# template:faster" in re.search(r'id="best-code">(.*?)</code>', page, re.S).group(1)  # type: ignore[union-attr]
    assert "def reference(" in re.search(r'id="reference-code">(.*?)</code>', page, re.S).group(1)  # type: ignore[union-attr]
    graph = dash.handle("GET", f"/ui/graph/{session}.png")
    assert graph is not None and graph.content_type == "image/png" and graph.body.startswith(b"\x89PNG")
    assert dash.handle("GET", f"/ui/searches/{session}").status == 404  # type: ignore[union-attr]  # not a search


def test_a_job_whose_session_has_no_record_yet_still_has_its_page(filled) -> None:  # type: ignore[no-untyped-def]
    from maxkernel.messages import new_id

    _, dash, _, _ = filled
    dash.queue.submit(JobSpec(task=TASK))
    job = Claimer(dash.queue).claim()
    assert job is not None
    dash.queue.started(job.id, new_id())  # the daemon names the session before the session writes its first record
    html = _get(dash, f"/ui/jobs/{job.id[:8]}")
    assert "running" in re.search(r'<span id="status"[^>]*>(.*?)</span>\s*<span>', html, re.S).group(1)  # type: ignore[union-attr]
    assert 'data-poll="2000"' in html  # and it keeps watching
    assert f'data-job="{job.id}"' in _get(dash, "/")  # and the jobs page lists it meanwhile


def test_memory_is_searched_by_task_strategy_code_and_note_text(filled) -> None:  # type: ignore[no-untyped-def]
    _, dash, _, _ = filled
    everything = _get(dash, "/ui/memory")
    assert everything.count('<tr class="kernel">') == 1 and everything.count('<tr class="note">') == 1
    by_code = _get(dash, "/ui/memory?q=ROWBLOCK(x")
    assert by_code.count('<tr class="kernel">') == 1 and by_code.count('<tr class="note">') == 0
    by_note = _get(dash, "/ui/memory?q=beat+the")
    assert by_note.count('<tr class="kernel">') == 0 and by_note.count('<tr class="note">') == 1
    none = _get(dash, "/ui/memory?q=100%25")  # a % in the query is a character, not a wildcard
    assert "No kernel matches." in none and "No note matches." in none
    kernel_id = re.search(r'href="/ui/memory/kernels/([0-9a-f]+)"', everything).group(1)  # type: ignore[union-attr]
    kernel = _get(dash, f"/ui/memory/kernels/{kernel_id}")
    assert "return rowblock(x, w)" in kernel and "def reference(" in kernel


def test_the_form_refuses_what_the_api_refuses_and_queues_nothing(filled) -> None:  # type: ignore[no-untyped-def]
    store, dash, _, _ = filled
    before = len(JobQueue(store.engine).list())
    for form, said in ((b"task=12p_RMSNorm&budget=-5", "must be positive"), (b"task=no_such_task", "no_such_task"),
                       (b"task=12p_RMSNorm&target=tpu-v99", "tpu-v99")):
        page = dash.handle("POST", "/ui/jobs", form)
        assert page is not None and page.status == 400
        assert said in re.search(r'id="error"[^>]*>(.*?)</div>', page.body.decode(), re.S).group(1)  # type: ignore[union-attr]
    assert len(JobQueue(store.engine).list()) == before
    page = dash.handle("POST", "/ui/jobs", b"task=12p_RMSNorm&budget=30&evals=2")
    assert page is not None and page.status == 303 and page.location and page.location.startswith("/ui/jobs/")


def test_a_job_is_cancelled_from_its_page_and_an_ended_one_is_left_as_it_was(filled) -> None:  # type: ignore[no-untyped-def]
    _, dash, _, done_id = filled
    job = dash.queue.submit(JobSpec(task=TASK))
    assert 'id="cancel"' in _get(dash, f"/ui/jobs/{job.id}")
    page = dash.handle("POST", f"/ui/jobs/{job.id[:10]}/cancel")
    assert page is not None and page.status == 303 and page.location == f"/ui/jobs/{job.id}"
    assert dash.queue.get(job.id).status == "cancelled"
    assert 'id="cancel"' not in _get(dash, f"/ui/jobs/{job.id}")
    page = dash.handle("POST", f"/ui/jobs/{done_id}/cancel")
    assert page is not None and page.status == 409 and "already done" in page.body.decode()
    assert dash.queue.get(done_id).status == "done"


def test_the_static_folder_serves_the_vendored_libraries_and_nothing_outside_it(filled) -> None:  # type: ignore[no-untyped-def]
    _, dash, _, _ = filled
    for path, kind in (("vendor/bootstrap/bootstrap.min.css", "text/css"), ("vendor/chartjs/chart.umd.min.js", "javascript"),
                       ("vendor/highlightjs/highlight.min.js", "javascript"), ("dashboard.js", "javascript")):
        page = dash.handle("GET", f"/ui/static/{path}")
        assert page is not None and page.status == 200 and kind in page.content_type, path
    for escape in ("../dashboard.py", "vendor/../../dashboard.py", "/etc/passwd", "..%2fdashboard.py"):
        assert dash.handle("GET", f"/ui/static/{escape}") is None, escape
    html = _get(dash, "/")
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html  # nothing from elsewhere


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="no chromium here (.ci/run installs it)")
def test_beyond_loopback_a_browser_needs_the_token_and_keeps_it_in_a_cookie(filled) -> None:  # type: ignore[no-untyped-def]
    from playwright.sync_api import sync_playwright

    from orchestrators.httpapi import ApiServer

    store, dash, session, _ = filled
    api = ApiServer(dash.queue, lambda: {"ok": True}, _free_port(), pages=dash, host="0.0.0.0", token="s3cret")
    api.start()
    base = f"http://127.0.0.1:{api.port}"
    try:
        for path in ("/ui/sessions", "/ui/static/dashboard.js", f"/ui/graph/{session}.png"):  # no token: nothing
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(base + path, timeout=30)
            assert refused.value.code == 401 and "token" in json.loads(refused.value.read())["error"]
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            reply = page.goto(f"{base}/ui/sessions")
            assert reply is not None and reply.status == 401 and page.locator("#login").count() == 1
            assert session[:8] not in page.content()  # the form, and nothing of the store
            page.fill("input[name=token]", "guess")
            page.click("button[type=submit]")
            assert "not the daemon's token" in page.text_content("#error")  # type: ignore[operator]
            assert page.context.cookies() == []
            page.fill("input[name=token]", "s3cret")
            page.click("button[type=submit]")
            page.wait_for_url(f"{base}/ui/sessions")
            assert page.locator(f'tr[data-session="{session}"]').count() == 1
            cookie, = page.context.cookies()
            assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and "s3cret" not in cookie["value"]
            # the libraries came from the daemon, behind the same token: the page is styled, its code highlighted
            page.goto(f"{base}/ui/sessions/{session}")
            assert page.evaluate("typeof Chart") == "function"
            assert page.locator("#best-code .hljs-comment").count() >= 1
            assert page.evaluate("getComputedStyle(document.querySelector('nav')).backgroundColor") != "rgba(0, 0, 0, 0)"
            browser.close()
        # a client with the header still needs nothing else; a wrong cookie is no token
        header = urllib.request.Request(base + "/ui/sessions", headers={"Authorization": "Bearer s3cret"})
        assert urllib.request.urlopen(header, timeout=30).status == 200
        forged = urllib.request.Request(base + "/ui/sessions", headers={"Cookie": "maxkernel_token=s3cret"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(forged, timeout=30)
        assert refused.value.code == 401
    finally:
        api.stop()
