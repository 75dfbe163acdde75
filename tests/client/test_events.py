"""The client's event streams against a real compactd over HTTP (each test once with
:class:`AsyncCompactd` and once with :class:`Compactd`): a session's compaction comes
out in order with its figures, a stream resumes after a given event, a tenant's stream
filters by type, and a connection cut (by a relay in between, or by a restart of the
server) is resumed by the client itself with ``Last-Event-ID``, every event once and in
order; the client gives up after its retries, and stops when closed. Then the SSE
parser alone, fed the ways a network splits a stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from typing import Any, Literal, cast

import pytest
from compactd_client import (
    AsyncCompactd,
    Compactd,
    CompactdConnectionError,
    CompactdError,
    InvalidRequestError,
    NotFoundError,
)
from compactd_client._events import Message, SSEParser, event_of
from compactd_client.types import Event

from app.core.settings import Settings
from app.main import create_app
from tests.client.conftest import serving
from tests.client.streams import Cutter, close, cutter_to, take, take_until
from tests.client.test_client import CONVERSATION, MANUAL, Awaited, turn
from tests.e2e.server import free_port, running
from tests.upstream_server import Upstream

Kind = Literal["async", "sync"]


@pytest.fixture(params=["async", "sync"])
def kind(request: pytest.FixtureRequest) -> Kind:
    return cast(Kind, request.param)


@asynccontextmanager
async def client(kind: Kind, base_url: str, **options: Any) -> AsyncIterator[AsyncCompactd]:
    """A client of ``base_url``: the async one, or the sync one awaited."""
    if kind == "async":
        async with AsyncCompactd(base_url, **options) as api:
            yield api
    else:
        with Compactd(base_url, **options) as sync:
            yield cast(AsyncCompactd, Awaited(sync))


def succeeded(event: Event) -> bool:
    return event["type"] == "compaction.succeeded"


def compaction_types(events: list[Event]) -> list[str]:
    return [e["type"] for e in events if e["type"].startswith("compaction.")]


LIFECYCLE = ["compaction.queued", "compaction.started", "compaction.succeeded"]


async def compacted(api: AsyncCompactd, sid: str, *, create: bool = True) -> str:
    """A session (``sid``) whose history was compacted (once more); the job's id."""
    if create:
        await api.create_session("gpt-4o", id=sid, config=MANUAL)
        await api.append_messages(sid, CONVERSATION)
    else:
        await api.append_messages(sid, turn(4))
    job = await api.request_compaction(sid, summarizer="extractive", wait=60)
    assert job["status"] == "succeeded", job
    return job["id"]


async def replay(api: AsyncCompactd, sid: str, compactions: int) -> list[Event]:
    """The session's log from the start up to its ``compactions``-th success."""
    stream = await api.events(sid)
    seen = 0

    def last(event: Event) -> bool:
        nonlocal seen
        seen += succeeded(event)
        return seen == compactions

    try:
        return await take_until(stream, last)
    finally:
        await close(stream)


async def test_a_compaction_streams_in_order_and_a_stream_resumes_after_an_event(
    kind: Kind, compactd_url: str
) -> None:
    async with client(kind, compactd_url) as api:
        job_id = await compacted(api, "s1")
        stream = await api.events("s1")
        try:
            got = await take_until(stream, succeeded)
            assert stream.last_event_id == got[-1]["id"]
        finally:
            await close(stream)
        assert compaction_types(got) == LIFECYCLE
        assert {e["session_id"] for e in got} == {"s1"}
        assert len({e["id"] for e in got}) == len(got)
        done = got[-1]["data"]
        assert done["compaction_id"] == job_id
        assert (done["reason"], done["summarizer"]) == ("manual", "extractive")
        assert done["tokens_before"] > done["tokens_after"] > 0
        assert all(e["created_at"] for e in got)

        # After the first: the rest, the same; after the one before last: the last.
        resumed = await api.events("s1", last_event_id=got[0]["id"])
        try:
            assert await take(resumed, len(got) - 1) == got[1:]
        finally:
            await close(resumed)
        after = await api.events("s1", after=got[-2]["id"])
        try:
            assert await take(after, 1) == got[-1:]
        finally:
            await close(after)

        # From now: what happens next, live, and nothing before it.
        live = await api.events("s1", after="now")
        try:
            second = await compacted(api, "s1", create=False)
            new = await take_until(live, succeeded)
        finally:
            await close(live)
        assert compaction_types(new) == LIFECYCLE
        assert new[-1]["data"]["compaction_id"] == second
        assert got + new == await replay(api, "s1", 2)


