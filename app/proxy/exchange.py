"""The upstream's answer passed back to the agent: whole, or streamed event for event;
once complete and sent, the reply is stored (:mod:`app.proxy.replies`). What the agent
did not get (a whole reply it hung up on, a stream cut short) is not stored
(docs/proxy.md, "Inside a call", steps 5 and 6)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Callable

import httpx
import orjson

from app.engine.proxy.stream import EventTooLarge, SseEvents
from app.engine.proxy.wire import Reply, UnreadableReply
from app.engine.proxy.wires import StreamReader, wire_of
from app.proxy.answer import Answer, Delivery, EventStream
from app.proxy.call import Call, ProxyDeps
from app.proxy.forward import agent_headers
from app.proxy.replies import finish, later, record, unsent
from app.proxy.upstream import MAX_REPLY_BYTES, read_limited, refused

log = logging.getLogger("compactd.proxy")


async def exchange(
    deps: ProxyDeps,
    call: Call,
    release: Callable[[], None],
    sending: asyncio.Future[httpx.Response],
) -> Answer:
    """The upstream's answer (``sending``: the request with the call's context, on
    its way), retried once after an overflow error that a relief made room for."""
    checked = await refused(deps, call, await sending, release)
    if isinstance(checked, Answer):
        return checked
    response = checked
    content_type = response.headers.get("content-type", "")
    if call.request.stream and content_type.startswith("text/event-stream"):

        async def unstarted() -> None:
            await response.aclose()
            later(deps, call, record(deps, call), release)

        return Answer(
            response.status_code,
            agent_headers(response.headers),
            stream=EventStream(_events(deps, call, response, release), unstarted),
            media_type="text/event-stream",
            holds_turn=True,
        )
    raw = await read_limited(response, MAX_REPLY_BYTES)
    headers = agent_headers(response.headers)
    try:
        reply = wire_of(call.request).reply(orjson.loads(raw))
    except (orjson.JSONDecodeError, UnreadableReply) as exc:
        log.warning(
            "proxied reply not stored: not a reply of the API",
            extra={"session_id": call.session_id, "reason": str(exc)},
        )
        later(deps, call, record(deps, call), release)
        return Answer(response.status_code, headers, raw, holds_turn=True)

    def delivered(sent: bool) -> None:
        if sent:
            later(deps, call, finish(deps, call, reply), release)
            return
        # The agent gave up waiting (its SDK may be retrying): a reply it never got
        # is not its history. The call's new messages are, and recorded; the tokens
        # the provider spent on it are reported all the same.
        log.warning(
            "proxied reply not stored: the agent hung up before it was sent",
            extra={"session_id": call.session_id},
        )
        later(deps, call, unsent(deps, call, reply), release)

    return Answer(response.status_code, headers, raw, holds_turn=True, delivery=Delivery(delivered))


async def _events(
    deps: ProxyDeps, call: Call, response: httpx.Response, release: Callable[[], None]
) -> AsyncGenerator[bytes, None]:
    """The upstream's events as they come; once the stream is complete, the reply is
    stored (after its end reached the agent, the session's turn held until then)."""
    wire = wire_of(call.request)
    reader = wire.reader(call.request)
    events = SseEvents()
    broken: str | None = None
    try:
        try:
            async for chunk in response.aiter_bytes():
                for event in events.feed(chunk):
                    if reader.feed(event):
                        yield event.raw
        except (httpx.HTTPError, EventTooLarge) as exc:
            broken = f"the upstream broke off its stream: {type(exc).__name__}"
        if broken is None and reader.unfinished:
            # It ended cleanly but before its finish reason: what came is part of a
            # reply, which the agent's SDK would hand on as if it were all of it.
            broken = "the upstream's stream ended before its finish reason"
        rest = events.rest()
        if broken is not None:
            # In the API's own words, so that the agent's SDK raises it. An event cut
            # off midway is not passed on: a client never dispatches one (SSE), and it
            # would run into the error event's lines.
            yield wire.stream_error(broken)
        elif rest:
            yield rest
    finally:
        await response.aclose()
        reply = _streamed_reply(reader) if broken is None and reader.complete else None
        if reply is not None:
            later(deps, call, finish(deps, call, reply), release)
        else:
            # Cut short (or the agent hung up first): nothing of it is stored; the
            # call's new messages are, and the history's record moves on with them.
            log.warning(
                "proxied stream not stored: it ended before its last event",
                extra={"session_id": call.session_id, "failed": broken or reader.failed},
            )
            later(deps, call, record(deps, call), release)


def _streamed_reply(reader: StreamReader) -> Reply | None:
    """A complete stream's reply (None when it cannot be stored, a Responses reply's item
    the store refuses: the agent has it, and its next call carries it)."""
    try:
        return reader.reply()
    except UnreadableReply as exc:
        log.warning("proxied stream not stored: %s", exc)
        return None
