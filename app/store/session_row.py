"""The ``session`` row: the one module that reads it, locks it and writes it.

Every change to a session's running totals and guards goes through
:meth:`Unit.save` (or, for the append's optimistic write, :func:`set_clause`
inside the append's one statement): the caller changes a :class:`SessionState`
in memory, with the row locked, and the row is written from it, columns that
changed only. So the totals have one writer, and "lock the session, do the
work, write the totals, commit" is written once, in :func:`locked`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from functools import lru_cache
from typing import Any

import asyncpg
from sqlalchemy import and_, delete, or_, select, text, true, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.core.database import driver_connection
from app.core.driver import Driver, Record, column_names, record_of
from app.core.errors import NotFound
from app.engine import tree
from app.engine.accounting import ledger
from app.store.tables import Branch, Entry, Event, PruneMark, Session, ToolCall


@dataclasses.dataclass(slots=True)
class SessionState:
    """The session columns the hot paths (append, context, prune, usage,
    compaction) read on a bare asyncpg connection, and the ones they write."""

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
    pruned_tokens: int
    usage_count: int
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
    # Where the session's entries are stored (its family's root) and the path it
    # follows from the root to its leaf (app.engine.tree.Path).
    family_id: str
    path_branches: list[int]
    path_ends: list[int]

    @property
    def path(self) -> tree.Path:
        return tree.Path(tuple(self.path_branches), tuple(self.path_ends))


STATE_FIELDS = column_names(SessionState)
STATE_COLUMNS = ", ".join(f"s.{name}" for name in STATE_FIELDS)
# What the hot paths write; the rest (model, window, config) is the session's
# settings, changed only by PATCH.
WRITTEN_FIELDS = tuple(
    name
    for name in STATE_FIELDS
    if name
    not in ("model", "context_window", "max_output_tokens", "input_limit", "config", "family_id")
)
_JSONB = frozenset({"last_usage"})
_ARRAYS = {"pinned_seqs": "bigint[]", "path_branches": "bigint[]", "path_ends": "bigint[]"}


def state_of(row: Record) -> SessionState:
    """A row that selected ``STATE_COLUMNS`` (and maybe more), as a state."""
    return record_of(SessionState, row)


def advance(state: object, event: ledger.LedgerEvent) -> None:
    """Apply ``event`` to the running totals of ``state`` (a :class:`SessionState`
    or the ORM row), in place: the arithmetic is :func:`app.engine.accounting.ledger.apply`'s."""
    values = {name: getattr(state, name) for name in ledger.TOTALS_FIELDS}
    values["pinned_seqs"] = tuple(values["pinned_seqs"] or ())
    before = ledger.Totals(**values)
    for name, value in ledger.changed(before, ledger.apply(before, event)).items():
        setattr(state, name, value)


def snapshot(state: SessionState) -> SessionState:
    """A copy that later changes to ``state`` leave alone."""
    return dataclasses.replace(
        state,
        pinned_seqs=list(state.pinned_seqs),
        path_branches=list(state.path_branches),
        path_ends=list(state.path_ends),
    )


_READ_SQL = f"SELECT {STATE_COLUMNS} FROM session AS s WHERE s.id = $1 AND s.tenant_id = $2"
_LOCK_SQL = _READ_SQL + " FOR UPDATE"


async def read_state(driver: Driver, tenant_id: str, session_id: str) -> SessionState | None:
    """The session's state, unlocked."""
    row = await driver.fetchrow(_READ_SQL, session_id, tenant_id)
    return None if row is None else state_of(row)


async def lock_state(driver: Driver, tenant_id: str, session_id: str) -> SessionState | None:
    """The session's state, its row locked for the caller's transaction."""
    row = await driver.fetchrow(_LOCK_SQL, session_id, tenant_id)
    return None if row is None else state_of(row)


_EXISTS_SQL = "SELECT 1 FROM session WHERE id = $1 AND tenant_id = $2"


