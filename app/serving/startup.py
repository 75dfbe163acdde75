"""What ``compactd serve`` tells a person while it starts, and the one line it ends with
when it cannot: a port already taken, a database it cannot reach.

Progress goes to the log (readable text on a terminal, JSON lines otherwise); the
banner is for a terminal only. A failure is a :class:`StartupError` whose message is
one line saying what went wrong and what to do; the command prints it and exits 1,
with no traceback.
"""

from __future__ import annotations

import errno
import logging
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TextIO
from urllib.parse import parse_qs, urlsplit

log = logging.getLogger("compactd.serve")


class StartupError(Exception):
    """``serve`` cannot start; the message is one line that says what to do."""


# ------------------------------------------------------------------------- port


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (as uvicorn binds one: ``SO_REUSEADDR``), taken
    before the database starts, so that a busy port is said at once and no other
    process can take it meanwhile. Raises :class:`StartupError`."""
    bare = host.strip("[]")
    try:
        infos = socket.getaddrinfo(bare, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise StartupError(
            f"cannot bind {host}:{port}: {exc.strerror or exc} "
            "(set --host or COMPACTD_HOST to an address of this machine, e.g. 127.0.0.1)"
        ) from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise StartupError(
                f"port {port} on {host} is already in use (another compactd, or another "
                f"server): stop it, or choose another port: make run PORT={port + 1}, or "
                f"compactd serve --port {port + 1}"
            ) from None
        if exc.errno == errno.EACCES:
            raise StartupError(
                f"not allowed to bind {host}:{port} (ports below 1024 need privileges): "
                "choose a port above 1023 with PORT=, --port or COMPACTD_PORT"
            ) from None
        raise StartupError(
            f"cannot bind {host}:{port}: {exc.strerror or exc} (check --host / COMPACTD_HOST)"
        ) from None
    sock.set_inheritable(True)
    return sock


# --------------------------------------------------------------------- database


def database_place(url: str) -> str:
    """Where ``url`` points, without its user or password: ``host:port/db``."""
    parts = urlsplit(url)
    # A Unix socket's folder comes as ?host=/path (libpq's way).
    host = parts.hostname or parse_qs(parts.query).get("host", ["localhost"])[0]
    port = parts.port or 5432
    return f"{host}:{port}{parts.path or ''}"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def database_problem(exc: BaseException, url: str, connect_timeout: float) -> str:
    """One line for a failure to reach or use the database at ``url``."""
    import asyncpg

    place = database_place(url)
    fix = "check DATABASE_URL, or unset it to use the embedded PostgreSQL"
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            return f"cannot find the database host of {place} ({cause.strerror}): {fix}"
        if isinstance(cause, ConnectionRefusedError):
            return (
                f"cannot reach the database at {place}: connection refused (is PostgreSQL "
                f"running there?): {fix}"
            )
        if isinstance(cause, TimeoutError):
            return (
                f"the database at {place} did not answer within {connect_timeout:g} s "
                f"(COMPACTD_DB_CONNECT_TIMEOUT_SECONDS): {fix}"
            )
        if isinstance(
            cause, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
        ):
            return f"the database at {place} refused the login: {first_line(cause)}: {fix}"
        if isinstance(cause, asyncpg.InvalidCatalogNameError):
            return f"the database at {place} does not exist: create it (createdb), or {fix}"
        if isinstance(cause, OSError) and cause.strerror:
            return f"cannot reach the database at {place}: {cause.strerror}: {fix}"
    return f"cannot use the database at {place}: {first_line(exc)}: {fix}"


def first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says (its type's name when it says nothing)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


# --------------------------------------------------------------------- progress


@contextmanager
def step(doing: str, **extra: object) -> Iterator[None]:
    """Log ``doing…`` now and ``done`` with its duration after, so that a slow start
    (the embedded PostgreSQL's first one creates its data folder) is never silent."""
    log.info("%s…", doing, extra=extra)
    started = time.perf_counter()
    yield
    log.info("%s: done in %.1f s", doing, time.perf_counter() - started)


# ----------------------------------------------------------------------- banner


@dataclass(frozen=True)
class StartupFacts:
    """What the banner says."""

    version: str
    host: str
    port: int
    database: str  # "embedded PostgreSQL, data in …" or "PostgreSQL at host:port/db"
    migrations: str
    keyed: bool
    loopback: bool
    workers: int = 1  # server processes (serve --workers)
    proxy: tuple[tuple[str, str], ...] = ()  # (API, upstream URL without credentials)
    warnings: tuple[str, ...] = ()  # e.g. a COMPACTD_ variable that is not a setting


def base_url(host: str, port: int) -> str:
    """The URL a person on this machine opens for a server bound to ``host``."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "[::1]"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def banner(facts: StartupFacts) -> str:
    """The lines printed once the server listens, on a terminal."""
    url = base_url(facts.host, facts.port)
    if facts.keyed:
        access = "API keys required (compactd keys list shows them)"
    elif facts.loopback:
        access = "open: no API keys exist, so it serves this machine only (loopback)"
    else:
        access = "open: no API keys, on a public address (--insecure-no-auth)"
    rows = [
        ("database", facts.database),
        ("migrations", facts.migrations),
        ("access", access),
        ("API docs", f"{url}/docs"),
    ]
    if facts.proxy:
        rows.insert(3, ("proxy", ", ".join(f"{api} -> {up}" for api, up in facts.proxy)))
    if facts.workers > 1:
        rows.insert(0, ("processes", f"{facts.workers} server processes on one port"))
    rows += [("warning", warning) for warning in facts.warnings]
    lines = ["", f"  compactd {facts.version} is serving on {url}"]
    lines += [f"  {name:<11} {value}" for name, value in rows]
    lines += ["  Press Ctrl-C to stop.", ""]
    return "\n".join(lines)


_UVICORN_STARTUP = (
    "Started server process",
    "Waiting for application startup",
    "Application startup complete",
)


def quiet_uvicorn_startup() -> None:
    """Drop uvicorn's start-up lines, which the banner replaces (its shutdown lines stay:
    they show a stop's progress)."""

    def keep(record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and str(record.msg).startswith(_UVICORN_STARTUP))

    logging.getLogger("uvicorn.error").addFilter(keep)


def is_terminal(stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
