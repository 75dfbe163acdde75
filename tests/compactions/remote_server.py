"""A real HTTP server that plays a remote summarization endpoint (seed 001's
``compaction.remoteEndpoint``) in tests, scripted per test.

One uvicorn server runs per test session in a background thread on a free
loopback port; each test gets its own :class:`Remote`, a path of its own on it
(``remote.url``), with its own script and record of requests. ``POST`` there
takes the next scripted action (:class:`Summary`, :class:`Status`, :class:`Raw`,
:class:`Hang`); when the script is spent it answers ``{"summary": DEFAULT}``.

Take the ``remote`` fixture in a test module after importing it::

    from tests.compactions.remote_server import remote_fixture, remote_server_fixture  # noqa: F401
"""

from __future__ import annotations

import asyncio
import itertools
import logging
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

from tests.upstream_server import _QUIET_DROP, _listening_socket

DEFAULT = "## Goal\nThe remote endpoint's summary.\n\n## Progress\n- (none)"


@dataclass(frozen=True, slots=True)
class Summary:
    """200 with ``{"summary": text}`` and the ``extra`` keys beside it."""

    text: str
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Status:
    """``code`` with ``body`` (JSON when a mapping) and ``headers``."""

    code: int
    body: Mapping[str, Any] | str = ""
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Raw:
    """200 labelled JSON with ``body`` as it is (not JSON, or JSON without a summary)."""

    body: bytes


@dataclass(frozen=True, slots=True)
class Hang:
    """Wait ``seconds``, then answer ``then`` (the default summary)."""

    seconds: float
    then: Action | None = None


Action: TypeAlias = Summary | Status | Raw | Hang


@dataclass(frozen=True, slots=True)
class Received:
    """One request as it arrived: path and query, headers (lower-case), parsed body."""

    path: str
    query: str
    headers: dict[str, str]
    json: Any


class Remote:
    """One test's endpoint: its URL, script and record."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._script: deque[Action] = deque()
        self._requests: list[Received] = []

    def script(self, actions: Iterable[Action]) -> None:
        with self._lock:
            self._script.extend(actions)

    @property
    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._requests)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._script)

    def _take(self, received: Received) -> Action | None:
        with self._lock:
            self._requests.append(received)
            return self._script.popleft() if self._script else None


class RemoteServer:
    def __init__(self, root: str) -> None:
        self.root = root
        self._counter = itertools.count(1)
        self._remotes: dict[str, Remote] = {}
        self._lock = threading.Lock()

    def new(self) -> Remote:
        key = f"r{next(self._counter)}"
        remote = Remote(f"{self.root}/{key}/summarize")
        with self._lock:
            self._remotes[key] = remote
        return remote

    def drop(self, remote: Remote) -> None:
        with self._lock:
            for key, known in list(self._remotes.items()):
                if known is remote:
                    del self._remotes[key]

    def get(self, key: str) -> Remote | None:
        with self._lock:
            return self._remotes.get(key)


def _json(body: Any, code: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(
        orjson.dumps(body), status_code=code, media_type="application/json", headers=headers
    )


async def _perform(action: Action | None) -> Response:
    match action:
        case None:
            return _json({"summary": DEFAULT})
        case Summary(text=text, extra=extra):
            return _json({**extra, "summary": text})
        case Status(code=code, body=body, headers=headers):
            if isinstance(body, str):
                return Response(body, status_code=code, headers=dict(headers))
            return _json(dict(body), code, headers)
        case Raw(body=body):
            return Response(body, status_code=200, media_type="application/json")
        case Hang(seconds=seconds, then=then):
            await asyncio.sleep(seconds)
            return await _perform(then)
    raise AssertionError(f"unknown action {action!r}")


def make_app(server: RemoteServer) -> Starlette:
    async def handle(request: Request) -> Response:
        remote = server.get(request.path_params["key"])
        if remote is None:
            return _json({"error": "no such test endpoint"}, 404)
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        received = Received(
            path=request.url.path,
            query=request.url.query,
            headers={k.lower(): v for k, v in request.headers.items()},
            json=body,
        )
        return await _perform(remote._take(received))

    return Starlette(routes=[Route("/{key}/{rest:path}", handle, methods=["POST"])])


@pytest.fixture(scope="session", name="remote_server")
def remote_server_fixture() -> Iterator[RemoteServer]:
    sock = _listening_socket()
    port = sock.getsockname()[1]
    server = RemoteServer(f"http://127.0.0.1:{port}")
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
            raise RuntimeError("the remote endpoint test server did not start")
        time.sleep(0.005)
    try:
        yield server
    finally:
        runner.should_exit = runner.force_exit = True
        thread.join(timeout=10)
        sock.close()
        logging.getLogger("uvicorn.error").removeFilter(_QUIET_DROP)


@pytest.fixture(name="remote")
def remote_fixture(remote_server: RemoteServer) -> Iterator[Remote]:
    """This test's remote summarization endpoint: ``remote.url`` is its URL."""
    remote = remote_server.new()
    yield remote
    remote_server.drop(remote)
