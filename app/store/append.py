"""The append's SQL: one statement reads everything an append checks (the session,
the stored calls its batch names, an earlier answer under its idempotency key) and one
writes everything it stores (entries, calls, answers, the session's totals, the
idempotency record), applied only if the session is still at the version read."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from app.core.driver import Driver
from app.engine.search_text import CALL_ARGUMENTS_CHARS
from app.store import idempotency
from app.store.paths import on_session_path
from app.store.session_row import STATE_COLUMNS, SessionState, set_clause, state_of


class StoredCall(NamedTuple):
    """The latest call on the session's path with a given id."""

    name: str
    result_seq: int | None  # its answer on this path, if it has one
    call_seq: int
    view_id: str | None  # how the model's view names it, when not by its id
    branch: int = 0  # the branch of the row that answers it on this path
    # An open call's arguments (their head: search_text.CALL_ARGUMENTS_CHARS), read
    # for the line that names it in its result's searchable text; None when answered.
    arguments: str | None = None


@dataclass(slots=True)
class AppendRead:
    """Everything an append checks, read in one statement: the session, the stored
    calls its batch names, and an earlier append with the same idempotency key."""

    session: SessionState
    calls: dict[str, StoredCall]
    idempotency: tuple[str, str] | None  # request hash, response (JSON text)
    # The parts of the session's latest system entry, when asked for (None: none).
    system_parts: list[dict[str, Any]] | None = None


class EntryRow(NamedTuple):
    """One new entry, as the append statement takes it (JSON columns as JSON text)."""

    seq: int
    id: uuid.UUID
    role: str
    parts: str
    tool_call_id: str | None
    tool_name: str | None
    is_error: bool
    name: str | None
    content_form: str
    extra: str | None
    tokens: int
    call_ids: str | None
    view_openai: str
    view_anthropic: str
    omitted_lines: int | None
    omitted_bytes: int | None
    view_call_id: str | None  # a result's call as the view names it, when not its own id
    call_id_tokens: int | None  # what that id costs in the view (results only)
    pinned: bool  # never summarized: the context keeps it wherever a compaction cuts
    search_text: str  # what recall searches (app.engine.search_text)
    parent_branch: int | None = None  # where the parent entry is (None: the first entry)
    path_tokens: int = 0  # the stored tokens of the path up to this entry
    search_pending: bool = False  # search_text left to the indexer (app.recall.indexer)


class CallRow(NamedTuple):
    call_id: str
    name: str
    call_seq: int
    result_seq: int | None
    view_id: str | None


class Answer(NamedTuple):
    """A stored call answered by this batch (the row of ``branch`` answers it)."""

    call_id: str
    call_seq: int
    result_seq: int
    branch: int


@dataclass(slots=True)
class AppendWrite:
    session_id: str
    family_id: str  # where the entries and calls are stored
    branch: int  # the leaf's branch: the one written
    read_version: int  # the write applies only if the session is still at this version
    source_format: str
    now: datetime
    entries: list[EntryRow]
    new_calls: list[CallRow]
    answers: list[Answer]
    session: SessionState  # with the totals after the append
    idempotency_key: str | None
    request_hash: str | None
    response: str | None  # JSON text, kept only with an idempotency key
    # The results whose call a compaction already cut off (ledger.Added.hidden): each
    # gets a zero-token prune mark with the entry, so the totals count what the view
    # shows (the view's pairing leaves such a result out).
    hidden: list[int] = field(default_factory=list)


_READ_SQL = f"""
SELECT {STATE_COLUMNS},
    (SELECT jsonb_agg(jsonb_build_array(c.call_id, c.name, c.result_seq, c.call_seq, c.view_id,
            c.branch, CASE WHEN c.result_seq IS NULL THEN (
                -- An open call's arguments, for its result's searchable text: the call's
                -- entry on the path (one indexed row), the head of its part's arguments.
                SELECT left(p->>'arguments', {CALL_ARGUMENTS_CHARS})
                FROM entry AS e, jsonb_array_elements(e.parts) AS p
                WHERE e.session_id = s.family_id AND e.tenant_id = $2 AND e.seq = c.call_seq
                    AND {on_session_path("e")} AND p->>'type' = 'tool_call'
                    AND p->>'id' = c.call_id
                LIMIT 1) END))
        FROM (SELECT DISTINCT ON (t.call_id) t.call_id, t.name,
                CASE WHEN {on_session_path("t", "result_seq").replace("t.branch", "t.result_branch")}
                    THEN t.result_seq END AS result_seq,
                t.call_seq, t.view_id, t.branch
            FROM tool_call AS t
            WHERE t.session_id = s.family_id AND t.tenant_id = $2 AND t.call_id = ANY($3::text[])
                AND {on_session_path("t", "call_seq")}
            ORDER BY t.call_id, t.call_seq DESC,
                array_position(s.path_branches, t.branch) DESC) AS c) AS calls,
    i.request_hash, i.response::text AS response
FROM session AS s
LEFT JOIN idempotency_record AS i
    ON i.session_id = s.id AND i.tenant_id = s.tenant_id AND i.key = $4::varchar
WHERE s.id = $1 AND s.tenant_id = $2
"""

