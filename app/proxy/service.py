"""A proxied model call: the agent's request in, the managed context upstream, the reply
back and into the stored history.

One call, in order:

1. The session named by ``X-Compactd-Session`` (created on first use with the request's
   model) and what the proxy knows of its stored history (:mod:`app.proxy.repository`),
   read on the pooled connection the call keeps until its request is upstream.
2. Matching (:mod:`app.engine.proxy.history`): the request's history must be the stored
   one followed by new messages. A request that is the stored history less its last
   message, an assistant reply, is the call that reply answered sent again (an SDK's
   retry of an answer sent but not read): it gets that reply again, from the store, with
   no upstream call (:meth:`ProxyService._replay`). Any other request that departs from
   the stored history goes on elsewhere (:mod:`app.proxy.conversations`), and is matched
   there: another first message is another conversation of the agent (a title request,
   a subagent), in a child session of the named one; a departure after a shared prefix
   (the agent edited or compacted its history) goes on on a new branch of the session's
   tree from the last shared message.
3. The new messages are appended (:class:`app.messages.service.AppendService`, with the
   session's version as ``If-Match``), and the context is built (:mod:`app.proxy.context`):
   ``GET /context``'s, read right after the append, or, when nothing but the proxy's own
   appends moved the session since the last call, the context that call sent extended by
   them; it is recorded as served, as ``GET /context`` records it.
4. The agent's request goes upstream with the context in place of its history and with
   everything else as sent (:mod:`app.engine.proxy.wire`). The context's version served
   is recorded, and the connection given back, while the request is on its way: none is
   held while the upstream answers.
5. The reply comes back whole, or as the provider streams it, event for event. A
   provider's context-overflow error is relieved (the provider-error path of
   :mod:`app.budget`: prune, and an emergency compaction when that is not enough) and
   the call retried once, only if the context is now smaller; any other error passes
   through with its status and body.
6. Once the reply is complete: its usage is reported (with the stop reason and the
   context version sent) and, once it has gone out to the agent, the reply is stored
   and the proxy's record of the history moved on. A whole reply the agent hung up on
   before it was sent (its SDK timed out) is not stored (:class:`Delivery`), nor
   anything of a stream that breaks off, carries an error, or loses its agent before
   its last event: what the agent did not get is not its history (and should it have
   got it after all, its next call carries it, and stores it). A reply with nothing to
   send back (no text, no tool call) waits for the agent's next call to carry it, or
   not. The agent does not wait for the storing; its next call on the session does (it
   waits for the session's turn), so it always finds its reply stored. A read of the
   session (GET .../messages) right after a call may come before the reply is stored:
   it is, a few milliseconds later.

Calls on one session are served one at a time in a process (:class:`_Turns`): the
second waits for the first to end, then is matched against the history the first left
(so a second call that does not carry the first one's reply goes on on a branch, and
one with the same history as the first is answered with its reply); a side
conversation's call keeps its named session's turn. Across
processes, appends carry the session's version (``If-Match``), and a reply is stored
only if no message was stored after the call's own; otherwise it is left out, and the
agent's next call, which carries it, stores it as its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.budget.schemas import ProviderError, UsageReport
from app.budget.service import BudgetService
from app.compactions import pivot
from app.compactions.service import CompactionService
from app.context.assembly import Built
from app.core import metrics
from app.core.database import driver_connection
from app.core.driver import Driver
from app.core.errors import (
    BadRequest,
    Conflict,
    PreconditionFailed,
    ProblemError,
    UnprocessableContent,
)
from app.core.http import run_sized
from app.core.outbound import redact_url
from app.core.settings import Settings
from app.engine.accounting import catalog, overflow_errors, provider_usage
from app.engine.accounting.tokens import EncodingName
from app.engine.formats.anthropic_format import system_messages_allowed
from app.engine.formats.storable import find_unstorable
from app.engine.model import Entry, InvalidMessage
from app.engine.proxy import recall as proxy_recall
from app.engine.proxy import responses_format
from app.engine.proxy.conversations import declares_tools
from app.engine.proxy.history import (
    Diverged,
    Known,
    Matched,
    Stored,
    contentless,
    digest,
    extend,
    match,
    raw_known,
    replays,
    start,
)
from app.engine.proxy.stream import (
    EventTooLarge,
    SseEvents,
)
from app.engine.proxy.wire import (
    PARSERS,
    ProxyRequest,
    Reply,
    UnreadableReply,
    Wire,
    overhead_tokens,
    replayed_body,
    replayed_events,
    retry_target,
    stored_reply,
    upstream_bytes,
)
from app.engine.proxy.wires import WIRES, StreamReader, wire_of
from app.messages.schemas import AppendRequest
from app.messages.service import Appended, AppendService, oversized_arguments
from app.proxy.conversations import MOVES, Conversations, Placed
from app.proxy.errors import BadGateway, GatewayTimeout
from app.proxy.forward import ProxyClient, agent_headers, upstream_headers, with_query
from app.proxy.repository import KnownRow, ProxyRepository, StoredMessage
from app.recall import agent_tools
from app.recall.tool_calls import ToolCallService
from app.sessions import service as sessions
from app.sessions.schemas import SESSION_ID_PATTERN, SessionCreate
from app.store.session_row import locked, read_state, record_served

log = logging.getLogger("compactd.proxy")

SESSION_HEADER = "x-compactd-session"
# Appends that lose their If-Match to another writer (a compaction committing, a usage
# report) are tried again this many times in all.
ATTEMPTS = 4
# Stored message entries read per statement when catching up on appends the proxy did
# not make (the /v1 API, another process), or locating a divergence.
PAGE = 1000
# The most of an upstream error body read (for the overflow classifier, and passed on).
MAX_ERROR_BYTES = 4 * 1024 * 1024
# The most of a whole reply read.
MAX_REPLY_BYTES = 64 * 1024 * 1024
_PATH_HEAD = re.compile(r"^messages\[(\d+)\]")
# The sessions the proxy creates: no synthetic "continue" after an automatic compaction,
# since the agent's call in flight carries its real next message.
PROXY_SESSION_CONFIG: dict[str, Any] = {"compaction": {"auto_continue": False}}


class EventStream:
    """A streamed reply's events, closed exactly once however the response ends: its
    events iterated to the end, abandoned midway (the agent hung up), or never started
    (the agent hung up before the first). Closing it runs what the stream leaves to do
    (``on_unstarted`` when it never started)."""

    def __init__(
        self, events: AsyncGenerator[bytes, None], on_unstarted: Callable[[], Awaitable[None]]
    ) -> None:
        self._events = events
        self._on_unstarted = on_unstarted
        self._started = False

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> bytes:
        self._started = True
        return await self._events.__anext__()

    async def aclose(self) -> None:
        if self._started:
            await self._events.aclose()  # runs its cleanup if it stopped midway
        else:
            self._started = True
            await self._on_unstarted()


class Delivery:
    """What a whole reply leaves to do once its response has ended, told exactly once
    whether its body went out to an agent still connected (only then is it stored)."""

    def __init__(self, then: Callable[[bool], None]) -> None:
        self._then: Callable[[bool], None] | None = then

    def __call__(self, sent: bool) -> None:
        then, self._then = self._then, None
        if then is not None:
            then(sent)


@dataclass(slots=True)
class Answer:
    """What goes back to the agent: a whole body, or a stream of events (close it once
    the response has ended). A whole reply to store comes with its ``delivery``: tell it,
    once the response has ended, whether the body was sent."""

    status: int
    headers: dict[str, str]
    body: bytes = b""
    stream: EventStream | None = None
    media_type: str = "application/json"
    # The session's turn passed on to what the call left to do (storing its reply).
    holds_turn: bool = False
    delivery: Delivery | None = None


@dataclass(slots=True)
class _Call:
    """One call in progress: the request, what was matched and stored, what was sent."""

    request: ProxyRequest
    session_id: str
    created_at: datetime  # the session's (app.context.assembly.Contexts tells sessions apart by it)
    headers: list[tuple[str, str]]
    matched: Matched
    overhead: int
    context: Built  # the context to send first
    known: Known  # after the new messages were stored
    last_seq: int  # of the last message entry the proxy knows is stored
    session_version: int  # the session's, as the call's own writes left it
    # The path of the session's tree the call's history is (a navigation moves it).
    path: tuple[tuple[int, ...], tuple[int, ...]] = ((0,), ())
    version: int = 0  # of the context sent
    sent_tokens: int = 0  # counted tokens of the context sent
    attempts: int = 0  # upstream requests made
    stored_reply: bool = field(default=False)
    # The request with the recall tools, when the session offers them.
    offered: proxy_recall.Offered | None = None
    # Anthropic: later system entries go as ``role: "system"`` messages (the request
    # allows them: anthropic_format.system_messages_allowed), not as ``<system>`` text.
    system_messages: bool = False
    sent: Built | None = None  # the context sent last


class _Turns:
    """One call at a time per session in this process (see the module's docstring)."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    def busy(self, key: tuple[str, str]) -> bool:
        """Whether a call has the session's turn, or waits for it."""
        return key in self._locks

    async def take(self, key: tuple[str, str], wait_seconds: float) -> Callable[[], None]:
        """Wait for the session's turn (at most ``wait_seconds``, then 409); returns the
        function that gives it back (call it exactly once)."""
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)

        def leave() -> None:
            held, count = self._locks[key]
            if count == 1:
                del self._locks[key]
            else:
                self._locks[key] = (held, count - 1)

        try:
            async with asyncio.timeout(wait_seconds):
                await lock.acquire()
        except TimeoutError:
            leave()
            raise Conflict(
                f"another call on session {key[1]!r} has been in progress for {wait_seconds:g} s; "
                "calls on one session are served one at a time"
            ) from None
        except BaseException:
            leave()
            raise

        def release() -> None:
            lock.release()
            leave()

        return release


