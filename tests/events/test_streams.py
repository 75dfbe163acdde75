"""A session's event stream over real HTTP: a client that disconnects and resumes
with ``Last-Event-ID`` gets every event exactly once, in order, across a restart of the
server (and while the server was down the events went on); ``after``; malformed ids
and unknown sessions are problems naming them; the process's cap on open streams,
which counts every stream however they arrive and however they end; keep-alives; and
open streams hold no request slot."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.compactions.helpers import compaction, conversation
from tests.compactions.worker_support import request_compaction
from tests.conftest import make_session
from tests.e2e.server import running
from tests.events.sse import (
    MARK,
    Frame,
    check_frames,
    connect,
    eventually,
    ids,
    logged,
    mark,
    open_stream,
    types,
)
from tests.helpers import append_ok, assert_problem
from tests.resilience.support import ServeProcess

MANUAL = {"compaction": {"auto": False, "keep_recent_tokens": 500}, "prune": {"auto": False}}


@pytest.fixture
def reader(db_url: str, settings: Settings) -> Iterator[str]:
    with running(create_app(settings, database_url=db_url)) as base:
        yield base


async def seeded(client: httpx.AsyncClient, *sids: str) -> None:
    """Sessions with something to compact: each compaction queued and cancelled is
    two events of the session's, on demand."""
    for sid in sids:
        await make_session(client, id=sid, config=MANUAL)
        for batch in conversation(6):
            await append_ok(client, sid, batch)


async def queue(client: httpx.AsyncClient, sid: str, **body: Any) -> str:
    job: str = (await request_compaction(client, sid, **body))["id"]
    return job