async def exists(driver: Driver, tenant_id: str, session_id: str) -> bool:
    return await driver.fetchval(_EXISTS_SQL, session_id, tenant_id) is not None


def _cast(name: str, param: int) -> str:
    if name in _JSONB:
        return f"${param}::jsonb"
    if name in _ARRAYS:
        return f"${param}::{_ARRAYS[name]}"
    return f"${param}"


@lru_cache(maxsize=64)
def set_clause(names: tuple[str, ...], first_param: int) -> str:
    """``col = $n, ...`` for ``names`` from parameter ``first_param`` on: the one
    place that spells a write of the session's state."""
    return ", ".join(f"{name} = {_cast(name, first_param + i)}" for i, name in enumerate(names))


@lru_cache(maxsize=64)
def _update_sql(names: tuple[str, ...], touched_now: bool) -> str:
    sets = set_clause(names, 3) if names else ""
    if touched_now:  # the database's clock: the transaction's start
        sets = f"{sets}, updated_at = now()" if sets else "updated_at = now()"
    return f"UPDATE session SET {sets} WHERE id = $1 AND tenant_id = $2"


class Unit:
    """A session locked for one transaction: its state read once, changed in
    memory by the use case, and written with :meth:`save` (the columns that
    changed since the last save; with ``updated_at`` whenever the version moved).

    A session that a unit did not read locked is never given one: writing
    absolute values is safe only because nothing else writes the row meanwhile.
    """

    __slots__ = ("_saved", "driver", "session_id", "state", "tenant_id")

    def __init__(self, driver: Driver, tenant_id: str, session_id: str, state: SessionState):
        self.driver = driver
        self.tenant_id = tenant_id
        self.session_id = session_id
        self.state = state
        self._saved = snapshot(state)

    def apply(self, event: ledger.LedgerEvent) -> None:
        """Advance the totals by ``event`` (in memory: :meth:`save` writes them)."""
        advance(self.state, event)

    async def save(self, *, now: datetime | None = None, last_usage: str | None = None) -> None:
        """Write what changed; ``last_usage`` (JSON text) too, when given. A new
        version also sets ``updated_at``: ``now``, or the database's clock."""
        state, saved = self.state, self._saved
        names = [n for n in WRITTEN_FIELDS if getattr(state, n) != getattr(saved, n)]
        values: list[object] = [getattr(state, n) for n in names]
        if last_usage is not None:
            names.append("last_usage")
            values.append(last_usage)
        touched = state.version != saved.version
        if touched and now is not None:
            names.append("updated_at")
            values.append(now)
        if not names and not touched:
            return
        sql = _update_sql(tuple(names), touched and now is None)
        await self.driver.execute(sql, self.session_id, self.tenant_id, *values)
        self._saved = snapshot(state)


async def lock(driver: Driver, tenant_id: str, session_id: str) -> Unit | None:
    """The session locked in the caller's transaction, or None if it does not exist."""
    state = await lock_state(driver, tenant_id, session_id)
    return None if state is None else Unit(driver, tenant_id, session_id, state)


@asynccontextmanager
async def locked(engine: AsyncEngine, tenant_id: str, session_id: str) -> AsyncIterator[Unit]:
    """The unit of work of every use case that changes a session: a connection,
    a transaction, the row locked (404 if there is none); commits on exit."""
    async with driver_connection(engine) as driver, driver.transaction():
        unit = await lock(driver, tenant_id, session_id)
        if unit is None:
            raise NotFound(f"session {session_id!r} does not exist")
        yield unit


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


async def record_served(
    driver: Driver, tenant_id: str, session_id: str, state: SessionState
) -> None:
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


