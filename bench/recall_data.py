"""Bulk histories for the recall bench, written straight into the tables.

A thousand sessions of a thousand entries through the API would take the better part
of an hour on this machine; what search costs does not depend on how the rows got
there. So the real traces' messages are parsed, rendered, counted and given their
searchable text once, in this process, by the same engine functions an append uses
(:func:`corpus_rows`), copied into a staging table, and every session's entries are
made from them by one ``INSERT … SELECT`` per batch of sessions: the database computes
each row's full-text vector and keeps both search indexes as it would on appends. Each
session starts at its own place in the corpus, so sessions differ, as a real tenant's
sessions on the same projects do.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import orjson

from app.engine.accounting import tokens
from app.engine.formats import openai_format
from app.engine.search_text import search_text
from app.engine.window.view import render_view
from tests import traces


@dataclass(frozen=True, slots=True)
class CorpusRow:
    role: str
    parts: str
    tool_call_id: str | None
    tool_name: str | None
    tokens: int
    call_ids: list[str] | None
    view_openai: str
    view_anthropic: str
    search_text: str


def corpus_messages() -> list[dict[str, Any]]:
    """Every trace's messages, in order."""
    out: list[dict[str, Any]] = []
    for path in traces.trace_files():
        out.extend(traces.load(path))
    return out


def corpus_rows(messages: list[dict[str, Any]]) -> list[CorpusRow]:
    """The messages as the append stores them (parts, views, tokens, search text)."""
    rows = []
    names: dict[str, str] = {}
    for n, message in enumerate(messages):
        entry = openai_format.parse_message(message, f"messages[{n}]")
        for call in entry.tool_calls():
            names[call["id"]] = call["name"]
        if entry.role == "tool" and entry.tool_call_id:
            entry.tool_name = names.get(entry.tool_call_id)
        view_openai, view_anthropic = render_view(entry)
        rows.append(
            CorpusRow(
                role=entry.role,
                parts=orjson.dumps(entry.parts).decode(),
                tool_call_id=entry.tool_call_id,
                tool_name=entry.tool_name,
                tokens=tokens.count_entry(entry),
                call_ids=list(entry.call_ids) or None,
                view_openai=view_openai,
                view_anthropic=view_anthropic,
                search_text=search_text(entry.parts),
            )
        )
    return rows


_STAGING_SQL = """
CREATE TEMPORARY TABLE recall_corpus (
    n int PRIMARY KEY, role text, parts jsonb, tool_call_id text, tool_name text, tokens int,
    call_ids text[], view_openai text, view_anthropic text, search_text text
)
"""

# Sessions $2 (ids), each of $3 entries from the corpus (of $4 rows) starting at its offset
# ($5); $1 the tenant.
_SESSIONS_SQL = """
INSERT INTO session (id, tenant_id, family_id, model, config, metadata, version, next_seq,
    entry_count, stored_tokens, context_tokens, context_tool_tokens, context_start_seq,
    calibration_factor, overhead_tokens, compaction_count, path_branches, path_ends)
SELECT s.id, $1, s.id, 'gpt-4o', '{}', '{}', 1, $3 + 1, $3, 0, 0, 0, 1, 1.0, 0, 0, '{0}', '{}'
FROM unnest($2::text[]) AS s(id)
"""
_BRANCHES_SQL = """
INSERT INTO branch (session_id, tenant_id, branch_id, owner_id, parent_branch, fork_seq,
    path_branches, path_ends)
SELECT s.id, $1, 0, s.id, NULL, 0, '{0}', '{}' FROM unnest($2::text[]) AS s(id)
"""
_ENTRIES_SQL = """
INSERT INTO entry (session_id, tenant_id, branch, seq, id, kind, role, parts, tool_call_id,
    tool_name, is_error, content_form, source_format, tokens, call_ids, view_openai,
    view_anthropic, parent_seq, parent_branch, path_tokens, pinned, search_text)
SELECT s.id, $1, 0, q.seq, gen_random_uuid(), 'message', c.role, c.parts, c.tool_call_id,
    c.tool_name, false, 'string', 'openai', c.tokens, c.call_ids, c.view_openai,
    c.view_anthropic, NULLIF(q.seq - 1, 0), CASE WHEN q.seq > 1 THEN 0 END, 0, false,
    c.search_text
FROM unnest($2::text[], $5::int[]) AS s(id, start)
CROSS JOIN generate_series(1, $3::int) AS q(seq)
JOIN recall_corpus AS c ON c.n = (s.start + q.seq) % $4
"""
_TOTALS_SQL = """
UPDATE session AS s SET stored_tokens = t.total, context_tokens = t.total
FROM (SELECT session_id, sum(tokens) AS total FROM entry
    WHERE tenant_id = $1 AND session_id = ANY($2::text[]) GROUP BY session_id) AS t
WHERE s.id = t.session_id AND s.tenant_id = $1
"""


async def stage(conn: asyncpg.Connection, rows: list[CorpusRow]) -> None:
    """The corpus, in a temporary table of this connection."""
    await conn.execute(_STAGING_SQL)
    await conn.copy_records_to_table(
        "recall_corpus",
        records=[
            (
                n,
                r.role,
                r.parts,
                r.tool_call_id,
                r.tool_name,
                r.tokens,
                r.call_ids,
                r.view_openai,
                r.view_anthropic,
                r.search_text,
            )
            for n, r in enumerate(rows)
        ],
    )


async def insert_sessions(
    conn: asyncpg.Connection,
    tenant_id: str,
    ids: list[str],
    entries: int,
    corpus_size: int,
    starts: list[int],
) -> None:
    """``ids``' sessions of ``entries`` entries each, from the staged corpus."""
    async with conn.transaction():
        await conn.execute(_SESSIONS_SQL, tenant_id, ids, entries)
        await conn.execute(_BRANCHES_SQL, tenant_id, ids)
        await conn.execute(_ENTRIES_SQL, tenant_id, ids, entries, corpus_size, starts)
        await conn.execute(_TOTALS_SQL, tenant_id, ids)


def session_ids(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{k:05d}-{uuid.uuid4().hex[:6]}" for k in range(count)]
