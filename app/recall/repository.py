"""Recall's SQL: the entries of a session's tree that match a query, ranked, a page
at a time.

Two sources of matches, each read through its own GIN index (migration 0010), both
led by the family's key so that a common word costs this family's share of its
posting list, not every tenant's:

- **words**: ``search_tsv @@`` the query's words, stemmed (``english``; paths and
  dotted names split in their parts, as the vector's are: see migration 0010); ranked
  by ``ts_rank_cd`` (cover density: the words close together rank higher), normalized
  to [0, 1);
- **substring**: ``search_text ~* 'query'`` (the query as written, any case) through
  the trigram index: an identifier, a path or an error name is found as written,
  whatever the parser makes of it (``django.core.exceptions.ImproperlyConfigured``
  one token, ``parse_iso_week`` three), inside a longer word too; a place in a file
  (``registry.py:135``) however the text writes it (``File "…/registry.py", line
  135``: :class:`app.engine.search_text.Query`). A hit where the query stands alone
  (not inside a longer identifier) scores 4, one inside a longer word 2: above any
  hit by words alone, which scores under 2. A summary (a compaction's, a branch's)
  where it stands alone scores 3: it lists names many times over (its file lists,
  its commands), and without this it outranked the entry that holds the fact, as
  written, by its cover density and by being newer.

The best hits by words alone (:data:`NEAR_RANKED`) are ranked again by the trigram
``word_similarity`` of the query to their text's start, which puts an identifier
written with other punctuation (``parse-iso-week``) first among them.

Bounded work: each source reads at most ``cap`` matching rows (a query as common as
"the" in a session of 10,000 entries stops there; the page then says it is not
complete), and the costly ones run on a fixed number of rows: ``word_similarity`` on
the best :data:`NEAR_RANKED`; the searchable text (bounded when written) is read for
the page's rows only, for their snippets (``app.engine.search_text.snippet``).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from app.core.driver import Driver
from app.engine import tree
from app.engine.search_text import Query
from app.store.paths import on_path

# The word-only hits whose similarity to the query is measured (and how much of each
# text is measured: word_similarity costs about 0.15 ms per 1,000 characters).
NEAR_RANKED = 10
NEAR_CHARS = 1_000


@dataclass(frozen=True, slots=True)
class Scope:
    """Which entries of the family are searched: the session's tree (the branches it
    writes, and the path its first branch forked from), narrowed by the filters."""

    owned: list[int]  # the branches the session writes
    base_branches: list[int]  # the path its first branch forked from (empty: none)
    base_ends: list[int]
    roles: list[str] | None = None
    kinds: list[str] | None = None
    tools: list[str] | None = None
    from_seq: int | None = None
    to_seq: int | None = None
    # A compaction's replaced entries: this path's seqs in [start, end).
    replaced: tuple[tree.Path, int, int] | None = None


@dataclass(frozen=True, slots=True)
class Hit:
    id: uuid.UUID
    branch: int
    seq: int
    role: str
    kind: str
    tool_name: str | None
    score: float
    exact: bool  # found as a substring (else by its words alone)
    text: str | None  # the searchable text, for the snippet


@dataclass(frozen=True, slots=True)
class Found:
    hits: list[Hit]
    complete: bool  # every match was ranked (no source stopped at its cap)


_OWNED_SQL = """
SELECT coalesce(array_agg(branch_id ORDER BY branch_id), '{}') FROM branch
WHERE session_id = $1 AND tenant_id = $2 AND owner_id = $3
"""


async def owned_branches(
    driver: Driver, tenant_id: str, family_id: str, session_id: str
) -> list[int]:
    """The branches of the family that the session writes."""
    found: list[int] = await driver.fetchval(_OWNED_SQL, family_id, tenant_id, session_id)
    return list(found)


def _scope_sql(scope: Scope, args: list[object]) -> str:
    """The scope's conditions on ``e`` (its values appended to ``args``)."""

    def arg(value: object, cast: str) -> str:
        args.append(value)
        return f"${len(args)}::{cast}"

    owned = arg(scope.owned, "bigint[]")
    where = [f"(e.branch = ANY({owned})"]
    if scope.base_branches:
        branches = arg(scope.base_branches, "bigint[]")
        ends = arg(scope.base_ends, "bigint[]")
        where[0] += f" OR ({on_path('e', branches, ends)})"
    where[0] += ")"
    if scope.roles is not None:
        where.append(f"e.role = ANY({arg(scope.roles, 'text[]')})")
    if scope.kinds is not None:
        where.append(f"e.kind = ANY({arg(scope.kinds, 'text[]')})")
    if scope.tools is not None:
        tools = arg(scope.tools, "text[]")
        # A tool's results, and the assistant entries that call it.
        where.append(
            f"(e.tool_name = ANY({tools}) OR (e.call_ids IS NOT NULL AND EXISTS ("
            "SELECT 1 FROM jsonb_array_elements(e.parts) AS p"
            f" WHERE p->>'type' = 'tool_call' AND p->>'name' = ANY({tools}))))"
        )
    if scope.from_seq is not None:
        where.append(f"e.seq >= {arg(scope.from_seq, 'bigint')}")
    if scope.to_seq is not None:
        where.append(f"e.seq <= {arg(scope.to_seq, 'bigint')}")
    if scope.replaced is not None:
        path, start, end = scope.replaced
        segments, segment_ends = path.segments(start, end)
        b, e = arg(segments, "bigint[]"), arg(segment_ends, "bigint[]")
        # As GET …/compactions/{id}/source: what the summary replaced, without the
        # entries the context kept (system, pinned) and the summaries.
        where.append(
            f"e.seq >= {arg(start, 'bigint')} AND {on_path('e', b, e)}"
            " AND e.kind <> 'compaction' AND e.role NOT IN ('system', 'developer')"
            " AND NOT e.pinned"
        )
    return " AND ".join(where)


