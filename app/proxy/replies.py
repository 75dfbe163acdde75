"""After the reply: its usage reported, the reply stored once it went out to the agent,
and the proxy's record of the history moved on; all of it after the agent has its
answer, the session's turn held until done (docs/proxy.md, "Inside a call", step 6)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from app.budget.schemas import UsageReport
from app.budget.service import BudgetService
from app.core.database import driver_connection
from app.core.errors import PreconditionFailed, ProblemError
from app.engine.accounting import provider_usage
from app.engine.model import Entry, InvalidMessage
from app.engine.proxy.history import Known, contentless, digest, extend, raw_known
from app.engine.proxy.wire import PARSERS, Reply
from app.messages.schemas import AppendRequest
from app.messages.service import AppendResult, AppendService
from app.proxy.call import ATTEMPTS, Call, ProxyDeps

log = logging.getLogger("compactd.proxy")


def later(
    deps: ProxyDeps, call: Call, work: Coroutine[Any, Any, None], release: Callable[[], None]
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

    deps.client.spawn(run())


async def finish(deps: ProxyDeps, call: Call, reply: Reply) -> None:
    """Report the reply's usage, store it, and record the history."""
    await _report(deps, call, reply)
    try:
        await _store_reply(deps, call, reply)
    finally:
        await record(deps, call)


async def unsent(deps: ProxyDeps, call: Call, reply: Reply) -> None:
    """Report the usage of a reply the agent never got, and record the history."""
    try:
        await _report(deps, call, reply)
    finally:
        await record(deps, call)


async def record(deps: ProxyDeps, call: Call) -> None:
    """What the proxy knows of the history now, and the raw digest of this request
    (all of its history is stored) for the next call's fast path."""
    known = raw_known(call.matched, call.request.messages, call.known.entry_count, call.known.chain)
    try:
        async with driver_connection(deps.engine) as driver:
            await deps.repo.save(driver, call.session_id, known, call.last_seq)
    except ProblemError as exc:  # the next call catches up from the entries
        log.warning(
            "proxy history not recorded",
            extra={"session_id": call.session_id, "reason": exc.detail},
        )


async def _report(deps: ProxyDeps, call: Call, reply: Reply) -> None:
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
        answer = await BudgetService(deps.engine, deps.tenant_id).usage(call.session_id, report)
        call.session_version = answer.version
    except (provider_usage.UsageError, ValidationError, ProblemError) as exc:
        log.warning(
            "proxied call's usage not reported",
            extra={"session_id": call.session_id, "reason": str(exc)[:500]},
        )


def _entries(call: Call, reply: Reply) -> list[Entry] | None:
    """The reply's entries, when it is one to store now (see :func:`_store_reply`)."""
    parse = PARSERS[call.request.api]
    try:
        entries: list[Entry] = [e for m in reply.messages for e in parse(m, "reply")]
    except InvalidMessage as exc:
        log.warning(
            "proxied reply not stored: the store refuses it",
            extra={"session_id": call.session_id, "reason": f"{exc.path}: {exc.detail}"},
        )
        return None
    if all(contentless(e) for e in entries):
        # Nothing in it to match (no text, no tool call): agents keep such a reply, or
        # drop it (Anthropic refuses an empty assistant message before the last). It
        # is stored if the agent's next call carries it, as one of its new messages.
        log.info(
            "proxied reply not stored yet: it has no content",
            extra={"session_id": call.session_id},
        )
        return None
    return entries


async def _store_reply(deps: ProxyDeps, call: Call, reply: Reply) -> None:
    """The reply appended after the call's own messages, unless another message came
    after them meanwhile (another process's call) or the session left their path."""
    entries = _entries(call, reply)
    if entries is None:
        return
    appender = AppendService(deps.engine, deps.tenant_id)
    expected: int | None = call.session_version
    for attempt in range(ATTEMPTS):
        if attempt:
            expected = await _still_next(deps, call)
            if expected is None:
                return
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
        _stored(deps, call, appended, entries)
        return
    log.warning(
        "proxied reply not stored: the session kept changing",
        extra={"session_id": call.session_id},
    )


async def _still_next(deps: ProxyDeps, call: Call) -> int | None:
    """The session's version, when the reply is still its next message though the
    session moved since the call's own writes (by something else: a compaction
    committing); None when a message came (another call, in another process: then this
    reply is not the next message) or the session moved to another path."""
    async with driver_connection(deps.engine) as driver:
        row = await deps.repo.known(driver, call.session_id)
        newer = await deps.repo.last_message_after(driver, call.session_id, call.last_seq)
    if row is None or newer is not None:
        log.warning(
            "proxied reply not stored: another call stored messages meanwhile",
            extra={"session_id": call.session_id},
        )
        return None
    if row.path != call.path:
        # A navigation: the reply answers the path the session has left.
        log.warning(
            "proxied reply not stored: the session moved to another path of its tree meanwhile",
            extra={"session_id": call.session_id},
        )
        return None
    return row.version


def _stored(deps: ProxyDeps, call: Call, appended: AppendResult, entries: list[Entry]) -> None:
    """What the proxy keeps of a stored reply: its seq, the context sent extended by it
    (the next call's, if nothing else comes), and the history it knows."""
    if appended.rows:
        call.last_seq = appended.rows[-1].seq
    deps.client.contexts.extend(deps.tenant_id, call.session_id, call.request.api, appended)
    call.known = Known(
        entry_count=call.known.entry_count + len(entries),
        chain=extend(call.known.chain, (digest(e) for e in entries)),
    )
