"""A small HTTP API on loopback for other tools: submit, list, status, result, cancel.

Standard library only (``ThreadingHTTPServer`` in a thread beside the daemon's event loop): every request
goes straight to the job table in the store, which is the queue the daemon works from. Bound beyond
loopback it refuses to start without the settings' token, and then answers 401 to every request (the
dashboard's pages, their scripts and styles included) that does not carry the token: in an
``Authorization: Bearer <token>`` header, or in the cookie a browser is given by ``/ui/login`` once it typed
the token there (a digest of the token; ``SameSite=Strict``: no other site's page can send it; ``HttpOnly``:
no script can read it). ``/ui/login`` is the one path open without the token; a browser asking for a page
without it is shown that form (still with status 401).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import structlog
from pydantic import ValidationError

from maxkernel.auth import is_loopback, matches
from orchestrators.jobs import BadJob, JobNotActive, JobQueue, JobSpec, UnknownJob, check_spec

log = structlog.get_logger("orchestrators.http")

_JOB = re.compile(r"^/jobs/([^/?]{1,64})(/result|/cancel)?$")
BEARER = "Bearer "
COOKIE = "maxkernel_token"
LOGIN = "/ui/login"


class BindRefused(ValueError):
    """An address beyond loopback without a token to guard it."""


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or ''."""
    return header[len(BEARER):].strip() if header and header.startswith(BEARER) else ""


def cookie_token(header: str | None) -> str:
    """The token of the dashboard's cookie in a ``Cookie`` header, or ''."""
    cookies = SimpleCookie()
    try:
        cookies.load(header or "")
    except CookieError:
        return ""
    return cookies[COOKIE].value if COOKIE in cookies else ""


def cookie_value(token: str) -> str:
    """What the dashboard's cookie holds for ``token``: a digest of it (cookie-safe, and never the token)."""
    return hashlib.sha256(f"maxkernel-dashboard:{token}".encode()).hexdigest()


def safe_next(path: str) -> str:
    """Where to go after the login: a path of this server only (never another site)."""
    return path if path.startswith("/") and not path.startswith("//") and "\\" not in path else "/"


def auth_headers(token: str) -> dict[str, str]:
    """What a client of this API sends to present ``token`` (nothing when there is none)."""
    return {"Authorization": f"{BEARER}{token}"} if token else {}