def search_sql(scope_sql: str, first: int, *, trigrams: bool = True) -> str:
    """The search, for a scope's conditions; its own parameters from ``$first``: the
    query's text, its regex and its regex alone, the cap, the page's size and the cursor
    (score, seq, branch; NULLs for the first page). Without ``trigrams`` (a literal
    the trigram index cannot look up) the substring is looked for in the session's
    entries one by one, up to the cap: a scan of the tree, not of the index, which
    would read every family's entries."""
    text, regex, alone, cap, limit, score, seq, branch = (f"${first + i}" for i in range(8))
    key = "e.session_id = $1 AND e.tenant_id = $2"
    # coalesce keeps the planner off the trigram index, which holds no key for it.
    haystack = "e.search_text" if trigrams else "coalesce(e.search_text, '')"
    return f"""
WITH q AS (
    SELECT plainto_tsquery('english', replace(replace({text}::text, '.', ' '), '/', ' '))
        AS tsq
), words AS (
    SELECT e.branch, e.seq, ts_rank_cd(e.search_tsv, q.tsq, 32)::float8 AS rank
    FROM entry AS e, q
    WHERE {key} AND e.search_tsv @@ q.tsq AND {scope_sql}
    LIMIT {cap}::int
), exact AS (
    SELECT e.branch, e.seq, CASE WHEN e.search_text ~* {alone}::text THEN
            CASE WHEN e.kind IN ('compaction', 'branch_summary') THEN 3.0 ELSE 4.0 END
        ELSE 2.0 END::float8 AS exact
    FROM entry AS e
    WHERE {key} AND {haystack} ~* {regex}::text AND {scope_sql}
    LIMIT {cap}::int
), found AS (
    SELECT branch, seq, coalesce(x.exact, 0) + coalesce(w.rank, 0) AS base, x.exact IS NOT NULL
        AS exact
    FROM words AS w FULL JOIN exact AS x USING (branch, seq)
), near AS (
    SELECT f.branch, f.seq,
        word_similarity({text}::text, left(e.search_text, {NEAR_CHARS}))::float8 AS sim
    FROM (SELECT branch, seq FROM found WHERE NOT exact
        ORDER BY base DESC, seq DESC, branch DESC LIMIT {NEAR_RANKED}) AS f
    JOIN entry AS e ON {key} AND e.branch = f.branch AND e.seq = f.seq
), scored AS (
    SELECT f.branch, f.seq, f.base + coalesce(n.sim, 0) AS score, f.exact
    FROM found AS f LEFT JOIN near AS n USING (branch, seq)
), page AS (
    SELECT * FROM scored
    WHERE {score}::float8 IS NULL
        OR (score, seq, branch) < ({score}::float8, {seq}::bigint, {branch}::bigint)
    ORDER BY score DESC, seq DESC, branch DESC
    LIMIT {limit}::int
)
SELECT e.id, p.branch, p.seq, e.role, e.kind, e.tool_name, p.score, p.exact,
    e.search_text AS text,
    (SELECT count(*) FROM words) >= {cap}::int OR (SELECT count(*) FROM exact) >= {cap}::int
        AS capped
FROM page AS p
JOIN entry AS e ON {key} AND e.branch = p.branch AND e.seq = p.seq
ORDER BY p.score DESC, p.seq DESC, p.branch DESC
"""


async def search(
    driver: Driver,
    tenant_id: str,
    family_id: str,
    scope: Scope,
    query: Query,
    *,
    cap: int,
    limit: int,
    after: tuple[float, int, int] | None,
) -> Found:
    """A page of the matches in ``scope``, best first, after the cursor ``after``
    (score, seq, branch of the last hit of the page before)."""
    args: list[object] = [family_id, tenant_id]
    scope_sql = _scope_sql(scope, args)
    sql = search_sql(scope_sql, len(args) + 1, trigrams=query.has_trigram)
    score, seq, branch = after if after is not None else (None, None, None)
    rows = await driver.fetch(
        sql,
        *args,
        query.words,
        query.regex,
        query.alone_regex,
        cap,
        limit,
        score,
        seq,
        branch,
    )
    hits = [
        Hit(
            id=r["id"],
            branch=r["branch"],
            seq=r["seq"],
            role=r["role"],
            kind=r["kind"],
            tool_name=r["tool_name"],
            score=r["score"],
            exact=r["exact"],
            text=r["text"],
        )
        for r in rows
    ]
    # Every row says whether a source stopped at its cap (an empty page: none did, or
    # the cursor is past them all).
    complete = not (rows and rows[0]["capped"])
    return Found(hits, complete)
