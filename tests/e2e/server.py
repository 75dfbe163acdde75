"""A real uvicorn server on a free loopback port, in a background thread."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from app.core.server import uvicorn_options


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` over real HTTP until the block ends; yields the base URL. The server
    is configured as ``compactd serve`` configures it, from the app's settings."""
    port = free_port()
    options = uvicorn_options(app.state.settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