async def cancel(client: httpx.AsyncClient, sid: str, job: str) -> None:
    r = await client.post(f"/v1/sessions/{sid}/compactions/{job}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"


async def cycle(client: httpx.AsyncClient, sid: str, times: int = 1) -> None:
    """``compaction.queued`` then ``compaction.cancelled``, ``times`` times."""
    for _ in range(times):
        await cancel(client, sid, await queue(client, sid))


async def everything(base: str, path: str, db_url: str, sid: str, **kw: Any) -> list[Frame]:
    """The stream's events up to a mark written now (the mark left out)."""
    last = await mark(db_url, sid)
    async with open_stream(base, path, **kw) as stream:
        frames = await stream.until(last)
    check_frames(frames)
    return frames[:-1]


def real(frames: list[Frame]) -> list[str]:
    """The ids of the events that are not the tests' marks."""
    return [f.id for f in frames if f.event != MARK]


def without_marks(log: list[tuple[str, str, str]]) -> list[str]:
    return [event_id for event_id, type_, _ in log if type_ != MARK]


# --- resuming across a restart -------------------------------------------------------


async def test_a_client_that_disconnects_resumes_across_a_restart_exactly_once_in_order(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await seeded(client, "s", "other")
    # A first server: a client reads three events of s, and the tenant's first four,
    # then leaves. The session goes on meanwhile.
    with running(create_app(settings, database_url=db_url)) as first:
        await cycle(client, "s", 2)
        await cycle(client, "other")
        async with open_stream(first, "/v1/sessions/s/events") as stream:
            seen = await stream.take(3)
        async with open_stream(first, "/v1/events") as stream:
            seen_all = await stream.take(4)
        assert types(seen) == ["compaction.queued", "compaction.cancelled", "compaction.queued"]
        await cycle(client, "s")
        left = await queue(client, "s")
    # The server is down; the work goes on (another process of compactd, here the
    # in-process app, writes to the same log).
    await cancel(client, "s", left)
    await cycle(client, "other")
    job = await queue(client, "s", summarizer="extractive")
    # A second server on the same database, with a worker of its own: it runs the job.
    with running(
        create_app(settings.model_copy(update={"compaction_workers": 1}), database_url=db_url)
    ) as second:

        async def done() -> bool:
            status: str = (await compaction(client, "s", job))["status"]
            return status == "succeeded"

        await eventually(done, "the second server's worker runs the job", within=30)
        last = await mark(db_url, "s")
        async with open_stream(
            second, "/v1/sessions/s/events", headers={"Last-Event-ID": seen[-1].id}
        ) as stream:
            rest = await stream.until(last)
        check_frames(seen + rest)
        log = await logged(db_url, session_id="s")
        # Every event of the session once, in the log's order: none lost, none repeated.
        assert ids(seen) + ids(rest) == [event_id for event_id, _, _ in log]
        assert types(rest) == [
            "compaction.cancelled",  # seen[2]'s, before the client left
            "compaction.queued",
            "compaction.cancelled",
            "compaction.queued",  # left queued when the first server stopped
            "compaction.cancelled",  # while no server ran
            "compaction.queued",
            "compaction.started",  # the second server's worker
            "compaction.succeeded",
            MARK,
        ]
        assert rest[-2].data["data"]["compaction_id"] == job
        # The tenant's stream resumes the same way, the other session's events in it.
        last_all = await mark(db_url, "other")
        async with open_stream(
            second, "/v1/events", headers={"Last-Event-ID": seen_all[-1].id}
        ) as stream:
            rest_all = await stream.until(last_all)
        check_frames(seen_all + rest_all)
        assert ids(seen_all) + ids(rest_all) == [e for e, _, _ in await logged(db_url)]
        assert {f.data["session_id"] for f in rest_all} == {"s", "other"}


@pytest.mark.slow
@pytest.mark.parametrize("signal_", [signal.SIGTERM, signal.SIGKILL], ids=["stop", "crash"])
async def test_a_client_connected_while_compactd_serve_restarts_loses_nothing(
    client: httpx.AsyncClient,
    db_url: str,
    settings: Settings,
    tmp_path: Path,
    signal_: signal.Signals,
) -> None:
    """What an EventSource does, against ``compactd serve`` itself: its stream ends
    when the process stops (at once and cleanly on SIGTERM; cut on SIGKILL), and it
    connects again, to the next process, with the last id it saw."""
    await seeded(client, "s")
    await cycle(client, "s")
    got: list[Frame] = []
    first = ServeProcess(db_url, settings, tmp_path / "first.log")
    try:
        await first.start()
        assert first.process is not None
        async with open_stream(first.base_url, "/v1/sessions/s/events") as stream:
            got += await stream.take(2)
            await cycle(client, "s")
            got += await stream.take(2)
            # Written as the process stops: the stream may carry them, or not.
            await cycle(client, "s")
            stopped_at = time.monotonic()
            first.process.send_signal(signal_)
            async with asyncio.timeout(30):
                while (frame := await stream.frames.get()) is not None:
                    got.append(frame)
            ended = time.monotonic() - stopped_at
            resume_from = stream.last_id
        exit_code = await asyncio.wait_for(first.process.wait(), 30)
        if signal_ == signal.SIGTERM:
            # Told to end before the server waits on its connections: no 10 s grace
            # period spent on it, and a clean end of the answer.
            assert stream.error is None, stream.error
            assert ended < 5.0, ended
            # A graceful stop: serve exits with the signal's status once shut down.
            assert exit_code == 128 + signal.SIGTERM, first.log.read_text()[-2000:]
        else:
            assert stream.error is not None
    finally:
        await first.close()
    await cycle(client, "s")  # while no server runs
    second = ServeProcess(db_url, settings, tmp_path / "second.log")
    try:
        await second.start()
        last = await mark(db_url, "s")
        async with open_stream(
            second.base_url, "/v1/sessions/s/events", headers={"Last-Event-ID": resume_from}
        ) as stream:
            assert stream.start_id == resume_from
            got += await stream.until(last)
    finally:
        await second.close()
    check_frames(got)
    assert ids(got) == [event_id for event_id, _, _ in await logged(db_url, session_id="s")]
    assert types(got).count("compaction.queued") == types(got).count("compaction.cancelled") == 4


# --- where a stream starts ------------------------------------------------------------


async def test_after_an_id_and_after_now(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await seeded(client, "s")
    await cycle(client, "s", 2)
    path = "/v1/sessions/s/events"
    whole = await everything(reader, path, db_url, "s")
    assert types(whole) == ["compaction.queued", "compaction.cancelled"] * 2
    # after=<id>: what follows it, as Last-Event-ID would.
    middle = whole[1].id
    by_query = await everything(reader, path, db_url, "s", params={"after": middle})
    by_header = await everything(reader, path, db_url, "s", headers={"Last-Event-ID": middle})
    assert real(by_query) == real(by_header) == ids(whole[2:])
    assert ids(by_query)[:2] == ids(whole[2:])  # then the earlier reads' marks
    # Both: Last-Event-ID (the reconnect) wins over the URL's after.
    both = await everything(
        reader, path, db_url, "s", params={"after": whole[0].id}, headers={"Last-Event-ID": middle}
    )
    assert ids(both)[:2] == ids(whole[2:])
    # after=0-0 is before everything; a place between two events starts at the next.
    start = await everything(reader, path, db_url, "s", params={"after": "0-0"})
    assert ids(start)[:4] == ids(whole)
    # after=now: nothing of the past, then what comes.
    for stream_path in (path, "/v1/events"):
        async with open_stream(reader, stream_path, params={"after": "now"}) as stream:
            # It opens saying where it starts: the newest event there is.
            assert stream.start_id == (await logged(db_url))[-1][0]
            await stream.nothing_for(1.5)
            await cycle(client, "s")
            fresh = await stream.take(2)
            assert types(fresh) == ["compaction.queued", "compaction.cancelled"]
            assert ids(fresh) == without_marks(await logged(db_url, session_id="s"))[-2:]
        # A client that lost its stream before any event resumes from where it started,
        # and misses nothing that came meanwhile.
        async with open_stream(reader, stream_path, params={"after": "now"}) as stream:
            opened_at = stream.start_id
        await cycle(client, "s")
        resume = {"Last-Event-ID": opened_at}
        async with open_stream(reader, stream_path, headers=resume) as stream:
            assert stream.start_id == opened_at
            meanwhile = await stream.take(2)
        assert ids(meanwhile) == without_marks(await logged(db_url, session_id="s"))[-2:]
    # Without after, a stream starts before everything.
    async with open_stream(reader, path) as stream:
        assert stream.start_id == "0-0"


async def test_a_session_stream_has_only_its_own_events(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await seeded(client, "s", "t")
    await cycle(client, "s")
    await cycle(client, "t", 2)
    await cycle(client, "s")
    s_events = await everything(reader, "/v1/sessions/s/events", db_url, "s")
    t_events = await everything(reader, "/v1/sessions/t/events", db_url, "t")
    assert {f.data["session_id"] for f in s_events} == {"s"}
    assert {f.data["session_id"] for f in t_events} == {"t"}
    assert len(s_events) == len(t_events) == 4
    assert ids(s_events) == without_marks(await logged(db_url, session_id="s"))


@pytest.mark.parametrize("path", ["/v1/sessions/s/events", "/v1/events"])
@pytest.mark.parametrize(
    "value",
    [
        "abc",
        "12",
        "12-",
        "-12",
        "1-2-3",
        "1--2",
        "-1-2",
        "1.5-2",
        "0x1-2",
        "nowish",
        "9223372036854775808-1",  # past a bigint: no event has it
        "1-9223372036854775808",
    ],
)
async def test_a_malformed_event_id_is_a_problem_naming_where_it_came_from(
    client: httpx.AsyncClient, reader: str, path: str, value: str
) -> None:
    await seeded(client, "s")
    async with httpx.AsyncClient(base_url=reader, timeout=10) as http:
        r = await http.get(path, headers={"Last-Event-ID": value})
        doc = assert_problem(r, 422, "Last-Event-ID")
        assert "after" not in doc["detail"].replace("Last-Event-ID", "")
        r = await http.get(path, params={"after": value})
        assert_problem(r, 422, "after")
        # Last-Event-ID is the one read when both are given: a good one wins.
        async with http.stream(
            "GET", path, params={"after": value}, headers={"Last-Event-ID": "1-1"}
        ) as r:
            assert r.status_code == 200


@pytest.mark.parametrize("path", ["/v1/sessions/s/events", "/v1/events"])
async def test_an_over_long_event_id_is_a_problem_too(
    client: httpx.AsyncClient, reader: str, path: str
) -> None:
    await seeded(client, "s")
    async with httpx.AsyncClient(base_url=reader, timeout=10) as http:
        r = await http.get(path, headers={"Last-Event-ID": "1" * 65})
        assert_problem(r, 422, "Last-Event-ID")
        r = await http.get(path, params={"after": "1-" + "2" * 63})
        assert_problem(r, 422, "after")


async def test_an_unknown_session_is_404_and_a_deleted_one_too(
    client: httpx.AsyncClient, reader: str
) -> None:
    await seeded(client, "s")
    async with httpx.AsyncClient(base_url=reader, timeout=10) as http:
        r = await http.get("/v1/sessions/nope/events")
        assert_problem(r, 404, "nope")
        # The malformed id is not what is reported for a session that is not there.
        r = await http.get("/v1/sessions/nope/events", headers={"Last-Event-ID": "x"})
        assert_problem(r, 404, "nope")
        r = await client.delete("/v1/sessions/s")
        assert r.status_code in (200, 204), r.text
        r = await http.get("/v1/sessions/s/events")
        assert_problem(r, 404, "s")


# --- the process's streams --------------------------------------------------------------


async def test_past_the_cap_a_stream_is_refused_with_503_until_one_closes(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await seeded(client, "s")
    app = create_app(settings.model_copy(update={"event_streams_max": 1}), database_url=db_url)
    with running(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            async with open_stream(base, "/v1/sessions/s/events"):
                for path in ("/v1/sessions/s/events", "/v1/events"):
                    r = await http.get(path)
                    doc = assert_problem(r, 503, "event streams")
                    assert r.headers["retry-after"] == "5"
                    assert "1" in doc["detail"]
                # Other requests are served as usual.
                r = await http.get("/v1/sessions/s")
                assert r.status_code == 200
            # The client left: its place is free again (once the server noticed).
            await eventually(lambda: not app.state.event_hub.streams, "no stream open")
            async with open_stream(base, "/v1/events") as stream:
                await cycle(client, "s")
                assert types(await stream.take(2))[-1] == "compaction.cancelled"


async def test_streams_opened_at_once_never_pass_the_cap(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await seeded(client, "s")
    app = create_app(settings.model_copy(update={"event_streams_max": 2}), database_url=db_url)
    with running(app) as base:
        hold = asyncio.Event()

        async def attempt(path: str) -> int:
            async with (
                httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(10, read=None)) as http,
                http.stream("GET", path) as r,
            ):
                if r.status_code == 200:
                    await hold.wait()
                return r.status_code

        tasks = [
            asyncio.create_task(attempt("/v1/sessions/s/events" if i % 2 else "/v1/events"))
            for i in range(10)
        ]
        try:
            await eventually(lambda: sum(t.done() for t in tasks) >= 8, "8 refused", 15)
            assert app.state.event_hub.streams == 2
        finally:
            hold.set()
            codes = await asyncio.gather(*tasks)
        assert sorted(codes) == [200] * 2 + [503] * 8
        await eventually(lambda: not app.state.event_hub.streams, "no stream open")


async def test_a_stream_whose_client_left_before_it_started_gives_its_place_back(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    """The client leaves while the handler still reads the database (held by a lock):
    no stream stays counted, whether its body ran or not."""
    await seeded(client, "s")
    app = create_app(settings.model_copy(update={"event_streams_max": 1}), database_url=db_url)
    with running(app) as base:
        for path in ("/v1/sessions/s/events", "/v1/events"):
            blocker = await connect(db_url)
            try:
                async with blocker.transaction():
                    # Where the stream starts (after=now) waits for the log's lock.
                    await blocker.execute("LOCK TABLE event IN ACCESS EXCLUSIVE MODE")
                    async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                        leaving = asyncio.create_task(http.get(path, params={"after": "now"}))
                        await asyncio.sleep(0.5)
                        leaving.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await leaving
                    await asyncio.sleep(0.5)  # the server has seen the client go
            finally:
                await blocker.close()
            await eventually(lambda: not app.state.event_hub.streams, "no stream open")
            async with open_stream(base, path):  # the one place is free
                pass


async def test_an_idle_stream_gets_keep_alive_comments(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await seeded(client, "s")
    app = create_app(
        settings.model_copy(update={"event_stream_heartbeat_seconds": 0.2}), database_url=db_url
    )
    with running(app) as base:
        async with open_stream(base, "/v1/sessions/s/events", params={"after": "now"}) as s:
            await s.nothing_for(1.0)
            assert s.comments[:2] == [": keep-alive"] * 2, s.comments
            await cycle(client, "s")
            assert types(await s.take(2)) == ["compaction.queued", "compaction.cancelled"]


async def test_open_streams_hold_no_request_slot(
    client: httpx.AsyncClient, db_url: str, settings: Settings
) -> None:
    await seeded(client, "s")
    app = create_app(
        settings.model_copy(
            update={
                "max_concurrent_requests": 1,
                "max_queued_requests": 1,
                "request_timeout_seconds": 2.0,
            }
        ),
        database_url=db_url,
    )
    with running(app) as base:
        async with (
            open_stream(base, "/v1/sessions/s/events") as one,
            open_stream(base, "/v1/events"),
            open_stream(base, "/v1/sessions/s/events"),
            httpx.AsyncClient(base_url=base, timeout=10) as http,
        ):
            started = time.monotonic()
            r = await http.get("/v1/sessions/s")
            assert r.status_code == 200, r.text
            assert time.monotonic() - started < 1.5
            r = await http.post("/v1/sessions/s/compactions", json={})
            assert r.status_code == 202, r.text
            assert (await one.next()).event == "compaction.queued"
