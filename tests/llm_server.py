"""A scripted LLM server for tests: real HTTP on 127.0.0.1, answers taken from a script.

It speaks the OpenAI chat-completions wire format (``POST /v1/chat/completions``, plus
``GET /v1/models``) and Anthropic's (``POST /v1/messages``), so the real SDKs can be driven
through our clients. Each request takes the next scripted item; when the script is empty the
``responder`` (request JSON -> item) answers, and without one the server answers HTTP 410 with
a message saying the script ran out. An item is:

- a ``str`` or a :class:`Reply`: an answer (usage counted in words unless given);
- an :class:`HTTPError`: a status with a message (or a raw body) and headers;
- a :class:`Delay`: sleep, then answer with its ``then`` item (late answers test timeouts).

Every request is recorded before it is answered::

    with ScriptedOpenAIServer() as server:
        server.script([HTTPError(429, headers={"Retry-After": "1"}), "def kernel(): ..."])
        client = OpenAIChatClient(server.config())
        answer = client.complete([Message(role="user", content="write a kernel")])
        assert server.requests[-1]["messages"][0]["content"] == "write a kernel"
"""

from __future__ import annotations

import json
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from stitchcuda.llm.base import LLMConfig


@dataclass
class Reply:
    text: str
    finish_reason: str = "stop"  # OpenAI vocabulary; "length" becomes Anthropic's "max_tokens"
    prompt_tokens: int | None = None  # None: words in the request's messages
    completion_tokens: int | None = None  # None: words in the text
    usage: bool = True  # False: leave usage out of the response, as some servers do
    model: str | None = None  # None: the model the request named


@dataclass
class HTTPError:
    status: int
    message: str = "scripted error"
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None  # sent as is (JSON unless str) when given; else the wire format's error envelope


@dataclass
class Delay:
    seconds: float
    then: Item = "late answer"


Item = str | Reply | HTTPError | Delay
Responder = Callable[[dict], Item]


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    json: dict
    status: int = 0  # what the server answered (0 while still answering)


class ScriptedOpenAIServer:
    def __init__(self, script: Iterable[Item] = (), *, responder: Responder | None = None,
                 model: str = "scripted-model"):
        self.model = model
        self.responder = responder
        self.log: list[Recorded] = []
        self.errors: list[str] = []  # tracebacks of responder failures
        self._queue: deque[Item] = deque(script)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> ScriptedOpenAIServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="scripted-llm-server", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scripting and inspection -----------------------------------------------------------
    def script(self, items: Iterable[Item]) -> ScriptedOpenAIServer:
        """Append items to the script."""
        with self._lock:
            self._queue.extend(items)
        return self

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    @property
    def port(self) -> int:
        assert self._httpd is not None, "start the server first"
        return self._httpd.server_address[1]

    @property
    def url(self) -> str:
        """The server root (what the Anthropic SDK wants)."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (ends in /v1)."""
        return self.url + "/v1"

    @property
    def requests(self) -> list[dict]:
        """The JSON body of every request so far, in order."""
        return [r.json for r in self.log]

    def messages(self, i: int = -1) -> list[dict]:
        """The messages of request ``i`` (the last by default)."""
        return self.log[i].json.get("messages", [])

    def config(self, **overrides: Any) -> LLMConfig:
        """An LLMConfig aimed at this server with short timeouts and waits; any field may be overridden."""
        provider = overrides.get("provider", "openai")
        fields: dict[str, Any] = dict(provider=provider, model=self.model,
                                      base_url=self.url if provider == "anthropic" else self.base_url,
                                      timeout_s=5.0, max_retries=2, retry_backoff_s=0.01, retry_max_wait_s=0.05)
        fields.update(overrides)
        return LLMConfig(**fields)

    # -- answering ----------------------------------------------------------------------------
    def _next_item(self, request: dict) -> Item:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        if self.responder is not None:
            try:
                return self.responder(request)
            except Exception:
                self.errors.append(traceback.format_exc())
                return HTTPError(418, f"the responder failed:\n{self.errors[-1]}")
        return HTTPError(410, f"ScriptedOpenAIServer: the script ran out after {len(self.log) - 1} "
                              "answered requests; add items with server.script([...]) or pass responder=")

    def _sleep(self, seconds: float) -> bool:
        """Sleep unless the server is closing; False when it is."""
        return not self._stop.wait(seconds)


def _words(text: str) -> int:
    return len(text.split())


def _prompt_words(request: dict) -> int:
    system = request.get("system")
    n = _words(system) if isinstance(system, str) else 0
    for m in request.get("messages", []):
        content = m.get("content", "")
        n += _words(content) if isinstance(content, str) else sum(
            _words(part.get("text", "")) for part in content if isinstance(part, dict))
    return n


class _Handler(BaseHTTPRequestHandler):
    server_owner: ScriptedOpenAIServer

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/v1/models":
            owner = self.server_owner
            self._send(200, {"object": "list", "data": [
                {"id": owner.model, "object": "model", "created": 0, "owned_by": "scripted",
                 "type": "model", "display_name": owner.model, "created_at": "2024-01-01T00:00:00Z"}]})
        else:
            self._send(404, {"error": {"message": f"no route GET {self.path}", "type": "not_found"}})

    def do_POST(self) -> None:
        owner = self.server_owner
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            request = json.loads(raw or b"{}")
        except json.JSONDecodeError:
            request = {"_raw": raw.decode(errors="replace")}
        path = self.path.split("?")[0].rstrip("/")
        record = Recorded(path=path, headers={k.lower(): v for k, v in self.headers.items()}, json=request)
        with owner._lock:
            owner.log.append(record)
        if path not in ("/v1/chat/completions", "/v1/messages"):
            record.status = 404
            self._send(404, {"error": {"message": f"no route POST {self.path}", "type": "not_found"}})
            return
        anthropic = path == "/v1/messages"
        item = owner._next_item(request)
        while isinstance(item, Delay):
            if not owner._sleep(item.seconds):
                return
            item = item.then
        if isinstance(item, str):
            item = Reply(item)
        if isinstance(item, HTTPError):
            record.status = item.status
            body = item.body if item.body is not None else _error_body(item, anthropic)
            self._send(item.status, body, item.headers)
            return
        record.status = 200
        self._send(200, _answer_body(item, request, owner, anthropic, len(owner.log)))

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if isinstance(body, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a timeout test)


def _error_body(err: HTTPError, anthropic: bool) -> dict:
    if anthropic:
        kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 429: "rate_limit_error", 529: "overloaded_error"}.get(err.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": err.message}}
    return {"error": {"message": err.message, "type": "scripted_error", "param": None, "code": err.status}}


def _answer_body(reply: Reply, request: dict, owner: ScriptedOpenAIServer, anthropic: bool, n: int) -> dict:
    model = reply.model or request.get("model") or owner.model
    prompt = _prompt_words(request) if reply.prompt_tokens is None else reply.prompt_tokens
    completion = _words(reply.text) if reply.completion_tokens is None else reply.completion_tokens
    if anthropic:
        body: dict[str, Any] = {
            "id": f"msg_scripted_{n}", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": reply.text}],
            "stop_reason": {"stop": "end_turn", "length": "max_tokens"}.get(reply.finish_reason,
                                                                             reply.finish_reason),
            "stop_sequence": None,
        }
        if reply.usage:
            body["usage"] = {"input_tokens": prompt, "output_tokens": completion}
        return body
    body = {
        "id": f"chatcmpl-scripted-{n}", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                     "finish_reason": reply.finish_reason, "logprobs": None}],
    }
    if reply.usage:
        body["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                         "total_tokens": prompt + completion}
    return body