# How far other live sessions of the family reach into each branch a deleted session
# wrote: what lies beyond, on those branches, no one reaches any more.
_TRIM_SQL = """
WITH reach AS (
    SELECT b.branch_id,
        max((o.path_ends || {open}::bigint)[array_position(o.path_branches, b.branch_id)]) AS last
    FROM branch AS b
    JOIN branch AS o ON o.session_id = b.session_id AND o.tenant_id = b.tenant_id
        AND b.branch_id = ANY(o.path_branches)
    JOIN session AS s ON s.id = o.owner_id AND s.tenant_id = o.tenant_id
        AND s.family_id = :family AND s.id <> :sid
    WHERE b.session_id = :family AND b.tenant_id = :tenant AND b.owner_id = :sid
    GROUP BY b.branch_id
)
DELETE FROM {table} AS x USING reach AS r
WHERE x.session_id = :family AND x.tenant_id = :tenant AND x.branch = r.branch_id
    AND x.{seq} > r.last
""".replace("{open}", str(tree.OPEN))
# A deleted session's branches that stay belong to no session: a new session that
# takes its id (a fork of the family) writes none of them.
_DISOWN_SQL = """
UPDATE branch SET owner_id = ''
WHERE session_id = :family AND tenant_id = :tenant AND owner_id = :sid
"""


class SessionRepository:
    """Sessions through the ORM, for the requests that manage them (create,
    read, list, change, delete); the hot paths use :class:`Unit` instead."""

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
        self,
        *,
        limit: int,
        after: tuple[datetime, str] | None,
        metadata: dict[str, Any] | None,
        parent_id: str | None = None,
    ) -> list[Session]:
        stmt = select(Session).where(Session.tenant_id == self.tenant_id)
        if parent_id is not None:
            stmt = stmt.where(Session.parent_id == parent_id)
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

    async def delete(self, session_id: str, family_id: str) -> bool:
        """The session and everything of it: the tables with a foreign key go by
        cascade; prune marks (which have none) here, and the entries, calls and
        branches of its family that no other session of it reaches (a fork's
        path runs through the session it was made from), in the same transaction."""
        await self.db.execute(
            delete(PruneMark).where(
                PruneMark.session_id == session_id, PruneMark.tenant_id == self.tenant_id
            )
        )
        await self.db.execute(
            delete(Event).where(Event.session_id == session_id, Event.tenant_id == self.tenant_id)
        )
        reached = (
            select(Branch.path_branches)
            .join(
                Session, (Session.id == Branch.owner_id) & (Session.tenant_id == Branch.tenant_id)
            )
            .where(
                Branch.session_id == family_id,
                Branch.tenant_id == self.tenant_id,
                Session.family_id == family_id,
                Session.id != session_id,
            )
        )
        kept = {b for (path,) in await self.db.execute(reached) for b in path}
        doomed = (
            select(Branch.branch_id)
            .where(Branch.session_id == family_id, Branch.tenant_id == self.tenant_id)
            .where(Branch.branch_id.not_in(kept) if kept else true())
        )
        orphans = [b for (b,) in await self.db.execute(doomed)]
        # The session's branches that others still reach (a fork's path runs through
        # them) stay, as far as they reach them; from now on no session writes them.
        params = {"family": family_id, "tenant": self.tenant_id, "sid": session_id}
        for name, seq in (("entry", "seq"), ("tool_call", "call_seq")):
            await self.db.execute(text(_TRIM_SQL.format(table=name, seq=seq)), params)
        await self.db.execute(text(_DISOWN_SQL), params)
        if orphans:
            for table, column in (
                (Entry, Entry.branch),
                (ToolCall, ToolCall.branch),
                (Branch, Branch.branch_id),
            ):
                await self.db.execute(
                    delete(table).where(
                        table.session_id == family_id,
                        table.tenant_id == self.tenant_id,
                        column.in_(orphans),
                    )
                )
        result = await self.db.execute(
            delete(Session)
            .where(Session.id == session_id, Session.tenant_id == self.tenant_id)
            .returning(Session.id)
        )
        return result.scalar_one_or_none() is not None
