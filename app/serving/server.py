"""How ``compactd serve`` runs uvicorn: its options, and an HTTP protocol that bounds what
a client can make the server hold before a request reaches the app.

uvicorn's httptools protocol reads a request's line and headers (its *head*) with no size
limit (httptools grows a header value as its bytes arrive, whatever its length; uvicorn's
``h11_max_incomplete_event_size`` applies to its h11 protocol only) and no time limit (the
keep-alive timeout runs between requests, not during one). :class:`BoundedHttpToolsProtocol`
adds both:

- a head larger than ``max_header_bytes`` gets 431 and the connection closes, once at most
  one read (uvloop's, 256 KiB) past the limit has been parsed;
- a head that is not complete ``header_timeout_seconds`` after its first byte (or after the
  connection opened, for a connection's first request) gets 408 and the connection closes;
  a connection that sends nothing at all in that time is closed without an answer.

A chunked body may end with *trailer* fields. httptools hands them to ``on_header`` like
the head's, and uvicorn appended them to the request's headers, which the app reads only
once the body is in: a client could send an ``Idempotency-Key`` or ``If-Match`` no proxy
in front saw as a header, and as many trailer bytes as it liked. Here trailers are dropped
(the app never sees them) and their bytes count with the head's against
``max_header_bytes``: over it, 431 and the connection closes. So do the bytes read after
the head that carry no body (chunk framing, trailers still arriving: httptools grows a
trailer field as its bytes arrive, like a header's), once at most one read past the limit.

The body itself, once the head is in, is the app's to bound: see :mod:`app.core.limits`.

:func:`serve` runs the app as ``uvicorn.run`` would, and once it has started moves what the
start-up built out of the garbage collector's way: work for the served process only, so
the tests' apps (and their servers) do not pay it. ``compactd serve --workers N`` runs it
in each of N processes (see :mod:`app.serving.supervisor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import orjson
import uvicorn
from starlette.types import ASGIApp
from uvicorn.config import STARTUP_FAILURE
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from app.core import metrics
from app.core.errors import PROBLEM_JSON, ProblemError, RequestTimeout
from app.core.settings import Settings

log = logging.getLogger("compactd.http")

# In flight requests get this long to finish on shutdown (SIGTERM).
GRACEFUL_SHUTDOWN_SECONDS = 10


class HeadersTooLarge(ProblemError):
    status, type, title = 431, "headers-too-large", "Request header fields too large"


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size and a time bound on each request head.
    :func:`bounded_protocol` makes the subclass that carries the two bounds."""

    max_header_bytes: ClassVar[int] = 64 * 1024
    header_timeout: ClassVar[float] = 10.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = False  # between a request's first byte and the end of its headers
        self._in_body = False  # between the end of a request's headers and its end
        self._heads = 0  # request heads begun on this connection
        self._head_bytes = 0  # the head's (while it arrives), then with its trailer fields
        self._body_read = False  # body bytes parsed in the read at hand
        self._bodiless_bytes = 0  # reads past the head carrying no body, since body came
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False

    # ---------------------------------------------------------------- the protocol

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_timer()  # the first request's head: counted from the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # nothing more is parsed or buffered for this connection
        in_head, in_body, heads = self._in_head, self._in_body, self._heads
        self._body_read = False
        super().data_received(data)
        if self._refused or heads != self._heads:
            return
        # A head still incomplete: count the reads made inside it. The read that starts
        # a head is not counted (it may end the previous request's body), so this bound
        # is one read loose; a head that completes is measured exactly below.
        if self._in_head and in_head:
            self._head_bytes += len(data)
            if self._head_bytes > self.max_header_bytes:
                self._refuse(self._too_large(), "header_too_large")
        # Past the head, a read that carried no body bytes carried chunk framing or
        # trailers: count those reads until body comes again (one read loose, as above;
        # trailer fields that complete are measured exactly in on_header).
        elif self._in_body and in_body:
            if self._body_read:
                self._bodiless_bytes = 0
                return
            self._bodiless_bytes += len(data)
            if self._bodiless_bytes > self.max_header_bytes:
                self._refuse(self._trailer_too_large(), "trailer_too_large", in_body=True)

    # The parser's callbacks: none acts once the connection is refused (the rest of
    # the read being parsed may hold a body or a pipelined request).

    def on_message_begin(self) -> None:
        if self._refused:
            return
        super().on_message_begin()
        self._in_head = True
        self._heads += 1
        self._head_bytes = 0
        if self._head_timer is None:
            self._arm_head_timer()

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused:
            return
        if self._in_head:
            super().on_header(name, value)
            return
        # A trailer field, after a chunked body: dropped, its bytes counted with the head's.
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > self.max_header_bytes:
            self._refuse(self._trailer_too_large(), "trailer_too_large", in_body=True)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._in_head = False
        self._cancel_head_timer()
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            self._refuse(self._too_large(), "header_too_large")
            return
        self._head_bytes = size
        self._in_body = True
        self._bodiless_bytes = 0
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            self._body_read = True
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._refused:
            self._in_body = False
            super().on_message_complete()

    # --------------------------------------------------------------------- bounds

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head:
            self._refuse(
                RequestTimeout(
                    f"the request line and headers did not arrive within {self.header_timeout:g} s"
                ),
                "header_timeout",
            )
        elif not self.transport.is_closing():
            self.transport.close()  # a connection that never sent a request

    def _too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            f"the request line and headers are over the {self.max_header_bytes}-byte limit"
        )

    def _trailer_too_large(self) -> HeadersTooLarge:
        return HeadersTooLarge(
            "the request line, headers and the chunked body's framing and trailer fields "
            f"are over the {self.max_header_bytes}-byte limit"
        )

    def _refuse(self, error: ProblemError, reason: str, *, in_body: bool = False) -> None:
        """Answer ``error`` and close. Refusing a head: while an earlier (pipelined)
        request's answer is still being written, close after it instead of cutting into
        it. Refusing the request whose body is arriving (``in_body``): the refusal is its
        answer, and its app, waiting for the body, sees a disconnect; if an answer was
        begun already (or an earlier request's is still being written), just close."""
        self._refused = True
        self._in_head = self._in_body = False
        self._cancel_head_timer()
        metrics.HTTP_REJECTED.labels(reason).inc()
        client = f"{self.client[0]}:{self.client[1]}" if self.client else None
        log.warning("request refused: %s", error.detail, extra={"client": client})
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if in_body and cycle is not None:
            if cycle.response_started or self.pipeline:
                self.transport.close()
                return
            cycle.disconnected = True
            cycle.message_event.set()
        elif cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            return
        self.transport.write(self._raw_problem(error))
        self.transport.close()

    def _raw_problem(self, error: ProblemError) -> bytes:
        body = orjson.dumps(error.body())
        lines = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:  # server, date
            lines += [name, b": ", value, b"\r\n"]
        lines += [
            b"content-type: " + PROBLEM_JSON.encode() + b"\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
        return b"".join(lines)


def bounded_protocol(max_header_bytes: int, header_timeout: float) -> type[HttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with these bounds."""
    return type(
        "CompactdHttpProtocol",
        (BoundedHttpToolsProtocol,),
        {"max_header_bytes": max_header_bytes, "header_timeout": header_timeout},
    )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """The ``uvicorn.run`` / ``uvicorn.Config`` options of ``compactd serve`` (the tests'
    servers use them too), host, port and log level aside."""
    return {
        "loop": "uvloop",
        "http": bounded_protocol(settings.max_header_bytes, settings.header_timeout_seconds),
        "log_config": None,
        "access_log": False,
        "timeout_graceful_shutdown": GRACEFUL_SHUTDOWN_SECONDS,
    }


class _ServeServer(uvicorn.Server):
    """uvicorn's server, which freezes the collector's view of the heap once started
    and then calls ``on_started``; in multiprocess metrics mode it also copies the
    app's pool figures into the shared gauges (see :mod:`app.core.metrics`)."""

    def __init__(
        self,
        config: uvicorn.Config,
        on_started: Callable[[], None] | None,
        on_stopping: Callable[[], None] | None = None,
        state: Any = None,
    ) -> None:
        super().__init__(config)
        self.on_started = on_started
        self.on_stopping = on_stopping
        self.app_state = state
        self._pool_sampler: asyncio.Task[None] | None = None

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # Before uvicorn waits for the open connections: what never ends by itself (an
        # event stream) is told to end, or the graceful period would run out on it.
        if self.on_stopping is not None:
            self.on_stopping()
        if self._pool_sampler is not None:
            self._pool_sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pool_sampler
        await super().shutdown(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if not self.started:
            return  # the app's start-up failed: uvicorn exits
        # Everything built so far lives as long as the process: keep it out of the
        # collector's full passes, which otherwise rescan it every few requests
        # that allocate much (a large prune paused ~70 ms on them).
        gc.collect()
        gc.freeze()
        engine = getattr(self.app_state, "engine", None)
        if metrics.MULTIPROCESS and engine is not None:
            self._pool_sampler = asyncio.create_task(metrics.sample_pool(engine))
        if self.on_started is not None:
            self.on_started()


def serve(
    app: ASGIApp,
    settings: Settings,
    host: str,
    port: int,
    *,
    sock: socket.socket | None = None,
    on_started: Callable[[], None] | None = None,
) -> None:
    """Serve ``app`` until a signal stops it, as ``uvicorn.run(app, ...)`` with
    :func:`uvicorn_options` would (exit status 3 if it failed to start), and freeze the
    collector's view of the heap once the app's start-up is done. ``sock``: a socket
    bound to ``host:port`` already (see :func:`app.serving.startup.listening_socket`);
    ``on_started`` is called once the server listens."""
    config = uvicorn.Config(
        app, host=host, port=port, log_level=settings.log_level, **uvicorn_options(settings)
    )
    state = getattr(app, "state", None)

    def stopping() -> None:
        hub = getattr(state, "event_hub", None)
        if hub is not None:
            hub.end_streams()

    server = _ServeServer(config, on_started, stopping, state)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=[sock] if sock is not None else None)
    if not server.started:
        sys.exit(STARTUP_FAILURE)
