"""The daemon's web dashboard: pages rendered on the server with Jinja2 (``orchestrators/templates/dashboard``),
styled with Bootstrap, the speedup chart drawn with Chart.js and code highlighted with highlight.js. Those
libraries are shipped with the package (``orchestrators/static/vendor``, each with its licence): a page fetches
nothing from anywhere but the daemon. Pages of live work fetch themselves again every ``POLL_MS`` and swap in
the regions marked ``data-live`` (``static/dashboard.js``), so progress, speedups, the chart and the graph
update in place while a job or search runs.

Pages: ``/`` (jobs with live progress and their speedup, and the submit form), ``/ui/jobs/<id>`` (and
``/ui/jobs/<id>/cancel``, a POST), ``/ui/sessions`` and ``/ui/sessions/<id>``, ``/ui/searches`` and
``/ui/searches/<id>`` (a job's, session's or search's chart, graph and best kernel beside the reference),
``/ui/memory`` (kernels and notes, searchable) and ``/ui/memory/kernels/<id>``, ``/ui/fleet`` (the fleet's
processes) and ``/ui/report/<id>`` (the HTML report). ``/ui/login`` takes the token into a cookie when the
daemon is bound beyond loopback (``orchestrators.httpapi``).
"""

from __future__ import annotations

import base64
import mimetypes
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jinja2
from pydantic import ValidationError

from jaxbench.report import format_speedup
from memory import Store
from memory.errors import RecordNotFoundError
from orchestrators import dashboard_data as data
from orchestrators.jobs import BadJob, JobInfo, JobNotActive, JobQueue, JobSpec, UnknownJob, check_spec
from orchestrators.report import UnknownSubject, render

POLL_MS = 2000
LIST_LIMIT = 100
STATIC = Path(__file__).resolve().parent / "static"
_ID = "([0-9a-f]{1,64})"
_SUBJECT = re.compile(rf"^/ui/(jobs|sessions|searches)/{_ID}$")
_REPORT = re.compile(rf"^/ui/report/{_ID}$")
_GRAPH = re.compile(rf"^/ui/graph/{_ID}\.png$")
_KERNEL = re.compile(rf"^/ui/memory/kernels/{_ID}$")
_CANCEL = re.compile(rf"^/ui/jobs/{_ID}/cancel$")
_SECTION = {"job": "jobs", "session": "sessions", "search": "searches"}  # a subject's kind -> its list page
_FORM_DEFAULTS = {"task": "", "target": "cpu", "budget": "120", "evals": "20", "priority": "0"}

_env = jinja2.Environment(loader=jinja2.PackageLoader("orchestrators", "templates/dashboard"), autoescape=True)
_drawing = threading.Lock()  # matplotlib's pyplot is not thread-safe; the HTTP server answers on many threads


@dataclass
class Page:
    status: int
    body: bytes
    content_type: str = "text/html; charset=utf-8"
    location: str | None = None
    headers: dict[str, str] | None = None


