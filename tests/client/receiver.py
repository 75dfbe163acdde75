"""A real HTTP server that receives a webhook's deliveries in the client's tests: it
records every POST as it arrived (headers, the raw body) and answers 200."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True, slots=True)
class Delivered:
    path: str
    headers: dict[str, str]  # names in lower case
    body: bytes


class Receiver:
    """Where deliveries arrive (``url``), and what arrived."""

    def __init__(self) -> None:
        self.url = ""
        self._lock = threading.Lock()
        self._got: list[Delivered] = []

    def record(self, delivered: Delivered) -> None:
        with self._lock:
            self._got.append(delivered)

    @property
    def got(self) -> list[Delivered]:
        with self._lock:
            return list(self._got)

    def wait_for(self, count: int, timeout: float = 20.0) -> list[Delivered]:
        """The first ``count`` deliveries, once they have arrived."""
        deadline = time.monotonic() + timeout
        while len(got := self.got) < count:
            assert time.monotonic() < deadline, f"{len(got)} of {count} deliveries arrived"
            time.sleep(0.02)
        return got[:count]


@contextmanager
def receiving() -> Iterator[Receiver]:
    """A receiver on a loopback port until the block ends."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            receiver.record(Delivered(self.path, headers, body))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