def make_handler(queue: JobQueue, status: Callable[[], dict[str, Any]],
                 pages: Any = None, token: str = "") -> type[BaseHTTPRequestHandler]:
    """``pages``: an ``orchestrators.dashboard.Dashboard`` answering ``/`` and ``/ui/...`` (None: JSON only);
    ``token``: when set, what every request must present."""
    class Handler(BaseHTTPRequestHandler):
        server_version = "maxkernel-daemon"

        def _admitted(self) -> bool:
            return (not token or matches(bearer(self.headers.get("Authorization")), token)
                    or matches(cookie_token(self.headers.get("Cookie")), cookie_value(token)))

        def _refused(self) -> bool:
            """Answer 401 to a request without the token (a browser's page request: with the token form);
            True when it was refused."""
            if self._admitted():
                return False
            log.warning("http.refused", path=self.path.split("?")[0], client=self.client_address[0])
            if pages is not None and "text/html" in (self.headers.get("Accept") or ""):
                from orchestrators.dashboard import login_page

                self._send(401, login_page(safe_next(self.path)), "text/html; charset=utf-8",
                           {"WWW-Authenticate": "Bearer"})
                return True
            data = json.dumps({"error": "a valid token is required (Authorization: Bearer <token>)"}).encode()
            self._send(401, data, "application/json", {"WWW-Authenticate": "Bearer"})
            return True

        def _send(self, code: int, data: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
            self.send_response(code)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _login(self, method: str) -> bool:
            """``/ui/login``: the token form, and on the right token a cookie that carries its digest; True
            when it was that path."""
            if pages is None or self.path.split("?")[0] != LOGIN:
                return False
            from urllib.parse import parse_qs

            from orchestrators.dashboard import login_page

            if method == "GET":
                self._send(200, login_page("/"), "text/html; charset=utf-8")
                return True
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            form = {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items() if v}
            target = safe_next(form.get("next", "/"))
            if not token or not matches(form.get("token", ""), token):
                log.warning("http.login_refused", client=self.client_address[0])
                self._send(401, login_page(target, "That is not the daemon's token."), "text/html; charset=utf-8")
                return True
            cookie = f"{COOKIE}={cookie_value(token)}; Path=/; HttpOnly; SameSite=Strict"
            self._send(303, b"", "text/plain", {"Location": target, "Set-Cookie": cookie})
            return True

        def log_message(self, fmt: str, *args: Any) -> None:
            log.debug("http.request", line=fmt % args)

        def _reply(self, code: int, body: Any) -> None:
            data = json.dumps(body, default=str).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

        def _page(self, method: str) -> bool:
            """Serve a dashboard page when the path is one; True when it was."""
            if pages is None or not (self.path == "/" or self.path.startswith("/ui")):
                return False
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) if method == "POST" else b""
            page = pages.handle(method, self.path, body)
            if page is None:
                return False
            headers = dict(page.headers or {})
            if page.location:
                headers["Location"] = page.location
            self._send(page.status, page.body, page.content_type, headers)
            return True

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self._login("GET") or self._refused() or self._page("GET"):
                return
            try:
                if self.path == "/status":
                    return self._reply(200, status())
                if self.path.split("?")[0] == "/jobs":
                    wanted = self.path.partition("status=")[2] or None
                    return self._reply(200, [j.model_dump(mode="json") for j in queue.list(wanted)])
                match = _JOB.match(self.path)
                if match and match.group(2) in (None, "/result"):
                    job = queue.get(match.group(1))
                    if match.group(2) is None:
                        return self._reply(200, job.model_dump(mode="json"))
                    if job.status != "done":
                        return self._reply(409, {"error": f"job {job.id} is {job.status}", "status": job.status})
                    return self._reply(200, job.result)
                self._reply(404, {"error": f"no route {self.path}"})
            except UnknownJob as exc:
                self._reply(404, {"error": str(exc)})

        def do_POST(self) -> None:  # noqa: N802
            if self._login("POST") or self._refused() or self._page("POST"):
                return
            try:
                if self.path == "/jobs":
                    spec = check_spec(JobSpec.model_validate(self._body()))
                    return self._reply(201, queue.submit(spec).model_dump(mode="json"))
                match = _JOB.match(self.path)
                if match and match.group(2) == "/cancel":
                    return self._reply(200, queue.cancel(match.group(1)).model_dump(mode="json"))
                self._reply(404, {"error": f"no route {self.path}"})
            except (ValidationError, json.JSONDecodeError) as exc:
                self._reply(400, {"error": " ".join(str(exc).split())})
            except BadJob as exc:
                self._reply(400, {"error": str(exc)})
            except JobNotActive as exc:
                self._reply(409, {"error": str(exc)})
            except UnknownJob as exc:
                self._reply(404, {"error": str(exc)})

    return Handler


class ApiServer:
    """The HTTP server on ``host`` (127.0.0.1 unless told otherwise; port 0: the system picks one), served
    from a daemon thread. Beyond loopback it needs ``token`` and requires it of every request."""

    def __init__(self, queue: JobQueue, status: Callable[[], dict[str, Any]], port: int = 0, pages: Any = None,
                 *, host: str = "127.0.0.1", token: str = "") -> None:
        if not is_loopback(f"{host}:{port}") and not token:
            raise BindRefused(f"the HTTP API on {host}:{port} is reachable beyond this machine: set a token "
                              "(MAXKERNEL_TOKEN or `token:` in the config) or bind 127.0.0.1")
        self.httpd = ThreadingHTTPServer((host, port), make_handler(queue, status, pages, token))
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="maxkernel-http", daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
