"""All SQL for the message log: entries, prune marks, the tool-call index and
idempotency records. Reads and writes run on a bare asyncpg connection
(:class:`~app.core.driver.Driver`), inside the caller's transaction when it has
one; the session row itself is written only by :mod:`app.store.session_row`."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from app.core.driver import Driver, Record, record_of
from app.engine import tree
from app.store.session_row import STATE_COLUMNS, SessionState, set_clause, state_of

_OPEN = f"{tree.OPEN}::bigint"


def on_path(alias: str, branches: str, ends: str, seq: str = "seq") -> str:
    """The key condition "on the path": the row's branch is one of ``branches``
    and its seq at most that branch's end in ``ends`` (SQL array expressions). A
    branch's own entries start after its fork point, so no lower end is needed."""
    a = f"{alias}." if alias else ""
    return (
        f"{a}branch = ANY({branches})"
        f" AND {a}{seq} <= ({ends})[array_position({branches}, {a}branch)]"
    )


def on_session_path(alias: str, seq: str = "seq") -> str:
    """:func:`on_path` for the path of the session row ``s`` of the same statement."""
    return on_path(alias, "s.path_branches", f"(s.path_ends || {_OPEN})", seq)


# $5 and $6 of the statements below that take a path.
_PATH_56 = on_path("", "$5::bigint[]", "$6::bigint[]")
_PATH_34 = on_path("", "$3::bigint[]", "$4::bigint[]")


@dataclass(frozen=True, slots=True)
class OnPath:
    """Where a session's log is read: its own id (its prune marks are its own),
    its family's (where the entries are stored) and the path it follows."""

    session_id: str
    family_id: str
    path: tree.Path

    @classmethod
    def of(cls, session_id: str, state: SessionState) -> OnPath:
        return cls(session_id, state.family_id, state.path)

    def args(self, lo: int, hi: int = tree.OPEN) -> tuple[list[int], list[int]]:
        """The arrays :func:`on_path` takes for the path's seqs ``lo <= seq < hi``."""
        return self.path.segments(lo, hi)


class StoredCall(NamedTuple):
    """The latest call on the session's path with a given id."""

    name: str
    result_seq: int | None  # its answer on this path, if it has one
    call_seq: int
    view_id: str | None  # how the model's view names it, when not by its id
    branch: int = 0  # the branch of the row that answers it on this path


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


# What a context read needs: pairing links, counts and one rendered fragment.
_WINDOW_COLUMNS = (
    "seq, role, coalesce(view_call_id, tool_call_id) AS link_id, call_ids, tokens, {} AS view,"
    " is_error, kind"
)
_WINDOW_SQL = {
    fmt: (
        f"SELECT {_WINDOW_COLUMNS.format(column)} FROM entry"
        f" WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 AND seq < $4 AND {_PATH_56}"
        " ORDER BY seq"
    )
    for fmt, column in (("openai", "view_openai"), ("anthropic", "view_anthropic"))
}
# The entries before the cut that the context keeps (system entries, and those
# pinned on append). A key range, like
# the window: lookups by "seq = ANY($3)" (or a join on unnest) were planned as
# scans of the whole session whenever its statistics lagged.
_PINNED_SQL = {
    fmt: (
        f"SELECT {_WINDOW_COLUMNS.format(column)} FROM entry"
        f" WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 AND seq <= $4 AND {_PATH_56}"
        " ORDER BY seq"
    )
    for fmt, column in (("openai", "view_openai"), ("anthropic", "view_anthropic"))
}

# Prune marks are read on their own, by key range, rather than joined: a join
# planned on stale statistics probed every mark for every entry.
MARKS_SQL = (
    "SELECT seq, tokens FROM prune_mark"
    f" WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 AND seq < $4 AND {_PATH_56}"
)

