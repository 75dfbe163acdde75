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
import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.database import driver_connection
from app.core.driver import Driver, Record, column_names, record_of
from app.core.errors import NotFound
from app.engine import tree
from app.engine.accounting import ledger
from app.engine.accounting.session_budget import SessionFigures


@dataclasses.dataclass(slots=True)
class SessionState(SessionFigures):
    """The session columns the hot paths (append, context, prune, usage,
    compaction) read on a bare asyncpg connection, and the ones they write: the
    figures the budget maths reads (:class:`SessionFigures`) and the rest."""

    config: dict[str, Any]
    version: int
    next_seq: int
    entry_count: int
    stored_tokens: int
    context_tool_tokens: int
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
_JSONB = frozenset({"last_usage", "config", "metadata"})
_ARRAYS = {"pinned_seqs": "bigint[]", "path_branches": "bigint[]", "path_ends": "bigint[]"}


def state_of(row: Record) -> SessionState:
    """A row that selected ``STATE_COLUMNS`` (and maybe more), as a state."""
    return record_of(SessionState, row)


def advance(state: SessionState, event: ledger.LedgerEvent) -> None:
    """Apply ``event`` to the running totals of ``state``, in place: the arithmetic is
    :func:`app.engine.accounting.ledger.apply`'s."""
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


# --- the session row whole: the requests that manage sessions ---------------------


@dataclasses.dataclass(slots=True)
class SessionRow(SessionState):
    """The whole session row, as its document shows it (create, read, list, change)."""

    id: str
    parent_id: str | None
    metadata: dict[str, Any]
    last_usage: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    # What compaction cost and saved (add_compaction_cost): read by the document only,
    # so not in SessionState, which every append and context read loads.
    summarizer_calls: int = 0
    summarizer_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    summarizer_cached_tokens: int = 0
    compaction_saved_tokens: int = 0


ROW_FIELDS = column_names(SessionRow)
_ROW_COLUMNS = ", ".join(f"s.{name}" for name in ROW_FIELDS)
# What PATCH changes besides the totals: the session's settings.
SETTINGS_FIELDS = ("model", "context_window", "max_output_tokens", "input_limit", "config")
_ROW_SQL = f"SELECT {_ROW_COLUMNS} FROM session AS s WHERE s.id = $1 AND s.tenant_id = $2"


def row_of(record: Record) -> SessionRow:
    return record_of(SessionRow, record)


_ADD_COST_SQL = """
UPDATE session SET summarizer_calls = summarizer_calls + $3,
    summarizer_input_tokens = summarizer_input_tokens + $4,
    summarizer_output_tokens = summarizer_output_tokens + $5,
    summarizer_cached_tokens = summarizer_cached_tokens + $6,
    compaction_saved_tokens = compaction_saved_tokens + $7
WHERE id = $1 AND tenant_id = $2
"""


async def add_compaction_cost(
    driver: Driver,
    tenant_id: str,
    session_id: str,
    *,
    calls: int,
    input_tokens: int,
    output_tokens: int,
    cached_tokens: int,
    saved_tokens: int,
) -> None:
    """Add a compaction's summarizer usage and the context tokens it removed to the
    session's sums, in the caller's transaction (the row locked by its unit of work).
    Columns no unit writes (they are not in :class:`SessionState`): added in place,
    so the version and ``updated_at`` stay the session's own."""
    await driver.execute(
        _ADD_COST_SQL,
        session_id,
        tenant_id,
        calls,
        input_tokens,
        output_tokens,
        cached_tokens,
        saved_tokens,
    )


async def read_row(
    driver: Driver, tenant_id: str, session_id: str, *, for_update: bool = False
) -> SessionRow | None:
    """The whole row; ``for_update`` locks it for the caller's transaction."""
    record = await driver.fetchrow(
        _ROW_SQL + " FOR UPDATE" if for_update else _ROW_SQL, session_id, tenant_id
    )
    return None if record is None else row_of(record)


async def list_rows(
    driver: Driver,
    tenant_id: str,
    *,
    limit: int,
    after: tuple[datetime, str] | None,
    metadata: dict[str, Any] | None,
    parent_id: str | None = None,
) -> list[SessionRow]:
    """The tenant's sessions in creation order, after ``after`` (created_at, id);
    ``metadata``: only those whose metadata holds it; ``parent_id``: its children."""
    where = ["s.tenant_id = $1"]
    args: list[object] = [tenant_id]
    if parent_id is not None:
        args.append(parent_id)
        where.append(f"s.parent_id = ${len(args)}")
    if metadata:
        args.append(_json(metadata))
        where.append(f"s.metadata @> ${len(args)}::jsonb")
    if after is not None:
        args.extend(after)
        at, sid = f"${len(args) - 1}", f"${len(args)}"
        where.append(f"(s.created_at > {at} OR (s.created_at = {at} AND s.id > {sid}))")
    args.append(limit)
    sql = (
        f"SELECT {_ROW_COLUMNS} FROM session AS s WHERE {' AND '.join(where)}"
        f" ORDER BY s.created_at, s.id LIMIT ${len(args)}"
    )
    return [row_of(r) for r in await driver.fetch(sql, *args)]


