"""All SQL for the message log, the tool-call index and idempotency records."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.messages.models import Entry, IdempotencyRecord, ToolCall

# What a context read needs: pairing links, counts and one rendered fragment.
_WINDOW_SQL = {
    fmt: (
        f"SELECT seq, role, tool_call_id, call_ids, tokens, {column} AS view FROM entry"
        " WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 ORDER BY seq"
    )
    for fmt, column in (("openai", "view_openai"), ("anthropic", "view_anthropic"))
}


class MessageRepository:
    def __init__(self, db: AsyncSession, tenant_id: str) -> None:
        self.db = db
        self.tenant_id = tenant_id

    async def idempotency_record(self, session_id: str, key: str) -> IdempotencyRecord | None:
        stmt = select(IdempotencyRecord).where(
            IdempotencyRecord.session_id == session_id,
            IdempotencyRecord.tenant_id == self.tenant_id,
            IdempotencyRecord.key == key,
        )
        return (await self.db.execute(stmt)).scalar_one_or_none()

    async def save_idempotency_record(
        self,
        session_id: str,
        key: str,
        request_hash: str,
        status_code: int,
        response: dict[str, Any],
    ) -> None:
        await self.db.execute(
            pg_insert(IdempotencyRecord).values(
                session_id=session_id,
                tenant_id=self.tenant_id,
                key=key,
                request_hash=request_hash,
                status_code=status_code,
                response=response,
            )
        )

    async def tool_calls(self, session_id: str, call_ids: list[str]) -> dict[str, ToolCall]:
        if not call_ids:
            return {}
        stmt = select(ToolCall).where(
            ToolCall.session_id == session_id,
            ToolCall.tenant_id == self.tenant_id,
            ToolCall.call_id.in_(call_ids),
        )
        return {c.call_id: c for c in (await self.db.execute(stmt)).scalars()}

    async def insert_entries(self, rows: list[dict[str, Any]]) -> None:
        await self.db.execute(insert(Entry), rows)

    async def insert_tool_calls(self, rows: list[dict[str, Any]]) -> None:
        if rows:
            await self.db.execute(insert(ToolCall), rows)

    async def mark_answered(self, session_id: str, answers: dict[str, int]) -> None:
        if not answers:
            return
        stmt = (
            update(ToolCall)
            .where(
                ToolCall.session_id == session_id,
                ToolCall.tenant_id == self.tenant_id,
                ToolCall.call_id == bindparam("answered_call_id"),
            )
            .values(result_seq=bindparam("answered_seq"))
        )
        params = [{"answered_call_id": c, "answered_seq": s} for c, s in answers.items()]
        await (await self.db.connection()).execute(stmt, params)

    async def window(self, session_id: str, start_seq: int, fmt: str) -> list[Any]:
        """The entries of the model's view, from the pivot on: light columns and the
        fragment rendered for ``fmt``, never the parts.

        The hottest read of the service, so it goes to asyncpg directly: rows
        come back as records (``seq, role, tool_call_id, call_ids, tokens, view``)
        without a per-row ORM pass.
        """
        sql = _WINDOW_SQL[fmt]
        conn = await (await self.db.connection()).get_raw_connection()
        driver: Any = conn.driver_connection
        records: list[Any] = await driver.fetch(sql, session_id, self.tenant_id, start_seq)
        return records

    async def page(self, session_id: str, after_seq: int, limit: int) -> list[Entry]:
        stmt = (
            select(Entry)
            .where(
                Entry.session_id == session_id,
                Entry.tenant_id == self.tenant_id,
                Entry.seq > after_seq,
            )
            .order_by(Entry.seq)
            .limit(limit)
        )
        return list((await self.db.execute(stmt)).scalars())
