"""Loopback HTTP servers that speak the Gemini REST protocol and OpenAI's /v1/chat/completions.

Each answers from a script (a FIFO of replies: a status code and a JSON body, or raw SSE chunks) and
keeps every request it received, so a test can check what the real client SDK sent.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    sse: list[Any] | None = None  # streamed chunks (Gemini streamGenerateContent?alt=sse)
    raw: bytes | None = None
    delay_s: float = 0.0  # wait before answering (a model that times out)


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class ScriptedServer:
    replies: list[Reply] = field(default_factory=list)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> "ScriptedServer":
        script = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                raw = self.rfile.read(length) if length else b""
                with script.lock:
                    script.received.append(Received(self.path, {k.lower(): v for k, v in self.headers.items()},
                                                    json.loads(raw) if raw else None))
                    reply = script.replies.pop(0) if script.replies else Reply(500, {"error": {"message": "script empty"}})
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.sse is not None:
                    payload = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in reply.sse)
                    ctype = "text/event-stream"
                elif reply.raw is not None:
                    payload, ctype = reply.raw, "application/json"
                else:
                    payload, ctype = json.dumps(reply.body).encode(), "application/json"
                try:
                    self.send_response(reply.status)
                    self.send_header("content-type", ctype)
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (the timeout test): nothing to answer

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# -- Gemini bodies ------------------------------------------------------------------------------------

def gemini_text(text: str, prompt: int = 11, completion: int = 7, finish: str = "STOP") -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": finish}],
            "usageMetadata": {"promptTokenCount": prompt, "candidatesTokenCount": completion,
                              "totalTokenCount": prompt + completion}}


def gemini_call(name: str, args: dict, call_id: str = "fc_1") -> dict:
    return {"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"id": call_id, "name": name,
                                                                                    "args": args}}]},
                            "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 20, "candidatesTokenCount": 5, "totalTokenCount": 25}}


def gemini_error(code: int, status: str) -> dict:
    return {"error": {"code": code, "message": f"scripted {status}", "status": status}}


# -- OpenAI bodies ------------------------------------------------------------------------------------

def openai_text(text: str, prompt: int = 50, completion: int = 20) -> dict:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "local-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


def openai_call(name: str, args: dict, call_id: str = "call_1") -> dict:
    return {"id": "chatcmpl-2", "object": "chat.completion", "created": 0, "model": "local-model",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None,
                "tool_calls": [{"id": call_id, "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)}}]}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 8, "total_tokens": 38}}


def openai_error(code: int, message: str) -> dict:
    return {"error": {"message": message, "type": "scripted", "code": code}}