_turns = _Turns()


# Overheads counted lately, by the system prompt and tools they count: an agent sends the
# same ones call after call, and a long system prompt takes a millisecond to tokenize.
_OVERHEADS: dict[bytes, int] = {}
_OVERHEADS_KEPT = 256


def _overhead(request: ProxyRequest, encoding: EncodingName) -> int:
    key = orjson.dumps(
        [
            request.wire,
            encoding,
            request.system,
            request.body.get("tools"),
            request.body.get("instructions") if request.responses else None,
        ]
    )
    found = _OVERHEADS.pop(key, None)
    if found is None:
        found = overhead_tokens(request, encoding)
        if len(_OVERHEADS) >= _OVERHEADS_KEPT:
            del _OVERHEADS[next(iter(_OVERHEADS))]
    _OVERHEADS[key] = found  # the newest last
    return found


def _session_id(header: str | None) -> str:
    """The X-Compactd-Session header's session id, or the 400 that says what is wrong."""
    if not header:
        raise BadRequest(
            "the X-Compactd-Session header is missing: name the session this call "
            "belongs to (any id of 1-128 letters, digits and . _ : -; created on first use)",
            errors=[{"field": "X-Compactd-Session", "detail": "missing"}],
        )
    if not re.fullmatch(SESSION_ID_PATTERN, header):
        raise BadRequest(
            f"X-Compactd-Session {header[:200]!r} is not a session id: 1-128 letters, "
            "digits and . _ : -, starting with a letter or digit",
            errors=[{"field": "X-Compactd-Session", "detail": "not a session id"}],
        )
    return header


