"""What GET /context records of the context it served (the context a later usage
report without ``context_version`` is about): never at the cost of a wait on the
session row, only forward, and nothing for a read of the same context again."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import asyncpg
import httpx

from app.core.database import driver_connection
from app.core.tenancy import DEFAULT_TENANT
from app.store.session_row import SessionState, read_state, record_served
from tests import postgres
from tests.conftest import make_session
from tests.helpers import append_ok, session_locked

TURN = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Why does test_login fail? " + "Here is the log. " * 40},
]


async def served_row(db_url: str, session_id: str) -> dict[str, Any]:
    """The served record as stored, with the row version's xmin (a write changes it)."""
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        row = await conn.fetchrow(
            "SELECT served_version, served_context_tokens, served_compaction_id, version, "
            "active_compaction_id, xmin::text AS xmin FROM session WHERE id = $1",
            session_id,
        )
    finally:
        await conn.close()
    assert row is not None
    return dict(row)


async def get_context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def test_a_context_read_does_not_wait_on_the_session_row_lock(
    db_url: str, client: httpx.AsyncClient
) -> None:
    """With the row locked for 2 s elsewhere, GET /context took 2 s (a 503 past
    statement_timeout): it wrote the served record and waited for the lock."""
    await make_session(client, id="busy")
    appended = await append_ok(client, "busy", TURN)
    async with session_locked(db_url, "busy"):
        started = time.perf_counter()
        # The lock is held until this read is over: a read that waits on it
        # would never finish here (the bound only ends the test sooner).
        r = await asyncio.wait_for(client.get("/v1/sessions/busy/context"), timeout=8)
        print(f"GET /context with the row locked: {time.perf_counter() - started:.3f} s")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["version"] == appended["version"]
        assert [m["role"] for m in body["messages"]] == ["system", "user"]
    # The row was locked: nothing recorded (a later report without a version
    # falls back to the rule for an unknown context).
    row = await served_row(db_url, "busy")
    assert row["served_version"] is None
    # Unlocked, the same read records what it served.
    await get_context(client, "busy")
    row = await served_row(db_url, "busy")
    assert row["served_version"] == row["version"] == appended["version"]
    assert row["served_context_tokens"] == appended["context_tokens"]


async def test_reading_the_same_context_again_writes_nothing(
    db_url: str, client: httpx.AsyncClient
) -> None:
    """A second read of one version (another format, a dashboard) leaves the
    record, and the row, as they are."""
    await make_session(client, id="twice")
    await append_ok(client, "twice", TURN)
    await get_context(client, "twice")
    first = await served_row(db_url, "twice")
    assert first["served_version"] == first["version"]
    await get_context(client, "twice", "anthropic")
    await get_context(client, "twice")
    assert await served_row(db_url, "twice") == first


async def stale_state(app: Any, sid: str) -> SessionState:
    async with driver_connection(app.state.engine) as driver:
        state = await read_state(driver, DEFAULT_TENANT, sid)
    assert state is not None
    return state


async def record(app: Any, sid: str, state: SessionState) -> None:
    async with driver_connection(app.state.engine) as driver:
        await record_served(driver, DEFAULT_TENANT, sid, state)


async def test_a_read_that_finishes_late_never_records_an_older_context(
    app: Any, db_url: str, client: httpx.AsyncClient
) -> None:
    """A read whose record lands after newer reads, or after the report that
    measured a newer context, must not move the record back: a report without
    a version would be taken to measure that older context."""
    await make_session(client, id="race")
    await append_ok(client, "race", TURN)
    old = await stale_state(app, "race")  # a read of this version, its write still to come

    await append_ok(client, "race", [{"role": "assistant", "content": "Looking."}])
    newer = await get_context(client, "race")
    await record(app, "race", old)
    row = await served_row(db_url, "race")
    assert row["served_version"] == newer["version"] > old.version

    # The agent's report (no context_version) measures the newer context and
    # consumes the record; the old read's write lands after it.
    r = await client.post("/v1/sessions/race/usage", json={"input_tokens": 900})
    assert r.status_code == 200, r.text
    assert (await served_row(db_url, "race"))["served_version"] is None
    await record(app, "race", old)
    assert (await served_row(db_url, "race"))["served_version"] is None


async def test_a_read_from_before_a_compaction_was_queued_does_not_undo_a_later_one(
    app: Any, db_url: str, client: httpx.AsyncClient
) -> None:
    """Queuing a compaction leaves the version as it is: at one version, the record
    follows the read that saw the compaction active, not an earlier one that
    lands later."""
    await make_session(client, id="queued", config={"compaction": {"keep_recent_tokens": 10}})
    await append_ok(client, "queued", TURN)
    await append_ok(client, "queued", [{"role": "assistant", "content": "Looking. " * 50}])
    old = await stale_state(app, "queued")
    assert old.active_compaction_id is None
    r = await client.post("/v1/sessions/queued/compactions", json={})  # no worker runs here
    assert r.status_code == 202, r.text
    job_id = uuid.UUID(r.json()["id"])
    newer = await get_context(client, "queued")
    assert newer["version"] == old.version
    row = await served_row(db_url, "queued")
    assert (row["served_version"], row["served_compaction_id"]) == (old.version, job_id)
    await record(app, "queued", old)
    row = await served_row(db_url, "queued")
    assert (row["served_version"], row["served_compaction_id"]) == (old.version, job_id)


async def test_a_read_only_database_still_serves_the_context(
    app: Any, db_url: str, client: httpx.AsyncClient
) -> None:
    """The record is bookkeeping: on a read-only connection (a standby) it is
    skipped, and the read does not fail."""
    await make_session(client, id="ro")
    await append_ok(client, "ro", TURN)
    state = await stale_state(app, "ro")
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        await conn.execute("SET default_transaction_read_only = on")
        await record_served(conn, DEFAULT_TENANT, "ro", state)
        assert await conn.fetchval("SELECT 1") == 1  # the connection is still usable
    finally:
        await conn.close()
    assert (await served_row(db_url, "ro"))["served_version"] is None
