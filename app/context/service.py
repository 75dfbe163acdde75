"""Building the context: the stored window, paired and rendered. No tokenizing."""

from __future__ import annotations

from typing import Literal

from sqlalchemy.ext.asyncio import AsyncSession

from app.context.schemas import ContextOut, ContextTokens, TokenBreakdown
from app.engine import anthropic_format, budget, openai_format
from app.engine.context import pair_tool_calls
from app.engine.tokens import REPLY_PRIMING_TOKENS
from app.messages.repository import MessageRepository
from app.messages.schemas import Format
from app.messages.service import entry_from_row
from app.sessions import service as sessions
from app.sessions.service import SessionService

_STATE: dict[str, Literal["ok", "prune", "compact", "overflow"]] = {
    "none": "ok",
    "prune": "prune",
    "compact": "compact",
    "emergency": "overflow",
}


class ContextService:
    def __init__(self, db: AsyncSession, tenant_id: str) -> None:
        self.sessions = SessionService(db, tenant_id)
        self.messages = MessageRepository(db, tenant_id)

    async def build(self, session_id: str, fmt: Format) -> ContextOut:
        session = await self.sessions.require(session_id)
        rows = await self.messages.window(session_id, session.context_start_seq)
        view = pair_tool_calls([entry_from_row(row) for row in rows])
        tool_tokens = sum(e.tokens for e in view if e.role == "tool")
        message_tokens = sum(e.tokens for e in view if e.role != "tool")
        overhead = REPLY_PRIMING_TOKENS + session.overhead_tokens
        window, _ = sessions.window_of(session)
        config = sessions.effective_config(session.config)
        acc = budget.Accounting(
            context_tokens=tool_tokens + message_tokens,
            calibration_factor=session.calibration_factor,
            overhead_tokens=overhead,
            reported_prompt_tokens=session.reported_prompt_tokens,
            context_tokens_at_report=session.context_tokens_at_report,
        )
        verdict = budget.verdict(acc, window, sessions.thresholds_of(config))

        system = None
        if fmt == "openai":
            messages = [openai_format.render_message(e) for e in view]
        else:
            system, messages = anthropic_format.render_messages(view)
        # Built from data the engine made; validating 1,000 messages again buys nothing.
        return ContextOut.model_construct(
            format=fmt,
            messages=messages,
            system=system,
            tokens=ContextTokens(
                estimated=verdict.estimated_tokens,
                budget=verdict.usable_tokens,
                fraction=verdict.fraction,
                breakdown=TokenBreakdown(
                    summary=0, messages=message_tokens, tool_outputs=tool_tokens, overhead=overhead
                ),
            ),
            state=_STATE[verdict.action],
            compaction=None,
            version=session.version,
        )