# The same, with the parts of the session's latest system entry: an append that
# carries a top-level system prompt stores it only when it differs. Every system
# entry before the window is pinned (a compaction pins those it cuts off), so the
# latest one is the window's, else the last pinned one: two bounded lookups, not
# a walk back over the whole log (which took 3 ms at 10,000 entries).
_READ_WITH_SYSTEM_SQL = _READ_SQL.replace(
    "    i.request_hash,",
    f"""    coalesce(
        (SELECT e.parts FROM entry AS e
            WHERE e.session_id = s.family_id AND e.tenant_id = $2
                AND e.seq >= s.context_start_seq AND {on_session_path("e")}
                AND e.role = 'system' AND e.kind = 'message'
            ORDER BY e.seq DESC LIMIT 1),
        (SELECT e.parts FROM entry AS e
            WHERE e.session_id = s.family_id AND e.tenant_id = $2 AND e.seq = ANY(s.pinned_seqs)
                AND {on_session_path("e")} AND e.role = 'system' AND e.kind = 'message'
            ORDER BY e.seq DESC LIMIT 1)
    ) AS system_parts,
    i.request_hash,""",
)
assert _READ_WITH_SYSTEM_SQL != _READ_SQL

_LOCK_SQL = "SELECT 1 FROM session WHERE id = $1 AND tenant_id = $2 FOR UPDATE"

# Postgres types of each row kind's fields, in field order: the write passes one
# array per field and unnest zips them back into rows.
_ENTRY_TYPES = (
    "bigint", "uuid", "text", "jsonb", "text", "text", "boolean", "text", "text",
    "jsonb", "int", "jsonb", "text", "text", "int", "int", "text", "int", "boolean",
    "text", "bigint", "bigint", "boolean",
)  # fmt: skip
_CALL_TYPES = ("text", "text", "bigint", "bigint", "text")
_ANSWER_TYPES = ("text", "bigint", "bigint", "bigint")
assert len(_ENTRY_TYPES) == len(EntryRow._fields)
assert len(_CALL_TYPES) == len(CallRow._fields)
assert len(_ANSWER_TYPES) == len(Answer._fields)

# $1-$17 are scalars (see write_append); the row arrays follow from $18.
_ENTRY_ARG = 18
_CALL_ARG = _ENTRY_ARG + len(_ENTRY_TYPES)
_ANSWER_ARG = _CALL_ARG + len(_CALL_TYPES)


def _unnest(first: int, types: tuple[str, ...], fields: tuple[str, ...]) -> str:
    arrays = ", ".join(f"${first + i}::{t}[]" for i, t in enumerate(types))
    return f"unnest({arrays}) AS r({', '.join(fields)})"


def _columns(rows: list[Any], fields: tuple[str, ...]) -> list[list[Any]]:
    return [[row[i] for row in rows] for i in range(len(fields))]


# What an append advances on the session, as $6-$12 (the overhead as it was,
# unless the append's request set it).
_ADVANCED = (
    "next_seq",
    "entry_count",
    "stored_tokens",
    "context_tokens",
    "context_tool_tokens",
    "version",
    "overhead_tokens",
)

# Everything hangs on the session update, which applies only at the version the
# append read: if another append came first, nothing is written and the append
# reads again. A call answered in its own batch is inserted with its result; one
# answered later is updated. The totals are absolute values, computed from what
# was read.
# The answered calls' ids are given twice: as the join's and as a key condition
# (call_id = ANY), without which the generic plan scanned every call of the session
# and joined the answers to each (1 ms an append at 2,500 calls, even with none).
_WRITE_SQL = f"""
WITH advanced AS (
    UPDATE session SET {set_clause(_ADVANCED, 6)}, updated_at = $4
    WHERE id = $1 AND tenant_id = $2 AND version = $5
    RETURNING version
), entries AS (
    INSERT INTO entry (session_id, tenant_id, branch, seq, id, kind, role, parts, tool_call_id,
        tool_name, is_error, name, content_form, extra, source_format, tokens, call_ids,
        view_openai, view_anthropic, omitted_lines, omitted_bytes, view_call_id,
        call_id_tokens, pinned, search_text, parent_seq, parent_branch, path_tokens,
        search_pending, created_at)
    SELECT $16, $2, $17, r.seq, r.id, 'message', r.role, r.parts, r.tool_call_id, r.tool_name,
        r.is_error, r.name, r.content_form, r.extra, $3, r.tokens,
        (SELECT array_agg(c) FROM jsonb_array_elements_text(r.call_ids) AS c),
        r.view_openai, r.view_anthropic, r.omitted_lines, r.omitted_bytes, r.view_call_id,
        r.call_id_tokens, r.pinned, r.search_text, NULLIF(r.seq - 1, 0), r.parent_branch,
        r.path_tokens, r.search_pending, $4
    FROM advanced, {_unnest(_ENTRY_ARG, _ENTRY_TYPES, EntryRow._fields)}
), new_calls AS (
    INSERT INTO tool_call (session_id, tenant_id, branch, call_id, name, call_seq, result_seq,
        result_branch, view_id)
    SELECT $16, $2, $17, r.call_id, r.name, r.call_seq, r.result_seq,
        CASE WHEN r.result_seq IS NOT NULL THEN $17 END, r.view_id
    FROM advanced, {_unnest(_CALL_ARG, _CALL_TYPES, CallRow._fields)}
), answered AS (
    UPDATE tool_call AS t SET result_seq = r.result_seq, result_branch = $17
    FROM advanced, {_unnest(_ANSWER_ARG, _ANSWER_TYPES, Answer._fields)}
    WHERE t.session_id = $16 AND t.tenant_id = $2 AND t.call_id = r.call_id
        AND t.branch = r.branch AND t.call_seq = r.call_seq
        AND t.call_id = ANY(${_ANSWER_ARG}::text[])
), idempotency AS (
    INSERT INTO idempotency_record (session_id, tenant_id, key, request_hash, status_code,
        response)
    SELECT $1, $2, $13::varchar, $14::varchar, 201, $15::jsonb
    FROM advanced WHERE $13::varchar IS NOT NULL
)
SELECT count(*) FROM advanced
"""


