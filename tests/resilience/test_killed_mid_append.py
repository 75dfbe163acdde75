"""The API process SIGKILLed mid-append, and every append retried with its
Idempotency-Key on a fresh process: exactly one copy of each is stored, and a
retry of an acknowledged append gets the first response again, byte for byte.

An append that was never acknowledged may still have been committed: the
deterministic cases hold the session's row lock from another connection, so
that the append is stuck inside its write when the process dies, and the write
goes through once the lock is released, after the client is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from app.core.settings import Settings
from tests.postgres import asyncpg_dsn
from tests.resilience.support import ServeProcess, copies, turn

# A slow tier: `make test` and CI run it, `make test-fast` leaves it out. Alone in a
# parallel run: which append the kill catches in flight depends on how fast the others go.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

FREE_SESSIONS = 4
APPENDS_PER_SESSION = 10
KILL_AFTER = 8  # acknowledged appends, before the SIGKILL


@pytest.fixture
async def serve(
    db_url: str, settings: Settings, tmp_path: Path
) -> AsyncIterator[list[ServeProcess]]:
    """Makes `compactd serve` processes on the test database; kills any left up."""
    made: list[ServeProcess] = []
    yield made
    for process in made:
        await process.close()


async def started(serve: list[ServeProcess], db_url: str, settings: Settings, log: Path) -> str:
    process = ServeProcess(db_url, settings, log)
    serve.append(process)
    await process.start()
    return process.base_url


async def create(base_url: str, *ids: str) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        for sid in ids:
            r = await http.post("/v1/sessions", json={"id": sid, "model": "gpt-4o"})
            assert r.status_code == 201, r.text


class RowLock:
    """``SELECT … FOR UPDATE`` on a session's row, from a connection of its own;
    a second connection watches (pg_stat_activity is a snapshot per transaction)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.conn: Any = None
        self.watch: Any = None
        self.tx: Any = None

    async def take(self, session_id: str) -> None:
        self.conn = await asyncpg.connect(self.dsn)
        self.watch = await asyncpg.connect(self.dsn)
        self.tx = self.conn.transaction()
        await self.tx.start()
        await self.conn.execute("SELECT 1 FROM session WHERE id = $1 FOR UPDATE", session_id)

    async def waiting(self) -> int:
        """How many backends wait for this lock (directly, or queued behind
        another waiter, which then holds the row's tuple lock)."""
        n: int = await self.watch.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND cardinality(pg_blocking_pids(pid)) > 0"
        )
        return n

    async def wait_for_waiters(self, n: int, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while True:
            if await self.waiting() >= n:
                return
            assert time.monotonic() < deadline, f"{n} backend(s) never queued on the lock"
            await asyncio.sleep(0.02)

    async def others(self) -> int:
        """Other backends on this database: the killed process's, until they end."""
        n: int = await self.watch.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> ALL($1::int[])",
            [self.conn.get_server_pid(), self.watch.get_server_pid()],
        )
        return n

    async def release(self) -> None:
        await self.tx.rollback()

    async def close(self) -> None:
        for conn in (self.conn, self.watch):
            if conn is not None:
                await conn.close()


async def post(http: httpx.AsyncClient, sid: str, key: str) -> httpx.Response:
    return await http.post(
        f"/v1/sessions/{sid}/messages",
        json={"messages": turn(key)},
        headers={"Idempotency-Key": key},
    )


