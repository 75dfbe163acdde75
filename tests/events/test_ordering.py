"""The log's order under concurrency: events written at once by many sessions, and by
transactions that commit in another order than they took their ids, come out of the
streams each exactly once, in (txid, id) order, to a reader that stays and to one that
keeps reconnecting with Last-Event-ID. A transaction's event is held back until every
transaction that began before it has ended, so that no reader ever moves past a place
an earlier transaction could still fill; a rolled-back event never shows."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from typing import Any

import asyncpg
import httpx
import pytest

from app.core.settings import Settings
from app.core.tenancy import DEFAULT_TENANT
from app.main import create_app
from app.store import events
from tests.compactions.helpers import conversation
from tests.conftest import make_session
from tests.e2e.server import running
from tests.events.sse import (
    MARK,
    Frame,
    check_frames,
    connect,
    ids,
    logged,
    mark,
    open_stream,
)
from tests.helpers import append_ok

MANUAL = {"compaction": {"auto": False, "keep_recent_tokens": 500}, "prune": {"auto": False}}


@pytest.fixture
def reader(db_url: str, settings: Settings) -> Iterator[str]:
    with running(create_app(settings, database_url=db_url)) as base:
        yield base


async def begin_and_emit(
    conn: asyncpg.Connection[asyncpg.Record], sid: str, **data: Any
) -> tuple[Any, events.Place]:
    """An open transaction on ``conn`` that wrote one event; (the transaction, its place)."""
    tx = conn.transaction()
    await tx.start()
    place = await events.emit(conn, DEFAULT_TENANT, sid, MARK, data)
    return tx, place


async def test_many_sessions_writing_at_once_come_out_once_each_in_the_log_s_order(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    sids = [f"s{n}" for n in range(8)]
    for sid in sids:
        await make_session(client, id=sid, config=MANUAL)
        for batch in conversation(6):
            await append_ok(client, sid, batch)
    before = {event_id for event_id, _, _ in await logged(db_url)}

    async def work(http: httpx.AsyncClient, sid: str) -> None:
        """Compactions queued and cancelled: each its own transaction."""
        for _ in range(4):
            r = await http.post(f"/v1/sessions/{sid}/compactions", json={})
            assert r.status_code == 202, r.text
            r = await http.post(f"/v1/sessions/{sid}/compactions/{r.json()['id']}/cancel")
            assert r.status_code == 200, r.text

    async with (
        open_stream(reader, "/v1/events", params={"after": "now"}) as tenant,
        open_stream(reader, "/v1/sessions/s3/events", params={"after": "now"}) as one,
        httpx.AsyncClient(base_url=reader, timeout=30) as http,
    ):
        # Over the server: its requests run at once, each on a connection of its own.
        await asyncio.gather(*(work(http, sid) for sid in sids))
        last = await mark(db_url, "s3")
        everything = await tenant.until(last)
        mine = await one.until(last)
    log = [(e, t, s) for e, t, s in await logged(db_url) if e not in before]
    check_frames(everything)
    assert ids(everything) == [event_id for event_id, _, _ in log]
    assert len(everything) == 8 * 4 * 2 + 1
    for sid in sids:
        of_sid = [f.event for f in everything if f.data["session_id"] == sid]
        assert of_sid == ["compaction.queued", "compaction.cancelled"] * 4 + [MARK] * (sid == "s3")
    check_frames(mine)
    assert ids(mine) == [f.id for f in everything if f.data["session_id"] == "s3"]


async def test_a_later_transaction_committed_first_is_held_back_until_the_earlier_ends(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await make_session(client, id="s")
    first, second = await connect(db_url), await connect(db_url)
    try:
        async with (
            open_stream(reader, "/v1/sessions/s/events") as stream,
            open_stream(reader, "/v1/events") as tenant,
        ):
            early, early_place = await begin_and_emit(first, "s", n=1)
            late, late_place = await begin_and_emit(second, "s", n=2)
            assert early_place < late_place
            await late.commit()
            # Committed, but an earlier transaction may still write before it: a reader
            # that took it now would skip that one for good.
            await stream.nothing_for(2.0)
            await tenant.nothing_for(0.1)
            # A reader resuming now holds it back the same way.
            async with open_stream(
                reader, "/v1/sessions/s/events", headers={"Last-Event-ID": "1-0"}
            ) as resumed:
                await resumed.nothing_for(1.2)
                await early.commit()
                got = await resumed.take(2)
            assert ids(got) == [str(early_place), str(late_place)]
            for reading in (stream, tenant):
                assert ids(await reading.take(2)) == [str(early_place), str(late_place)]
    finally:
        await first.close()
        await second.close()


async def test_ids_taken_in_another_order_than_transactions_began_lose_nothing(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    """The transaction that began first writes the larger id, and commits first: a
    reader takes it, then the other's smaller id, which a reader ordering by id alone
    (and resuming after the larger one) would never have shown."""
    await make_session(client, id="s")
    first, second = await connect(db_url), await connect(db_url)
    try:
        async with open_stream(reader, "/v1/sessions/s/events") as stream:
            began = first.transaction()
            await began.start()
            await first.execute("SELECT pg_current_xact_id()")  # its txid: the older
            other, small = await begin_and_emit(second, "s", n=1)
            big = await events.emit(first, DEFAULT_TENANT, "s", MARK, {"n": 2})
            assert big.id > small.id
            assert big.txid < small.txid
            assert big < small  # the log's order: by transaction first
            await began.commit()
            (got,) = await stream.take(1)
            assert got.id == str(big)
            await stream.nothing_for(1.2)  # the other is still open
            # A client that leaves here resumes after the larger id...
            await other.commit()
            after_big = await stream.take(1)
            assert ids(after_big) == [str(small)]
        async with open_stream(
            reader, "/v1/sessions/s/events", headers={"Last-Event-ID": str(big)}
        ) as resumed:
            # ... and still gets the smaller one, once.
            last = await mark(db_url, "s")
            assert ids(await resumed.until(last)) == [str(small), last]
    finally:
        await first.close()
        await second.close()


async def test_transactions_committing_in_random_order_reach_every_reader_once_in_order(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    """Ten connections write at once, holding their transactions a random while, some
    rolling back: a reader that stays and one that reconnects every few events both
    get exactly the committed events, in the log's order."""
    sids = ["a", "b", "c"]
    for sid in sids:
        await make_session(client, id=sid)
    rng = random.Random(17)
    rolled_back: list[str] = []

    async def writer(n: int) -> None:
        conn = await connect(db_url)
        try:
            for k in range(15):
                tx = conn.transaction()
                await tx.start()
                places = [
                    await events.emit(
                        conn, DEFAULT_TENANT, rng.choice(sids), MARK, {"w": n, "k": k}
                    )
                    for _ in range(rng.randint(1, 3))
                ]
                await asyncio.sleep(rng.random() * 0.03)
                if rng.random() < 0.1:
                    await tx.rollback()
                    rolled_back.extend(str(p) for p in places)
                else:
                    await tx.commit()
        finally:
            await conn.close()

    stayer: list[Frame] = []
    hopper: list[Frame] = []
    listening = asyncio.Event()
    last_id: list[str] = []

    async def hop() -> None:
        """Reads a few events, leaves, comes back with Last-Event-ID, until the end."""
        while True:
            headers = {"Last-Event-ID": hopper[-1].id} if hopper else {}
            params = {} if hopper else {"after": "now"}
            async with open_stream(reader, "/v1/events", headers=headers, params=params) as s:
                listening.set()
                for _ in range(rng.randint(1, 7)):
                    hopper.append(await s.next(30))
                    if last_id and hopper[-1].id == last_id[0]:
                        return

    async with open_stream(reader, "/v1/events", params={"after": "now"}) as stream:
        hopping = asyncio.create_task(hop())
        await asyncio.wait_for(listening.wait(), 10)
        await asyncio.gather(*(writer(n) for n in range(10)))
        last_id.append(await mark(db_url, "a", end=True))
        stayer += await stream.until(last_id[0], within=30)
        await asyncio.wait_for(hopping, 60)
    log = [event_id for event_id, _, _ in await logged(db_url)]
    check_frames(stayer)
    check_frames(hopper)
    assert ids(stayer) == ids(hopper) == log
    assert not set(rolled_back) & set(log)
    assert len(log) > 100
