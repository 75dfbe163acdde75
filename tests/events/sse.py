"""An event stream held open against a real server, read frame by frame, and the log
read straight from the database to compare it with.

:class:`Stream` reads in a task of its own into a queue, so that waiting for the next
event with a timeout never cuts a read in half. :func:`mark` writes an event through
the log's own :func:`app.store.events.emit`: read up to it, a stream has shown
everything before it, so a test can say "exactly these, and nothing else"."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import orjson

from app.core.tenancy import DEFAULT_TENANT
from app.store import events
from tests import postgres

# The type of the events tests write to mark a place in the log (any known type does:
# nothing subscribes to it here).
MARK = "webhook.test"
# An event's time: UTC, microseconds, Z (docs/events.md).
CREATED_AT = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")


@dataclass(frozen=True)
class Frame:
    """One server-sent event: its ``id:``, ``event:`` and parsed ``data:`` lines."""

    id: str
    event: str
    data: dict[str, Any]


@dataclass
class Stream:
    """An open ``GET`` of an event stream (see :func:`open_stream`)."""

    response: httpx.Response
    frames: asyncio.Queue[Frame | None] = field(default_factory=asyncio.Queue)
    comments: list[str] = field(default_factory=list)
    retry: list[str] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None
    # Every id line, as an EventSource keeps its lastEventId: the opening one (where
    # the stream starts, with no data) and each event's.
    id_lines: list[str] = field(default_factory=list)

    @property
    def start_id(self) -> str:
        """Where the server says the stream starts (its first id line, before any event)."""
        return self.id_lines[0]

    @property
    def last_id(self) -> str:
        """What a client sends as Last-Event-ID when it connects again."""
        return self.id_lines[-1]

    async def _read(self) -> None:
        fields: dict[str, str] = {}
        try:
            async for line in self.response.aiter_lines():
                if line == "":
                    if "data" in fields:
                        await self.frames.put(
                            Frame(fields["id"], fields["event"], orjson.loads(fields["data"]))
                        )
                    fields = {}
                elif line.startswith(":"):
                    self.comments.append(line)
                else:
                    name, _, value = line.partition(": ")
                    if name == "retry":
                        self.retry.append(value)
                    else:
                        assert name not in fields, f"{name!r} twice in one frame: {line!r}"
                        fields[name] = value
                        if name == "id":
                            self.id_lines.append(value)
        except (httpx.HTTPError, OSError) as exc:
            self.error = exc
        finally:
            self.ended.set()
            await self.frames.put(None)

    async def next(self, within: float = 20.0) -> Frame:
        """The next event; fails when none comes within ``within`` s or the stream ends."""
        frame = await asyncio.wait_for(self.frames.get(), within)
        assert frame is not None, f"the stream ended ({self.error!r})"
        return frame

    async def take(self, count: int, within: float = 20.0) -> list[Frame]:
        return [await self.next(within) for _ in range(count)]

    async def until(self, event_id: str, within: float = 20.0) -> list[Frame]:
        """Every event up to and including ``event_id`` (which must come)."""
        got: list[Frame] = []
        while not got or got[-1].id != event_id:
            got.append(await self.next(within))
        return got

    async def nothing_for(self, seconds: float) -> None:
        """Fails when an event comes within ``seconds``."""
        with contextlib.suppress(TimeoutError):
            frame = await asyncio.wait_for(self.frames.get(), seconds)
            raise AssertionError(f"an event came: {frame}")


@contextlib.asynccontextmanager
async def open_stream(
    base: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    params: Any = None,  # as httpx takes them: a dict, or (name, value) pairs
) -> AsyncIterator[Stream]:
    """An event stream, open (200, ``text/event-stream``, its ``retry:`` line and the
    ``id:`` line saying where it starts read: the server holds its place among the
    streams) until the block ends, when the client disconnects."""
    async with (
        httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(20.0, read=None)) as client,
        client.stream(
            "GET", path, headers=headers or {}, params=httpx.QueryParams(params)
        ) as response,
    ):
        if response.status_code != 200:
            raise AssertionError(f"{response.status_code}: {(await response.aread())!r}")
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        stream = Stream(response)
        reader = asyncio.create_task(stream._read())
        try:
            for _ in range(200):  # the first lines are sent at once
                if stream.id_lines or stream.ended.is_set():
                    break
                await asyncio.sleep(0.01)
            assert stream.retry == ["2000"], (stream.retry, stream.error)
            assert events.parse_place(stream.start_id) is not None, stream.id_lines
            yield stream
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


async def connect(db_url: str) -> asyncpg.Connection[asyncpg.Record]:
    conn: asyncpg.Connection[asyncpg.Record] = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    return conn


async def mark(db_url: str, session_id: str, tenant: str = DEFAULT_TENANT, **data: Any) -> str:
    """Write an event (``MARK``) to the session's log, committed; its id."""
    conn = await connect(db_url)
    try:
        async with conn.transaction():
            place = await events.emit(conn, tenant, session_id, MARK, {"mark": True, **data})
        return str(place)
    finally:
        await conn.close()


async def logged(
    db_url: str, *, tenant: str = DEFAULT_TENANT, session_id: str | None = None
) -> list[tuple[str, str, str]]:
    """The log as the database holds it, in its order: (event id, type, session id)."""
    conn = await connect(db_url)
    try:
        rows = await conn.fetch(
            "SELECT txid || '-' || id AS event_id, type, session_id FROM event "
            "WHERE tenant_id = $1 AND ($2::text IS NULL OR session_id = $2) "
            "ORDER BY event.txid, event.id",
            tenant,
            session_id,
        )
        return [(r["event_id"], r["type"], r["session_id"]) for r in rows]
    finally:
        await conn.close()


def ids(frames: list[Frame]) -> list[str]:
    return [f.id for f in frames]


def types(frames: list[Frame]) -> list[str]:
    return [f.event for f in frames]


def check_frames(frames: list[Frame]) -> None:
    """Each frame's ``data`` is the event's document and repeats its id and type; the
    frames are in the log's order, (txid, id), none twice."""
    places: list[events.Place] = []
    for f in frames:
        assert f.data["id"] == f.id, f
        assert f.data["type"] == f.event, f
        assert set(f.data) == {"id", "type", "session_id", "created_at", "data"}, f
        assert isinstance(f.data["data"], dict), f
        assert CREATED_AT.fullmatch(f.data["created_at"]), f
        place = events.parse_place(f.id)
        assert place is not None, f
        places.append(place)
    assert places == sorted(set(places)), f"out of order or repeated: {ids(frames)}"


async def eventually(
    check: Callable[[], bool | Awaitable[bool]], what: str, within: float = 10.0
) -> None:
    """Wait until ``check()`` holds; fails after ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        held = check()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.05)