# A mark per output, with what its placeholder costs; the placeholder itself is
# rendered when the context is read (the same text for every output), so the
# entry and its stored view stay as they are.
INSERT_MARKS_SQL = """
INSERT INTO prune_mark (session_id, tenant_id, branch, seq, pruned_at, tokens)
SELECT $1, $2, p.branch, p.seq, $3, p.tokens
FROM unnest($4::bigint[], $5::int[], $6::bigint[]) AS p(seq, tokens, branch)
"""


class AppendRepository:
    """The append of one tenant's sessions: a read and a write, each one statement
    prepared once per connection, with no transaction block around them unless the
    caller opens one."""

    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id

    async def read_for_append(
        self,
        driver: Driver,
        session_id: str,
        call_ids: list[str],
        idempotency_key: str | None,
        *,
        lock: bool,
        system: bool = False,
    ) -> AppendRead | None:
        """What an append checks; ``lock`` first locks the session row, inside the
        caller's transaction, so that the write that follows cannot lose a race.

        The lock is its own statement: a read that waited on it must see what
        the append before it committed (its idempotency record, its answered
        calls), and under READ COMMITTED only a statement begun after the wait
        does; a ``FOR UPDATE`` on the read itself refreshes the session row alone.
        ``system``: read the parts of the session's latest system entry too.
        """
        if lock:
            await driver.execute(_LOCK_SQL, session_id, self.tenant_id)
        row = await driver.fetchrow(
            _READ_WITH_SYSTEM_SQL if system else _READ_SQL,
            session_id,
            self.tenant_id,
            call_ids,
            idempotency_key,
        )
        if row is None:
            return None
        # A JSON array per call (not a row):
        # [call_id, name, result_seq, call_seq, view_id, branch, arguments].
        calls = {c[0]: StoredCall(c[1], c[2], c[3], c[4], c[5], c[6]) for c in row["calls"] or ()}
        request_hash = row["request_hash"]
        record = (request_hash, row["response"]) if request_hash is not None else None
        system_parts = row["system_parts"] if system else None
        if isinstance(system_parts, str):
            system_parts = orjson.loads(system_parts)
        return AppendRead(state_of(row), calls, record, system_parts)

    async def write_append(self, driver: Driver, write: AppendWrite) -> bool:
        """Insert the entries, their calls and the answers, advance the session's
        totals and keep the idempotency record, in one statement. False, with
        nothing written, when the session is no longer at ``write.read_version``."""
        if write.hidden:
            async with driver.transaction():  # the entries and their marks, or neither
                if not await self._write_append(driver, write):
                    return False
                await driver.execute(
                    INSERT_MARKS_SQL,
                    write.session_id,
                    self.tenant_id,
                    write.now,
                    write.hidden,
                    [0] * len(write.hidden),
                    [write.branch] * len(write.hidden),
                )
                return True
        return await self._write_append(driver, write)

    async def _write_append(self, driver: Driver, write: AppendWrite) -> bool:
        totals = write.session
        applied: int = await driver.fetchval(
            _WRITE_SQL,
            write.session_id,
            self.tenant_id,
            write.source_format,
            write.now,
            write.read_version,
            totals.next_seq,
            totals.entry_count,
            totals.stored_tokens,
            totals.context_tokens,
            totals.context_tool_tokens,
            totals.version,
            totals.overhead_tokens,
            write.idempotency_key,
            write.request_hash,
            write.response,
            write.family_id,
            write.branch,
            *_columns(write.entries, EntryRow._fields),
            *_columns(write.new_calls, CallRow._fields),
            *_columns(write.answers, Answer._fields),
        )
        return applied == 1

    async def replace_idempotent_response(
        self, driver: Driver, session_id: str, key: str, response_json: str
    ) -> None:
        """The response an append's record keeps, once its prune is in it."""
        await idempotency.replace_response(driver, self.tenant_id, session_id, key, response_json)