_READ_SQL = f"""
SELECT {STATE_COLUMNS},
    (SELECT jsonb_agg(jsonb_build_array(c.call_id, c.name, c.result_seq, c.call_seq, c.view_id,
            c.branch))
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


_IDEMPOTENT_RESPONSE_SQL = """
UPDATE idempotency_record SET response = $4::jsonb
WHERE session_id = $1 AND tenant_id = $2 AND key = $3
"""


_STATE_AND_MARKS_SQL = f"""
SELECT {STATE_COLUMNS},
    (SELECT jsonb_agg(jsonb_build_array(m.seq, m.tokens)) FROM prune_mark AS m
        WHERE m.session_id = s.id AND m.tenant_id = s.tenant_id
            AND m.seq >= s.context_start_seq AND m.seq < s.next_seq
            AND {on_session_path("m")}) AS marks
FROM session AS s
WHERE s.id = $1 AND s.tenant_id = $2
"""


async def read_state_and_marks(
    driver: Driver, tenant_id: str, session_id: str
) -> tuple[SessionState, dict[int, int]] | None:
    """The session and the prune marks of its view, from one snapshot: a prune
    that commits meanwhile shows in both or in neither."""
    row = await driver.fetchrow(_STATE_AND_MARKS_SQL, session_id, tenant_id)
    if row is None:
        return None
    return state_of(row), {seq: tokens for seq, tokens in row["marks"] or ()}


async def read_marks(
    driver: Driver, tenant_id: str, at: OnPath, start_seq: int, end_seq: int
) -> dict[int, int]:
    """The prune marks on the path in ``start_seq <= seq < end_seq``: seq to
    placeholder tokens."""
    rows = await driver.fetch(
        MARKS_SQL, at.session_id, tenant_id, start_seq, end_seq, *at.args(start_seq, end_seq)
    )
    return {r["seq"]: r["tokens"] for r in rows}


async def read_window(
    driver: Driver,
    tenant_id: str,
    at: OnPath,
    start_seq: int,
    end_seq: int,
    fmt: str,
    *,
    summary_seq: int | None = None,
    pinned_seqs: list[int] | None = None,
) -> list[Any]:
    """The entries of the model's view, in the model's order: the pinned entries
    (system ones, and those marked pinned on append), the summary, then
    ``start_seq <= seq < end_seq`` of the path. Light columns and
    the fragment rendered for ``fmt``, never the parts. Records (``seq, role,
    link_id, call_ids, tokens, view, is_error, kind``), no per-row ORM pass."""
    records = await driver.fetch(
        _WINDOW_SQL[fmt],
        at.family_id,
        tenant_id,
        start_seq,
        end_seq,
        *at.args(start_seq, end_seq),
    )
    # The latest summary (its entry is in the window, after the entries it
    # kept) goes first; earlier summaries are not shown.
    summary: list[Record] = []
    window: list[Record] = []
    for r in records:
        if r["seq"] == summary_seq:
            summary.append(r)
        if r["kind"] != "compaction":
            window.append(r)
    if not pinned_seqs:
        return [*summary, *window]
    pinned: list[Record] = []
    for first, last in _runs(pinned_seqs):
        pinned.extend(
            await driver.fetch(
                _PINNED_SQL[fmt], at.family_id, tenant_id, first, last, *at.args(first, last + 1)
            )
        )
    return [*pinned, *summary, *window]


def _runs(seqs: list[int]) -> list[tuple[int, int]]:
    """Sorted seqs as ranges of consecutive ones: [1, 2, 3, 9] -> [(1, 3), (9, 9)]."""
    runs: list[tuple[int, int]] = []
    for seq in sorted(seqs):
        if runs and seq == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], seq)
        else:
            runs.append((seq, seq))
    return runs


_ITEMS_SQL = f"""
SELECT seq, role, kind, tool_name, tokens, coalesce(view_call_id, tool_call_id) AS link_id,
    is_error, call_id_tokens
FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 AND seq < $4 AND kind <> 'compaction'
    AND {on_path("", "$6::bigint[]", "$7::bigint[]")}
