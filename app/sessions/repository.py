"""All SQL for sessions. Every query is scoped by tenant; nothing commits here."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import asyncpg
from sqlalchemy import and_, delete, or_, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession

from app.messages.models import PruneMark
from app.sessions.models import Session


@dataclass(slots=True)
class SessionState:
    """The session columns the hot paths (append, context) read on a bare
    asyncpg connection; an append also advances the totals."""

    model: str
    context_window: int | None
    max_output_tokens: int | None
    input_limit: int | None
    config: dict[str, Any]
    version: int
    next_seq: int
    entry_count: int
    stored_tokens: int
    context_tokens: int
    context_tool_tokens: int
    calibration_factor: float
    overhead_tokens: int
    reported_prompt_tokens: int | None
    context_tokens_at_report: int | None
    context_start_seq: int
    prune_checked_tool_tokens: int | None
    prune_checked_urgent: bool | None
    prune_count: int
    summary_seq: int | None
    pinned_seqs: list[int]
    active_compaction_id: uuid.UUID | None
    compaction_failures: int
    compaction_held_seq: int | None
    compaction_count: int
    pivot_version: int | None
    served_version: int | None
    served_context_tokens: int | None
    served_compaction_id: uuid.UUID | None


STATE_FIELDS = tuple(f.name for f in fields(SessionState))
STATE_COLUMNS = ", ".join(f"s.{name}" for name in STATE_FIELDS)
_LOCK_STATE_SQL = (
    f"SELECT {STATE_COLUMNS} FROM session AS s WHERE s.id = $1 AND s.tenant_id = $2 FOR UPDATE"
)


_READ_STATE_SQL = f"SELECT {STATE_COLUMNS} FROM session AS s WHERE s.id = $1 AND s.tenant_id = $2"


async def read_state(driver: Any, tenant_id: str, session_id: str) -> SessionState | None:
    """The session's state, unlocked."""
    row = await driver.fetchrow(_READ_STATE_SQL, session_id, tenant_id)
    return None if row is None else SessionState(*row)


async def lock_state(driver: Any, tenant_id: str, session_id: str) -> SessionState | None:
    """The session's state, its row locked for the caller's transaction."""
    row = await driver.fetchrow(_LOCK_STATE_SQL, session_id, tenant_id)
    return None if row is None else SessionState(*row)


# Not a change of the session (no new version): bookkeeping of what was read.
# A context read never waits on the session row: appends, usage reports and
# compaction commits hold its lock for the length of their transactions, and a
# read queued behind them would stall (or fail past statement_timeout) for the
# sake of a note. So the row is updated only if it can be locked at once (SKIP
# LOCKED; NO KEY UPDATE, the lock an UPDATE of these columns takes, so that
# foreign-key checks of entries being inserted do not get in the way), and
# otherwise the read records nothing. Only forward, so that a read racing
# others never writes back an older context than one recorded since: a newer
# version; the same version only while the compaction it saw is still the
# active one (queuing one does not move the version); and once a report has
# consumed the record (NULL), only the session's current version, since an
# older read may finish after the report that measured a newer context.
_SERVED_SQL = """
UPDATE session SET served_version = $3, served_context_tokens = $4, served_compaction_id = $5
WHERE id = $1 AND tenant_id = $2
    AND id IN (
        SELECT id FROM session WHERE id = $1 AND tenant_id = $2 FOR NO KEY UPDATE SKIP LOCKED
    )
    AND CASE
        WHEN served_version IS NULL THEN version = $3
        WHEN served_version < $3 THEN true
        WHEN served_version = $3 THEN active_compaction_id IS NOT DISTINCT FROM $5
        ELSE false
    END
"""


async def record_served(driver: Any, tenant_id: str, session_id: str, state: SessionState) -> None:
    """Remember the context just served (read as ``state``): the usage report
    of the model call made with it may come without its version.

    Best effort, and never a wait: when the session row is locked by a write in
    progress, or the database is read-only, nothing is recorded, and a report
    without ``context_version`` that follows falls back to the rule for an
    unknown context (see :func:`app.budget.service.measured_before_pivot`).
    Reading the same context again writes nothing.
    """
    if (
        state.served_version == state.version
        and state.served_compaction_id == state.active_compaction_id
    ):
        return  # served already and not measured yet: nothing to write
    # A read-only database (a standby) still serves contexts.
    with contextlib.suppress(asyncpg.ReadOnlySQLTransactionError):
        await driver.execute(
            _SERVED_SQL,
            session_id,
            tenant_id,
            state.version,
            state.context_tokens,
            state.active_compaction_id,
        )


class SessionRepository:
    def __init__(self, db: AsyncSession, tenant_id: str) -> None:
        self.db = db
        self.tenant_id = tenant_id

    async def get(self, session_id: str, *, for_update: bool = False) -> Session | None:
        stmt = select(Session).where(Session.id == session_id, Session.tenant_id == self.tenant_id)
        if for_update:
            stmt = stmt.with_for_update().execution_options(populate_existing=True)
        return (await self.db.execute(stmt)).scalar_one_or_none()

    async def add(self, session: Session) -> None:
        self.db.add(session)
        await self.db.flush()

    async def list(
        self, *, limit: int, after: tuple[datetime, str] | None, metadata: dict[str, Any] | None
    ) -> list[Session]:
        stmt = select(Session).where(Session.tenant_id == self.tenant_id)
        if metadata:
            stmt = stmt.where(Session.metadata_.contains(metadata))
        if after is not None:
            created_at, sid = after
            stmt = stmt.where(
                or_(
                    Session.created_at > created_at,
                    and_(Session.created_at == created_at, Session.id > sid),
                )
            )
        stmt = stmt.order_by(tuple_(Session.created_at, Session.id)).limit(limit)
        return list((await self.db.execute(stmt)).scalars())

    async def delete(self, session_id: str) -> bool:
        """The session and everything of it: the tables with a foreign key go by
        cascade, prune marks (which have none) here, in the same transaction."""
        await self.db.execute(
            delete(PruneMark).where(
                PruneMark.session_id == session_id, PruneMark.tenant_id == self.tenant_id
            )
        )
        result = await self.db.execute(
            delete(Session)
            .where(Session.id == session_id, Session.tenant_id == self.tenant_id)
            .returning(Session.id)
        )
        return result.scalar_one_or_none() is not None
