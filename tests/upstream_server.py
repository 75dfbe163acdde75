"""A real HTTP server that plays the upstream LLM in tests, scripted per test.

One uvicorn server (a small Starlette app) runs per test session in a background
thread on a free loopback port. Each test gets its own :class:`Upstream`: a URL prefix
of its own on that server, with its own script and its own record of requests, so
tests share no state and start in no time.

Routes, under the test's ``upstream.url`` (``http://127.0.0.1:PORT/<id>/v1``):

* ``POST /chat/completions`` answers in the OpenAI chat-completions shape;
* ``POST /messages`` answers in the Anthropic Messages shape.

Requests are first checked as the real APIs do (JSON with ``model`` and
``messages``; Anthropic's ``anthropic-version`` header and ``max_tokens``; the key
when ``upstream.api_key`` is set), and refused with a 400 or 401 in the API's error
shape without consuming the script. Otherwise each request takes the next scripted
action (:class:`Reply`, :class:`Status`, :class:`Empty`, :class:`Garbage`,
:class:`Hang`, :class:`Drip`, :class:`Close`); when the script is spent, it gets a deterministic
summary built from the request (:func:`default_summary`).

Register the fixtures in ``tests/conftest.py``::

    from tests.upstream_server import upstream_fixture, upstream_server_fixture  # noqa: F401

and take ``upstream: Upstream`` in a test.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

# Scripted actions


@dataclass(frozen=True, slots=True)
class Reply:
    """200 with ``text`` as the answer. ``usage`` replaces the reported usage, in the
    API's own shape (``prompt_tokens``... or ``input_tokens``...)."""

    text: str
    usage: Mapping[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """Answer ``code`` with ``body`` (a JSON object, or text sent as is) and ``headers``.
    Without a body, the API's own error shape for that status is sent."""

    code: int
    body: Mapping[str, Any] | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Empty:
    """200 in the API's shape with no text (``content: ""`` or ``content: []``)."""


@dataclass(frozen=True, slots=True)
class Garbage:
    """200 labelled JSON whose body is not JSON (an HTML page from a proxy, say)."""

    body: str = "<html><body><h1>502 Bad Gateway</h1></body></html>"


@dataclass(frozen=True, slots=True)
class Hang:
    """Wait ``seconds`` (or until the client gives up), then perform ``then`` (by
    default the default summary). Other requests are served meanwhile."""

    seconds: float
    then: Action | None = None


@dataclass(frozen=True, slots=True)
class Drip:
    """Send the answer ``then`` (by default the default summary) ``chunk`` bytes at a
    time, ``interval`` seconds apart: never silent long enough to trip a read timeout,
    yet slow in total."""

    interval: float
    chunk: int = 16
    then: Action | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Start a 200 that announces a longer body, send part of it, then drop the
    connection: the client sees the peer close mid-response."""


Action: TypeAlias = Reply | Status | Empty | Garbage | Hang | Drip | Close


# Real error bodies, for Status(...)

OPENAI_CONTEXT_OVERFLOW: dict[str, Any] = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your "
        "messages resulted in 9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC_CONTEXT_OVERFLOW: dict[str, Any] = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 208310 tokens > 200000 maximum",
    },
}


def context_overflow(api: str) -> Status:
    """The 400 each API sends when the prompt does not fit the model's window."""
    body = OPENAI_CONTEXT_OVERFLOW if api == "openai" else ANTHROPIC_CONTEXT_OVERFLOW
    return Status(400, body=body)


_OPENAI_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, Used 3, "
        "Requested 1. Please try again in 20s.",
    ),
    500: (
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    404: ("not_found_error", "model: not found"),
    413: ("request_too_large", "Request exceeds the maximum size"),
    429: (
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per minute.",
    ),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


def error_body(api: str, code: int, message: str | None = None) -> dict[str, Any]:
    """The error object ``api`` sends with ``code``."""
    if api == "openai":
        kind, err_code, default = _OPENAI_ERRORS.get(code, ("server_error", None, "Error."))
        return {
            "error": {"message": message or default, "type": kind, "param": None, "code": err_code}
        }
    kind, default = _ANTHROPIC_ERRORS.get(code, ("api_error", "Error."))
    return {
        "type": "error",
        "error": {"type": kind, "message": message or default},
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
    }


# What the server saw


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as it arrived. ``path`` is below the test's prefix (``/v1/messages``),
    header names are lower-case, ``json`` is the parsed body (``None`` if not JSON) and
    ``at`` is ``time.monotonic()`` on arrival."""

    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    at: float


class Upstream:
    """One test's view of the upstream server: its URL, script and record."""

    def __init__(self, url: str) -> None:
        self.url = url
        #: When set, requests must carry it (Bearer or ``x-api-key``) or get a 401.
        self.api_key: str | None = None
        self._lock = threading.Condition()
        self._script: deque[Action] = deque()
        self._requests: list[RecordedRequest] = []

    def script(self, actions: Iterable[Action]) -> None:
        """Queue ``actions``, one per request in arrival order, after any queued."""
        with self._lock:
            self._script.extend(actions)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def pending(self) -> int:
        """Scripted actions not yet consumed."""
        with self._lock:
            return len(self._script)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until ``count`` requests have arrived (from a test, through
        ``asyncio.to_thread``); raises ``TimeoutError`` after ``timeout`` seconds."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} requests arrived")
            return list(self._requests)

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    def _next(self) -> Action | None:
        with self._lock:
            return self._script.popleft() if self._script else None


