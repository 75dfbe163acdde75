"""Reading the stored history back: pages of entries, rendered in a wire format."""

from __future__ import annotations

from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.database import driver_connection
from app.core.errors import NotFound
from app.engine import tree
from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry
from app.history.schemas import Format, HistoryEntry, HistoryPage
from app.store import history
from app.store.history import HistoryRow
from app.store.paths import OnPath
from app.store.session_row import read_state


def entry_from_row(row: Any, extra: dict[str, Any] | None = None) -> Entry:
    """A stored row as an entry; ``extra`` (the client's unknown keys) only for history."""
    return Entry(
        role=row.role,
        parts=row.parts,
        tool_call_id=row.tool_call_id,
        tool_name=row.tool_name,
        is_error=row.is_error,
        name=row.name,
        content_form=row.content_form,
        extra=extra or {},
        tokens=row.tokens,
    )


def render_history(row: HistoryRow, fmt: Format) -> dict[str, Any]:
    entry = entry_from_row(row, row.extra)
    if fmt == "openai":
        return openai_format.render_message(entry, for_history=True)
    if entry.role in ("system", "developer"):
        return {
            "role": entry.role,
            "content": entry.text()
            if entry.content_form == "string"
            else [
                # A top-level system's blocks keep their cache_control and the like.
                {"type": "text", "text": p["text"], **p.get("extra", {})}
                for p in entry.parts
                if p["type"] == "text"
            ],
            # A mid-conversation system message's own keys (Claude Code's output_config).
            **entry.extra,
        }
    _, msgs = anthropic_format.render_messages([entry], for_history=True)
    return msgs[0] if msgs else {"role": entry.role, "content": []}


class HistoryService:
    """Reading the message log of one tenant's sessions."""

    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def history(
        self,
        session_id: str,
        *,
        after_seq: int,
        limit: int,
        fmt: Format,
        before_seq: int | None = None,
        replaced_only: bool = False,
        path: tree.Path | None = None,
    ) -> HistoryPage:
        """A page of the session's path (or of ``path``, a path of its family)."""
        async with driver_connection(self.engine) as driver:
            session = await read_state(driver, self.tenant_id, session_id)
            if session is None:
                raise NotFound(f"session {session_id!r} does not exist")
            at = OnPath(session_id, session.family_id, path or session.path)
            rows = await history.page(
                driver,
                self.tenant_id,
                at,
                after_seq,
                limit + 1,
                before_seq=before_seq,
                replaced_only=replaced_only,
            )
        page = rows[:limit]
        return HistoryPage(
            entries=[
                HistoryEntry(
                    id=r.id,
                    seq=r.seq,
                    kind=r.kind,
                    role=r.role,
                    tokens=r.tokens,
                    source_format=r.source_format,
                    tool_name=r.tool_name,
                    created_at=r.created_at,
                    pruned_at=r.pruned_at,
                    erased_bytes=r.erased_bytes,
                    omitted_lines=r.omitted_lines,
                    omitted_bytes=r.omitted_bytes,
                    message=render_history(r, fmt),
                )
                for r in page
            ],
            next_after_seq=page[-1].seq if len(rows) > limit else None,
        )