def _shift(path: str, by: int, field: str = "messages") -> str:
    """A path of a sub-list's message (``messages[2].content``) as the request's own
    (``field``: the body's list of them, ``input`` for a Responses request)."""
    found = _PATH_HEAD.match(path)
    if found is None:
        return path
    return f"{field}[{int(found.group(1)) + by}]" + path[found.end() :]


def _invalid(exc: InvalidMessage) -> BadRequest:
    """A message the store refuses: a 400, as the provider would answer it."""
    return _bad(exc.path, exc.detail)


def _bad(field: str, detail: str) -> BadRequest:
    return BadRequest(f"{field}: {detail}", errors=[{"field": field, "detail": detail}])


class ProxyService:
    """Proxied model calls of one tenant."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        sessionmaker: async_sessionmaker[AsyncSession],
        client: ProxyClient,
        settings: Settings,
        tenant_id: str,
        query: bytes = b"",
    ) -> None:
        self.engine = engine
        self.sessionmaker = sessionmaker
        self.client = client
        self.http = client.get()
        self.settings = settings
        self.tenant_id = tenant_id
        self.repo = ProxyRepository(tenant_id)
        # The agent's query string (Claude Code's ?beta=true): it goes upstream as sent.
        self.query = query

    async def call(
        self, api: Wire, session_id: str | None, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer:
        """Serve one proxied call (see the module's docstring)."""
        session_id = _session_id(session_id)
        key = (self.tenant_id, session_id)
        wait = self.settings.proxy_timeout_seconds
        # A free turn is taken before the body is parsed, and what the proxy knows of the
        # history is read meanwhile (it needs the session's id only; a large body takes
        # milliseconds to parse). When another call has the turn, the body is read first,
        # so that a bad one gets its 400 without waiting.
        request = None if not _turns.busy(key) else _read_body(api, body)
        release = await _turns.take(key, wait)
        handed_over = False
        try:
            # One connection for the known history, the append and the context.
            async with driver_connection(self.engine) as driver:
                first: asyncio.Future[KnownRow | None] | None = None
                if request is None:
                    first = asyncio.ensure_future(self.repo.known(driver, session_id))
                    await asyncio.sleep(0)  # the read is on its way
                    try:
                        request = _read_body(api, body)
                    except BaseException:
                        await asyncio.wait([first])  # the connection is free again
                        if not first.cancelled():
                            first.exception()  # the body's error is the answer
                        raise
                prepared = await self._prepare(
                    driver, request, session_id, len(body), headers, first
                )
                if isinstance(prepared, StoredMessage):
                    return self._replayed(request, session_id, prepared)
                # The session the call goes on in: the named one, or its child for
                # another conversation (app.proxy.conversations).
                session_id = prepared.session_id
                # The request goes upstream now; the context is recorded as served, and
                # the connection given back, while it is on its way.
                sending = asyncio.ensure_future(
                    self._send(prepared, self._body(prepared, prepared.context))
                )
                try:
                    await self._served(driver, session_id, prepared.context)
                except BaseException:
                    await _abandon(sending)
                    raise
            if prepared.offered is not None:
                answer = await self._recall_exchange(prepared, release, sending)
            else:
                answer = await self._exchange(prepared, release, sending)
            handed_over = answer.holds_turn
            return answer
        finally:
            if not handed_over:
                release()

    async def compact(
        self, session_id: str | None, body: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer:
        """``POST /responses/compact``: the agent's remote-compaction request, answered
        with compactd's own compaction, never the upstream's. The request's history is
        matched and its new items stored as a call's are, the session is compacted on
        the spot (extractive: stored, listed and undoable as any compaction), and the
        answer's ``output`` is the session's context now, as Responses items (the
        summary, then the history kept), for the agent to carry on from."""
        session_id = _session_id(session_id)
        key = (self.tenant_id, session_id)
        request = _read_body("responses", body)
        release = await _turns.take(key, self.settings.proxy_timeout_seconds)
        try:
            async with driver_connection(self.engine) as driver:
                prepared = await self._prepare(driver, request, session_id, len(body), headers)
            assert isinstance(prepared, _Call)  # a Responses call is never a replay
            compacted = await self._compact_now(prepared.session_id, asked=True)
            context = await self._fresh_context(prepared)
            await self._record(prepared)
        finally:
            release()
        output = responses_format.to_items(
            orjson.loads(context.messages), responses_format.custom_tools(request.body.get("tools"))
        )
        answer = {
            "id": f"resp_compactd_{prepared.session_id}_{context.version}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "model": request.model,
            "output": output,
            "usage": {
                "input_tokens": 0,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 0,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 0,
            },
        }
        return Answer(
            200,
            {"content-type": "application/json", "x-compactd-compacted": str(compacted).lower()},
            orjson.dumps(answer),
        )

    # --- before the upstream call ---------------------------------------------

    async def _prepare(
        self,
        driver: Driver,
        request: ProxyRequest,
        session_id: str,
        body_bytes: int,
        raw_headers: list[tuple[bytes, bytes]],
        first: Awaitable[KnownRow | None] | None = None,
    ) -> _Call | StoredMessage:
        """Match the request against the stored history, store its new messages and
        build the context to send; or, for a request sent again whose reply is stored,
        that reply (see :meth:`_replay`). ``first``: the known history's read, made
        already."""
        wire = wire_of(request)
        encoding = catalog.lookup(request.model).encoding
        created = False
        parent_id: str | None = None  # of the child session the call moved to
        moves = 0
        for _ in range(ATTEMPTS + MOVES):
            tail: list[Stored] = []
            if first is not None:
                row, first = await first, None
            else:
                row = await self.repo.known(driver, session_id)
            if row is None:
                if created:  # pragma: no cover - deleted at once after its creation
                    raise Conflict(f"session {session_id!r} was deleted during the call")
                await self._create(session_id, request.model, parent_id)
                created = True
                continue
            known, last_seq = row.known, row.last_seq
            offered = (
                proxy_recall.offer(request, agent_tools.definitions(request.api))
                if row.recall_tools and wire.recall
                else None
            )
            # The system prompt and the tools (the recall tools too, when offered): the
            # session's overhead, set with the append (so its verdict counts them), and
            # again by the usage report.
            overhead = _overhead(request if offered is None else offered.request, encoding)
            if row.behind:
                known, last_seq, tail = await self._caught_up(driver, session_id, known, last_seq)
            # The raw fast path's check here (serializing and hashing: C code, that a
            # thread would only slow down); the parsing of what it leaves in a worker
            # thread when that is much (a first call's whole history).
            begin = start(request.messages, known)
            rest = len(request.messages) - begin.messages
            try:
                found = await run_sized(
                    body_bytes * rest // max(1, len(request.messages)),
                    match,
                    request.messages,
                    known,
                    wire.parse,
                    request.offset,
                    tail,
                    begin,
                    request.field,
                )
            except InvalidMessage as exc:
                raise _invalid(exc) from None
            if isinstance(found, Diverged):
                replayed = (
                    await self._replay(driver, session_id, found, known, tail, last_seq)
                    if wire.replays
                    else None
                )
                if replayed is not None:
                    return replayed
                placed = await self._diverged(driver, request, session_id, row, moves)
                if placed.session_id != session_id:
                    created = False
                session_id, parent_id, moves = placed.session_id, placed.parent_id, moves + 1
                continue
            new = request.messages[found.new_from :]
            appended: Appended | None = None
            version = row.version
            if new:
                # In the store's format (a Responses item as its chat message).
                stored = wire.stored(new)
                self._check_storable(request, found.new_from, new, stored)
                try:
                    appended = await AppendService(self.engine, self.tenant_id).store(
                        session_id,
                        AppendRequest(messages=stored, format=wire.store),
                        idempotency_key=None,
                        if_match=str(row.version),
                        body_bytes=body_bytes * len(new) // max(1, len(request.messages)),
                        overhead_tokens=overhead,
                        driver=driver,
                    )
                except PreconditionFailed:
                    continue  # another writer came first: read and match again
                except UnprocessableContent as exc:
                    raise _shifted(exc, request.offset + found.new_from, request.field) from None
                version = appended.version
                if appended.rows:
                    last_seq = appended.rows[-1].seq
            if not row.tools_declared and declares_tools(request.body):
                # Its conversation is no longer provisional (app.proxy.conversations).
                await self.repo.note_tools(driver, session_id)
            system_messages = request.api == "anthropic" and system_messages_allowed(
                request.messages, raw_headers
            )
            context = await self.client.contexts.after_append(
                driver,
                self.tenant_id,
                session_id,
                request.api,
                row.created_at,
                appended,
                system_messages=system_messages,
            )
            return _Call(
                request=request,
                session_id=session_id,
                created_at=row.created_at,
                headers=upstream_headers(raw_headers),
                matched=found,
                overhead=overhead,
                context=context,
                known=Known(entry_count=found.end.entries, chain=found.end.chain),
                last_seq=last_seq,
                session_version=version,
                path=row.path,
                offered=offered,
                system_messages=system_messages,
            )
        raise Conflict(
            f"session {session_id!r} kept changing while this call's messages were stored "
            f"({ATTEMPTS} attempts); retry"
        )

    async def _caught_up(
        self, driver: Driver, session_id: str, known: Known, last_seq: int
    ) -> tuple[Known, int, list[Stored]]:
        """``known`` extended over the message entries stored after ``last_seq`` by
        others than the proxy (the /v1 API, another process), and the seq of the last.
        From the first of them whose content pruning erased on, they are left as a tail
        for the request to be compared with (their chain cannot be made from the store)."""
        tail: list[Stored] = []
        while True:
            rows = await self.repo.messages_after(driver, session_id, last_seq, PAGE)
            if not rows:
                return known, last_seq, tail
            chained = 0
            while not tail and chained < len(rows) and not rows[chained].erased:
                chained += 1
            if chained:
                known = Known(
                    entry_count=known.entry_count + chained,
                    chain=extend(known.chain, (digest(r.entry) for r in rows[:chained])),
                    raw_count=known.raw_count,
                    raw_digest=known.raw_digest,
                    raw_entry_count=known.raw_entry_count,
                    raw_chain=known.raw_chain,
                )
            tail += (Stored.of(r.entry, r.erased) for r in rows[chained:])
            last_seq = rows[-1].seq
            if len(rows) < PAGE:
                return known, last_seq, tail

    async def _replay(
        self,
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
        last = await self.repo.message_at(driver, session_id, last_seq)
        if last is None or last.erased or not replays(found, known, tail, last.entry):
            return None
        return last

    def _replayed(self, request: ProxyRequest, session_id: str, stored: StoredMessage) -> Answer:
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

    async def _create(self, session_id: str, model: str, parent_id: str | None = None) -> None:
        async with self.sessionmaker() as db:
            try:
                await sessions.SessionService(db, self.tenant_id).create(
                    SessionCreate(
                        model=model,
                        id=session_id,
                        config=PROXY_SESSION_CONFIG,
                        parent_id=parent_id,
                    )
                )
                await db.commit()
            except Conflict:
                pass  # a concurrent first call created it
            except ValidationError as exc:
                raise BadRequest(f"model: {exc.errors()[0]['msg']}") from None

    async def _diverged(
        self, driver: Driver, request: ProxyRequest, session_id: str, row: KnownRow, moves: int
    ) -> Placed:
        """Where a call whose history is not the stored one plus new messages goes on:
        a new branch of the session's tree, or a child session for another conversation
        (app.proxy.conversations, which makes the move)."""
        return await Conversations(self.engine, self.tenant_id, self.repo).place(
            driver, request, session_id, row, moves
        )

    def _check_storable(
        self, request: ProxyRequest, start: int, new: list[Any], stored: list[Any]
    ) -> None:
        """The checks every append's body gets (the proxy's body is exempt from the
        whole-body ones: only its new messages are stored); ``stored``: the new messages
        in the store's format."""
        max_items = self.settings.max_json_items
        for i, message in enumerate(new):
            found = find_unstorable(message, request.path(start + i), max_items)
            if found:
                raise _bad(*found)
        if wire_of(request).store == "openai":
            found = oversized_arguments(stored, max_items)
            if found:
                raise _bad(_shift(found[0], request.offset + start, request.field), found[1])

    def _body(self, call: _Call, context: Built) -> bytes:
        """The agent's request with ``context`` in place of its history, as JSON."""
        call.version = context.version
        call.sent_tokens = context.tokens
        call.sent = context
        if call.offered is not None:
            return upstream_bytes(call.offered.request, context.messages, context.system)
        return wire_of(call.request).upstream(call.request, context.messages, context.system)

    async def _fresh_context(self, call: _Call) -> Built:
        """The context read again (after a relief, for the retry), recorded as served."""
        async with driver_connection(self.engine) as driver:
            context = await self.client.contexts.fresh(
                driver,
                self.tenant_id,
                call.session_id,
                call.request.api,
                call.created_at,
                system_messages=call.system_messages,
            )
            await self._served(driver, call.session_id, context)
        return context

    async def _served(self, driver: Driver, session_id: str, context: Built) -> None:
        """Record ``context`` as the one served, as GET /context does (a usage report
        without ``context_version`` is about it)."""
        await record_served(driver, self.tenant_id, session_id, context.state)

    # --- the upstream call ----------------------------------------------------

    async def _send(self, call: _Call, body: bytes) -> httpx.Response:
        call.attempts += 1
        url = self.client.urls[call.request.wire]
        url = with_query(url, self.query)
        upstream = self.http.build_request("POST", url, content=body, headers=call.headers)
        try:
            return await self.http.send(upstream, stream=True)
        except httpx.TimeoutException:
            # The URL as shown has no credential (a user:password@ or a key= the operator
            # put in it): the answer goes to any agent.
            raise GatewayTimeout(
                f"the upstream ({redact_url(url)}) did not answer within "
                f"{self.settings.proxy_timeout_seconds:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise BadGateway(
                f"the upstream ({redact_url(url)}) could not be reached: {type(exc).__name__}"
            ) from None

    async def _exchange(
        self, call: _Call, release: Callable[[], None], sending: asyncio.Future[httpx.Response]
    ) -> Answer:
        """The upstream's answer (``sending``: the request with the call's context, on
        its way), retried once after an overflow error that a relief made room for."""
        checked = await self._refused(call, await sending, release)
        if isinstance(checked, Answer):
            return checked
        response = checked
        content_type = response.headers.get("content-type", "")
        if call.request.stream and content_type.startswith("text/event-stream"):

            async def unstarted() -> None:
                await response.aclose()
                self._later(call, self._record(call), release)

            return Answer(
                response.status_code,
                agent_headers(response.headers),
                stream=EventStream(self._events(call, response, release), unstarted),
                media_type="text/event-stream",
                holds_turn=True,
            )
        raw = await _read(response, MAX_REPLY_BYTES)
        headers = agent_headers(response.headers)
        try:
            reply = wire_of(call.request).reply(orjson.loads(raw))
        except (orjson.JSONDecodeError, UnreadableReply) as exc:
            log.warning(
                "proxied reply not stored: not a reply of the API",
                extra={"session_id": call.session_id, "reason": str(exc)},
            )
            self._later(call, self._record(call), release)
            return Answer(response.status_code, headers, raw, holds_turn=True)

        def delivered(sent: bool) -> None:
            if sent:
                self._later(call, self._finish(call, reply), release)
                return
            # The agent gave up waiting (its SDK may be retrying): a reply it never got
            # is not its history. The call's new messages are, and recorded; the tokens
            # the provider spent on it are reported all the same.
            log.warning(
                "proxied reply not stored: the agent hung up before it was sent",
                extra={"session_id": call.session_id},
            )
            self._later(call, self._unsent(call, reply), release)

        return Answer(
            response.status_code, headers, raw, holds_turn=True, delivery=Delivery(delivered)
        )

    async def _refused(
        self, call: _Call, response: httpx.Response, release: Callable[[], None]
    ) -> httpx.Response | Answer:
        """``response`` when it is not an error. An error is the agent's answer, but for
        an overflow on the call's first request that a relief made room for: then the
        retry's response, or its error."""
        if response.status_code < 400:
            return response
        raw = await _read(response, MAX_ERROR_BYTES)
        verdict = overflow_errors.classify(response.status_code, raw.decode("utf-8", "replace"))
        if verdict.overflow and await self._relieved(call, response.status_code, raw, verdict):
            response = await self._send(call, self._body(call, await self._fresh_context(call)))
            if response.status_code < 400:
                return response
            raw = await _read(response, MAX_ERROR_BYTES)
        self._later(call, self._record(call), release)
        return Answer(response.status_code, agent_headers(response.headers), raw, holds_turn=True)

    async def _recall_exchange(
        self, call: _Call, release: Callable[[], None], sending: asyncio.Future[httpx.Response]
    ) -> Answer:
        """:meth:`_exchange` for a session that offers the recall tools: the model's
        calls of them answered and the model asked again, for up to
        ``proxy_recall.ROUNDS`` requests; the agent gets the last reply, without those
        calls (app.engine.proxy.recall)."""
        offered = call.offered
        assert offered is not None
        assert call.sent is not None
        api, wire = call.request.api, wire_of(call.request)
        checked = await self._refused(call, await sending, release)
        if isinstance(checked, Answer):
            return checked
        response, extra, rounds, first_usage = checked, [], 1, None
        while True:
            raw = await _read(response, MAX_REPLY_BYTES)
            headers = agent_headers(response.headers)
            try:
                data = orjson.loads(raw)
                reply = wire.reply(data)
            except (orjson.JSONDecodeError, UnreadableReply) as exc:
                log.warning(
                    "proxied reply not stored: not a reply of the API",
                    extra={"session_id": call.session_id, "reason": str(exc)},
                )
                self._later(call, self._record(call), release)
                return Answer(response.status_code, headers, raw, holds_turn=True)
            if first_usage is None:
                first_usage = reply.usage  # what the context sent cost: the report's
            wanted = proxy_recall.calls(api, reply.message, offered.names)
            if not wanted or rounds >= proxy_recall.ROUNDS:
                break
            answered = await self._answer_recall(
                call, wanted, last=rounds + 1 == proxy_recall.ROUNDS
            )
            extra += proxy_recall.round_messages(api, reply.message, answered)
            body = upstream_bytes(
                offered.request,
                proxy_recall.extended(call.sent.messages, extra),
                call.sent.system,
            )
            checked = await self._refused(call, await self._send(call, body), release)
            if isinstance(checked, Answer):
                return checked
            response, rounds = checked, rounds + 1
        message = proxy_recall.without_calls(api, reply.message, offered.names)
        stored = Reply(
            message, reply.finish_reason if message == reply.message else None, first_usage
        )
        headers["x-compactd-recall-rounds"] = str(rounds - 1)

        def delivered(sent: bool) -> None:
            self._later(call, (self._finish if sent else self._unsent)(call, stored), release)

        if rounds == 1 and message == reply.message and not call.request.stream:
            return Answer(
                response.status_code, headers, raw, holds_turn=True, delivery=Delivery(delivered)
            )
        created = int(time.time())
        found_id = data.get("id") if isinstance(data, dict) else None
        response_id = found_id if isinstance(found_id, str) else None
        model = call.request.model
        if not call.request.stream:
            whole = replayed_body(api, message, model, created, reply.usage, response_id)
            return Answer(
                200,
                {**headers, "content-type": "application/json"},
                orjson.dumps(whole),
                holds_turn=True,
                delivery=Delivery(delivered),
            )
        events = replayed_events(
            api, message, model, created, call.request.wants_usage, reply.usage, response_id
        )
        # Stored as a streamed reply is: the message the agent builds from the events.
        reader = wire.reader(call.request)
        parsed = SseEvents()
        for event in events:
            for read in parsed.feed(event):
                reader.feed(read)
        stored = Reply(reader.reply().message, stored.finish_reason, first_usage)

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

        headers.pop("content-type", None)
        return Answer(
            200,
            {**headers, "cache-control": "no-cache"},
            stream=EventStream(stream(), unstarted),
            media_type="text/event-stream",
            holds_turn=True,
        )

    async def _answer_recall(
        self, call: _Call, wanted: list[dict[str, Any]], *, last: bool
    ) -> list[tuple[dict[str, Any], str, bool]]:
        """Each recall call run as POST …/tool-calls runs it; one round's results hold
        ``recall.result_tokens`` together. Before the last round, the results say so."""
        answered: list[tuple[dict[str, Any], str, bool]] = []
        async with self.sessionmaker() as db:
            tools = ToolCallService(self.engine, db, self.tenant_id)
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

    def _later(
        self, call: _Call, work: Coroutine[Any, Any, None], release: Callable[[], None]
    ) -> None:
        """Finish ``work`` once the reply is on its way to the agent, then give the
        session's turn back: the agent does not wait for its reply to be stored, and its
        next call on the session waits for the turn, so it finds it stored."""

        async def run() -> None:
            try:
                await work
            except Exception:  # delivered but not stored: the next call stores it
                log.exception("proxied reply not stored", extra={"session_id": call.session_id})
            finally:
                release()

        self.client.spawn(run())

    async def _relieved(
        self, call: _Call, status: int, raw: bytes, verdict: overflow_errors.OverflowMatch
    ) -> bool:
        """After a provider's overflow error: relieve the window as a forwarded provider
        error does (prune, with no minimum; a compaction queued), and when that leaves
        more than the retry should hold, an emergency compaction on the spot. Whether
        the context is now smaller than the one refused (only then is it retried)."""
        if call.attempts > 1:
            return False
        message = raw.decode("utf-8", "replace")[:1_000_000]
        budget = BudgetService(self.engine, self.tenant_id)
        answer = await budget.provider_error(
            call.session_id,
            ProviderError(status=status, message=message, context_version=call.version),
        )
        target = retry_target(call.sent_tokens, verdict)
        now = await self._context_tokens(call.session_id)
        if now > target:
            compacted = await self._compact_now(call.session_id)
            queued = answer.recovery.compaction if answer.recovery else None
            if compacted and queued is not None and queued.created and queued.status == "queued":
                # The emergency compaction did the queued one's work.
                with contextlib.suppress(ProblemError):
                    await CompactionService(self.engine, self.tenant_id).cancel(
                        call.session_id, queued.id
                    )
            now = await self._context_tokens(call.session_id)
        log.info(
            "proxied call refused as too long: relieved",
            extra={
                "session_id": call.session_id,
                "sent_tokens": call.sent_tokens,
                "context_tokens": now,
                "target_tokens": target,
                "retried": now < call.sent_tokens,
            },
        )
        return now < call.sent_tokens

    async def _context_tokens(self, session_id: str) -> int:
        async with driver_connection(self.engine) as driver:
            state = await read_state(driver, self.tenant_id, session_id)
        return 0 if state is None else state.context_tokens

    async def _compact_now(self, session_id: str, *, asked: bool = False) -> bool:
        """An extractive compaction on the spot (``asked``: the agent asked for it, so a
        session whose automatic compaction is off is compacted all the same)."""
        with metrics.after_commit():
            async with locked(self.engine, self.tenant_id, session_id) as unit:
                config = sessions.effective_config(unit.state.config)
                if not (config.compaction.enabled and (asked or config.compaction.auto)):
                    return False
                # The call being retried carries the agent's next message: no "continue".
                config = config.model_copy(
                    update={
                        "compaction": config.compaction.model_copy(update={"auto_continue": False})
                    }
                )
                return await pivot.compact_now(unit, config, now=datetime.now(UTC)) is not None

    async def _events(
        self, call: _Call, response: httpx.Response, release: Callable[[], None]
    ) -> AsyncGenerator[bytes, None]:
        """The upstream's events as they come; once the stream is complete, the reply is
        stored (after its end reached the agent, the session's turn held until then)."""
        request = call.request
        wire = wire_of(request)
        reader = wire.reader(request)
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
                self._later(call, self._finish(call, reply), release)
            else:
                # Cut short (or the agent hung up first): nothing of it is stored; the
                # call's new messages are, and the history's record moves on with them.
                log.warning(
                    "proxied stream not stored: it ended before its last event",
                    extra={"session_id": call.session_id, "failed": broken or reader.failed},
                )
                self._later(call, self._record(call), release)

    # --- after the reply ------------------------------------------------------

    async def _finish(self, call: _Call, reply: Reply) -> None:
        """Report the reply's usage, store it, and record the history."""
        await self._report(call, reply)
        try:
            await self._store_reply(call, reply)
        finally:
            await self._record(call)

    async def _unsent(self, call: _Call, reply: Reply) -> None:
        """Report the usage of a reply the agent never got, and record the history."""
        try:
            await self._report(call, reply)
        finally:
            await self._record(call)

    async def _report(self, call: _Call, reply: Reply) -> None:
        if reply.usage is None:
            return
        try:
            read = provider_usage.read_usage(reply.usage)
            reason = reply.finish_reason or read.finish_reason
            report = UsageReport.model_validate(
                {
                    **read.native(),
                    "finish_reason": reason[:64] if reason else None,
                    "context_version": call.version,
                    "tools_tokens": call.overhead,
                }
            )
            answer = await BudgetService(self.engine, self.tenant_id).usage(call.session_id, report)
            call.session_version = answer.version
        except (provider_usage.UsageError, ValidationError, ProblemError) as exc:
            log.warning(
                "proxied call's usage not reported",
                extra={"session_id": call.session_id, "reason": str(exc)[:500]},
            )

    async def _store_reply(self, call: _Call, reply: Reply) -> None:
        parse = PARSERS[call.request.api]
        try:
            entries: list[Entry] = [e for m in reply.messages for e in parse(m, "reply")]
        except InvalidMessage as exc:
            log.warning(
                "proxied reply not stored: the store refuses it",
                extra={"session_id": call.session_id, "reason": f"{exc.path}: {exc.detail}"},
            )
            return
        if all(contentless(e) for e in entries):
            # Nothing in it to match (no text, no tool call): agents keep such a reply, or
            # drop it (Anthropic refuses an empty assistant message before the last). It
            # is stored if the agent's next call carries it, as one of its new messages.
            log.info(
                "proxied reply not stored yet: it has no content",
                extra={"session_id": call.session_id},
            )
            return
        appender = AppendService(self.engine, self.tenant_id)
        expected = call.session_version
        for attempt in range(ATTEMPTS):
            if attempt:
                # The session moved since the call's own writes: by a message (another
                # call, in another process: then this reply is not the next message), or
                # by something else (a compaction committing).
                async with driver_connection(self.engine) as driver:
                    row = await self.repo.known(driver, call.session_id)
                    newer = await self.repo.last_message_after(
                        driver, call.session_id, call.last_seq
                    )
                if row is None or newer is not None:
                    log.warning(
                        "proxied reply not stored: another call stored messages meanwhile",
                        extra={"session_id": call.session_id},
                    )
                    return
                if row.path != call.path:
                    # A navigation: the reply answers the path the session has left.
                    log.warning(
                        "proxied reply not stored: the session moved to another path of "
                        "its tree meanwhile",
                        extra={"session_id": call.session_id},
                    )
                    return
                expected = row.version
            try:
                appended = await appender.store(
                    call.session_id,
                    AppendRequest(messages=reply.messages, format=call.request.api),
                    idempotency_key=None,
                    if_match=str(expected),
                )
            except PreconditionFailed:
                continue
            except ProblemError as exc:
                log.warning(
                    "proxied reply not stored: the store refuses it",
                    extra={"session_id": call.session_id, "reason": exc.detail[:500]},
                )
                return
            if appended.rows:
                call.last_seq = appended.rows[-1].seq
            # The context sent, with the reply: the next call's, if nothing else comes.
            self.client.contexts.extend(self.tenant_id, call.session_id, call.request.api, appended)
            call.known = Known(
                entry_count=call.known.entry_count + len(entries),
                chain=extend(call.known.chain, (digest(e) for e in entries)),
            )
            call.stored_reply = True
            return
        log.warning(
            "proxied reply not stored: the session kept changing",
            extra={"session_id": call.session_id},
        )

    async def _record(self, call: _Call) -> None:
        """What the proxy knows of the history now, and the raw digest of this request
        (all of its history is stored) for the next call's fast path."""
        known = raw_known(
            call.matched, call.request.messages, call.known.entry_count, call.known.chain
        )
        try:
            async with driver_connection(self.engine) as driver:
                await self.repo.save(driver, call.session_id, known, call.last_seq)
        except ProblemError as exc:  # the next call catches up from the entries
            log.warning(
                "proxy history not recorded",
                extra={"session_id": call.session_id, "reason": exc.detail},
            )


def _streamed_reply(reader: StreamReader) -> Reply | None:
    """A complete stream's reply (None when it cannot be stored, a Responses reply's item
    the store refuses: the agent has it, and its next call carries it)."""
    try:
        return reader.reply()
    except UnreadableReply as exc:
        log.warning("proxied stream not stored: %s", exc)
        return None


def _read_body(api: Wire, body: bytes) -> ProxyRequest:
    """The agent's request, or the 400 that says why it is not one."""
    try:
        # Here, not in a worker thread: orjson holds the GIL for the whole parse, so a
        # thread does not let the loop run meanwhile, and takes longer (a 1.5 MB
        # history: 9 ms here, 12 to 16 ms through a thread, measured).
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(
            f"the body is not valid JSON ({exc})",
            errors=[{"field": "body", "detail": str(exc)}],
        ) from None
    try:
        return WIRES[api].read(parsed)
    except InvalidMessage as exc:
        raise BadRequest(
            f"{exc.path}: {exc.detail}", errors=[{"field": exc.path, "detail": exc.detail}]
        ) from None


def _shifted(exc: UnprocessableContent, by: int, field: str = "messages") -> BadRequest:
    """An append's 422 as the provider's 400, its message paths as the request's own."""
    errors = exc.extensions.get("errors")
    if not isinstance(errors, list):
        return BadRequest(exc.detail)
    fixed = [{**e, "field": _shift(str(e.get("field", "")), by, field)} for e in errors]
    detail = "; ".join(f"{e['field']}: {e['detail']}" for e in fixed)
    return BadRequest(detail, errors=fixed)


async def _abandon(sending: asyncio.Future[httpx.Response]) -> None:
    """Give up an upstream request on its way: cancelled, or, if its answer came
    already, that answer closed."""
    sending.cancel()
    await asyncio.wait([sending])  # what it raised, if anything, is its own
    if not sending.cancelled() and sending.exception() is None:
        await sending.result().aclose()


async def _read(response: httpx.Response, limit: int) -> bytes:
    """The response's body, at most ``limit`` bytes of it; the response is closed."""
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in response.aiter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size >= limit:
                break
    except httpx.TimeoutException:
        raise GatewayTimeout("the upstream stopped answering mid-reply") from None
    except httpx.HTTPError as exc:
        raise BadGateway(f"the upstream broke off its reply: {type(exc).__name__}") from None
    finally:
        await response.aclose()
    return b"".join(chunks)[:limit]
