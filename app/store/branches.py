"""The tree's SQL: branches, the entries a navigation or a fork lands on, the
pivot a path holds at a given entry, the tree as a page, and what a deleted
session leaves behind (app.engine.tree says what a path is)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from app.core.driver import Driver
from app.engine import tree
from app.store.log import OnPath, on_path


@dataclass(frozen=True, slots=True)
class Landing:
    """An entry of the family, as a navigation or a fork finds it."""

    id: uuid.UUID
    branch: int
    seq: int
    kind: str
    path_tokens: int


@dataclass(frozen=True, slots=True)
class PivotAt:
    """The pivot a path holds at some entry: the latest compaction on it (its
    summary's seq, where its window starts, the entries it pinned) and how many
    compactions the path holds; none: the whole path is the window."""

    summary_seq: int | None
    start_seq: int
    pinned_seqs: tuple[int, ...]
    count: int


_LANDING = "id, branch, seq, kind, path_tokens"

_BY_ID_SQL = f"SELECT {_LANDING} FROM entry WHERE session_id = $1 AND tenant_id = $2 AND id = $3"
_AT_SQL = (
    f"SELECT {_LANDING} FROM entry"
    " WHERE session_id = $1 AND tenant_id = $2 AND branch = $3 AND seq = $4"
)
_TIP_SQL = "SELECT max(seq) FROM entry WHERE session_id = $1 AND tenant_id = $2 AND branch = $3"
_BRANCH_SQL = (
    "SELECT owner_id, path_branches, path_ends FROM branch"
    " WHERE session_id = $1 AND tenant_id = $2 AND branch_id = $3"
)
_NEW_BRANCH_SQL = """
INSERT INTO branch (session_id, tenant_id, branch_id, owner_id, parent_branch, fork_seq,
    path_branches, path_ends)
VALUES ($1, $2, nextval('branch_id_seq'), $3, $4, $5, $6::bigint[] || currval('branch_id_seq'),
    $7::bigint[])
RETURNING branch_id
"""
_ROOT_BRANCH_SQL = """
INSERT INTO branch (session_id, tenant_id, branch_id, owner_id, parent_branch, fork_seq,
    path_branches, path_ends)
VALUES ($1, $2, 0, $3, NULL, 0, '{0}', '{}')
"""
_FAMILY_TAKEN_SQL = "SELECT 1 FROM branch WHERE session_id = $1 AND tenant_id = $2 LIMIT 1"

# The latest compaction entry of one branch at or before a seq (the partial index).
_LAST_COMPACTION_SQL = """
SELECT seq, pivot_start, pivot_pinned FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND branch = $3 AND seq <= $4 AND kind = 'compaction'
ORDER BY seq DESC LIMIT 1
"""
_COUNT_COMPACTIONS_SQL = f"""
SELECT count(*) FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND kind = 'compaction'
    AND {on_path("", "$3::bigint[]", "$4::bigint[]")}
"""
_COMPACTION_ENTRY_SQL = """
SELECT branch, seq FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND kind = 'compaction' AND job_id = $3
LIMIT 1
"""


_FIRST_BRANCH_SQL = """
SELECT path_branches, path_ends FROM branch
WHERE session_id = $1 AND tenant_id = $2 AND owner_id = $3
ORDER BY branch_id LIMIT 1
"""


async def first_branch_path(
    driver: Driver, tenant_id: str, family_id: str, session_id: str
) -> tree.Path | None:
    """The path of the first branch the session writes: for a fork, through the
    entries of the session it was made from, which are in its tree."""
    row = await driver.fetchrow(_FIRST_BRANCH_SQL, family_id, tenant_id, session_id)
    if row is None:
        return None
    return tree.Path(tuple(row["path_branches"]), tuple(row["path_ends"]))


async def forget_proxy_history(driver: Driver, tenant_id: str, session_id: str) -> None:
    """Drop the proxy's record of the session's history (app.proxy.repository): after a
    navigation it is another path's, read again on the next proxied call."""
    await driver.execute(
        "DELETE FROM proxy_history WHERE session_id = $1 AND tenant_id = $2", session_id, tenant_id
    )


async def landing_by_id(
    driver: Driver, tenant_id: str, family_id: str, entry_id: uuid.UUID
) -> Landing | None:
    row = await driver.fetchrow(_BY_ID_SQL, family_id, tenant_id, entry_id)
    return None if row is None else Landing(**dict(row))


async def landing_at(
    driver: Driver, tenant_id: str, family_id: str, branch: int, seq: int
) -> Landing | None:
    row = await driver.fetchrow(_AT_SQL, family_id, tenant_id, branch, seq)
    return None if row is None else Landing(**dict(row))


async def branch_path(
    driver: Driver, tenant_id: str, family_id: str, branch: int
) -> tuple[str, tree.Path] | None:
    """The session that writes ``branch``, and the path that leads to it."""
    row = await driver.fetchrow(_BRANCH_SQL, family_id, tenant_id, branch)
    if row is None:
        return None
    return row["owner_id"], tree.Path(tuple(row["path_branches"]), tuple(row["path_ends"]))


async def branch_tip(driver: Driver, tenant_id: str, family_id: str, branch: int) -> int | None:
    """The last seq ``branch`` holds (None: none yet)."""
    tip: int | None = await driver.fetchval(_TIP_SQL, family_id, tenant_id, branch)
    return tip


async def new_branch(
    driver: Driver, tenant_id: str, family_id: str, owner_id: str, prefix: tree.Prefix
) -> tree.Path:
    """A branch written by ``owner_id`` after the prefix's last entry; its path."""
    branch: int = await driver.fetchval(
        _NEW_BRANCH_SQL,
        family_id,
        tenant_id,
        owner_id,
        prefix.branches[-1],
        prefix.depth,
        list(prefix.branches),
        list(prefix.ends),
    )
    return prefix.then(branch)


async def root_branch(driver: Driver, tenant_id: str, family_id: str, owner_id: str) -> None:
    """Branch 0 of a new family, written by its root session."""
    await driver.execute(_ROOT_BRANCH_SQL, family_id, tenant_id, owner_id)


async def family_taken(driver: Driver, tenant_id: str, family_id: str) -> bool:
    """Whether a family still stores entries under this id (its root session was
    deleted while a fork of it lives on)."""
    return await driver.fetchval(_FAMILY_TAKEN_SQL, family_id, tenant_id) is not None


async def pivot_at(driver: Driver, tenant_id: str, at: OnPath, seq: int) -> PivotAt:
    """The pivot the path holds at its entry ``seq``: the latest compaction at or
    before it, found segment by segment from the newest (a partial index of the
    compaction entries), and the count of those on the path."""
    branches, ends = at.args(1, seq + 1)
    count: int = await driver.fetchval(
        _COUNT_COMPACTIONS_SQL, at.family_id, tenant_id, branches, ends
    )
    for branch, end in zip(reversed(branches), reversed(ends), strict=True):
        row = await driver.fetchrow(_LAST_COMPACTION_SQL, at.family_id, tenant_id, branch, end)
        if row is not None:
            return PivotAt(row["seq"], row["pivot_start"], tuple(row["pivot_pinned"] or ()), count)
    return PivotAt(None, 1, (), count)


async def path_to_compaction(
    driver: Driver, tenant_id: str, family_id: str, compaction_id: uuid.UUID
) -> tree.Path | None:
    """The path that leads to a compaction's summary entry (None: it wrote none)."""
    row = await driver.fetchrow(_COMPACTION_ENTRY_SQL, family_id, tenant_id, compaction_id)
    if row is None:
        return None
    found = await branch_path(driver, tenant_id, family_id, row["branch"])
    if found is None:
        return None
    return found[1].prefix(row["seq"]).reopen()


# --- the tree as a page ----------------------------------------------------------

# The session's tree: the entries of the branches it writes, and of the path it
# was forked from (its first branch's). Each with its parent's id and how many
# children it has there. Keyset-paged on (branch, seq).
_TREE_SQL = f"""
WITH mine AS (
    SELECT branch_id FROM branch WHERE session_id = $1 AND tenant_id = $2 AND owner_id = $3
), visible AS (
    SELECT e.* FROM entry AS e
    WHERE e.session_id = $1 AND e.tenant_id = $2
        AND (e.branch IN (SELECT branch_id FROM mine)
            OR {on_path("e", "$4::bigint[]", "$5::bigint[]")})
)
SELECT v.id, v.branch, v.seq, v.kind, v.role, v.tokens, v.pinned,
    coalesce(
        left((SELECT string_agg(p->>'text', ' ') FROM jsonb_array_elements(v.parts) AS p
            WHERE p->>'type' = 'text'), 200),
        'calls ' || (SELECT string_agg(p->>'name', ', ') FROM jsonb_array_elements(v.parts) AS p
            WHERE p->>'type' = 'tool_call'),
        v.parts->0->>'type'
    ) AS label,
    (SELECT p.id FROM entry AS p
        WHERE p.session_id = $1 AND p.tenant_id = $2 AND p.branch = v.parent_branch
            AND p.seq = v.parent_seq) AS parent_id,
    (SELECT count(*) FROM visible AS c
        WHERE c.parent_branch = v.branch AND c.parent_seq = v.seq) AS children
FROM visible AS v
WHERE (v.branch, v.seq) > ($6::bigint, $7::bigint)
ORDER BY v.branch, v.seq
LIMIT $8
"""


async def tree_page(
    driver: Driver,
    tenant_id: str,
    family_id: str,
    session_id: str,
    base: tree.Path | None,
    after: tuple[int, int],
    limit: int,
) -> list[Any]:
    """A page of the session's tree after ``(branch, seq)``; ``base``: the path
    its first branch forked from (a fork's), whose entries are in its tree too."""
    branches, ends = ([], []) if base is None else base.segments(1, tree.OPEN)
    return await driver.fetch(
        _TREE_SQL, family_id, tenant_id, session_id, branches, ends, after[0], after[1], limit
    )
