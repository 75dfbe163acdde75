"""Before the upstream call: the agent's history placed against the stored one, its
new messages stored, and the context to send built (docs/proxy.md, "Inside a call",
steps 1 to 3). A history that departs from the stored one is answered from the store
when it is a call sent again (:mod:`app.proxy.replays`), else goes on elsewhere
(:mod:`app.proxy.conversations`) and is placed again there."""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from app.core.driver import Driver
from app.core.errors import BadRequest, Conflict, PreconditionFailed, UnprocessableContent
from app.core.http import run_sized
from app.core.settings import Settings
from app.engine.accounting import catalog
from app.engine.formats.anthropic_format import system_messages_allowed
from app.engine.formats.storable import find_unstorable
from app.engine.model import InvalidMessage
from app.engine.proxy import recall as proxy_recall
from app.engine.proxy.conversations import declares_tools
from app.engine.proxy.history import (
    Diverged,
    Known,
    Matched,
    Stored,
    digest,
    extend,
    match,
    start,
)
from app.engine.proxy.wire import ProxyRequest
from app.engine.proxy.wires import wire_of
from app.messages.intake import refused_messages
from app.messages.schemas import AppendRequest
from app.messages.service import AppendResult, AppendService
from app.proxy.call import ATTEMPTS, Call, ProxyDeps
from app.proxy.conversations import MOVES, PAGE, Conversations
from app.proxy.forward import upstream_headers
from app.proxy.replays import replayable
from app.proxy.repository import KnownRow, StoredMessage
from app.proxy.request import bad, invalid, overhead, shift, shifted
from app.recall import agent_tools
from app.sessions import service as sessions
from app.sessions.schemas import SessionCreate

# The sessions the proxy creates: no synthetic "continue" after an automatic compaction,
# since the agent's call in flight carries its real next message.
PROXY_SESSION_CONFIG: dict[str, Any] = {"compaction": {"auto_continue": False}}


@dataclass(frozen=True, slots=True)
class _Matching:
    """The request's history matched against one read of the session (``known``,
    ``last_seq`` and ``tail`` caught up over what others stored since the proxy's
    record), with the recall tools it is offered and the overhead it counts."""

    row: KnownRow
    found: Matched | Diverged
    known: Known
    last_seq: int
    tail: list[Stored]
    offered: proxy_recall.Offered | None
    overhead: int


async def prepare(
    deps: ProxyDeps,
    driver: Driver,
    request: ProxyRequest,
    session_id: str,
    body_bytes: int,
    raw_headers: list[tuple[bytes, bytes]],
    first: Awaitable[KnownRow | None] | None = None,
) -> Call | StoredMessage:
    """Match the request against the stored history, store its new messages and
    build the context to send; or, for a request sent again whose reply is stored,
    that reply. ``first``: the known history's read, made already."""
    wire = wire_of(request)
    created = False
    parent_id: str | None = None  # of the child session the call moved to
    moves = 0
    for _ in range(ATTEMPTS + MOVES):
        if first is not None:
            row, first = await first, None
        else:
            row = await deps.repo.known(driver, session_id)
        if row is None:
            if created:  # pragma: no cover - deleted at once after its creation
                raise Conflict(f"session {session_id!r} was deleted during the call")
            await _create(deps, session_id, request.model, parent_id)
            created = True
            continue
        matching = await _match(deps, driver, request, session_id, row, body_bytes)
        found = matching.found
        if isinstance(found, Diverged):
            if wire.replays:
                replayed = await replayable(
                    deps.repo,
                    driver,
                    session_id,
                    found,
                    matching.known,
                    matching.tail,
                    matching.last_seq,
                )
                if replayed is not None:
                    return replayed
            # Where it goes on: a new branch of the session's tree, or a child session
            # for another conversation (app.proxy.conversations, which makes the move).
            placed = await Conversations(deps.engine, deps.tenant_id, deps.repo).place(
                driver, request, session_id, row, moves
            )
            if placed.session_id != session_id:
                created = False
            session_id, parent_id, moves = placed.session_id, placed.parent_id, moves + 1
            continue
        try:
            appended = await _append(deps, driver, request, session_id, matching, body_bytes)
        except PreconditionFailed:
            continue  # another writer came first: read and match again
        return await _call_of(deps, driver, request, session_id, raw_headers, matching, appended)
    raise Conflict(
        f"session {session_id!r} kept changing while this call's messages were stored "
        f"({ATTEMPTS} attempts); retry"
    )


