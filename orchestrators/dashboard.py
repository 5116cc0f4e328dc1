"""The daemon's web dashboard: HTML pages rendered on the server with Jinja2, served by the daemon's own
HTTP server beside its JSON API. No script and no front-end build: pages of unfinished work refresh
themselves (``<meta http-equiv=refresh>``), and the submit form is a plain HTML form.

Pages: ``/`` (jobs with status, reason and live progress, and the submit form), ``/ui/jobs/<id>``,
``/ui/report/<id>`` (a session's, search's or job's report), ``/ui/searches`` and ``/ui/memory`` (the
memory's kernels with their code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

import jinja2
import sqlalchemy as sa
from pydantic import ValidationError

from jaxbench.report import format_speedup
from jaxbench.task import TaskError, load_task
from maxkernel.targets.names import parse_target
from memory import Store
from orchestrators.graph import EVALUATION_TYPES
from orchestrators.jobs import JobInfo, JobQueue, JobSpec, UnknownJob
from orchestrators.report import UnknownSubject, render
from orchestrators.tables import ensure, searches

REFRESH_S = 2
_JOB = re.compile(r"^/ui/jobs/([0-9a-f]{1,64})$")
_REPORT = re.compile(r"^/ui/report/([0-9a-f]{1,64})$")

_LAYOUT = """<!doctype html><html><head><meta charset="utf-8"><title>MaxKernel · {{ title }}</title>
{% if refresh %}<meta http-equiv="refresh" content="{{ refresh }}">{% endif %}
<style>body{font-family:sans-serif;max-width:1200px;margin:1.5em auto}table{border-collapse:collapse;margin:1em 0}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}pre{background:#f6f6f6;padding:.8em;
overflow:auto;max-height:30em}nav a{margin-right:1em}.error{color:#b00}</style></head><body>
<nav><a href="/">jobs</a><a href="/ui/searches">searches</a><a href="/ui/memory">memory</a></nav>
<h1>{{ title }}</h1>{% block body %}{% endblock %}</body></html>"""

_TEMPLATES = {
    "layout.html": _LAYOUT,
    "jobs.html": """{% extends "layout.html" %}{% block body %}
{% if error %}<p class="error" id="error">{{ error }}</p>{% endif %}
<form method="post" action="/ui/jobs" id="submit">
<label>task <input name="task" required placeholder="12p_RMSNorm"></label>
<label>target <input name="target" value="cpu"></label>
<label>budget (s) <input name="budget" type="number" min="1" value="120"></label>
<label>evaluations <input name="evals" type="number" min="1" value="20"></label>
<label>priority <input name="priority" type="number" value="0"></label>
<button type="submit">submit</button></form>
<table id="jobs"><tr><th>job</th><th>task</th><th>target</th><th>status</th><th>progress</th><th>result</th>
<th>reason</th><th>report</th></tr>
{% for row in rows %}<tr class="job" data-status="{{ row.job.status }}"><td><a href="/ui/jobs/{{ row.job.id }}">{{ row.job.id }}</a></td>
<td>{{ row.job.task_id }}</td><td>{{ row.job.target }}</td><td class="status">{{ row.job.status }}</td>
<td>{{ row.progress }}</td><td>{{ row.result }}</td><td>{{ row.reason }}</td>
<td>{% if row.job.sessions %}<a href="/ui/report/{{ row.job.id }}">report</a>{% endif %}</td></tr>{% endfor %}
</table>{% endblock %}""",
    "job.html": """{% extends "layout.html" %}{% block body %}
<table><tr><th>job</th><td>{{ row.job.id }}</td></tr><tr><th>task</th><td>{{ row.job.task_id }}</td></tr>
<tr><th>status</th><td id="status">{{ row.job.status }}</td></tr><tr><th>progress</th><td>{{ row.progress }}</td></tr>
<tr><th>result</th><td>{{ row.result }}</td></tr><tr><th>reason</th><td>{{ row.reason }}</td></tr>
<tr><th>sessions</th><td>{% for s in row.job.sessions %}<a href="/ui/report/{{ s }}">{{ s }}</a> {% endfor %}</td></tr>
</table>{% if row.job.sessions %}<p><a id="report" href="/ui/report/{{ row.job.id }}">the job's report</a></p>{% endif %}
{% endblock %}""",
    "searches.html": """{% extends "layout.html" %}{% block body %}<table><tr><th>search</th><th>task</th>
<th>algorithm</th><th>status</th></tr>{% for s in rows %}<tr><td><a href="/ui/report/{{ s.id }}">{{ s.id }}</a></td>
<td>{{ s.task_id }}</td><td>{{ s.algorithm }}</td><td>{{ s.status }}</td></tr>{% endfor %}</table>{% endblock %}""",
    "memory.html": """{% extends "layout.html" %}{% block body %}{% for k in kernels %}
<h2 id="k-{{ k.id }}">{{ k.task_id }} · {{ k.target }} · {{ k.strategy or "-" }} · {{ k.speed }}</h2>
<p>kernel {{ k.id }}{% if k.session_id %}, from <a href="/ui/report/{{ k.session_id }}">session {{ k.session_id }}</a>{% endif %}</p>
<pre>{{ k.code }}</pre>{% else %}<p>The memory holds no kernel yet.</p>{% endfor %}{% endblock %}""",
}

_env = jinja2.Environment(loader=jinja2.DictLoader(_TEMPLATES), autoescape=True)


@dataclass
class Page:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    location: str | None = None


class Dashboard:
    """Answers the dashboard's routes; ``handle`` returns None for a path that is not one of them."""

    def __init__(self, queue: JobQueue, store: Store) -> None:
        self.queue, self.store = queue, store

    def handle(self, method: str, path: str, body: bytes = b"") -> Page | None:
        path = path.split("?")[0]
        try:
            if method == "GET":
                return self._get(path)
            if method == "POST" and path == "/ui/jobs":
                return self._submit(body)
        except (UnknownJob, UnknownSubject, LookupError) as exc:
            return self._page("not found", "jobs.html", 404, error=str(exc).strip("'\""), rows=[])
        return None

    def _get(self, path: str) -> Page | None:
        if path in ("/", "/ui", "/ui/"):
            rows = [self._row(j) for j in self.queue.list(None)]
            live = any(r["job"].status in ("queued", "running") for r in rows)
            return self._page("jobs", "jobs.html", rows=rows, refresh=REFRESH_S if live else None)
        if match := _JOB.match(path):
            row = self._row(self.queue.get(match.group(1)))
            live = row["job"].status in ("queued", "running")
            return self._page(f"job {row['job'].id}", "job.html", row=row, refresh=REFRESH_S if live else None)
        if match := _REPORT.match(path):
            return Page(200, render(self.store, match.group(1)).encode())
        if path == "/ui/searches":
            ensure(self.store.engine)
            with self.store.engine.connect() as conn:
                rows = conn.execute(sa.select(searches).order_by(searches.c.created_at.desc()).limit(200)).all()
            return self._page("searches", "searches.html", rows=rows)
        if path == "/ui/memory":
            kernels = [k.model_dump() | {"speed": format_speedup(k.speedup, k.report.interval)} for k in self.store.list_kernels(limit=100)]
            return self._page("memory", "memory.html", kernels=kernels)
        return None

    def _submit(self, body: bytes) -> Page:
        """The form's job, validated as the JSON API validates one; on a bad value the form again, saying why."""
        form = {k: v[0].strip() for k, v in parse_qs(body.decode()).items() if v and v[0].strip()}
        budget: dict[str, Any] = {}
        if "budget" in form:
            budget["time_s"] = form["budget"]
        if "evals" in form:
            budget["max_evaluations"] = form["evals"]
        try:
            spec = JobSpec.model_validate({"task": form.get("task", ""), "target": form.get("target", "cpu"),
                                           "priority": form.get("priority", 0), "budget": budget})
            load_task(spec.task)  # a task or target that does not exist is refused here, not after a run
            parse_target(spec.target)
        except ValidationError as exc:
            first = exc.errors()[0]
            return self._refused(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        except (TaskError, ValueError) as exc:
            return self._refused(str(exc).splitlines()[0])
        job = self.queue.submit(spec)
        return Page(303, b"", location=f"/ui/jobs/{job.id}")

    def _refused(self, error: str) -> Page:
        return self._page("jobs", "jobs.html", 400, error=error, rows=[self._row(j) for j in self.queue.list(None)])

    def _row(self, job: JobInfo) -> dict[str, Any]:
        """A job with its live progress (evaluations judged so far, from the event log) and its outcome."""
        done = sum(1 for s in job.sessions for e in self.store.events(session_id=s)
                   if e.message_type in EVALUATION_TYPES)
        cap = job.budget.max_evaluations
        progress = f"{done}/{cap} evaluations" if cap else f"{done} evaluations"
        result = job.result or {}
        outcome = result.get("verdict") or ""
        if result.get("best_strategy"):
            outcome = f"{result['best_strategy']}: {outcome}"
        return {"job": job, "progress": progress, "result": outcome, "reason": job.error or result.get("stop_reason", "")}

    def _page(self, title: str, template: str, status: int = 200, **values: Any) -> Page:
        values.setdefault("refresh", None)
        values.setdefault("error", None)
        html = _env.get_template(template).render(title=title, **values)
        return Page(status, html.encode())
