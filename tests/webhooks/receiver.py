"""A real HTTP server that receives webhook deliveries and hook calls in tests.

One uvicorn server (a small Starlette app) runs per test session in a background
thread on a free loopback port. Each test gets its own :class:`Inbox`: a URL prefix
of its own on that server (``http://127.0.0.1:PORT/<key>/<name>``, one ``name`` per
endpoint the test registers), with its own scripts and record, so tests share no
state.

Every ``POST`` is recorded as it arrived (headers, the raw body, the parsed JSON),
then answered with the endpoint's next scripted action, or with its standing action
once the script is spent (by default ``200 {}``):

* :class:`Answer`: a status and a JSON body (or raw bytes: garbage);
* :class:`Hang`: no answer for ``seconds`` (or until the client gives up), then
  ``then``.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer ``status`` with ``json`` (any JSON value) or, when given, ``raw`` as is
    (labelled JSON: a body that is not JSON is garbage)."""

    status: int = 200
    json: Any = field(default_factory=dict)
    raw: bytes | None = None


@dataclass(frozen=True, slots=True)
class Hang:
    """Say nothing for ``seconds`` (less if the client disconnects), then ``then``."""

    seconds: float
    then: Answer = field(default_factory=Answer)


Action: TypeAlias = Answer | Hang


@dataclass(frozen=True, slots=True)
class Received:
    """One request as it arrived; header names are lower-case."""

    name: str
    headers: dict[str, str]
    body: bytes
    json: Any
    at: float


class Inbox:
    """One test's endpoints on the receiver: their URLs, scripts and record."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Condition()
        self._scripts: dict[str, deque[Action]] = defaultdict(deque)
        self._standing: dict[str, Action] = {}
        self._received: list[Received] = []

    def url(self, name: str) -> str:
        return f"{self.root}/{name}"

    def script(self, name: str, actions: Iterable[Action]) -> None:
        """Queue ``actions`` for ``name``'s next requests, in arrival order."""
        with self._lock:
            self._scripts[name].extend(actions)

    def always(self, name: str, action: Action) -> None:
        """What ``name`` answers once its script is spent."""
        with self._lock:
            self._standing[name] = action

    def received(self, name: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self._received if name is None or r.name == name]

    async def wait_for(self, count: int, name: str | None = None, within: float = 10.0) -> None:
        """Until ``count`` requests (to ``name``) have arrived; TimeoutError after
        ``within`` seconds."""
        deadline = time.monotonic() + within
        while len(self.received(name)) < count:
            if time.monotonic() > deadline:
                got = len(self.received(name))
                raise TimeoutError(f"{got} of {count} requests arrived at {name or 'the inbox'}")
            await asyncio.sleep(0.01)

    def _take(self, request: Received) -> Action:
        with self._lock:
            self._received.append(request)
            script = self._scripts[request.name]
            if script:
                return script.popleft()
            return self._standing.get(request.name, Answer())


class ReceiverServer:
    """The shared server: hands each test an :class:`Inbox` with its own prefix."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._inboxes: dict[str, Inbox] = {}
        self._ids = itertools.count(1)

    def new(self) -> Inbox:
        key = f"t{next(self._ids)}"
        inbox = Inbox(f"{self.root}/{key}")
        with self._lock:
            self._inboxes[key] = inbox
        return inbox

    def drop(self, inbox: Inbox) -> None:
        with self._lock:
            for key, known in list(self._inboxes.items()):
                if known is inbox:
                    del self._inboxes[key]

    def get(self, key: str) -> Inbox | None:
        with self._lock:
            return self._inboxes.get(key)


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


def make_app(server: ReceiverServer) -> Starlette:
    async def handle(request: Request) -> Response:
        inbox = server.get(request.path_params["key"])
        if inbox is None:
            return Response(b'{"error": "no such test inbox"}', 404, media_type="application/json")
        raw = await request.body()
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            parsed = None
        action = inbox._take(
            Received(
                name=request.path_params["name"],
                headers={k.lower(): v for k, v in request.headers.items()},
                body=raw,
                json=parsed,
                at=time.monotonic(),
            )
        )
        if isinstance(action, Hang):
            await _wait(request, action.seconds)
            action = action.then
        body = action.raw if action.raw is not None else orjson.dumps(action.json)
        return Response(body, action.status, media_type="application/json")

    return Starlette(routes=[Route("/{key}/{name}", handle, methods=["POST"])])


@pytest.fixture(scope="session")
def receiver_server() -> Iterator[ReceiverServer]:
    """The shared receiver, started once per test session."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server = ReceiverServer(f"http://127.0.0.1:{sock.getsockname()[1]}")
    config = uvicorn.Config(
        make_app(server), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
    )
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the webhook receiver did not start")
        time.sleep(0.005)
    try:
        yield server
    finally:
        runner.should_exit = runner.force_exit = True
        thread.join(timeout=10)
        sock.close()


@pytest.fixture
def inbox(receiver_server: ReceiverServer) -> Iterator[Inbox]:
    """This test's endpoints on the receiver."""
    made = receiver_server.new()
    yield made
    receiver_server.drop(made)