async def _match(
    deps: ProxyDeps,
    driver: Driver,
    request: ProxyRequest,
    session_id: str,
    row: KnownRow,
    body_bytes: int,
) -> _Matching:
    """The request's history matched against the session as ``row`` read it."""
    wire = wire_of(request)
    offered = (
        proxy_recall.offer(request, agent_tools.definitions(request.api))
        if row.recall_tools and wire.recall
        else None
    )
    # The system prompt and the tools (the recall tools too, when offered): the
    # session's overhead, set with the append (so its verdict counts them), and
    # again by the usage report.
    encoding = catalog.lookup(request.model).encoding
    counted = overhead(request if offered is None else offered.request, encoding)
    known, last_seq = row.known, row.last_seq
    tail: list[Stored] = []
    if row.behind:
        known, last_seq, tail = await _caught_up(deps, driver, session_id, known, last_seq)
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
        raise invalid(exc) from None
    return _Matching(row, found, known, last_seq, tail, offered, counted)


async def _caught_up(
    deps: ProxyDeps, driver: Driver, session_id: str, known: Known, last_seq: int
) -> tuple[Known, int, list[Stored]]:
    """``known`` extended over the message entries stored after ``last_seq`` by
    others than the proxy (the /v1 API, another process), and the seq of the last.
    From the first of them whose content pruning erased on, they are left as a tail
    for the request to be compared with (their chain cannot be made from the store)."""
    tail: list[Stored] = []
    while True:
        rows = await deps.repo.messages_after(driver, session_id, last_seq, PAGE)
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


async def _append(
    deps: ProxyDeps,
    driver: Driver,
    request: ProxyRequest,
    session_id: str,
    matching: _Matching,
    body_bytes: int,
) -> AppendResult | None:
    """The request's new messages stored (None when it has none), with the session's
    version as read for ``If-Match`` (PreconditionFailed: another writer came first)."""
    found = matching.found
    assert isinstance(found, Matched)
    new = request.messages[found.new_from :]
    if not new:
        return None
    wire = wire_of(request)
    # In the store's format (a Responses item as its chat message).
    stored = wire.stored(new)
    _check_storable(deps.settings, request, found.new_from, new, stored)
    try:
        return await AppendService(deps.engine, deps.tenant_id).store(
            session_id,
            AppendRequest(messages=stored, format=wire.store),
            idempotency_key=None,
            if_match=str(matching.row.version),
            body_bytes=body_bytes * len(new) // max(1, len(request.messages)),
            overhead_tokens=matching.overhead,
            driver=driver,
        )
    except UnprocessableContent as exc:
        raise shifted(exc, request.offset + found.new_from, request.field) from None


def _check_storable(
    settings: Settings, request: ProxyRequest, start: int, new: list[Any], stored: list[Any]
) -> None:
    """The checks every append's body gets (the proxy's body is exempt from the
    whole-body ones: only its new messages are stored); ``stored``: the new messages
    in the store's format."""
    max_items = settings.max_json_items
    for i, message in enumerate(new):
        found = find_unstorable(message, request.path(start + i), max_items)
        if found:
            raise bad(*found)
    found = refused_messages(stored, wire_of(request).store, settings)  # app.messages.intake
    if found:
        raise bad(shift(found[0], request.offset + start, request.field), found[1])


async def _call_of(
    deps: ProxyDeps,
    driver: Driver,
    request: ProxyRequest,
    session_id: str,
    raw_headers: list[tuple[bytes, bytes]],
    matching: _Matching,
    appended: AppendResult | None,
) -> Call:
    """The call, its new messages stored: its context built, ready to go upstream."""
    row, found = matching.row, matching.found
    assert isinstance(found, Matched)
    version, last_seq = row.version, matching.last_seq
    if appended is not None:
        version = appended.version
        if appended.rows:
            last_seq = appended.rows[-1].seq
    if not row.tools_declared and declares_tools(request.body):
        # Its conversation is no longer provisional (app.proxy.conversations).
        await deps.repo.note_tools(driver, session_id)
    system_messages = request.api == "anthropic" and system_messages_allowed(
        request.messages, raw_headers
    )
    context = await deps.client.contexts.after_append(
        driver,
        deps.tenant_id,
        session_id,
        request.api,
        row.created_at,
        appended,
        system_messages=system_messages,
    )
    return Call(
        request=request,
        session_id=session_id,
        created_at=row.created_at,
        headers=upstream_headers(raw_headers),
        matched=found,
        overhead=matching.overhead,
        context=context,
        known=Known(entry_count=found.end.entries, chain=found.end.chain),
        last_seq=last_seq,
        session_version=version,
        path=row.path,
        offered=matching.offered,
        system_messages=system_messages,
    )


async def _create(
    deps: ProxyDeps, session_id: str, model: str, parent_id: str | None = None
) -> None:
    """The session, created on first use with the request's model (and under
    ``parent_id``, a side conversation's child)."""
    try:
        await sessions.SessionService(deps.engine, deps.tenant_id).create(
            SessionCreate(
                model=model,
                id=session_id,
                config=PROXY_SESSION_CONFIG,
                parent_id=parent_id,
            )
        )
    except Conflict:
        pass  # a concurrent first call created it
    except ValidationError as exc:
        raise BadRequest(f"model: {exc.errors()[0]['msg']}") from None