async def test_sigkill_under_concurrent_appends(
    serve: list[ServeProcess], db_url: str, settings: Settings, tmp_path: Path
) -> None:
    base_url = await started(serve, db_url, settings, tmp_path / "serve-1.log")
    free = [f"free-{i}" for i in range(FREE_SESSIONS)]
    await create(base_url, *free, "held")
    work = [(sid, f"{sid}-{n}") for n in range(APPENDS_PER_SESSION) for sid in free]
    work.append(("held", "held-0"))
    lock = RowLock(asyncpg_dsn(db_url))
    await lock.take("held")
    acked: dict[str, httpx.Response] = {}
    armed = asyncio.Event()
    enough = asyncio.Event()

    async def send(http: httpx.AsyncClient, sid: str, key: str) -> None:
        try:
            r = await post(http, sid, key)
        except httpx.TransportError:
            return  # in flight when the process died: never acknowledged
        assert r.status_code == 201, r.text
        acked[key] = r
        if armed.is_set() and not enough.is_set() and len(acked) >= KILL_AFTER:
            serve[0].kill_now()  # at once: the other appends are still in flight
            enough.set()

    try:
        limits = httpx.Limits(max_connections=len(work))
        async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:
            tasks = [asyncio.create_task(send(http, sid, key)) for sid, key in work]
            # The held append is stuck in its write; once a few of the others are
            # acknowledged, the process is killed while the rest are on their way
            # (appends to one session take turns in the process).
            await lock.wait_for_waiters(1)
            armed.set()
            if len(acked) >= KILL_AFTER:
                serve[0].kill_now()
                enough.set()
            await asyncio.wait_for(enough.wait(), 30)
            await serve[0].kill()
            await asyncio.gather(*tasks)
        print(f"\n[resilience] acknowledged before SIGKILL: {len(acked)} of {len(work)}")
        assert "held-0" not in acked
        assert len(acked) < len(work), "every append finished before the kill"

        # The held append's write goes through now, its client long gone; wait
        # for every backend of the killed process to end, so that whatever it
        # was going to commit is committed.
        await lock.release()
        deadline = time.monotonic() + 30
        while await lock.others():
            assert time.monotonic() < deadline, "the killed process's backends did not end"
            await asyncio.sleep(0.02)
    finally:
        await lock.close()

    base_url = await started(serve, db_url, settings, tmp_path / "serve-2.log")
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        retried = await asyncio.gather(*(post(http, sid, key) for sid, key in work))
        replayed = 0
        for (_, key), r in zip(work, retried, strict=True):
            assert r.status_code == 201, (key, r.text)
            if key in acked:
                # The same response, byte for byte, marked as a replay.
                assert r.headers["idempotent-replayed"] == "true", key
                assert r.content == acked[key].content, key
                assert r.headers["etag"] == acked[key].headers["etag"], key
            replayed += r.headers.get("idempotent-replayed") == "true"
        for sid in [*free, "held"]:
            assert await copies(http, sid) == {key: 1 for s, key in work if s == sid}, sid
        # The held append was committed by its orphaned backend: the retry replays it.
        held = retried[-1]
        assert held.headers.get("idempotent-replayed") == "true", held.headers
        await entries_match(http, "held", held.json())
        print(
            f"[resilience] after restart: {replayed} replays, {len(work) - replayed} stored "
            "by the retry"
        )


async def test_retry_queued_behind_the_killed_append_stores_once(
    serve: list[ServeProcess], db_url: str, settings: Settings, tmp_path: Path
) -> None:
    """The retry comes while the killed process's append still waits for the row
    lock: both wait; one stores, the other replays it."""
    # The orphan's wait must outlast the restart: a statement_timeout longer than the
    # default's 2.5 s, which would cancel it first.
    settings = settings.model_copy(
        update={"db_statement_timeout_seconds": 10.0, "db_command_timeout_seconds": 15.0}
    )
    base_url = await started(serve, db_url, settings, tmp_path / "serve-1.log")
    await create(base_url, "held")
    lock = RowLock(asyncpg_dsn(db_url))
    await lock.take("held")
    try:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            first = asyncio.create_task(post(http, "held", "k"))
            await lock.wait_for_waiters(1)
            await serve[0].kill()
            with pytest.raises(httpx.TransportError):
                await first

        base_url = await started(serve, db_url, settings, tmp_path / "serve-2.log")
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
            retry = asyncio.create_task(post(http, "held", "k"))
            await lock.wait_for_waiters(2)  # the orphan and the retry
            await lock.release()
            r = await retry
            assert r.status_code == 201, r.text
            assert await copies(http, "held") == {"k": 1}
            await entries_match(http, "held", r.json())
            again = await post(http, "held", "k")
            assert again.status_code == 201, again.text
            assert again.headers["idempotent-replayed"] == "true"
            assert again.content == r.content
    finally:
        await lock.close()


async def entries_match(http: httpx.AsyncClient, sid: str, body: dict[str, Any]) -> None:
    """The response names the entries that are stored (ids and seqs)."""
    r = await http.get(f"/v1/sessions/{sid}/messages")
    assert r.status_code == 200, r.text
    stored = [(e["id"], e["seq"]) for e in r.json()["entries"]]
    assert [(e["id"], e["seq"]) for e in body["entries"]] == stored
