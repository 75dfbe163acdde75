"""A tiny HTTP relay between a client and a real compactd, scripted to fail for real.

It listens on a loopback port and passes each request on to the server behind it,
unless its script says otherwise for that request (in arrival order):

* :class:`Forward` (also when the script is spent): pass the request on, and the
  answer back;
* :class:`Drop`: pass the request on, then close the client's connection without
  the answer (the server did the work; the client saw the connection die);
* :class:`Answer`: answer ``status`` with ``headers`` itself, after passing the
  request on when ``forwarded`` (a gateway that timed out on a slow answer) or
  without (a rate limiter in front).

Each request is recorded (method, path, headers, arrival time) for the test to read.
"""

from __future__ import annotations

import http.client
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeAlias
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


@dataclass(frozen=True)
class Forward:
    pass


@dataclass(frozen=True)
class Drop:
    pass


@dataclass(frozen=True)
class Answer:
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)
    forwarded: bool = False


Action: TypeAlias = Forward | Drop | Answer


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    at: float


class Relay:
    """The relay's script and record; ``url`` is where clients connect."""

    def __init__(self, target: str) -> None:
        parts = urlsplit(target)
        self.target = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.url = ""
        self._lock = threading.Lock()
        self._script: deque[Action] = deque()
        self._seen: list[Seen] = []

    def script(self, actions: Iterable[Action]) -> None:
        with self._lock:
            self._script.extend(actions)

    @property
    def seen(self) -> list[Seen]:
        with self._lock:
            return list(self._seen)

    def _next(self, seen: Seen) -> Action:
        with self._lock:
            self._seen.append(seen)
            return self._script.popleft() if self._script else Forward()

    def _forward(
        self, method: str, target: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.target, timeout=60)
        try:
            conn.request(method, target, body=body or None, headers=headers)
            answer = conn.getresponse()
            return answer.status, answer.reason, answer.getheaders(), answer.read()
        finally:
            conn.close()

    def serve(self, sock: socket.socket) -> None:
        """Relay the requests of one client connection until it closes or is dropped."""
        reader = sock.makefile("rb")
        while True:
            request_line = reader.readline()
            if not request_line:
                return
            method, target, _ = request_line.decode("latin-1").split(" ", 2)
            headers: dict[str, str] = {}
            while (line := reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            body = reader.read(int(headers.get("content-length", "0")))
            action = self._next(Seen(method, target, headers, time.monotonic()))
            if isinstance(action, Answer):
                if action.forwarded:
                    self._forward(method, target, headers, body)
                status, reason = action.status, "Scripted"
                answer = b'{"title": "Scripted", "status": %d}' % status
                answer_headers = [("content-type", "application/problem+json")]
                answer_headers += list(action.headers.items())
            else:
                status, reason, answer_headers, answer = self._forward(
                    method, target, headers, body
                )
                if isinstance(action, Drop):
                    sock.shutdown(socket.SHUT_RDWR)
                    return
            head = [f"HTTP/1.1 {status} {reason}"]
            head += [f"{k}: {v}" for k, v in answer_headers if k.lower() not in HOP_BY_HOP]
            head.append(f"content-length: {len(answer)}")
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + answer)


@contextmanager
def relay_to(target: str) -> Iterator[Relay]:
    """A relay in front of ``target`` (a base URL), running until the block ends."""
    relay = Relay(target)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            relay.serve(self.request)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server(("127.0.0.1", 0), Handler) as server:
        relay.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield relay
        finally:
            server.shutdown()
            thread.join(timeout=10)
