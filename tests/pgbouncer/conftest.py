"""A real PgBouncer in transaction pooling in front of the tests' Postgres, and the app
served through it (``COMPACTD_DATABASE_POOLER=pgbouncer``) with its LISTEN connections
on the direct URL, as docs/deployment.md ("Behind PgBouncer") sets it up.

One PgBouncer per test process (a session fixture), started from Debian's ``pgbouncer``
on a free loopback port. Its wildcard database passes every database name through to the
tests' Postgres, so each test's fresh copy (``db_url``) has a pooled URL too. Its pools
are small (``POOL_SIZE`` server connections per database) so that many client
connections share few server connections, and a transaction pooler's traps (a session
setting or a named statement left on a server that the next client gets, a LISTEN on a
server that serves others) show. PgBouncer refuses to run as root: as root it runs as the
user that owns the Postgres socket folder (the embedded server's), else ``postgres``.

Without the ``pgbouncer`` binary the tests are skipped, except in CI (``CI=true``),
where .ci/run installs it and its absence is a failure.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import URL, make_url

from app.core.settings import Settings
from app.main import create_app
from tests import postgres
from tests.conftest import TEST_SETTINGS
from tests.e2e.server import free_port

# Server connections per (database, user) pool: fewer than the clients the tests open.
POOL_SIZE = 4


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found is not None:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(
            "pgbouncer is not installed in CI: .ci/run installs it (apt-get install pgbouncer)"
        )
    pytest.skip("pgbouncer is not installed: `apt-get install pgbouncer` runs the PgBouncer tests")


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: ``url(direct)`` is the same database through it."""

    port: int
    folder: Path
    process: subprocess.Popen[bytes]

    def url(self, direct: str) -> str:
        parts = make_url(direct)
        pooled = URL.create(
            parts.drivername,
            username=parts.username,
            password=parts.password,
            host="127.0.0.1",
            port=self.port,
            database=parts.database,
        )
        return pooled.render_as_string(hide_password=False)

    def log(self) -> str:
        return (self.folder / "pgbouncer.log").read_text(errors="replace")


def _server_address(admin_url: str) -> tuple[str, int]:
    """Where the tests' Postgres listens: a socket folder or a host, and its port."""
    url = make_url(admin_url)
    host = url.query.get("host") or url.host or "127.0.0.1"
    port = url.query.get("port") or url.port or 5432
    return str(host), int(str(port))


def _run_as(host: str) -> str | None:
    """The user PgBouncer runs as: None (as we are) unless we are root, which PgBouncer
    refuses to be: then the owner of the server's socket folder (it alone may enter the
    embedded server's), else ``postgres`` (Debian's package creates it), else nobody."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        owner = pwd.getpwuid(os.stat(host).st_uid).pw_name
        if owner != "root":
            return owner
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name).pw_name
    return "nobody"


def _quoted(value: str) -> str:
    return '"' + value.replace('"', '""') + '"'


def write_config(
    folder: Path, admin_url: str, port: int, user: str | None, pool_size: int = POOL_SIZE
) -> Path:
    host, server_port = _server_address(admin_url)
    admin = make_url(admin_url)
    users = folder / "users.txt"
    # trust: a client names a user of this file and is let in; the password (if the
    # server wants one) is what PgBouncer logs in to the server with.
    users.write_text(f"{_quoted(admin.username or 'postgres')} {_quoted(admin.password or '')}\n")
    config = folder / "pgbouncer.ini"
    config.write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={host} port={server_port}",
                "",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {users}",
                f"admin_users = {admin.username or 'postgres'}",
                "pool_mode = transaction",
                f"default_pool_size = {pool_size}",
                "min_pool_size = 0",
                "reserve_pool_size = 0",
                "max_client_conn = 2000",
                # A client waiting for a server longer than this fails instead of hanging.
                "query_wait_timeout = 30",
                "server_idle_timeout = 60",
                "log_connections = 0",
                "log_disconnections = 0",
                "",
            ]
        )
    )
    if user is not None:
        record = pwd.getpwnam(user)
        for path in (folder, users, config):
            os.chown(path, record.pw_uid, record.pw_gid)
    return config


def _wait_until_listening(process: subprocess.Popen[bytes], port: int, log: Path) -> None:
    deadline = time.monotonic() + 15
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited ({process.returncode}):\n{log.read_text()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"pgbouncer did not listen on {port}:\n{log.read_text()}")
        time.sleep(0.05)


@contextlib.contextmanager
def running_pgbouncer(admin_url: str, pool_size: int = POOL_SIZE) -> Iterator[Bouncer]:
    """PgBouncer in front of ``admin_url``'s server; ``pool_size`` server connections per
    database (the bench gives it more than the tests)."""
    binary = pgbouncer_binary()
    folder = Path(tempfile.mkdtemp(prefix="compactd-pgbouncer-"))
    host, _ = _server_address(admin_url)
    user = _run_as(host)
    port = free_port()
    config = write_config(folder, admin_url, port, user, pool_size)
    log = folder / "pgbouncer.log"
    argv = [binary, *(["-u", user] if user else []), str(config)]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_until_listening(process, port, log)
        yield Bouncer(port, folder, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pgbouncer(admin_url: str) -> Iterator[Bouncer]:
    with running_pgbouncer(admin_url) as bouncer:
        yield bouncer


async def role_settings(direct_url: str, settings: Settings) -> None:
    """What docs/deployment.md asks of the database behind a transaction pooler: the
    service's statement_timeout as its role's setting in its database. Done before any
    pooled connection reaches the database, as PgBouncer's server connections take the
    role's settings when they open."""
    conn = await asyncpg.connect(postgres.asyncpg_dsn(direct_url))
    try:
        database = make_url(direct_url).database or ""
        timeout = int(settings.db_statement_timeout_seconds * 1000)
        await conn.execute(
            f"ALTER ROLE CURRENT_USER IN DATABASE {_quoted(database)} "
            f"SET statement_timeout = {timeout}"
        )
    finally:
        await conn.close()


def pooled_settings(direct_url: str, **changes: Any) -> Settings:
    """The tests' settings behind the pooler, LISTENing on ``direct_url``."""
    return TEST_SETTINGS.model_copy(
        update={"database_pooler": "pgbouncer", "database_direct_url": direct_url, **changes}
    )


@pytest.fixture
def settings(db_url: str) -> Settings:
    return pooled_settings(db_url)


@pytest.fixture
async def pooled_url(db_url: str, settings: Settings, pgbouncer: Bouncer) -> str:
    """This test's database through PgBouncer, its role's settings made first."""
    await role_settings(db_url, settings)
    return pgbouncer.url(db_url)


@contextlib.asynccontextmanager
async def served(url: str, settings: Settings) -> AsyncIterator[Any]:
    application = create_app(settings, database_url=url)
    async with application.router.lifespan_context(application):
        yield application


@contextlib.asynccontextmanager
async def client_of(application: Any) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
        yield c


@pytest.fixture
async def app(pooled_url: str, settings: Settings) -> AsyncIterator[Any]:
    """The app with its database behind PgBouncer."""
    async with served(pooled_url, settings) as application:
        yield application


@pytest.fixture
async def client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(app) as c:
        yield c
