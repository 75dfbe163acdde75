"""HTTP routes for events: a session's stream and a tenant's, as server-sent events.

Each event is ``id: <event id>``, ``event: <type>``, ``data: <JSON>`` (its id, type,
session, time and data). A client that reconnects with ``Last-Event-ID`` (every SSE
client does) gets every event after that one exactly once, in order, across
restarts of the server, as long as it is retained (``events_retention_seconds``).
``after`` does the same as a query parameter (``now``: only events to come). An idle
stream gets a comment line every ``event_stream_heartbeat_seconds``.

Streams hold no request slot (they would hold it for hours); the process opens at
most ``event_streams_max`` of them and answers 503 past that.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.core.database import EngineDep, driver_connection
from app.core.driver import Driver
from app.core.errors import NotFound, ServiceUnavailable, invalid
from app.core.openapi import problems
from app.core.tenancy import TenantDep
from app.events.hub import EventHub, Waiter
from app.sessions.router import SessionIdPath, checked_id
from app.store import events
from app.store.session_row import read_state

router = APIRouter(tags=["events"])

PAGE = 500

LastEventId = Annotated[
    str | None,
    Header(
        alias="Last-Event-ID",
        max_length=64,
        description="Resume after this event (sent by SSE clients when they reconnect).",
    ),
]
After = Annotated[
    str | None,
    Query(
        max_length=64,
        description="Start after this event id, or `now` for only the events to come. "
        "Default: every retained event. `Last-Event-ID` wins when both are given.",
    ),
]
Types = Annotated[
    list[str],
    Query(
        alias="type",
        max_length=len(events.TYPES),
        description="Only events of these types (repeatable).",
    ),
]

# One event of the stream (OpenAPI 3.1: a text/event-stream schema describes each event,
# as 3.2's itemSchema does).
_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "event", "data"],
    "properties": {
        "id": {"type": "string", "pattern": "^[0-9]+-[0-9]+$", "description": "The event id."},
        "event": {"type": "string", "enum": list(events.TYPES), "description": "Its type."},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "description": "The event as JSON: id, type, session_id, created_at, data.",
        },
        "retry": {"type": "integer"},
    },
}
_STREAM_DOC: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A stream of server-sent events.",
        "content": {"text/event-stream": {"schema": _EVENT_SCHEMA}},
    },
    **problems(404, 422),
}


def _hub(request: Request, tenant: str) -> EventHub:
    hub: EventHub = request.app.state.event_hub
    settings = request.app.state.settings
    if hub.closing:
        raise ServiceUnavailable("the server is shutting down")
    if hub.streams >= settings.event_streams_max:
        raise ServiceUnavailable(
            f"this process has {hub.streams} event streams open, its maximum; retry shortly",
            headers={"Retry-After": "5"},
        )
    if hub.tenant_streams(tenant) >= settings.event_streams_per_tenant_max:
        raise ServiceUnavailable(
            f"this tenant has {hub.tenant_streams(tenant)} event streams open, its maximum "
            "(COMPACTD_EVENT_STREAMS_PER_TENANT_MAX); close one, or use GET /v1/events",
            headers={"Retry-After": "5"},
        )
    return hub


def _join(request: Request, tenant: str, session_id: str | None) -> Waiter:
    """The stream's place among the process's, checked and taken with no ``await``
    between: the body of a stream runs only once its answer has started, so streams
    asked for at once would all pass the check before any of them counted."""
    return _hub(request, tenant).join(tenant, session_id)


async def _start(
    driver: Driver, tenant: str, session_id: str | None, last: str | None, after: str | None
) -> events.Place:
    given, field = (last, "Last-Event-ID") if last is not None else (after, "after")
    if given is None or given == "":
        return events.START
    if given == "now":
        return await events.latest(driver, tenant, session_id)
    place = events.parse_place(given)
    if place is None:
        raise invalid(field, f"{given[:64]!r} is not an event id (like 8123-42) or `now`")
    return place


def _check_types(types: list[str]) -> list[str] | None:
    unknown = [t for t in types if t not in events.TYPES]
    if unknown:
        raise invalid(
            "type", f"unknown event type {unknown[0][:64]!r}; known: {', '.join(events.TYPES)}"
        )
    return types or None


def _frame(event: events.Event) -> bytes:
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (
        str(event.place).encode(),
        event.type.encode(),
        event.document(),
    )


async def _stream(
    request: Request,
    waiter: Waiter,
    tenant: str,
    session_id: str | None,
    start: events.Place,
    types: list[str] | None,
) -> AsyncIterator[bytes]:
    hub = waiter.hub
    engine = request.app.state.engine
    settings = request.app.state.settings
    heartbeat = settings.event_stream_heartbeat_seconds
    poll = min(1.0, heartbeat)
    cursor = start
    idle = 0.0
    try:
        # Where it starts, as an id without data: a client that loses the stream before
        # its first event resumes from here (with after=now, it would skip what came).
        yield b"retry: 2000\nid: %s\n\n" % str(start).encode()
        while not hub.closing:

            async def fetch(after: events.Place = cursor) -> list[events.Event]:
                async with driver_connection(engine) as driver:
                    if session_id is None:
                        return await events.tenant_after(driver, tenant, after, PAGE, types)
                    return await events.session_after(driver, tenant, session_id, after, PAGE)

            # Streams at the same place of the same log, woken by the same event, share
            # one read (100 streams of a session: one query, not 100).
            key = (tenant, session_id, cursor, tuple(types or ()))
            batch = await hub.read(key, fetch)
            for event in batch:
                cursor = event.place
                if types is None or event.type in types:
                    yield _frame(event)
            if len(batch) == PAGE:
                continue
            if batch:
                idle = 0.0
            await waiter.wait(poll)
            idle += poll
            if idle >= heartbeat:
                idle = 0.0
                yield b": keep-alive\n\n"
    finally:
        waiter.close()


class _EventStream(StreamingResponse):
    """A stream that gives its place back however it ends, even when its body never
    ran (the client left before the answer started)."""

    def __init__(self, body: AsyncIterator[bytes], waiter: Waiter) -> None:
        super().__init__(
            body,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.waiter = waiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.waiter.close()


def _response(
    request: Request,
    tenant: str,
    session_id: str | None,
    start: events.Place,
    types: list[str] | None,
) -> StreamingResponse:
    waiter = _join(request, tenant, session_id)  # after the handler's last await
    return _EventStream(_stream(request, waiter, tenant, session_id, start, types), waiter)


@router.get(
    "/v1/sessions/{session_id}/events",
    response_class=StreamingResponse,
    responses=_STREAM_DOC,
)
async def session_events(
    request: Request,
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    last_event_id: LastEventId = None,
    after: After = None,
) -> StreamingResponse:
    """The session's events as server-sent events: verdict changes, prunes,
    compactions queued, started, retried, succeeded, failed and cancelled (with the
    tokens before and after), navigations and hook calls (see docs/events.md)."""
    sid = checked_id(session_id)
    _hub(request, tenant)  # full: refused before any database work
    async with driver_connection(engine) as driver:
        if await read_state(driver, tenant, sid) is None:
            raise NotFound(f"session {sid!r} does not exist")
        start = await _start(driver, tenant, sid, last_event_id, after)
    return _response(request, tenant, sid, start, None)


@router.get("/v1/events", response_class=StreamingResponse, responses=_STREAM_DOC)
async def tenant_events(
    request: Request,
    engine: EngineDep,
    tenant: TenantDep,
    last_event_id: LastEventId = None,
    after: After = None,
    types: Types = [],  # noqa: B006 - FastAPI reads the default, never mutates it
) -> StreamingResponse:
    """Every event of the tenant's sessions (and the tenant's own: a webhook
    disabled), in the same format and order guarantees as a session's stream."""
    _hub(request, tenant)  # full: refused before any database work
    wanted = _check_types(types)
    async with driver_connection(engine) as driver:
        start = await _start(driver, tenant, None, last_event_id, after)
    return _response(request, tenant, None, start, wanted)
