"""A real uvicorn server on a free loopback port, in a background thread."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

from app.serving.server import uvicorn_options


def free_port() -> int:
    """A loopback port free now, for a server in another process to bind. In a parallel
    run (pytest-xdist) each worker takes only ports of its own residue modulo the number
    of workers, so two workers never hand out the same port before its server binds it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    mine = int(worker.removeprefix("gw")) % workers
    with contextlib.ExitStack() as others:  # held until the choice: the kernel offers new ones
        while True:
            s = others.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            if port % workers == mine:
                return port


class _Server(uvicorn.Server):
    """uvicorn's server, which ends the app's event streams as it begins to stop (as
    ``compactd serve`` does): uvicorn would otherwise wait its graceful period on them."""

    def __init__(self, config: uvicorn.Config, app: Any) -> None:
        super().__init__(config)
        self.app = app

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        hub = getattr(self.app.state, "event_hub", None)
        if hub is not None:
            hub.end_streams()
        await super().shutdown(sockets)


@contextlib.contextmanager
def running(app: Any) -> Iterator[str]:
    """Serve ``app`` over real HTTP until the block ends; yields the base URL. The server
    is configured as ``compactd serve`` configures it, from the app's settings. It
    listens on a socket bound here first, so no other server can take its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port: int = listener.getsockname()[1]
    options = uvicorn_options(app.state.settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", **options)
    server = _Server(config, app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
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
        listener.close()