class UpstreamServer:
    """The shared server: hands each test an :class:`Upstream` with its own prefix."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._upstreams: dict[str, Upstream] = {}
        self._ids = itertools.count(1)

    def new(self) -> Upstream:
        key = f"t{next(self._ids)}"
        upstream = Upstream(f"{self.root}/{key}/v1")
        with self._lock:
            self._upstreams[key] = upstream
        return upstream

    def drop(self, upstream: Upstream) -> None:
        with self._lock:
            for key, known in list(self._upstreams.items()):
                if known is upstream:
                    del self._upstreams[key]

    def get(self, key: str) -> Upstream | None:
        with self._lock:
            return self._upstreams.get(key)


# The app


def default_summary(prompt: str) -> str:
    """The answer when the script is spent: depends only on the prompt, and
    quotes none of it (a reply that echoes the prompt is refused as unusable)."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return (
        f"## Goal\nContinue the task (prompt {digest}).\n\n"
        f"## Progress\nSummary of a prompt of {len(prompt)} characters."
    )


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages", []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
            )
    return "\n".join(parts)


def _json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def _reply(api: str, body: dict[str, Any], reply: Reply) -> Response:
    model = reply.model or str(body.get("model"))
    prompt_chars = len(_prompt_text(body)) + len(str(body.get("system", "")))
    input_tokens, output_tokens = max(1, prompt_chars // 4), max(1, len(reply.text) // 4)
    if api == "openai":
        usage = reply.usage or {
            "prompt_tokens": input_tokens,
            "completion_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        return _json_response(
            {
                "id": "chatcmpl-upstream-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": reply.text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": reply.finish_reason or "stop",
                    }
                ],
                "usage": dict(usage),
            }
        )
    usage = reply.usage or {"input_tokens": input_tokens, "output_tokens": output_tokens}
    content = [{"type": "text", "text": reply.text}] if reply.text else []
    return _json_response(
        {
            "id": "msg_upstream_test",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": reply.finish_reason or "end_turn",
            "stop_sequence": None,
            "usage": dict(usage),
        }
    )


class _DropConnection(Exception):
    """Raised after a partial response so that uvicorn closes the socket."""


class _CutResponse(Response):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        partial = b'{"id": "cut", "choices": [{"index": 0, "message": {"content": "Summ'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"4096")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": partial, "more_body": True})
        raise _DropConnection


class _DripResponse(Response):
    def __init__(self, inner: Response, interval: float, chunk: int) -> None:
        self.inner, self.interval, self.chunk = inner, interval, max(1, chunk)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inner = self.inner
        start = {"type": "http.response.start", "status": inner.status_code}
        await send({**start, "headers": inner.raw_headers})
        body = bytes(inner.body)
        for offset in range(0, len(body), self.chunk):
            await asyncio.sleep(self.interval)
            piece = body[offset : offset + self.chunk]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _QuietDrop(logging.Filter):
    """uvicorn logs the exception it closed the connection for; this one is on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _DropConnection))


async def _wait(request: Request, seconds: float) -> None:
    """Sleep ``seconds``, or less if the client disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waiter = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()


