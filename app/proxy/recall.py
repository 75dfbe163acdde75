"""The upstream exchange of a session that offers the recall tools: the model's calls
of them answered as ``POST …/tool-calls`` answers them and the model asked again, for
up to ``ROUNDS`` requests; the agent gets the last reply, without those calls
(:mod:`app.engine.proxy.recall`; docs/proxy.md, "Recall tools")."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from app.core.errors import ProblemError
from app.engine.proxy import recall as proxy_recall
from app.engine.proxy.stream import SseEvents
from app.engine.proxy.wire import (
    Reply,
    UnreadableReply,
    replayed_body,
    replayed_events,
    upstream_bytes,
)
from app.engine.proxy.wires import wire_of
from app.proxy.answer import Answer, Delivery, EventStream
from app.proxy.call import Call, ProxyDeps
from app.proxy.forward import agent_headers
from app.proxy.replies import finish, later, record, unsent
from app.proxy.upstream import MAX_REPLY_BYTES, read_limited, refused, send
from app.recall import agent_tools
from app.recall.tool_calls import ToolCallService

log = logging.getLogger("compactd.proxy")


@dataclass(frozen=True, slots=True)
class _Last:
    """The model's last reply of the exchange, as the upstream sent it, and the rounds
    it took; ``first_usage``: what the context sent cost (the usage report's)."""

    status: int
    headers: dict[str, str]
    raw: bytes
    data: Any
    reply: Reply
    rounds: int
    first_usage: dict[str, Any] | None


async def recall_exchange(
    deps: ProxyDeps,
    call: Call,
    release: Callable[[], None],
    sending: asyncio.Future[httpx.Response],
) -> Answer:
    """:func:`app.proxy.exchange.exchange` for a session that offers the recall tools
    (see the module's docstring)."""
    checked = await refused(deps, call, await sending, release)
    if isinstance(checked, Answer):
        return checked
    last = await _rounds(deps, call, release, checked)
    if isinstance(last, Answer):
        return last
    return _answer(deps, call, release, last)


async def _rounds(
    deps: ProxyDeps, call: Call, release: Callable[[], None], response: httpx.Response
) -> _Last | Answer:
    """The model asked again while its reply calls the recall tools (and rounds are
    left); the agent's answer instead when a reply is not one of the API, or an
    upstream error ends the exchange."""
    offered, sent = call.offered, call.sent
    assert offered is not None
    assert sent is not None
    api, wire = call.request.api, wire_of(call.request)
    extra: list[dict[str, Any]] = []
    rounds, first_usage = 1, None
    while True:
        raw = await read_limited(response, MAX_REPLY_BYTES)
        headers = agent_headers(response.headers)
        try:
            data = orjson.loads(raw)
            reply = wire.reply(data)
        except (orjson.JSONDecodeError, UnreadableReply) as exc:
            log.warning(
                "proxied reply not stored: not a reply of the API",
                extra={"session_id": call.session_id, "reason": str(exc)},
            )
            later(deps, call, record(deps, call), release)
            return Answer(response.status_code, headers, raw, holds_turn=True)
        if first_usage is None:
            first_usage = reply.usage  # what the context sent cost: the report's
        wanted = proxy_recall.calls(api, reply.message, offered.names)
        if not wanted or rounds >= proxy_recall.ROUNDS:
            return _Last(response.status_code, headers, raw, data, reply, rounds, first_usage)
        answered = await _answer_recall(deps, call, wanted, last=rounds + 1 == proxy_recall.ROUNDS)
        extra += proxy_recall.round_messages(api, reply.message, answered)
        body = upstream_bytes(
            offered.request, proxy_recall.extended(sent.messages, extra), sent.system
        )
        checked = await refused(deps, call, await send(deps, call, body), release)
        if isinstance(checked, Answer):
            return checked
        response, rounds = checked, rounds + 1


def _answer(deps: ProxyDeps, call: Call, release: Callable[[], None], last: _Last) -> Answer:
    """The last reply as the agent gets it: as sent when the exchange took one round
    and called no recall tool, else rewritten without those calls."""
    offered = call.offered
    assert offered is not None
    api, reply, request = call.request.api, last.reply, call.request
    message = proxy_recall.without_calls(api, reply.message, offered.names)
    finish_reason = reply.finish_reason if message == reply.message else None
    headers = {**last.headers, "x-compactd-recall-rounds": str(last.rounds - 1)}
    delivery = Delivery(
        _delivered(deps, call, release, Reply(message, finish_reason, last.first_usage))
    )
    if last.rounds == 1 and message == reply.message and not request.stream:
        return Answer(last.status, headers, last.raw, holds_turn=True, delivery=delivery)
    created = int(time.time())
    found_id = last.data.get("id") if isinstance(last.data, dict) else None
    response_id = found_id if isinstance(found_id, str) else None
    if not request.stream:
        whole = replayed_body(api, message, request.model, created, reply.usage, response_id)
        return Answer(
            200,
            {**headers, "content-type": "application/json"},
            orjson.dumps(whole),
            holds_turn=True,
            delivery=delivery,
        )
    events = replayed_events(
        api, message, request.model, created, request.wants_usage, reply.usage, response_id
    )
    # Stored as a streamed reply is: the message the agent builds from the events.
    reader = wire_of(request).reader(request)
    parsed = SseEvents()
    for event in events:
        for read in parsed.feed(event):
            reader.feed(read)
    delivered = _delivered(
        deps, call, release, Reply(reader.reply().message, finish_reason, last.first_usage)
    )
    headers.pop("content-type", None)
    return _streamed(events, headers, delivered)


def _delivered(
    deps: ProxyDeps, call: Call, release: Callable[[], None], stored: Reply
) -> Callable[[bool], None]:
    """What the reply leaves to do once it went out (``sent``) or not."""

    def delivered(sent: bool) -> None:
        later(deps, call, (finish if sent else unsent)(deps, call, stored), release)

    return delivered


def _streamed(
    events: list[bytes], headers: dict[str, str], delivered: Callable[[bool], None]
) -> Answer:
    """The rewritten reply as server-sent events; told whether they all went out."""

    async def stream() -> AsyncGenerator[bytes, None]:
        sent = False
        try:
            for event in events:
                yield event
            sent = True
        finally:
            delivered(sent)

    async def unstarted() -> None:
        delivered(False)

    return Answer(
        200,
        {**headers, "cache-control": "no-cache"},
        stream=EventStream(stream(), unstarted),
        media_type="text/event-stream",
        holds_turn=True,
    )


async def _answer_recall(
    deps: ProxyDeps, call: Call, wanted: list[dict[str, Any]], *, last: bool
) -> list[tuple[dict[str, Any], str, bool]]:
    """Each recall call run as POST …/tool-calls runs it; one round's results hold
    ``recall.result_tokens`` together. Before the last round, the results say so."""
    answered: list[tuple[dict[str, Any], str, bool]] = []
    tools = ToolCallService(deps.engine, deps.tenant_id)
    share: int | None = None
    for raw in wanted:
        try:
            if share is None:
                share = max(
                    agent_tools.MIN_RESULT_TOKENS,
                    await tools.result_tokens(call.session_id) // len(wanted),
                )
            ran = await tools.run(call.session_id, raw, share)
            text, is_error = ran.content, ran.is_error
        except ProblemError as exc:
            text, is_error = f"Error: {exc.detail}", True
        if last:
            text = f"{text}\n\n{proxy_recall.LAST_ROUND_NOTE}"
        answered.append((raw, text, is_error))
    return answered
