"""GET /context: the context assembled (:mod:`app.context.assembly`, as the proxy's is)
with its token figures, spliced into one document. No tokenizing, no rendering: both
were done once, when each message was written."""

from __future__ import annotations

from typing import Literal

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.context import assembly
from app.context.schemas import ContextTokens, TokenBreakdown
from app.core.database import driver_connection
from app.history.schemas import Format
from app.sessions import service as sessions
from app.store.session_row import record_served

_STATE: dict[str, Literal["ok", "prune", "compact", "overflow"]] = {
    "none": "ok",
    "prune": "prune",
    "compact": "compact",
    "emergency": "overflow",
}


class ContextService:
    """The context read: the window's two statements (:func:`app.context.assembly.read`)
    on a bare asyncpg connection, and the context recorded as served."""

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def build(self, session_id: str, fmt: Format) -> bytes:
        """The ``ContextOut`` document as JSON bytes."""
        async with driver_connection(self.engine) as driver:
            window = await assembly.read(driver, self.tenant_id, session_id, fmt)
            await record_served(driver, self.tenant_id, session_id, window.state)
        session, config, items = window.state, window.config, window.items
        messages_json, system_json, used = assembly.assemble(items, fmt)

        summary_tokens = tool_tokens = message_tokens = 0
        for i in used:
            item = items[i]
            if item.seq == session.summary_seq:
                summary_tokens += item.tokens
            elif item.role == "tool":
                tool_tokens += item.tokens
            else:
                message_tokens += item.tokens
        # The estimate, state and fraction are the session's verdict, the very
        # figures /overflow gives: one computation from the running totals. The
        # breakdown says what the messages assembled here hold, and the overhead
        # the verdict counts (the reply's priming in it).
        verdict = sessions.verdict_of(session, config)
        overhead = sessions.accounting_of(session).overhead_tokens
        tokens = ContextTokens(
            estimated=verdict.estimated_tokens,
            budget=verdict.usable_tokens,
            fraction=verdict.fraction,
            breakdown=TokenBreakdown(
                summary=summary_tokens,
                messages=message_tokens,
                tool_outputs=tool_tokens,
                overhead=overhead,
            ),
        )
        rest = orjson.dumps(
            {
                "format": fmt,
                "tokens": tokens.model_dump(),
                "state": _STATE[verdict.action],
                "compaction": None
                if session.summary_seq is None
                else {
                    "entry_seq": session.summary_seq,
                    "first_kept_seq": session.context_start_seq,
                    "summary_tokens": summary_tokens,
                    "count": session.compaction_count,
                },
                "version": session.version,
            }
        )
        # Splice the stored fragments in as they are: the one JSON pass of a read.
        return b"".join(
            (
                b'{"messages":',
                messages_json,
                b',"system":',
                system_json if system_json is not None else b"null",
                b",",
                rest[1:],
            )
        )
