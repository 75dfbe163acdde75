"""Reading the client's event streams in tests (the sync one in a thread, so that a
test's deadline holds), and a TCP relay that cuts connections for real.

:class:`Cutter` listens on a loopback port and pumps the bytes of each connection to
its target and back, unchanged (a server-sent event stream goes through as it comes).
``cut()`` closes every connection open now, both ways, as a network or a restart
would; ``point_at()`` sends the next connections to another server. It records the
head of each connection's first request, to read the headers a client sent.
"""

from __future__ import annotations

import asyncio
import select
import socket
import socketserver
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit

from compactd_client import AsyncEventStream, EventStream
from compactd_client.types import Event

Stream = EventStream | AsyncEventStream


async def take_until(
    stream: Stream, last: Callable[[Event], bool], *, seconds: float = 30.0
) -> list[Event]:
    """The stream's next events, up to the first for which ``last`` is true; fails
    after ``seconds``."""

    async def read_async(events: AsyncEventStream) -> list[Event]:
        got: list[Event] = []
        async for event in events:
            got.append(event)
            if last(event):
                break
        return got

    def read_sync(events: EventStream) -> list[Event]:
        got: list[Event] = []
        for event in events:
            got.append(event)
            if last(event):
                break
        return got

    if isinstance(stream, AsyncEventStream):
        return await asyncio.wait_for(read_async(stream), seconds)
    try:
        return await asyncio.wait_for(asyncio.to_thread(read_sync, stream), seconds)
    except TimeoutError:
        stream.close()  # the thread's read fails, and it ends
        raise


async def take(stream: Stream, count: int, *, seconds: float = 30.0) -> list[Event]:
    """The stream's next ``count`` events; fails after ``seconds``."""
    seen = 0

    def counted(_: Event) -> bool:
        nonlocal seen
        seen += 1
        return seen >= count

    return await take_until(stream, counted, seconds=seconds)


async def close(stream: Stream) -> None:
    if isinstance(stream, AsyncEventStream):
        await stream.aclose()
    else:
        stream.close()


class Cutter:
    """The relay's target, its open connections and the request heads it saw."""

    def __init__(self, target: str) -> None:
        self.url = ""
        self._lock = threading.Lock()
        self._target = self._address(target)
        self._open: set[socket.socket] = set()
        self._heads: list[str] = []

    @staticmethod
    def _address(base_url: str) -> tuple[str, int]:
        parts = urlsplit(base_url)
        return parts.hostname or "127.0.0.1", parts.port or 80

    def point_at(self, base_url: str) -> None:
        """Send the connections made from now on to ``base_url``."""
        with self._lock:
            self._target = self._address(base_url)

    def cut(self) -> None:
        """Close every open connection, both ways."""
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    @property
    def connections(self) -> int:
        """Connections open now (each counted once)."""
        with self._lock:
            return len(self._open) // 2

    @property
    def heads(self) -> list[str]:
        """The head (request line and headers) of each connection's first request."""
        with self._lock:
            return list(self._heads)

    def serve(self, client: socket.socket) -> None:
        with self._lock:
            target = self._target
        try:
            upstream = socket.create_connection(target, timeout=5)
        except OSError:
            return  # nobody there: the client's connection closes unanswered
        with self._lock:
            self._open |= {client, upstream}
        head = b""
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    if sock is client and b"\r\n\r\n" not in head:
                        head += data
                        if b"\r\n\r\n" in head:
                            with self._lock:
                                self._heads.append(head.split(b"\r\n\r\n")[0].decode("latin-1"))
                    (upstream if sock is client else client).sendall(data)
        except OSError:
            return
        finally:
            with self._lock:
                self._open -= {client, upstream}
            upstream.close()


@contextmanager
def cutter_to(target: str) -> Iterator[Cutter]:
    """A :class:`Cutter` in front of ``target`` (a base URL) until the block ends."""
    cutter = Cutter(target)

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            cutter.serve(self.request)

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    with Server(("127.0.0.1", 0), Handler) as server:
        cutter.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield cutter
        finally:
            cutter.cut()
            server.shutdown()
            thread.join(timeout=10)
