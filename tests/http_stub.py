"""A recording HTTP server on 127.0.0.1 for tests: scripted replies per path, every request kept.

Each path gets a *responder*, a callable from the recorded request to a ``Reply`` (status, JSON or raw
body, headers, delay). Helpers build the usual ones: ``sequence`` (a scripted run of replies, then a
fallback), ``openai_chat`` / ``anthropic_messages`` / ``openai_responses`` / ``generic`` (well-formed
provider answers, optionally capped at ``max_choices``), ``with_delay`` (fixed latency).

The server is threaded, so concurrent clients really overlap; delays wait on an event that ``stop()``
sets, so a "hanging" reply never holds a test up after the server is closed. It binds 127.0.0.1 on a
free port and never talks to anything else. It does not implement HTTP beyond what the tests need
(no chunked request bodies, no TLS).
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit


@dataclass
class RecordedRequest:
    """One request as the server saw it. ``headers`` keeps lower-cased names."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8"))


@dataclass
class Reply:
    """What to send back. ``json`` wins over ``body``; ``delay`` seconds pass before anything is sent."""

    status: int = 200
    json: Any = None
    body: bytes | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


Responder = Callable[[RecordedRequest], Reply]


def sequence(replies: Iterable[Reply], then: Responder | Reply | None = None) -> Responder:
    """Reply with ``replies`` in order (one per request, thread-safe), then with ``then`` for ever.

    Without ``then`` the last scripted reply repeats.
    """
    queue = list(replies)
    lock = threading.Lock()
    last: list[Reply] = []

    def responder(request: RecordedRequest) -> Reply:
        with lock:
            if queue:
                reply = queue.pop(0)
                last[:] = [reply]
                return reply
        if then is None:
            return last[0]
        return then(request) if callable(then) else then

    return responder


def with_delay(responder: Responder, delay: float) -> Responder:
    """Add a fixed latency to every reply of ``responder``."""

    def delayed(request: RecordedRequest) -> Reply:
        reply = responder(request)
        return Reply(reply.status, reply.json, reply.body, dict(reply.headers), reply.delay + delay)

    return delayed


def _prompt_of(payload: dict) -> str:
    if "prompt" in payload:
        return str(payload["prompt"])
    if "input" in payload:
        return str(payload["input"])
    messages = payload.get("messages") or [{}]
    return str(messages[-1].get("content", ""))


def generic(field_name: str = "completions", max_choices: int | None = None) -> Responder:
    """Generic endpoint: ``{field_name: ["<prompt>#0", ...]}`` with num_return_sequences entries (capped)."""

    def responder(request: RecordedRequest) -> Reply:
        payload = request.json
        count = int(payload.get("num_return_sequences", 1))
        if max_choices is not None:
            count = min(count, max_choices)
        texts = [f"{_prompt_of(payload)}#{i}" for i in range(count)]
        body: dict[str, Any] = {}
        node = body
        *parents, leaf = field_name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = texts
        return Reply(json=body)

    return responder


def openai_chat(max_choices: int | None = None) -> Responder:
    """Chat completions: ``n`` choices (capped at ``max_choices``), content ``"<prompt>|n<n>|<i>"``."""

    def responder(request: RecordedRequest) -> Reply:
        payload = request.json
        n = int(payload.get("n", 1))
        count = n if max_choices is None else min(n, max_choices)
        prompt = _prompt_of(payload)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": f"{prompt}|n{n}|{i}"}, "finish_reason": "stop"}
            for i in range(count)
        ]
        return Reply(json={"id": "chatcmpl-stub", "object": "chat.completion", "choices": choices})

    return responder


def anthropic_messages() -> Responder:
    """Messages API: one text block (plus a second one the client must ignore)."""

    def responder(request: RecordedRequest) -> Reply:
        prompt = _prompt_of(request.json)
        content = [{"type": "text", "text": f"{prompt}|a"}, {"type": "text", "text": "ignored second block"}]
        return Reply(json={"id": "msg_stub", "type": "message", "role": "assistant", "content": content})

    return responder


def openai_responses() -> Responder:
    """Responses API: a reasoning item first, then a message with one output_text part."""

    def responder(request: RecordedRequest) -> Reply:
        prompt = _prompt_of(request.json)
        output = [
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"{prompt}|r"}]},
        ]
        return Reply(json={"id": "resp_stub", "object": "response", "output": output})

    return responder


class HttpStub:
    """Threaded recording server. Use as a context manager; ``url(path)`` gives the address of a path."""

    def __init__(self) -> None:
        self.requests: list[RecordedRequest] = []
        self._routes: dict[str, Responder] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._in_flight = 0
        self.max_in_flight = 0
        self._server = _Server(("127.0.0.1", 0), _make_handler(self))
        self._server.stopping = self._stopping
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    # -- lifecycle -------------------------------------------------------------------------------------
    def start(self) -> HttpStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> HttpStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration and inspection ------------------------------------------------------------------
    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def route(self, path: str, responder: Responder | Reply) -> None:
        """Serve ``path`` (query string ignored) with ``responder``; a plain ``Reply`` is sent every time."""
        if isinstance(responder, Reply):
            fixed = responder
            responder = lambda _request: fixed  # noqa: E731
        with self._lock:
            self._routes[path] = responder

    def requests_for(self, path: str) -> list[RecordedRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    # -- used by the handler ---------------------------------------------------------------------------
    def _handle(self, request: RecordedRequest) -> Reply:
        with self._lock:
            self.requests.append(request)
            responder = self._routes.get(request.path)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if responder is None:
                return Reply(status=404, body=f"no route for {request.path}")
            reply = responder(request)
            if reply.delay > 0:
                self._stopping.wait(reply.delay)
            return reply
        finally:
            with self._lock:
                self._in_flight -= 1


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # 64 clients connecting at once must not overflow the listen backlog (the default is 5).
    request_queue_size = 256
    stopping: threading.Event | None = None

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up, or a request still in flight when its test stopped the stub, is not an error of the
        stub; socketserver would print its traceback to whatever stderr is current, another test's captured one."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError) or (self.stopping is not None and self.stopping.is_set()):
            return
        super().handle_error(request, client_address)


def _make_handler(stub: HttpStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # Without TCP_NODELAY, Nagle plus delayed ACKs add about 40 ms to every small reply.
        disable_nagle_algorithm = True

        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            self._serve()

        def do_GET(self) -> None:  # noqa: N802
            self._serve()

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            recorded = RecordedRequest(
                method=self.command,
                path=parts.path,
                query=parts.query,
                headers={k.lower(): v for k, v in self.headers.items()},
                body=body,
            )
            reply = stub._handle(recorded)
            if stub._stopping.is_set():
                self.close_connection = True
                return
            if reply.json is not None:
                payload = json.dumps(reply.json).encode("utf-8")
                content_type = "application/json"
            else:
                raw = reply.body if reply.body is not None else b""
                payload = raw.encode("utf-8") if isinstance(raw, str) else raw
                content_type = "text/plain; charset=utf-8"
            try:
                self.send_response(reply.status)
                headers = {"Content-Type": content_type, **reply.headers}
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
            pass

    return Handler
