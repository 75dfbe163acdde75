"""A provider's context-overflow error relieved as ``POST …/overflow-errors`` relieves
it, with an emergency compaction when that is not enough, so that the call may be
retried once with a smaller context (docs/proxy.md, "A provider's context-overflow
error"); and the compaction the agent asks for (``/responses/compact``)."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime

from app.budget.schemas import ProviderError
from app.budget.service import BudgetService
from app.compactions import pivot
from app.compactions.service import CompactionService
from app.core import metrics
from app.core.database import driver_connection
from app.core.errors import ProblemError
from app.engine.accounting import overflow_errors
from app.engine.proxy.wire import retry_target
from app.proxy.call import Call, ProxyDeps
from app.sessions import service as sessions
from app.store.session_row import locked, read_state

log = logging.getLogger("compactd.proxy")


async def relieved(
    deps: ProxyDeps, call: Call, status: int, raw: bytes, verdict: overflow_errors.OverflowMatch
) -> bool:
    """After a provider's overflow error: relieve the window as a forwarded provider
    error does (prune, with no minimum; a compaction queued), and when that leaves
    more than the retry should hold, an emergency compaction on the spot. Whether
    the context is now smaller than the one refused (only then is it retried)."""
    if call.attempts > 1:
        return False
    message = raw.decode("utf-8", "replace")[:1_000_000]
    budget = BudgetService(deps.engine, deps.tenant_id)
    answer = await budget.provider_error(
        call.session_id,
        ProviderError(status=status, message=message, context_version=call.version),
    )
    target = retry_target(call.sent_tokens, verdict)
    now = await _context_tokens(deps, call.session_id)
    if now > target:
        compacted = await compact_now(deps, call.session_id)
        queued = answer.recovery.compaction if answer.recovery else None
        if compacted and queued is not None and queued.created and queued.status == "queued":
            # The emergency compaction did the queued one's work.
            with contextlib.suppress(ProblemError):
                await CompactionService(deps.engine, deps.tenant_id).cancel(
                    call.session_id, queued.id
                )
        now = await _context_tokens(deps, call.session_id)
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


async def _context_tokens(deps: ProxyDeps, session_id: str) -> int:
    async with driver_connection(deps.engine) as driver:
        state = await read_state(driver, deps.tenant_id, session_id)
    return 0 if state is None else state.context_tokens


async def compact_now(deps: ProxyDeps, session_id: str, *, asked: bool = False) -> bool:
    """An extractive compaction on the spot (``asked``: the agent asked for it, so a
    session whose automatic compaction is off is compacted all the same)."""
    with metrics.after_commit():
        async with locked(deps.engine, deps.tenant_id, session_id) as unit:
            config = sessions.effective_config(unit.state.config)
            if not (config.compaction.enabled and (asked or config.compaction.auto)):
                return False
            # The call being retried carries the agent's next message: no "continue".
            config = config.model_copy(
                update={"compaction": config.compaction.model_copy(update={"auto_continue": False})}
            )
            return await pivot.compact_now(unit, config, now=datetime.now(UTC)) is not None