ORDER BY seq DESC
LIMIT $5
"""

_FIRST_CHUNK = 512

# A mark per output, with what its placeholder costs; the placeholder itself is
# rendered when the context is read (the same text for every output), so the
# entry and its stored view stay as they are.
_PRUNE_SQL = """
INSERT INTO prune_mark (session_id, tenant_id, branch, seq, pruned_at, tokens)
SELECT $1, $2, p.branch, p.seq, $3, p.tokens
FROM unnest($4::bigint[], $5::int[], $6::bigint[]) AS p(seq, tokens, branch)
"""

# prune.erase: the stored output itself becomes the placeholder, and the views and the
# searchable text with it (what was erased is found no more);
# but not an entry that another session of the family (a fork) can reach, on the path
# of any branch it writes: its content is that session's too, and only marked here.
_ERASE_SQL = f"""
UPDATE entry AS e SET parts = p.parts, view_openai = p.view_openai,
    view_anthropic = p.view_anthropic, erased_bytes = octet_length(e.parts::text),
    search_text = coalesce((SELECT string_agg(x->>'text', E'\\n') FROM jsonb_array_elements(p.parts)
        AS x WHERE x->>'type' = 'text'), '')
FROM unnest($3::bigint[], $4::jsonb[], $5::text[], $6::text[], $7::bigint[])
    AS p(seq, parts, view_openai, view_anthropic, branch)
WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.branch = p.branch AND e.seq = p.seq
    AND e.erased_bytes IS NULL
    AND NOT EXISTS (
        SELECT 1 FROM branch AS o
        JOIN session AS s ON s.id = o.owner_id AND s.tenant_id = o.tenant_id
        WHERE o.session_id = $1 AND o.tenant_id = $2 AND s.family_id = $1 AND s.id <> $8
            AND {on_path("e", "o.path_branches", f"(o.path_ends || {_OPEN})")}
    )
"""


_SOURCE_SQL = {
    light: f"""
SELECT seq, kind, role, {"NULL::jsonb" if light else "parts"} AS parts, tool_call_id,
    tool_name, is_error, name, tokens, coalesce(view_call_id, tool_call_id) AS link_id, call_ids,
    pinned
FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 AND seq < $4 AND {_PATH_56}
ORDER BY seq
"""
    for light in (False, True)
}


_INSERT_ENTRY_SQL = """
INSERT INTO entry (session_id, tenant_id, seq, id, kind, role, parts, tool_call_id, tool_name,
    is_error, name, content_form, extra, source_format, tokens, call_ids, view_openai,
    view_anthropic, parent_seq, created_at, branch, parent_branch, path_tokens, job_session_id,
    job_id, pivot_start, pivot_pinned, search_text)
VALUES ($1, $2, $3::bigint, $4, $5, 'user', $6::jsonb, NULL, NULL, false, NULL, 'string', NULL,
    'openai', $7, NULL, $8, $9, NULLIF($3::bigint - 1, 0), $10, $11, $12, $13, $14, $15, $16,
    $17::bigint[], $18)
"""

# The context's size after the pivot moves, from the stored counts: the kept
# window (pruned outputs at their placeholder's size), the pinned entries
# (system ones, and those marked pinned on append) and the new summary.
# The window is read segment by segment (each a range of one branch's key): the key
# condition of on_path() looks each row's branch up in the path's arrays
# (array_position), some 1.6 us a row over a path of 100 segments, which made the
# recount of a 4,700-entry window 8 ms of the database's CPU instead of 2.
_CONTEXT_TOTALS_SQL = f"""
WITH window_entries AS (
    SELECT e.seq, e.role, e.tokens
    FROM unnest($8::bigint[], $9::bigint[]) AS p(branch, last)
    CROSS JOIN LATERAL (
        SELECT e.seq, e.role, e.tokens FROM entry AS e
        WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.branch = p.branch
            AND e.seq >= $3 AND e.seq <= p.last AND e.seq <= $10
            AND (e.kind <> 'compaction' OR e.seq = $5)
    ) AS e
    UNION ALL
    SELECT e.seq, e.role, e.tokens FROM entry AS e
    WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.seq >= $6 AND e.seq <= $7
        AND e.seq = ANY($4::bigint[]) AND {on_path("e", "$11::bigint[]", "$12::bigint[]")}
), marked AS (
    SELECT w.role, w.tokens - m.tokens AS saved FROM prune_mark AS m
    JOIN window_entries AS w ON w.seq = m.seq
    WHERE m.session_id = $13 AND m.tenant_id = $2 AND m.seq >= $3 AND m.seq <= $10
        AND {on_path("m", "$8::bigint[]", "$9::bigint[]")}
)
SELECT
    (SELECT coalesce(sum(tokens), 0) FROM window_entries)
        - (SELECT coalesce(sum(saved), 0) FROM marked) AS context_tokens,
    (SELECT coalesce(sum(tokens), 0) FROM window_entries WHERE role = 'tool')
        - (SELECT coalesce(sum(saved), 0) FROM marked WHERE role = 'tool') AS tool_tokens
