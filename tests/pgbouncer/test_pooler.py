"""What PgBouncer's transaction pooling does to a client, and that compactd's connections
are fit for it.

The pooler really pools transactions here: many clients share a few server connections,
and a session setting made by one client is what the next one finds (so compactd makes
none). A direct connection's startup parameters are refused, so an app not told of the
pooler answers 503 rather than misbehave. Told of it (``database_pooler``), the app
leaves no named prepared statement on any server (one with asyncpg's statement cache
does), every pooled connection has the role's statement_timeout, a lock wait past it is
a 503 that leaves the connection usable, and without the role's setting the app says
what to run and the driver's command timeout still bounds the wait."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg
import httpx
import pytest
from sqlalchemy import make_url

from app.core.database import driver_connection
from app.core.settings import Settings
from tests import postgres
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import append, assert_problem, history, session_locked
from tests.pgbouncer.conftest import (
    POOL_SIZE,
    Bouncer,
    client_of,
    pooled_settings,
    role_settings,
    served,
)
from tests.resilience.support import assert_unavailable

USER = [{"role": "user", "content": "hello"}]
WARNING = "statement_timeout through the pooler"


async def _connect(url: str, **options: Any) -> asyncpg.Connection[asyncpg.Record]:
    conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(
        postgres.asyncpg_dsn(url), **options
    )
    return conn


async def test_many_clients_share_a_few_server_connections(pooled_url: str) -> None:
    clients = [await _connect(pooled_url, statement_cache_size=0) for _ in range(3 * POOL_SIZE)]
    try:
        pids = await asyncio.gather(*(c.fetchval("SELECT pg_backend_pid()") for c in clients))
        assert 1 <= len(set(pids)) <= POOL_SIZE < len(clients)
        # A session setting outlives its transaction, on a server that serves the next
        # client: why compactd never SETs, and behind the pooler sends no startup settings.
        # The setting and the server it landed on come from one statement; the pooler
        # hands servers out as it likes, so the others ask until one reaches that server.
        setter = await clients[0].fetchval(
            "SELECT pg_backend_pid() FROM (SELECT set_config('work_mem', '7MB', false)) s"
        )
        found = []
        for attempt in range(40 * len(clients)):
            other = clients[1 + attempt % (len(clients) - 1)]
            row = await other.fetchrow("SELECT pg_backend_pid(), current_setting('work_mem')")
            assert row is not None
            pid, work_mem = row[0], row[1]
            found.append((pid, work_mem))
            if pid == setter:
                break
        assert found[-1] == (setter, "7MB"), found
        assert all(mem != "7MB" for pid, mem in found if pid != setter), found
    finally:
        for c in clients:
            await c.close()


async def test_a_direct_connections_startup_parameters_are_refused(
    pooled_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(asyncpg.PostgresError, match="unsupported startup parameter"):
        await _connect(pooled_url, server_settings={"plan_cache_mode": "force_generic_plan"})
    # An app not told of the pooler sends them: a 503, not a misbehaving service, and
    # the log says why.
    caplog.set_level(logging.WARNING, logger="compactd")
    async with served(pooled_url, TEST_SETTINGS) as application, client_of(application) as client:
        assert_unavailable(await client.post("/v1/sessions", json={"model": "gpt-4o"}))
    assert any("unsupported startup parameter" in r.getMessage() for r in caplog.records)


async def _named_statements_on_each_server(pooled_url: str) -> dict[int, int]:
    """Every server connection of the database's pool, each held at once by a client in
    a transaction: its pid, and how many named prepared statements it holds."""
    clients = [await _connect(pooled_url, statement_cache_size=0) for _ in range(POOL_SIZE)]
    transactions = [c.transaction() for c in clients]
    try:
        for t in transactions:
            await t.start()
        rows = [
            await c.fetchrow(
                "SELECT pg_backend_pid() AS pid, "
                "(SELECT count(*) FROM pg_prepared_statements) AS named"
            )
            for c in clients
        ]
    finally:
        for t in transactions:
            with contextlib.suppress(Exception):
                await t.rollback()
        for c in clients:
            await c.close()
    counts = {row["pid"]: row["named"] for row in rows if row is not None}
    assert len(counts) == POOL_SIZE, counts  # each client held its own server
    return counts


async def test_the_service_leaves_no_named_statement_on_the_servers(
    app: Any, client: httpx.AsyncClient, pooled_url: str
) -> None:
    await make_session(client, id="s")
    writes = [
        append(client, "s", [{"role": "user", "content": f"turn {i}"}])
        for i in range(3 * POOL_SIZE)
    ]
    assert all(r.status_code == 201 for r in await asyncio.gather(*writes))
    for path in ("", "/context", "/messages", "/overflow", "/compactions", "/search?q=turn"):
        r = await client.get(f"/v1/sessions/s{path}")
        assert r.status_code == 200, (path, r.text)
    r = await client.post("/v1/sessions/s/usage", json={"input_tokens": 100, "output_tokens": 5})
    assert r.status_code == 200, r.text
    async with driver_connection(app.state.engine) as driver:
        assert await driver.fetchval("SELECT count(*) FROM entry") == 3 * POOL_SIZE
    assert set((await _named_statements_on_each_server(pooled_url)).values()) == {0}

    # The check sees one: asyncpg's statement cache names its statements.
    cached = await _connect(pooled_url)
    try:
        assert await cached.fetchval("SELECT 1 + $1::int", 1) == 2
    finally:
        await cached.close()
    assert sum((await _named_statements_on_each_server(pooled_url)).values()) >= 1


def shown(milliseconds: int) -> str:
    """A timeout as Postgres's SHOW writes it: in the largest unit that divides it."""
    for unit, size in (("h", 3_600_000), ("min", 60_000), ("s", 1_000)):
        if milliseconds % size == 0:
            return f"{milliseconds // size}{unit}"
    return f"{milliseconds}ms"


