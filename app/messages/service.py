"""Appending to and reading the stored history."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime
from typing import Any

import orjson
from sqlalchemy.ext.asyncio import AsyncSession

from app.core.errors import UnprocessableContent, invalid
from app.engine import anthropic_format, catalog, openai_format, tokens, view
from app.engine.model import Entry, InvalidMessage
from app.messages.models import Entry as EntryRow
from app.messages.repository import MessageRepository
from app.messages.schemas import (
    AppendRequest,
    AppendResponse,
    Format,
    HistoryEntry,
    HistoryPage,
    StoredEntry,
    Verdict,
)
from app.sessions import service as sessions
from app.sessions.service import SessionService

# Call ids are a btree key, and Postgres refuses index rows over ~2.7 kB; real
# providers use ids of a few dozen characters.
MAX_TOOL_CALL_ID_CHARS = 512


def parse_batch(messages: list[Any], fmt: Format) -> list[Entry]:
    """The batch in the canonical model; raises a 422 naming the first bad field."""
    entries: list[Entry] = []
    try:
        for i, raw in enumerate(messages):
            path = f"messages[{i}]"
            if fmt == "openai":
                entries.append(openai_format.parse_message(raw, path))
            else:
                entries.extend(anthropic_format.parse_message(raw, path))
    except InvalidMessage as exc:
        raise invalid(exc.path, exc.detail) from None
    return entries


def request_hash(body: AppendRequest) -> str:
    raw = orjson.dumps(
        {"format": body.format, "messages": body.messages}, option=orjson.OPT_SORT_KEYS
    )
    return hashlib.sha256(raw).hexdigest()


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


def render_history(row: EntryRow, fmt: Format) -> dict[str, Any]:
    entry = entry_from_row(row, row.extra)
    if fmt == "openai":
        return openai_format.render_message(entry, for_history=True)
    if entry.role in ("system", "developer"):
        return {
            "role": entry.role,
            "content": entry.text()
            if entry.content_form == "string"
            else [{"type": "text", "text": p["text"]} for p in entry.parts if p["type"] == "text"],
        }
    _, msgs = anthropic_format.render_messages([entry], for_history=True)
    return msgs[0] if msgs else {"role": entry.role, "content": []}


class MessageService:
    """The message log of one tenant's sessions."""

    def __init__(self, db: AsyncSession, tenant_id: str) -> None:
        self.db = db
        self.tenant_id = tenant_id
        self.repo = MessageRepository(db, tenant_id)
        self.sessions = SessionService(db, tenant_id)

    async def append(
        self,
        session_id: str,
        body: AppendRequest,
        *,
        idempotency_key: str | None,
        if_match: str | None,
        max_messages: int | None = None,
    ) -> tuple[AppendResponse, bool]:
        """Store a batch atomically. Returns the response and whether it is a replay."""
        if max_messages is not None and len(body.messages) > max_messages:
            raise invalid(
                "messages",
                f"holds {len(body.messages)} messages; at most {max_messages} per append",
            )
        entries = parse_batch(body.messages, body.format)
        digest = request_hash(body) if idempotency_key else ""
        # The row lock serializes appends to one session (seq without gaps); it
        # costs nothing to other sessions. One read, then count under it.
        session = await self.sessions.require(session_id, for_update=True)
        if idempotency_key:
            record = await self.repo.idempotency_record(session_id, idempotency_key)
            if record is not None:
                if record.request_hash != digest:
                    raise UnprocessableContent(
                        f"Idempotency-Key {idempotency_key!r} was already used with a different body",
                        errors=[
                            {"field": "Idempotency-Key", "detail": "reused with a different body"}
                        ],
                    )
                return AppendResponse.model_validate(record.response), True
        sessions.check_if_match(if_match, session.version)
        encoding = catalog.lookup(session.model).encoding
        counts = [tokens.count_entry(e, encoding) for e in entries]

        answers, new_calls = await self._link_tool_calls(session_id, entries, session.next_seq)

        now = datetime.now(UTC)
        rows: list[dict[str, Any]] = []
        stored: list[StoredEntry] = []
        tool_tokens = 0
        for offset, (entry, count) in enumerate(zip(entries, counts, strict=True)):
            seq = session.next_seq + offset
            entry_id = uuid.uuid4()
            view_openai, view_anthropic = view.render_view(entry)
            rows.append(
                {
                    "session_id": session_id,
                    "tenant_id": self.tenant_id,
                    "seq": seq,
                    "id": entry_id,
                    "kind": "message",
                    "role": entry.role,
                    "parts": entry.parts,
                    "tool_call_id": entry.tool_call_id,
                    "tool_name": entry.tool_name,
                    "is_error": entry.is_error,
                    "name": entry.name,
                    "content_form": entry.content_form,
                    "extra": entry.extra or None,
                    "source_format": body.format,
                    "tokens": count,
                    "call_ids": list(entry.call_ids) or None,
                    "view_openai": view_openai,
                    "view_anthropic": view_anthropic,
                    "parent_seq": seq - 1 if seq > 1 else None,
                    "created_at": now,
                }
            )
            stored.append(StoredEntry(id=entry_id, seq=seq, role=entry.role, tokens=count))
            if entry.role == "tool":
                tool_tokens += count
        await self.repo.insert_entries(rows)
        await self.repo.insert_tool_calls(
            [
                {
                    "session_id": session_id,
                    "tenant_id": self.tenant_id,
                    "call_id": call_id,
                    "name": name,
                    "call_seq": session.next_seq + offset,
                    "result_seq": answers.pop(call_id, None),
                }
                for call_id, (name, offset) in new_calls.items()
            ]
        )
        await self.repo.mark_answered(session_id, answers)

        added = sum(counts)
        session.next_seq += len(entries)
        session.entry_count += len(entries)
        session.stored_tokens += added
        session.context_tokens += added
        session.context_tool_tokens += tool_tokens
        session.version += 1
        session.updated_at = now
        await self.db.flush()

        response = AppendResponse(
            entries=stored,
            version=session.version,
            context_tokens=session.context_tokens,
            overflow=Verdict.model_validate(sessions.verdict_of(session), from_attributes=True),
        )
        if idempotency_key:
            await self.repo.save_idempotency_record(
                session_id, idempotency_key, digest, 201, response.model_dump(mode="json")
            )
        return response, False

    async def _link_tool_calls(
        self, session_id: str, entries: list[Entry], first_seq: int
    ) -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
        """Check every result answers one open call; name each result's tool.

        Returns the stored calls answered by this batch (call id to result seq)
        and the batch's own calls (call id to tool name and batch offset).
        """
        new_calls: dict[str, tuple[str, int]] = {}
        for offset, entry in enumerate(entries):
            for call in entry.tool_calls():
                if len(call["id"]) > MAX_TOOL_CALL_ID_CHARS:
                    raise invalid(
                        f"messages[{offset}]",
                        f"a tool call id is {len(call['id'])} characters; at most {MAX_TOOL_CALL_ID_CHARS}",
                    )
                if call["id"] in new_calls:
                    raise invalid(
                        f"messages[{offset}]",
                        f"tool call id {call['id']!r} appears twice in the batch",
                    )
                new_calls[call["id"]] = (call["name"], offset)
        result_ids = [e.tool_call_id for e in entries if e.role == "tool" and e.tool_call_id]
        known = await self.repo.tool_calls(session_id, list(new_calls) + result_ids)
        for call_id in new_calls:
            if call_id in known:
                offset = new_calls[call_id][1]
                raise invalid(
                    f"messages[{offset}]",
                    f"tool call id {call_id!r} is already used by an earlier message of this session",
                )
        answered: dict[str, int] = {}
        for offset, entry in enumerate(entries):
            if entry.role != "tool" or entry.tool_call_id is None:
                continue
            call_id = entry.tool_call_id
            where = f"messages[{offset}].tool_call_id"
            if call_id in answered:
                raise invalid(where, f"tool call {call_id!r} already has a result in this batch")
            if call_id in new_calls:
                name, call_offset = new_calls[call_id]
                if call_offset > offset:
                    raise invalid(where, f"the result for {call_id!r} comes before its call")
            elif call_id in known:
                stored = known[call_id]
                if stored.result_seq is not None:
                    raise invalid(
                        where,
                        f"tool call {call_id!r} already has a result (entry seq {stored.result_seq})",
                    )
                name = stored.name
            else:
                raise invalid(where, f"{call_id!r} matches no tool call of this session")
            entry.tool_name = name
            answered[call_id] = first_seq + offset
        return answered, new_calls

    async def history(
        self, session_id: str, *, after_seq: int, limit: int, fmt: Format
    ) -> HistoryPage:
        await self.sessions.require(session_id)
        rows = await self.repo.page(session_id, after_seq, limit + 1)
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
                    message=render_history(r, fmt),
                )
                for r in page
            ],
            next_after_seq=page[-1].seq if len(rows) > limit else None,
        )
