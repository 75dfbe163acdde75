"""The message log's repository: what pruning, compactions and the tree read and
write of a session's entries, prune marks and tool calls, on a bare asyncpg connection
(:class:`~app.core.driver.Driver`), inside the caller's transaction, the session locked.

The store's other modules hold the other shapes of access: the path's key condition
(:mod:`app.store.paths`), the append's two statements (:mod:`app.store.append`), the
context's reads (:mod:`app.store.context_reads`) and the history's pages
(:mod:`app.store.history`); the session row itself is written only by
:mod:`app.store.session_row`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import orjson

from app.core.driver import Driver, Record, record_of
from app.engine import tree
from app.store.append import INSERT_MARKS_SQL, AppendRepository
from app.store.context_reads import read_marks
from app.store.paths import OnPath, on_path

_OPEN = f"{tree.OPEN}::bigint"
# $5 and $6, and $3 and $4, of the statements below that take a path.
_PATH_56 = on_path("", "$5::bigint[]", "$6::bigint[]")
_PATH_34 = on_path("", "$3::bigint[]", "$4::bigint[]")


# The prune marks of one session's path in a range, as another session's (a fork's).
_COPY_MARKS_SQL = """
INSERT INTO prune_mark (session_id, tenant_id, branch, seq, pruned_at, tokens)
SELECT $3, tenant_id, branch, seq, pruned_at, tokens FROM prune_mark
WHERE session_id = $1 AND tenant_id = $2 AND seq >= $4 AND seq < $5
    AND branch = ANY($6::bigint[])
    AND seq <= ($7::bigint[])[array_position($6::bigint[], branch)]
"""

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


class LogRepository(AppendRepository):
    """The message log of one tenant's sessions: the append's statements
    (:class:`~app.store.append.AppendRepository`) and everything else, which runs in
    the caller's transaction, the session locked."""

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
            INSERT_MARKS_SQL,
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

    async def copy_marks(
        self, driver: Driver, at: OnPath, to_session_id: str, start_seq: int, end_seq: int
    ) -> None:
        """The prune marks of ``at`` in ``start_seq <= seq < end_seq`` made
        ``to_session_id``'s too (a fork's, whose path shares those entries)."""
        await driver.execute(
            _COPY_MARKS_SQL,
            at.session_id,
            self.tenant_id,
            to_session_id,
            start_seq,
            end_seq,
            *at.args(start_seq, end_seq),
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