async def test_every_pooled_connection_has_the_roles_statement_timeout(
    app: Any, settings: Settings
) -> None:
    expected = shown(int(settings.db_statement_timeout_seconds * 1000))

    async def timeout() -> str:
        async with driver_connection(app.state.engine) as driver:
            found: str = await driver.fetchval("SHOW statement_timeout")
            await asyncio.sleep(0.01)  # held a while, so that the others take more servers
            return found

    assert set(await asyncio.gather(*(timeout() for _ in range(3 * POOL_SIZE)))) == {expected}


async def test_a_lock_wait_past_the_statement_timeout_is_a_503_and_the_pool_goes_on(
    db_url: str, pgbouncer: Bouncer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = pooled_settings(
        db_url, db_statement_timeout_seconds=0.5, db_command_timeout_seconds=5.0
    )
    await role_settings(db_url, settings)
    caplog.set_level(logging.WARNING, logger="compactd")
    async with (
        served(pgbouncer.url(db_url), settings) as application,
        client_of(application) as client,
    ):
        sid = (await make_session(client))["id"]
        async with session_locked(db_url, sid):
            started = time.monotonic()
            slow = await append(client, sid, USER)
            took = time.monotonic() - started
        assert_problem(slow, 503, "retry")
        assert slow.headers["retry-after"]
        assert took < 3.0, took  # Postgres cancelled it, long before the command timeout
        assert await history(client, sid) == []
        for _ in range(2 * POOL_SIZE):  # connections and servers are all fine afterwards
            ok = await append(client, sid, USER)
            assert ok.status_code == 201, ok.text
        assert len(await history(client, sid)) == 2 * POOL_SIZE
    assert not [r for r in caplog.records if WARNING in r.getMessage()]


async def test_without_the_role_setting_it_warns_and_the_command_timeout_bounds(
    db_url: str, pgbouncer: Bouncer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = pooled_settings(
        db_url, db_statement_timeout_seconds=0.5, db_command_timeout_seconds=2.0
    )
    caplog.set_level(logging.WARNING, logger="compactd")
    async with (
        served(pgbouncer.url(db_url), settings) as application,
        client_of(application) as client,
    ):
        sid = (await make_session(client))["id"]
        warnings = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
        database = make_url(db_url).database
        assert warnings == [
            "statement_timeout through the pooler is 0 ms, not the 500 ms of "
            "COMPACTD_DB_STATEMENT_TIMEOUT_SECONDS: behind a transaction pooler it comes from "
            f'the role, so run ALTER ROLE "postgres" IN DATABASE "{database}" SET '
            "statement_timeout = 500 (docs/deployment.md, Behind PgBouncer)"
        ]
        key = {"Idempotency-Key": "lock-wait"}
        async with session_locked(db_url, sid):
            started = time.monotonic()
            slow = await append(client, sid, USER, headers=key)
            took = time.monotonic() - started
        assert_problem(slow, 503, "retry")
        assert 1.5 < took < 5.0, took  # the driver gave up, and dropped the connection
        # Its statement, left waiting on the lock, may yet have run (as on a direct
        # connection: a 503 never says nothing was stored). The retry with its key stores
        # it exactly once, and the pool goes on.
        again = await append(client, sid, USER, headers=key)
        assert again.status_code == 201, again.text
        assert [e["message"] for e in await history(client, sid)] == USER
        ok = await append(client, sid, USER)
        assert ok.status_code == 201, ok.text