async def test_a_tenant_stream_has_every_session_s_events_of_the_types_asked(
    kind: Kind, compactd_url: str
) -> None:
    async with client(kind, compactd_url) as api:
        jobs = {await compacted(api, "a"), await compacted(api, "b")}
        stream = await api.tenant_events(types=["compaction.succeeded", "compaction.queued"])
        try:
            got = await take(stream, 4)
        finally:
            await close(stream)
        assert [(e["session_id"], e["type"]) for e in got] == [
            ("a", "compaction.queued"),
            ("a", "compaction.succeeded"),
            ("b", "compaction.queued"),
            ("b", "compaction.succeeded"),
        ]
        assert {e["data"]["compaction_id"] for e in got} == jobs

        # Problems come at the call, before any event.
        with pytest.raises(InvalidRequestError) as unknown:
            await api.tenant_events(types=["compaction.exploded"])
        assert [e["field"] for e in unknown.value.errors] == ["type"], unknown.value.body
        with pytest.raises(NotFoundError):
            await api.events("nobody")
        with pytest.raises(InvalidRequestError) as bad_id:
            await api.events("a", last_event_id="yesterday")
        assert [e["field"] for e in bad_id.value.errors] == ["Last-Event-ID"]


def last_event_ids(cutter: Cutter) -> list[str | None]:
    """The ``Last-Event-ID`` of each connection's request, in order (None: not sent)."""
    found: list[str | None] = []
    for head in cutter.heads:
        lines = [line.partition(":") for line in head.split("\r\n")[1:]]
        values = [value.strip() for name, _, value in lines if name.lower() == "last-event-id"]
        found.append(values[0] if values else None)
    return found


async def test_a_dropped_connection_resumes_after_the_last_event_read(
    kind: Kind, compactd_url: str
) -> None:
    with cutter_to(compactd_url) as cutter:
        async with (
            client(kind, compactd_url) as api,
            client(kind, cutter.url, backoff=0.05) as watcher,
        ):
            await compacted(api, "cut")
            stream = await watcher.events("cut")
            try:
                before = await take_until(stream, succeeded)
                assert cutter.connections == 1
                cutter.cut()
                # Written while the connection is down: read after the reconnection.
                await compacted(api, "cut", create=False)
                after = await take_until(stream, succeeded)
            finally:
                await close(stream)
            assert compaction_types(after) == LIFECYCLE
            assert before + after == await replay(api, "cut", 2)
            assert last_event_ids(cutter) == [None, before[-1]["id"]]
            # Closed: its connection is gone, and it reads nothing more.
            await until(lambda: cutter.connections == 0)
            assert await take(stream, 1) == []


async def test_a_stream_left_with_break_closes_at_the_end_of_its_block(
    compactd_url: str,
) -> None:
    async with AsyncCompactd(compactd_url) as setup:
        await compacted(setup, "blocks")
    with cutter_to(compactd_url) as cutter:
        async with AsyncCompactd(cutter.url) as api:
            async with await api.events("blocks") as events:
                async for event in events:
                    assert event["session_id"] == "blocks"
                    break
                assert cutter.connections == 1
            assert events.closed
            assert event["session_id"] == "blocks"
            await until(lambda: cutter.connections == 0)
        with Compactd(cutter.url) as sync, sync.events("blocks") as stream:
            first = next(stream)
            for _ in stream:
                break
            assert cutter.connections == 1
        assert stream.closed
        assert first == event
        assert stream.last_event_id != first["id"]  # the loop took the second
        await until(lambda: cutter.connections == 0)
        assert list(stream) == []


async def until(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)


@contextmanager
def compactd(settings: Settings, upstream: Upstream, db_url: str) -> Iterator[str]:
    with running(create_app(serving(settings, upstream), database_url=db_url)) as base:
        yield base


