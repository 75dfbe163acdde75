"""What leaves the log: a deleted session's events (and nothing of another session's),
and events older than the retention (``app.store.events.expire``, which the webhook
dispatcher runs beside the workers). A stream then starts at the first event kept,
and one that resumes after an event gone resumes after its place."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from app.core.settings import Settings
from app.core.tenancy import DEFAULT_TENANT
from app.main import create_app
from app.store import events
from tests.conftest import make_session
from tests.e2e.server import running
from tests.events.sse import (
    MARK,
    check_frames,
    connect,
    eventually,
    ids,
    logged,
    mark,
    open_stream,
)
from tests.events.test_streams import cycle, seeded


@pytest.fixture
def reader(db_url: str, settings: Settings) -> Iterator[str]:
    with running(create_app(settings, database_url=db_url)) as base:
        yield base


async def age(db_url: str, event_ids: list[str], seconds: float) -> None:
    """Time travel: these events were written ``seconds`` ago."""
    conn = await connect(db_url)
    try:
        for event_id in event_ids:
            place = events.parse_place(event_id)
            assert place is not None
            done = await conn.execute(
                "UPDATE event SET created_at = now() - make_interval(secs => $3) "
                "WHERE txid = $1 AND id = $2",
                place.txid,
                place.id,
                seconds,
            )
            assert done == "UPDATE 1"
    finally:
        await conn.close()


async def test_deleting_a_session_deletes_its_events_and_no_other_s(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await seeded(client, "s", "t")
    await cycle(client, "s", 2)
    await cycle(client, "t")
    kept = await logged(db_url, session_id="t")
    assert len(await logged(db_url, session_id="s")) == 4
    assert len(kept) == 2
    r = await client.delete("/v1/sessions/s")
    assert r.status_code in (200, 204), r.text
    assert await logged(db_url, session_id="s") == []
    assert await logged(db_url, session_id="t") == kept
    # The tenant's stream no longer has them.
    last = await mark(db_url, "t")
    async with open_stream(reader, "/v1/events") as stream:
        frames = await stream.until(last)
    assert ids(frames) == [e for e, _, _ in kept] + [last]
    # A session made again under the id starts with an empty log.
    await make_session(client, id="s")
    last = await mark(db_url, "s")
    async with open_stream(reader, "/v1/sessions/s/events") as stream:
        assert ids(await stream.until(last)) == [last]


async def test_expire_deletes_what_is_older_than_the_retention_in_batches(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await seeded(client, "s")
    await cycle(client, "s", 4)
    log = [e for e, _, _ in await logged(db_url)]
    assert len(log) == 8
    old, recent = log[:5], log[5:]
    await age(db_url, old, 3 * 3600)
    conn = await connect(db_url)
    try:
        # Nothing is as old as a day.
        assert await events.expire(conn, 24 * 3600) == 0
        # Two hours: the five aged three; a batch at a time.
        assert await events.expire(conn, 2 * 3600, batch=2) == 2
        assert await events.expire(conn, 2 * 3600, batch=2) == 2
        assert await events.expire(conn, 2 * 3600, batch=2) == 1
        assert await events.expire(conn, 2 * 3600, batch=2) == 0
    finally:
        await conn.close()
    assert [e for e, _, _ in await logged(db_url)] == recent
    # A stream starts at the first event kept; one resuming after an event gone
    # resumes after its place.
    for headers in ({}, {"Last-Event-ID": old[0]}, {"Last-Event-ID": old[-1]}):
        last = await mark(db_url, "s")
        async with open_stream(reader, "/v1/sessions/s/events", headers=headers) as stream:
            frames = await stream.until(last)
        check_frames(frames)
        assert ids(frames)[:3] == recent
        assert all(f.event == MARK for f in frames[3:])
    # A tiny retention: everything written before it.
    await asyncio.sleep(0.05)
    remaining = len(await logged(db_url))
    conn = await connect(db_url)
    try:
        assert await events.expire(conn, 0.01) == remaining == 3 + 3  # and the 3 marks
    finally:
        await conn.close()
    assert await logged(db_url) == []


async def test_a_server_s_dispatcher_expires_old_events(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await seeded(client, "s")
    await cycle(client, "s", 2)
    log = [e for e, _, _ in await logged(db_url)]
    await age(db_url, log[:3], 2 * 3600)
    # Its first pass expires what is older than events_retention_seconds.
    app = create_app(
        settings.model_copy(update={"compaction_workers": 1, "events_retention_seconds": 3600.0}),
        database_url=db_url,
    )
    with running(app):

        async def expired() -> bool:
            return len(await logged(db_url)) == len(log) - 3

        await eventually(expired, "the dispatcher's expiry", within=20)
    assert [e for e, _, _ in await logged(db_url, tenant=DEFAULT_TENANT)] == log[3:]