def _json(value: object) -> str:
    return orjson.dumps(value).decode()


_FAMILY_TAKEN_SQL = "SELECT 1 FROM branch WHERE session_id = $1 AND tenant_id = $2 LIMIT 1"

_INSERT_SQL = f"""
INSERT INTO session AS s (id, tenant_id, family_id, parent_id, path_branches, path_ends, model,
    context_window, max_output_tokens, input_limit, config, metadata, version, next_seq,
    entry_count, stored_tokens, context_tokens, context_tool_tokens, context_start_seq,
    calibration_factor, overhead_tokens, compaction_count, pruned_tokens, prune_count,
    usage_count, compaction_failures, pinned_seqs)
VALUES ($1, $2, $3, $4, ARRAY[{tree.ROOT_BRANCH}]::bigint[], '{{}}'::bigint[], $5, $6, $7, $8,
    $9::jsonb, $10::jsonb, 1, 1, 0, 0, 0, 0, 1, 1.0, 0, 0, 0, 0, 0, 0, '{{}}'::bigint[])
RETURNING {_ROW_COLUMNS}
"""
_ROOT_BRANCH_SQL = f"""
INSERT INTO branch (session_id, tenant_id, branch_id, owner_id, parent_branch, fork_seq,
    path_branches, path_ends)
VALUES ($1, $2, {tree.ROOT_BRANCH}, $3, NULL, 0, ARRAY[{tree.ROOT_BRANCH}]::bigint[],
    '{{}}'::bigint[])
"""


@dataclasses.dataclass(frozen=True, slots=True)
class NewSession:
    """A session to create: what its creator gives."""

    id: str
    parent_id: str | None
    model: str
    context_window: int | None
    max_output_tokens: int | None
    input_limit: int | None
    config: dict[str, Any]
    metadata: dict[str, Any]


async def family_taken(driver: Driver, tenant_id: str, session_id: str) -> bool:
    """Whether a family still stores entries under ``session_id`` (a session of that id
    was deleted while a fork of it lives)."""
    return await driver.fetchval(_FAMILY_TAKEN_SQL, session_id, tenant_id) is not None


async def insert(driver: Driver, tenant_id: str, new: NewSession, family_id: str) -> SessionRow:
    """A new session, empty, and the root branch of its family ``family_id`` (its own
    id, unless a family still stores entries under that). Raises asyncpg's
    IntegrityConstraintViolationError when the id is taken or the parent is gone."""
    record = await driver.fetchrow(
        _INSERT_SQL,
        new.id,
        tenant_id,
        family_id,
        new.parent_id,
        new.model,
        new.context_window,
        new.max_output_tokens,
        new.input_limit,
        _json(new.config),
        _json(new.metadata),
    )
    assert record is not None  # an INSERT … RETURNING of one row
    await driver.execute(_ROOT_BRANCH_SQL, family_id, tenant_id, new.id)
    return row_of(record)


# A fork: the source's settings, calibration and overhead; its own counters, from zero.
_FORK_SQL = """
INSERT INTO session (id, tenant_id, family_id, model, context_window, max_output_tokens,
    input_limit, config, metadata, version, next_seq, entry_count, stored_tokens,
    context_tokens, context_tool_tokens, context_start_seq, calibration_factor,
    overhead_tokens, compaction_count, pruned_tokens, prune_count, usage_count,
    compaction_failures, path_branches, path_ends, created_at, updated_at, parent_id)
SELECT $3, tenant_id, family_id, model, context_window, max_output_tokens, input_limit, config,
    coalesce($4::jsonb, metadata), 1, 1, 0, 0, 0, 0, 1, calibration_factor, overhead_tokens,
    0, 0, 0, 0, 0, $5::bigint[], $6::bigint[], $7, $7, $8
FROM session WHERE id = $1 AND tenant_id = $2
"""


async def insert_fork(
    driver: Driver,
    tenant_id: str,
    source_id: str,
    new_id: str,
    *,
    metadata: dict[str, Any] | None,
    path: tree.Prefix,
    now: datetime,
    parent_id: str | None,
) -> None:
    """A new session of the source's family at ``path`` (its prefix up to the fork
    point): the source's settings, calibration and overhead, ``metadata`` unless None;
    its own counters from zero. Raises asyncpg's UniqueViolationError when the id is
    taken."""
    await driver.execute(
        _FORK_SQL,
        source_id,
        tenant_id,
        new_id,
        None if metadata is None else _json(metadata),
        list(path.branches),
        list(path.ends),
        now,
        parent_id,
    )