async def test_a_stream_goes_on_across_a_restart_of_the_server(
    kind: Kind, db_url: str, settings: Settings, upstream: Upstream
) -> None:
    with ExitStack() as first_server, cutter_to(f"http://127.0.0.1:{free_port()}") as cutter:
        first = first_server.enter_context(compactd(settings, upstream, db_url))
        cutter.point_at(first)
        async with client(kind, first) as api:
            await compacted(api, "restarted")
        async with client(kind, cutter.url, backoff=0.05) as watcher:
            stream = await watcher.events("restarted")
            try:
                before = await take_until(stream, succeeded)
                # The server goes away, its connections with it, and another comes up
                # on the same database; the stream, read again, finds it.
                cutter.cut()
                first_server.close()
                with compactd(settings, upstream, db_url) as second:
                    cutter.point_at(second)
                    async with client(kind, second) as api:
                        await compacted(api, "restarted", create=False)
                        after = await take_until(stream, succeeded)
                        assert before + after == await replay(api, "restarted", 2)
                    await close(stream)  # before the server stops: it waits for streams
            finally:
                await close(stream)
        assert compaction_types(after) == LIFECYCLE
        assert last_event_ids(cutter) == [None, before[-1]["id"]]


async def test_a_stream_gives_up_after_its_retries(kind: Kind, compactd_url: str) -> None:
    with cutter_to(compactd_url) as cutter:
        async with (
            client(kind, compactd_url) as api,
            client(kind, cutter.url, max_retries=1, backoff=0.05) as watcher,
        ):
            await compacted(api, "abandoned")
            stream = await watcher.events("abandoned")
            await take_until(stream, succeeded)
            cutter.point_at(f"http://127.0.0.1:{free_port()}")  # nobody there
            cutter.cut()
            started = time.monotonic()
            with pytest.raises(CompactdConnectionError):
                await take(stream, 1)
            # One more connection, after the wait the server asked for (retry: 2000).
            assert time.monotonic() - started >= 2.0
            assert len(cutter.heads) == 1  # the second one never reached a server
            assert stream.closed
            assert await take(stream, 1) == []
            # A session deleted meanwhile: the server's answer to the reconnection.
            cutter.point_at(compactd_url)
            again = await watcher.events("abandoned", after="now")
            await api.delete_session("abandoned")
            cutter.cut()
            with pytest.raises(NotFoundError):
                await take(again, 1)
            assert again.closed


# The parser alone.

FRAMES = (
    b"retry: 2000\n\n: keep-alive\n\n"
    b'id: 1-1\r\nevent: compaction.queued\r\ndata: {"note": "caf\xc3\xa9 \xe2\x80\xa8 end"}\r\n\r\n'
    b"id: 1-2\revent: compaction.started\rdata: line one\rdata:line two\r\r"
    b": a comment between\n"
    b"data\nid: 1-3\n\n"
    b"id: 1-4\n\n"
)
PARSED = [
    Message("1-1", "compaction.queued", '{"note": "caf\u00e9 \u2028 end"}'),
    Message("1-2", "compaction.started", "line one\nline two"),
    Message("1-3", "message", ""),
]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, len(FRAMES)])
def test_the_parser_reads_the_same_events_however_the_stream_is_split(size: int) -> None:
    parser = SSEParser()
    got = [m for i in range(0, len(FRAMES), size) for m in parser.feed(FRAMES[i : i + size])]
    assert got == PARSED
    assert parser.retry_seconds == 2.0
    # An id without data moves the place too (as the standard says).
    assert parser.last_event_id == "1-4"


def test_the_parser_drops_what_a_dropped_connection_left_unfinished() -> None:
    parser = SSEParser("0-9")
    assert parser.feed(b'\xef\xbb\xbfid: 1-1\ndata: {"half') == []
    parser.restart()
    assert parser.last_event_id == "0-9"
    assert parser.feed(b"\xef\xbb\xbfid: 1-1\ndata: x\r") == []
    assert parser.feed(b"\n\r\n") == [Message("1-1", "message", "x")]
    parser.heard = False
    assert not parser.feed(b": keep-alive\n\nretry: soon\n\n")
    assert parser.heard  # a comment: the connection is alive
    assert parser.retry_seconds is None


def test_an_event_that_is_not_compactd_s_json_is_an_error() -> None:
    event = event_of(Message("1-1", "x", '{"id": "1-1", "type": "x", "data": {}}'))
    assert event["id"] == "1-1"
    for data in ("not json", "[1, 2]", '{"type": "x"}'):
        with pytest.raises(CompactdError, match="1-1"):
            event_of(Message("1-1", "x", data))