async def _perform(
    api: str, request: Request, body: dict[str, Any], action: Action | None
) -> Response:
    match action:
        case None:
            return _reply(api, body, Reply(default_summary(_prompt_text(body))))
        case Reply():
            return _reply(api, body, action)
        case Status(code=code, body=payload, headers=headers):
            if payload is None:
                payload = error_body(api, code)
            if isinstance(payload, str):
                return Response(payload, status_code=code, headers=dict(headers))
            return _json_response(dict(payload), code, headers)
        case Empty():
            return _reply(api, body, Reply(""))
        case Garbage(body=text):
            return Response(text, status_code=200, media_type="application/json")
        case Hang(seconds=seconds, then=then):
            await _wait(request, seconds)
            return await _perform(api, request, body, then)
        case Drip(interval=interval, chunk=chunk, then=then):
            inner = await _perform(api, request, body, then)
            return _DripResponse(inner, interval, chunk)
        case Close():
            return _CutResponse()
    raise AssertionError(f"unknown action {action!r}")


def _invalid(api: str, request: Request, body: Any, upstream: Upstream) -> Response | None:
    """The 400 or 401 the real API would send for this request, if any."""
    if upstream.api_key is not None:
        if api == "openai":
            sent = request.headers.get("authorization")
            expected = f"Bearer {upstream.api_key}"
        else:
            sent = request.headers.get("x-api-key")
            expected = upstream.api_key
        if sent != expected:
            return _json_response(error_body(api, 401), 401)
    if api == "anthropic" and not request.headers.get("anthropic-version"):
        return _json_response(error_body(api, 400, "anthropic-version: header is required"), 400)
    if not isinstance(body, dict):
        return _json_response(error_body(api, 400, "The body is not a JSON object."), 400)
    if not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
        return _json_response(error_body(api, 400, "model and messages are required."), 400)
    if api == "anthropic" and not isinstance(body.get("max_tokens"), int):
        return _json_response(error_body(api, 400, "max_tokens: Field required"), 400)
    return None


def make_app(server: UpstreamServer) -> Starlette:
    """The Starlette app behind :class:`UpstreamServer`."""

    async def handle(request: Request) -> Response:
        upstream = server.get(request.path_params["key"])
        if upstream is None:
            return _json_response({"error": {"message": "no such test upstream"}}, 404)
        api = "openai" if request.url.path.endswith("/chat/completions") else "anthropic"
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        prefix = f"/{request.path_params['key']}"
        upstream._record(
            RecordedRequest(
                path=request.url.path.removeprefix(prefix),
                headers={k.lower(): v for k, v in request.headers.items()},
                body=raw,
                json=body,
                at=time.monotonic(),
            )
        )
        refusal = _invalid(api, request, body, upstream)
        if refusal is not None:
            return refusal
        return await _perform(api, request, body, upstream._next())

    return Starlette(
        routes=[
            Route("/{key}/v1/chat/completions", handle, methods=["POST"]),
            Route("/{key}/v1/messages", handle, methods=["POST"]),
        ]
    )


# Running it


_QUIET_DROP = _QuietDrop()


def _listening_socket() -> socket.socket:
    # Bound here and handed to uvicorn, so no other process can take the port between
    # choosing it and listening on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


@pytest.fixture(scope="session", name="upstream_server")
def upstream_server_fixture() -> Iterator[UpstreamServer]:
    """The shared upstream server, started once per test session."""
    sock = _listening_socket()
    port = sock.getsockname()[1]
    server = UpstreamServer(f"http://127.0.0.1:{port}")
    config = uvicorn.Config(
        make_app(server), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    logging.getLogger("uvicorn.error").addFilter(_QUIET_DROP)
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the upstream test server did not start")
        time.sleep(0.005)
    try:
        yield server
    finally:
        runner.should_exit = runner.force_exit = True
        thread.join(timeout=10)
        sock.close()
        logging.getLogger("uvicorn.error").removeFilter(_QUIET_DROP)


@pytest.fixture(name="upstream")
def upstream_fixture(upstream_server: UpstreamServer) -> Iterator[Upstream]:
    """This test's upstream LLM: ``upstream.url`` is the ``base_url`` to call."""
    upstream = upstream_server.new()
    yield upstream
    upstream_server.drop(upstream)