def settings_changed(row: SessionRow, before: SessionRow) -> list[str]:
    """The columns of ``row`` that differ from ``before``: its settings, metadata
    and totals."""
    names = (*SETTINGS_FIELDS, "metadata", *WRITTEN_FIELDS)
    return [n for n in names if getattr(row, n) != getattr(before, n)]


async def write_row(
    driver: Driver, tenant_id: str, row: SessionRow, before: SessionRow, now: datetime
) -> None:
    """Write what changed in ``row`` since ``before`` (read locked in the caller's
    transaction), and ``updated_at = now``."""
    names = settings_changed(row, before)
    values: list[object] = [
        _json(getattr(row, n)) if n in _JSONB else getattr(row, n) for n in names
    ]
    row.updated_at = now
    sets = set_clause((*names, "updated_at"), 3)
    await driver.execute(
        f"UPDATE session SET {sets} WHERE id = $1 AND tenant_id = $2",
        row.id,
        tenant_id,
        *values,
        now,
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
        AND s.family_id = $1 AND s.id <> $3
    WHERE b.session_id = $1 AND b.tenant_id = $2 AND b.owner_id = $3
    GROUP BY b.branch_id
)
DELETE FROM {table} AS x USING reach AS r
WHERE x.session_id = $1 AND x.tenant_id = $2 AND x.branch = r.branch_id
    AND x.{seq} > r.last
""".replace("{open}", str(tree.OPEN))
_TRIM_ENTRIES_SQL = _TRIM_SQL.format(table="entry", seq="seq")
_TRIM_CALLS_SQL = _TRIM_SQL.format(table="tool_call", seq="call_seq")
# A deleted session's branches that stay belong to no session: a new session that
# takes its id (a fork of the family) writes none of them.
_DISOWN_SQL = """
UPDATE branch SET owner_id = ''
WHERE session_id = $1 AND tenant_id = $2 AND owner_id = $3
"""
# The branches of the family that the other sessions of it reach (their paths).
_REACHED_SQL = """
SELECT b.path_branches FROM branch AS b
JOIN session AS s ON s.id = b.owner_id AND s.tenant_id = b.tenant_id
WHERE b.session_id = $1 AND b.tenant_id = $2 AND s.family_id = $1 AND s.id <> $3
"""
_DOOMED_SQL = """
SELECT branch_id FROM branch
WHERE session_id = $1 AND tenant_id = $2 AND NOT (branch_id = ANY($3::bigint[]))
"""
_DELETE_OWN_SQL = tuple(
    f"DELETE FROM {table} WHERE session_id = $1 AND tenant_id = $2"
    for table in ("prune_mark", "event")
)
_DELETE_ORPHANS_SQL = tuple(
    f"DELETE FROM {table} WHERE session_id = $1 AND tenant_id = $2 AND {column} = ANY($3::bigint[])"
    for table, column in (("entry", "branch"), ("tool_call", "branch"), ("branch", "branch_id"))
)
_DELETE_SQL = "DELETE FROM session WHERE id = $1 AND tenant_id = $2 RETURNING id"


async def delete(driver: Driver, tenant_id: str, session_id: str, family_id: str) -> bool:
    """The session and everything of it, in the caller's transaction: the tables with
    a foreign key go by cascade; prune marks and events (which have none) here, and the
    entries, calls and branches of its family that no other session of it reaches (a
    fork's path runs through the session it was made from)."""
    for sql in _DELETE_OWN_SQL:
        await driver.execute(sql, session_id, tenant_id)
    reached = await driver.fetch(_REACHED_SQL, family_id, tenant_id, session_id)
    kept = sorted({b for r in reached for b in r["path_branches"]})
    orphans = [r["branch_id"] for r in await driver.fetch(_DOOMED_SQL, family_id, tenant_id, kept)]
    # The session's branches that others still reach (a fork's path runs through
    # them) stay, as far as they reach them; from now on no session writes them.
    for sql in (_TRIM_ENTRIES_SQL, _TRIM_CALLS_SQL, _DISOWN_SQL):
        await driver.execute(sql, family_id, tenant_id, session_id)
    if orphans:
        for sql in _DELETE_ORPHANS_SQL:
            await driver.execute(sql, family_id, tenant_id, orphans)
    return await driver.fetchval(_DELETE_SQL, session_id, tenant_id) is not None
