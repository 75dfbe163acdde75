"""Building the context: the stored window, paired and spliced. No tokenizing, no
rendering: both were done once, when each message was written."""

from __future__ import annotations

from typing import Literal, NamedTuple

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.context.schemas import ContextTokens, TokenBreakdown
from app.core.database import driver_connection
from app.core.driver import Record
from app.core.errors import NotFound
from app.engine.window.view import PlaceholderViews, assemble_anthropic, assemble_openai
from app.history.schemas import Format
from app.sessions import service as sessions
from app.store.log import OnPath, read_state_and_marks, read_window
from app.store.session_row import record_served

_STATE: dict[str, Literal["ok", "prune", "compact", "overflow"]] = {
    "none": "ok",
    "prune": "prune",
    "compact": "compact",
    "emergency": "overflow",
}


class _Item(NamedTuple):
    """One row of the window, as the assemblers read it (both view names hold the
    fragment of the requested format). A tuple: a context read makes one per row."""

    seq: int
    role: str
    tool_call_id: str | None
    call_ids: tuple[str, ...]
    tokens: int
    view_openai: str

    @property
    def view_anthropic(self) -> str:
        return self.view_openai


_new_item = tuple.__new__  # _Item(...) without NamedTuple's Python-level __new__


def _item(row: Record, view: str, tokens: int) -> _Item:
    call_ids = row["call_ids"]
    return _new_item(
        _Item,
        (
            row["seq"],
            row["role"],
            row["link_id"],
            tuple(call_ids) if call_ids else (),
            tokens,
            view,
        ),
    )


def _items(rows: list[Record], marks: dict[int, int], fmt: Format, placeholder: str) -> list[_Item]:
    """The window's rows; a pruned tool result shows the placeholder and costs its tokens."""
    if not marks:
        return [_item(row, row["view"], row["tokens"]) for row in rows]
    views = PlaceholderViews(placeholder)
    side = 0 if fmt == "openai" else 1
    items = []
    for row in rows:
        tokens = marks.get(row["seq"])
        if tokens is None:
            items.append(_item(row, row["view"], row["tokens"]))
        else:
            rendered = views.render(row["link_id"], row["is_error"])[side]
            items.append(_item(row, rendered, tokens))
    return items


class ContextService:
    """The context read: two statements on a bare asyncpg connection. The session
    and its prune marks come from one snapshot, and the window stops below the
    ``next_seq`` read with them, so it matches the totals even when an append
    commits between the two."""

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def build(self, session_id: str, fmt: Format) -> bytes:
        """The ``ContextOut`` document as JSON bytes."""
        async with driver_connection(self.engine) as driver:
            found = await read_state_and_marks(driver, self.tenant_id, session_id)
            if found is None:
                raise NotFound(f"session {session_id!r} does not exist")
            session, marks = found
            start, end = session.context_start_seq, session.next_seq
            rows = await read_window(
                driver,
                self.tenant_id,
                OnPath.of(session_id, session),
                start,
                end,
                fmt,
                summary_seq=session.summary_seq,
                pinned_seqs=session.pinned_seqs,
            )
            await record_served(driver, self.tenant_id, session_id, session)
        config = sessions.effective_config(session.config)
        items = _items(rows, marks, fmt, config.prune.placeholder)
        system_json: bytes | None = None
        if fmt == "openai":
            messages_json, used = assemble_openai(items)
        else:
            system_json, messages_json, used = assemble_anthropic(items)

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