class Dashboard:
    """Answers the dashboard's routes; ``handle`` returns None for a path that is not one of them.
    ``data_path``: the daemon's data folder (where a fleet it belongs to is found)."""

    def __init__(self, queue: JobQueue, store: Store, data_path: Path | None = None) -> None:
        self.queue, self.store = queue, store
        if data_path is None:
            from maxkernel.config import load_settings

            data_path = load_settings().data_path
        self.data_path = data_path
        # what the list pages read once per session or ended search, not at every poll
        self._session_best: data.BestCache = {}
        self._search_rows: dict[str, Any] = {}

    def handle(self, method: str, path: str, body: bytes = b"") -> Page | None:
        url = urlsplit(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            if method == "GET":
                return self._get(url.path, query)
            if method == "POST" and url.path == "/ui/jobs":
                return self._submit(body)
            if method == "POST" and (match := _CANCEL.match(url.path)):
                return self._cancel(match.group(1))
        except (UnknownJob, UnknownSubject, LookupError, RecordNotFoundError) as exc:
            return self._page("not found", "notfound.html", 404, error=str(exc).strip("'\""))
        return None

    # -- pages ------------------------------------------------------------------------------------

    def _get(self, path: str, query: dict[str, str]) -> Page | None:
        if path in ("/", "/ui", "/ui/"):
            return self._jobs()
        if path.startswith("/ui/static/"):
            return self._static(path.removeprefix("/ui/static/"))
        if match := _SUBJECT.match(path):
            return self._subject(match.group(1), match.group(2))
        if match := _REPORT.match(path):
            return Page(200, render(self.store, match.group(1)).encode())
        if match := _GRAPH.match(path):
            return self._graph(match.group(1))
        if path == "/ui/sessions":
            rows = data.session_views(self.store, LIST_LIMIT, self._session_best)
            return self._page("sessions", "sessions.html", rows=rows, poll=self._poll(r.status == "running" for r in rows))
        if path == "/ui/searches":
            rows = data.search_views(self.store, LIST_LIMIT, self._search_rows)
            return self._page("searches", "searches.html", rows=rows, poll=self._poll(r.status == "running" for r in rows))
        if path == "/ui/memory":
            page = int(query["page"]) if query.get("page", "").isdigit() else 0
            view = data.memory_view(self.store, query.get("q", "").strip(), query.get("target", "").strip(), page)
            return self._page("memory", "memory.html", m=view)
        if match := _KERNEL.match(path):
            return self._kernel(match.group(1))
        if path == "/ui/fleet":
            found = data.fleet_processes(self.data_path)
            fleet = {"root": found[0], "rows": found[1]} if found else None
            return self._page("fleet", "fleet.html", fleet=fleet, poll=POLL_MS * 2 if fleet else None)
        return None

    def _jobs(self, status: int = 200, error: str | None = None, form: dict[str, str] | None = None) -> Page:
        rows = data.job_views(self.store, self.queue.list(None)[:LIST_LIMIT])
        counts = self.queue.counts()
        order = ("running", "cancelling", "queued", "done", "failed", "cancelled")
        shown = sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
        return self._page("jobs", "jobs.html", status, rows=rows, counts=shown, error=error,
                          form=_FORM_DEFAULTS | (form or {}), poll=self._poll(r.live for r in rows))

    def _subject(self, kind: str, subject: str) -> Page:
        job: JobInfo | None = None
        if kind == "jobs":
            job = self.queue.get(subject)
            subject = job.id
        else:  # an id or any unique prefix of one, as on the command line
            from orchestrators.tables import resolve_id

            subject = resolve_id(self.store, subject, ("search",) if kind == "searches" else ("session",))[1]
        view = data.subject_view(self.store, subject, job)
        if _SECTION[view.kind] != kind:
            raise LookupError(f"{subject} is a {view.kind}, not one of the {kind}")
        return self._page(f"{view.title} {view.id[:12]}", "subject.html", v=view, points=view.points(), section=kind,
                          poll=POLL_MS if view.live else None)

    def _graph(self, subject: str) -> Page:
        from orchestrators.report import gather, graph_png

        found = gather(self.store, subject)
        with _drawing:
            png = base64.b64decode(graph_png(found.nodes, found.best_id))
        return Page(200, png, "image/png", headers={"Cache-Control": "private, max-age=300"})

    def _kernel(self, kernel_id: str) -> Page:
        kernel_id = self.store.resolve(kernel_id, ("kernel",))[1]
        found = self.store.kernels([kernel_id])[kernel_id]
        report = found.report
        facts = [("task", found.task_id), ("target", found.target), ("strategy", found.strategy or "-"),
                 ("speedup", format_speedup(found.speedup, report.interval)),
                 ("kernel ms", f"{found.kernel_ms:.4g}" if found.kernel_ms else "-"),
                 ("reference ms", f"{found.ref_ms:.4g}" if found.ref_ms else "-"), ("basis", found.basis or "-"),
                 ("produced by", found.produced_by or "-"), ("remembered", found.created_at.strftime("%Y-%m-%d %H:%M"))]
        return self._page(f"kernel {found.id[:12]}", "kernel.html", k=found, facts=facts, section="memory",
                          reference=data.reference_source(found.task_id))

    def _static(self, name: str) -> Page | None:
        """A file of the package's static folder (nothing outside it, whatever the path says)."""
        path = (STATIC / name).resolve()
        if not path.is_relative_to(STATIC) or not path.is_file():
            return None
        kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        if kind.startswith("text/") or kind.endswith("javascript"):
            kind += "; charset=utf-8"
        return Page(200, path.read_bytes(), kind, headers={"Cache-Control": "private, max-age=3600"})

    # -- the submit form --------------------------------------------------------------------------

    def _submit(self, body: bytes) -> Page:
        """The form's job, checked as the JSON API checks one; on a bad value the form again, saying why."""
        form = {k: v[0].strip() for k, v in parse_qs(body.decode()).items() if v and v[0].strip()}
        budget: dict[str, Any] = {}
        if "budget" in form:
            budget["time_s"] = form["budget"]
        if "evals" in form:
            budget["max_evaluations"] = form["evals"]
        try:
            spec = check_spec(JobSpec.model_validate({"task": form.get("task", ""), "target": form.get("target", "cpu"),
                                                      "priority": form.get("priority", 0), "budget": budget}))
        except ValidationError as exc:
            first = exc.errors()[0]
            return self._jobs(400, f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}", form)
        except BadJob as exc:
            return self._jobs(400, str(exc).splitlines()[0], form)
        job = self.queue.submit(spec)
        return Page(303, b"", location=f"/ui/jobs/{job.id}")

    def _cancel(self, job_id: str) -> Page:
        """Cancel a queued job, or ask the daemon to stop a running one; back to the job's page either way
        (saying why when it had already ended)."""
        try:
            job = self.queue.cancel(job_id)
        except JobNotActive as exc:
            job = self.queue.get(job_id)
            view = data.subject_view(self.store, job.id, job)
            return self._page(f"{view.title} {view.id[:12]}", "subject.html", 409, v=view, points=view.points(),
                              section="jobs", error=str(exc))
        return Page(303, b"", location=f"/ui/jobs/{job.id}")

    # -- rendering --------------------------------------------------------------------------------

    def _nav(self) -> list[tuple[str, str]]:
        nav = [("/", "jobs"), ("/ui/sessions", "sessions"), ("/ui/searches", "searches"), ("/ui/memory", "memory")]
        if data.fleet_root(self.data_path) is not None:
            nav.append(("/ui/fleet", "fleet"))
        return nav

    @staticmethod
    def _poll(live: Any) -> int:
        """A list page polls fast while something on it runs, slowly otherwise (new work appears by itself)."""
        return POLL_MS if any(live) else POLL_MS * 3

    def _page(self, title: str, template: str, status: int = 200, **values: Any) -> Page:
        values.setdefault("poll", None)
        values.setdefault("error", None)
        values.setdefault("section", title if template != "subject.html" else "")
        html = _env.get_template(template).render(title=title, nav=self._nav(), **values)
        return Page(status, html.encode())


def login_page(next_path: str = "/", error: str | None = None) -> bytes:
    """The token form shown to a browser without the token (its only page that needs none)."""
    return _env.get_template("login.html").render(next=next_path, error=error).encode()
