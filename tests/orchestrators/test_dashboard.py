"""The daemon's dashboard in a real headless browser (Playwright driving Debian's chromium) on a real daemon
(started by ``maxkernel daemon start``, which says where its dashboard is) and store: submit a job from the
page and watch its chart, progress and status change in place until it is done; watch a search started from
the shell appear on the searches page and end there; open the session, the search, memory and its search; no
page scrolls sideways in a 1400-px window.

With ``DASHBOARD_SHOTS=<folder>`` set it also saves each page at 1400 and 800 px wide there (the
docs' pictures: ``docs/_static/dashboard``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from maxkernel.config import load_settings

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                 reason="no chromium here (.ci/run installs it with apt-get install -y chromium)"),
              pytest.mark.slow]
WIDE, NARROW = 1400, 800
NO_SIDEWAYS = "document.documentElement.scrollWidth <= document.documentElement.clientWidth"
GRAPH_DRAWN = "(document.querySelector('img[alt=graph]') || {}).naturalWidth > 0"  # the picture arrived and decoded
SPEEDUP = re.compile(r"\d+\.\d\dx")


def _mark(page) -> None:  # type: ignore[no-untyped-def]
    """Leave a mark in the page's window: still there later means the page was updated in place, not loaded again."""
    page.evaluate("window.__stayed = true")


def _stayed(page) -> bool:  # type: ignore[no-untyped-def]
    return bool(page.evaluate("window.__stayed === true"))


def _shoot(page, name: str) -> None:  # type: ignore[no-untyped-def]
    """The page at both widths into the docs' folder (only when asked for), checking each for sideways scroll."""
    folder = os.environ.get("DASHBOARD_SHOTS")
    for width in (WIDE, NARROW):
        page.set_viewport_size({"width": width, "height": 900})
        page.wait_for_timeout(300)  # the chart and the layout settle at the new width
        if width == WIDE:
            assert page.evaluate(NO_SIDEWAYS), f"{name} scrolls sideways at {WIDE} px"
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(folder) / f"{name}-{width}.png"), full_page=True)
    page.set_viewport_size({"width": WIDE, "height": 900})


def test_live_jobs_sessions_searches_and_memory_in_a_browser(fast_env: dict[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    from orchestrators.daemon import stop

    settings = load_settings()
    started = subprocess.run([sys.executable, "-m", "maxkernel.cli", "daemon", "start", "--concurrency", "1"], cwd=ROOT,
                             env=os.environ.copy(), capture_output=True, text=True, timeout=300)
    search = None
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        said = re.search(r"dashboard and API at (http://127\.0\.0\.1:\d+)/$", started.stdout.strip())
        assert said is not None, started.stdout  # `daemon start` says where the dashboard is
        base = said.group(1)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": WIDE, "height": 900})
            page.goto(f"{base}/")
            assert page.evaluate("getComputedStyle(document.querySelector('nav')).backgroundColor") != "rgba(0, 0, 0, 0)"
            page.fill("input[name=task]", "no_such_task")
            page.click("button[type=submit]")
            assert "no_such_task" in page.text_content("#error")  # type: ignore[operator]  # refused at the door

            page.fill("input[name=task]", "12p_RMSNorm")
            page.fill("input[name=budget]", "150")
            page.fill("input[name=evals]", "4")
            page.click("button[type=submit]")
            assert "/ui/jobs/" in page.url
            job_id = page.url.rsplit("/", 1)[1]
            _mark(page)
            # The page fetches itself again while the job runs: the chart gains points in place, then it is done.
            page.wait_for_function("Number(document.getElementById('chart').dataset.points || 0) >= 1", timeout=240_000)
            if os.environ.get("DASHBOARD_SHOTS"):  # the jobs page while the job runs, for the docs
                jobs = browser.new_page(viewport={"width": WIDE, "height": 900})
                jobs.goto(f"{base}/")
                _shoot(jobs, "jobs-running")
                jobs.close()
            page.wait_for_function("document.getElementById('status').textContent.trim() === 'done'", timeout=240_000)
            assert _stayed(page), "the job page was loaded again instead of updated in place"
            page.wait_for_timeout(500)
            done = int(re.search(r"(\d+)/4 evaluations", page.text_content("#subject-head") or "").group(1))  # type: ignore[union-attr]
            assert int(page.evaluate("document.getElementById('chart').dataset.points")) == done >= 1
            assert SPEEDUP.search(page.text_content("#speedup") or "")
            page.wait_for_function(GRAPH_DRAWN, timeout=60_000)
            assert "def kernel(" in (page.text_content("#best-code") or "")
            assert page.locator("#best-code .hljs-keyword").count() >= 1  # highlighted
            assert "def reference(" in (page.text_content("#reference-code") or "")
            _shoot(page, "job")

            page.goto(f"{base}/")
            row = page.locator("tr.job", has_text=job_id[:8])
            assert row.get_attribute("data-status") == "done"
            assert SPEEDUP.search(row.locator("td.speedup").text_content() or "")
            _shoot(page, "jobs")

            # A search started from the shell shows up on the open searches page, and ends there, by itself.
            page.goto(f"{base}/ui/searches")
            _mark(page)
            search = subprocess.Popen([sys.executable, "-m", "maxkernel.cli", "search", "12p_RMSNorm", "--evals", "4"],
                                      cwd=ROOT, env=os.environ.copy(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            page.wait_for_selector("tr.search", timeout=120_000)
            page.wait_for_selector("tr.search[data-status=done]", timeout=300_000)
            assert search.wait(timeout=120) == 0
            assert _stayed(page)
            assert SPEEDUP.search(page.locator("tr.search td.speedup").text_content() or "")
            _shoot(page, "searches")
            page.click("tr.search a")
            page.wait_for_function("Number(document.getElementById('chart').dataset.points || 0) >= 1")
            page.wait_for_function(GRAPH_DRAWN, timeout=60_000)
            _shoot(page, "search")

            page.click("nav a.nav-link:text-is('sessions')")
            session_row = page.locator("tr.session", has_text="daemon").first
            assert SPEEDUP.search(session_row.locator("td.speedup").text_content() or "")
            _shoot(page, "sessions")

            page.click("nav a.nav-link:text-is('memory')")
            assert page.locator("tr.kernel", has_text="12p_RMSNorm").count() >= 1
            page.fill("#q", "zz-nothing-like-this")
            page.click("#memory-search button[type=submit]")
            assert page.locator("tr.kernel").count() == 0 and page.locator("tr.note").count() == 0
            page.fill("#q", "RMSNorm")
            page.click("#memory-search button[type=submit]")
            assert page.locator("tr.kernel").count() >= 1
            _shoot(page, "memory")
            page.click("tr.kernel a")
            assert "def kernel(" in (page.text_content("#best-code") or "")
            _shoot(page, "kernel")
            browser.close()
    finally:
        if search is not None and search.poll() is None:
            search.kill()
            search.wait()
        stop(settings)