"""


_TAIL_SQL = """
SELECT e.role, e.kind, e.call_ids IS NOT NULL AS makes_calls,
    s.last_usage->>'finish_reason' AS finish_reason
FROM session AS s JOIN entry AS e ON e.session_id = s.family_id AND e.tenant_id = s.tenant_id
WHERE s.id = $1 AND s.tenant_id = $2 AND e.branch = $4 AND e.seq = $3
"""

# Whether the latest assistant entry with tool calls, at or before $3, still
# waits on one of them.
_LAST_CALLER_SQL = """
SELECT e.seq FROM entry AS e
WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.branch = $3 AND e.seq <= $4
    AND e.role = 'assistant' AND e.call_ids IS NOT NULL
ORDER BY e.seq DESC LIMIT 1
"""

# Of the calls made at $3, one with no answer on the path: the row that answers
# each call on this path is the one of the latest segment holding it.
_PENDING_SQL = f"""
SELECT EXISTS (
    SELECT 1 FROM (
        SELECT DISTINCT ON (t.call_id) t.result_seq, t.result_branch
        FROM tool_call AS t
        WHERE t.session_id = $1 AND t.tenant_id = $2 AND t.call_seq = $3
            AND {on_path("t", "$4::bigint[]", "$5::bigint[]", "call_seq")}
        ORDER BY t.call_id, array_position($4::bigint[], t.branch) DESC
    ) AS c
    WHERE c.result_seq IS NULL OR NOT coalesce(
        c.result_branch = ANY($4::bigint[])
            AND c.result_seq <= ($5::bigint[])[array_position($4::bigint[], c.result_branch)],
        false)
)
"""


class WindowItem(NamedTuple):
    """An entry of the current view, as pruning reads it."""

    seq: int
    role: str
    kind: str
    tool_name: str | None
    tokens: int
    pruned: bool
    tool_call_id: str | None
    is_error: bool
    call_id_tokens: int | None


def _window_item(r: Record, marks: dict[int, int]) -> WindowItem:
    seq = r["seq"]
    return WindowItem(
        seq,
        r["role"],
        r["kind"],
        r["tool_name"],
        marks.get(seq, r["tokens"]),
        # A zero-token mark hides a result whose call a compaction cut off (AppendWrite
        # .hidden); pruning never made it (a placeholder costs tokens), so it does not
        # stop pruning's walk.
        marks.get(seq, 0) > 0,
        r["link_id"],
        r["is_error"],
        r["call_id_tokens"],
    )


class PrunedRow(NamedTuple):
    seq: int
    tokens: int  # the placeholder's


class ErasedRow(NamedTuple):
    seq: int
    parts: str  # JSON text
    view_openai: str
    view_anthropic: str


@dataclass(slots=True)
class SourceRow:
    """An entry since the pivot, as a compaction reads it."""

    seq: int
    kind: str
    role: str
    parts: list[dict[str, Any]]
    tool_call_id: str | None
    tool_name: str | None
    is_error: bool
    name: str | None
    tokens: int
    link_id: str | None  # the result's call as the view names it
    call_ids: list[str] | None  # the calls as the view names them
    pinned: bool = False  # marked on append: never summarized


@dataclass(slots=True)
class NewEntry:
    seq: int
    kind: str
    parts_json: str
    tokens: int
    view_openai: str
    view_anthropic: str
    search_text: str  # what recall searches (app.engine.search_text)


class LogRepository:
    """The message log of one tenant's sessions, on a bare asyncpg connection.

    The append is a read and a write, each one statement prepared once per
    connection, with no transaction block around them unless the caller opens
    one; everything else runs in the caller's transaction, the session locked."""

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
        # [call_id, name, result_seq, call_seq, view_id, branch].
        calls = {c[0]: StoredCall(c[1], c[2], c[3], c[4], c[5]) for c in row["calls"] or ()}
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
                    _PRUNE_SQL,
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
        await driver.execute(
            _IDEMPOTENT_RESPONSE_SQL, session_id, self.tenant_id, key, response_json
        )

    async def window_items(
        self, driver: Driver, at: OnPath, start_seq: int, end_seq: int
    ) -> list[WindowItem]:
        """The view's entries, oldest first, but only as far back as pruning walks.

        Pruning walks back from the newest entry and stops at a summary or at an
        entry an earlier prune marked; so entries are fetched newest first, in
        growing chunks, until a chunk holds such a stop. A prune that finds
        nothing new reads what arrived since the last one, not the whole view.
        """
        newest_first: list[WindowItem] = []
        upper, chunk = end_seq, _FIRST_CHUNK
        while upper > start_seq:
            rows = await driver.fetch(
                _ITEMS_SQL,
                at.family_id,
                self.tenant_id,
                start_seq,
                upper,
                chunk,
                *at.args(start_seq, upper),
            )
            if not rows:
                break
            marks = await read_marks(driver, self.tenant_id, at, rows[-1]["seq"], upper)
            batch = [_window_item(r, marks) for r in rows]
            newest_first.extend(batch)
            if len(batch) < chunk or any(i.pruned or i.kind == "summary" for i in batch):
                break
            upper, chunk = batch[-1].seq, chunk * 4
        newest_first.reverse()
        return newest_first

    async def mark_pruned(
        self,
        driver: Driver,
        at: OnPath,
        rows: list[PrunedRow],
        now: datetime,
        erased: list[ErasedRow],
    ) -> None:
        """Mark the entries and clear the stored content of ``erased``; the
        session's totals are the caller's (:class:`app.store.session_row.Unit`)."""
        await driver.execute(
            _PRUNE_SQL,
            at.session_id,
            self.tenant_id,
            now,
            [r.seq for r in rows],
            [r.tokens for r in rows],
            [at.path.branch_of(r.seq) for r in rows],
        )
        if erased:
            await driver.execute(
                _ERASE_SQL,
                at.family_id,
                self.tenant_id,
                [r.seq for r in erased],
                [r.parts for r in erased],
                [r.view_openai for r in erased],
                [r.view_anthropic for r in erased],
                [at.path.branch_of(r.seq) for r in erased],
                at.session_id,
            )

    async def source(
        self, driver: Driver, at: OnPath, start_seq: int, end_seq: int, *, light: bool = False
    ) -> tuple[list[SourceRow], dict[int, int]]:
        """The path's entries ``start_seq <= seq < end_seq`` and their prune marks;
        ``light`` leaves their parts out (empty)."""
        rows = await driver.fetch(
            _SOURCE_SQL[light],
            at.family_id,
            self.tenant_id,
            start_seq,
            end_seq,
            *at.args(start_seq, end_seq),
        )
        marks = await read_marks(driver, self.tenant_id, at, start_seq, end_seq)
        out = []
        for r in rows:
            parts = r["parts"] or []
            if isinstance(parts, str):
                parts = orjson.loads(parts)
            out.append(record_of(SourceRow, {**r, "parts": parts}))
        return out, marks

    async def insert_entry(
        self,
        driver: Driver,
        at: OnPath,
        entry: NewEntry,
        now: datetime,
        path_tokens: int,
        job_id: uuid.UUID | None = None,
        pivot: tuple[int, list[int]] | None = None,
    ) -> None:
        """A compactd entry (a summary, a "continue") at the leaf of the path;
        ``path_tokens``: the path's stored tokens with it; for a summary, ``job_id``
        (the compaction that wrote it, the session's) and ``pivot`` (the window's
        first seq after it and the seqs it keeps before that)."""
        await driver.execute(
            _INSERT_ENTRY_SQL,
            at.family_id,
            self.tenant_id,
            entry.seq,
            uuid.uuid4(),
            entry.kind,
            entry.parts_json,
            entry.tokens,
            entry.view_openai,
            entry.view_anthropic,
            now,
            at.path.leaf_branch,
            at.path.branch_of(entry.seq - 1) if entry.seq > 1 else None,
            path_tokens,
            None if job_id is None else at.session_id,
            job_id,
            None if pivot is None else pivot[0],
            None if pivot is None else pivot[1],
            entry.search_text,
        )

    async def pinned_tokens(self, driver: Driver, at: OnPath) -> int:
        """The tokens of the path's entries marked pinned on append (read through
        the partial index entry_pinned_idx, which holds only those)."""
        total = await driver.fetchval(
            "SELECT coalesce(sum(tokens), 0) FROM entry"
            f" WHERE session_id = $1 AND tenant_id = $2 AND pinned AND {_PATH_34}",
            at.family_id,
            self.tenant_id,
            *at.args(1),
        )
        return int(total)

    async def context_totals(
        self,
        driver: Driver,
        at: OnPath,
        start_seq: int,
        pinned: list[int],
        summary_seq: int | None,
        end_seq: int = tree.OPEN,
    ) -> tuple[int, int]:
        """The context's tokens and its tool-output tokens, recounted from the
        stored rows: the path's window ``start_seq <= seq < end_seq`` (with the
        summary ``summary_seq`` only), the ``pinned`` entries, the marks."""
        row = await driver.fetchrow(
            _CONTEXT_TOTALS_SQL,
            at.family_id,
            self.tenant_id,
            start_seq,
            pinned,
            summary_seq,
            min(pinned, default=0),
            max(pinned, default=-1),
            *at.args(start_seq, end_seq),
            end_seq - 1,
            *at.args(min(pinned, default=1), max(pinned, default=0) + 1),
            at.session_id,
        )
        if row is None:  # pragma: no cover - an aggregate always answers one row
            raise RuntimeError("no context totals")
        return int(row["context_tokens"]), int(row["tool_tokens"])

    async def tail(
        self, driver: Driver, at: OnPath, seq: int
    ) -> tuple[str, str, bool, str | None] | None:
        """The role and kind of the path's entry ``seq``, whether it makes tool
        calls, and the finish reason of the session's last usage report."""
        row = await driver.fetchrow(
            _TAIL_SQL, at.session_id, self.tenant_id, seq, at.path.branch_of(seq)
        )
        if row is None:
            return None
        return row["role"], row["kind"], row["makes_calls"], row["finish_reason"]

    async def calls_pending(self, driver: Driver, at: OnPath, seq: int) -> bool:
        """Whether the path's latest assistant entry with tool calls, at or before
        ``seq``, still waits on one of them there. Looked for segment by segment,
        newest first, each an ordered scan of one branch's key."""
        branches, ends = at.args(1, seq + 1)
        for branch, end in zip(reversed(branches), reversed(ends), strict=True):
            caller = await driver.fetchval(
                _LAST_CALLER_SQL, at.family_id, self.tenant_id, branch, end
            )
            if caller is not None:
                pending: bool = await driver.fetchval(
                    _PENDING_SQL, at.family_id, self.tenant_id, caller, *at.args(1)
                )
                return pending
        return False
