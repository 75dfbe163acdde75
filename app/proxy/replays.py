"""A call sent again (its history is the stored one less its last message, the reply
that answered it) is answered with that stored reply, with no upstream call and nothing
stored (docs/proxy.md, "A call sent again")."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator

import orjson

from app.core.driver import Driver
from app.engine.proxy.history import Diverged, Known, Stored, replays
from app.engine.proxy.wire import ProxyRequest, replayed_body, replayed_events, stored_reply
from app.proxy.answer import Answer, EventStream
from app.proxy.repository import ProxyRepository, StoredMessage

log = logging.getLogger("compactd.proxy")


async def replayable(
    repo: ProxyRepository,
    driver: Driver,
    session_id: str,
    found: Diverged,
    known: Known,
    tail: list[Stored],
    last_seq: int,
) -> StoredMessage | None:
    """The stored reply, when the request is exactly the one that reply answered, sent
    again: the stored history less its last message, an assistant reply (an SDK
    retrying a call whose answer it did not read, or a second call with the same
    history). It is answered with that reply, not a new one: the stored history stays
    what the agent sent and received."""
    if not found.shorter or found.entries != found.stored_entries - 1:
        return None
    last = await repo.message_at(driver, session_id, last_seq)
    if last is None or last.erased or not replays(found, known, tail, last.entry):
        return None
    return last


def replayed(request: ProxyRequest, session_id: str, stored: StoredMessage) -> Answer:
    """The answer to a call sent again: its stored reply, whole or streamed, with no
    upstream call (so no usage) and nothing stored."""
    log.info(
        "proxied call sent again: answered with its stored reply",
        extra={"session_id": session_id, "seq": stored.seq},
    )
    message = stored_reply(request.api, stored.entry)
    created = int(time.time())
    headers = {"x-compactd-replay": str(stored.seq)}
    if not request.stream:
        body = orjson.dumps(replayed_body(request.api, message, request.model, created))
        return Answer(200, {**headers, "content-type": "application/json"}, body)
    events = replayed_events(request.api, message, request.model, created, request.wants_usage)

    async def stream() -> AsyncGenerator[bytes, None]:
        for event in events:
            yield event

    async def unstarted() -> None:
        pass

    return Answer(
        200,
        {**headers, "cache-control": "no-cache"},
        stream=EventStream(stream(), unstarted),
        media_type="text/event-stream",
    )
