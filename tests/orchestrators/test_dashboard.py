"""The daemon's dashboard in a real headless browser (Playwright driving Debian's chromium): submit a job
from the page, watch it finish, open its report; the memory page shows the kernel it remembered."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from maxkernel.config import load_settings

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="no chromium here (.ci/run installs it with apt-get install -y chromium)")


def test_submit_a_job_from_the_page_watch_it_finish_and_open_its_report(fast_env: dict[str, str]) -> None:
    from playwright.sync_api import sync_playwright

    from orchestrators.daemon import spawn, stop

    settings = load_settings()
    state = spawn(settings, concurrency=1)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(f"http://127.0.0.1:{state.port}/")
            page.fill("input[name=task]", "no_such_task")
            page.click("button[type=submit]")
            assert "no_such_task" in page.text_content("#error")  # refused at the door, the form shown again

            page.fill("input[name=task]", "12p_RMSNorm")
            page.fill("input[name=budget]", "120")
            page.fill("input[name=evals]", "3")
            page.click("button[type=submit]")
            assert "/ui/jobs/" in page.url
            job_id = page.url.rsplit("/", 1)[1]
            # The page refreshes itself while the job runs; wait for it to say done.
            page.wait_for_function("document.getElementById('status').textContent.trim() === 'done'", timeout=240_000)
            assert "evaluations" in page.content()
            page.click("#report")
            assert page.locator("h1").text_content().startswith("daemon job " + job_id)
            assert page.locator("img[alt=graph]").count() == 1 and "Best kernel" in page.content()

            page.goto(f"http://127.0.0.1:{state.port}/")
            row = page.locator("tr.job", has_text=job_id)
            assert row.get_attribute("data-status") == "done"
            page.click("text=memory")
            assert "12p_RMSNorm" in page.content() and "def kernel(" in page.locator("pre").first.text_content()
            browser.close()
    finally:
        stop(settings)
