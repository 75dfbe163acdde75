"""The tree's SQL: branches, the entries a navigation or a fork lands on, the
pivot a path holds at a given entry, the tree as a page, and what a deleted
session leaves behind (app.engine.tree says what a path is)."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from app.core.driver import Driver, Record
from app.engine import tree
from app.store.paths import OnPath, on_path


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a landing's branch is: the session that writes it, the path that leads to
    it, and the last seq it holds."""

    owner_id: str
    path: tree.Path
    tip: int


@dataclass(frozen=True, slots=True)
class Landing:
    """An entry of the family, as a navigation or a fork finds it; ``placement``, when
    read with it (``placed=True``): what moving the leaf there asks of its branch, read
    in the same statement."""

    id: uuid.UUID
    branch: int
    seq: int
    kind: str
    path_tokens: int
    placement: Placement | None = None


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

# Ordered by id so that the (session_id, tenant_id, id) key is the plan's, even when
# the statistics lag (the primary key's prefix alone meant a scan of the family).
_BY_ID_SQL = (
    f"SELECT {_LANDING} FROM entry WHERE session_id = $1 AND tenant_id = $2 AND id = $3"
    " ORDER BY id LIMIT 1"
)
_AT_SQL = (
    f"SELECT {_LANDING} FROM entry"
    " WHERE session_id = $1 AND tenant_id = $2 AND branch = $3 AND seq = $4"
)
# The landing with its placement (its branch's row and last seq): what a navigation
# reads of its target in one round trip instead of three.
_PLACED = """
SELECT e.id, e.branch, e.seq, e.kind, e.path_tokens, b.owner_id, b.path_branches, b.path_ends,
    (SELECT t.seq FROM entry AS t
        WHERE t.session_id = $1 AND t.tenant_id = $2 AND t.branch = e.branch
        ORDER BY t.seq DESC LIMIT 1) AS tip
FROM entry AS e
LEFT JOIN branch AS b ON b.session_id = $1 AND b.tenant_id = $2 AND b.branch_id = e.branch
WHERE e.session_id = $1 AND e.tenant_id = $2 AND {where}
"""
_PLACED_BY_ID_SQL = _PLACED.format(where="e.id = $3 ORDER BY e.id LIMIT 1")
_PLACED_AT_SQL = _PLACED.format(where="e.branch = $3 AND e.seq = $4")
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
# A branch that starts at the root (no fork point): a path of its own from seq 1.
_NEW_ROOT_BRANCH_SQL = """
INSERT INTO branch (session_id, tenant_id, branch_id, owner_id, parent_branch, fork_seq,
    path_branches, path_ends)
VALUES ($1, $2, nextval('branch_id_seq'), $3, NULL, 0, ARRAY[currval('branch_id_seq')],
    '{}'::bigint[])
RETURNING branch_id
"""

# The compaction entries on a path (the partial index holds only those): the latest,
# and how many, in one statement.
_COMPACTIONS_SQL = f"""
WITH on_path AS (
    SELECT seq, pivot_start, pivot_pinned FROM entry
    WHERE session_id = $1 AND tenant_id = $2 AND kind = 'compaction'
        AND {on_path("", "$3::bigint[]", "$4::bigint[]")}
)
SELECT (SELECT count(*) FROM on_path) AS count, l.seq, l.pivot_start, l.pivot_pinned
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT * FROM on_path ORDER BY seq DESC LIMIT 1) AS l ON true
"""
# The latest branch summary on a path at or before a seq (a background job's read:
# branch summaries are few, and not indexed apart).
_LAST_BRANCH_SUMMARY_SQL = f"""
SELECT max(seq) FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND kind = 'branch_summary'
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


# The record as if none were kept (what the proxy reads for no row), but for whether a
# call on the session declared tools, which is the session's, not its path's.
_FORGET_PROXY_HISTORY_SQL = """
UPDATE proxy_history SET entry_count = 0, last_seq = 0, chain = $3, raw_count = 0,
    raw_digest = NULL, raw_entry_count = 0, raw_chain = $3, updated_at = now()
WHERE session_id = $1 AND tenant_id = $2
"""


async def forget_proxy_history(driver: Driver, tenant_id: str, session_id: str) -> None:
    """Forget the proxy's record of the session's history (app.proxy.repository): after
    a navigation it is another path's, read again on the next proxied call."""
    await driver.execute(_FORGET_PROXY_HISTORY_SQL, session_id, tenant_id, bytes(32))


def _landing(row: Record, placed: bool) -> Landing:
    landing = Landing(row["id"], row["branch"], row["seq"], row["kind"], row["path_tokens"])
    if not placed or row["owner_id"] is None:  # no branch row: move_leaf reads it again
        return landing
    path = tree.Path(tuple(row["path_branches"]), tuple(row["path_ends"]))
    return dataclasses.replace(landing, placement=Placement(row["owner_id"], path, row["tip"]))


async def landing_by_id(
    driver: Driver, tenant_id: str, family_id: str, entry_id: uuid.UUID, *, placed: bool = False
) -> Landing | None:
    sql = _PLACED_BY_ID_SQL if placed else _BY_ID_SQL
    row = await driver.fetchrow(sql, family_id, tenant_id, entry_id)
    return None if row is None else _landing(row, placed)


async def landing_at(
    driver: Driver,
    tenant_id: str,
    family_id: str,
    branch: int,
    seq: int,
    *,
    placed: bool = False,
) -> Landing | None:
    sql = _PLACED_AT_SQL if placed else _AT_SQL
    row = await driver.fetchrow(sql, family_id, tenant_id, branch, seq)
    return None if row is None else _landing(row, placed)


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


async def new_root_branch(
    driver: Driver, tenant_id: str, family_id: str, owner_id: str
) -> tree.Path:
    """A branch written by ``owner_id`` that starts at the root (its first entry is
    seq 1, with no parent); its path."""
    branch: int = await driver.fetchval(_NEW_ROOT_BRANCH_SQL, family_id, tenant_id, owner_id)
    return tree.Path((branch,), ())


async def pivot_at(driver: Driver, tenant_id: str, at: OnPath, seq: int) -> PivotAt:
    """The pivot the path holds at its entry ``seq``: the latest compaction at or
    before it, and the count of those on the path (a partial index of the
    compaction entries: no pass over the others)."""
    branches, ends = at.args(1, seq + 1)
    row = await driver.fetchrow(_COMPACTIONS_SQL, at.family_id, tenant_id, branches, ends)
    assert row is not None  # one row, always
    if row["seq"] is None:
        return PivotAt(None, 1, (), row["count"])
    return PivotAt(row["seq"], row["pivot_start"], tuple(row["pivot_pinned"] or ()), row["count"])


async def last_branch_summary(driver: Driver, tenant_id: str, at: OnPath, seq: int) -> int | None:
    """The seq of the latest branch summary entry on the path at or before ``seq``."""
    found: int | None = await driver.fetchval(
        _LAST_BRANCH_SUMMARY_SQL, at.family_id, tenant_id, *at.args(1, seq + 1)
    )
    return found


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

# The session's tree: the entries of the branches it writes, and of the path it was
# forked from (its first branch's), a page in (branch, seq) order (the primary key's).
_PAGE_SQL = f"""
SELECT e.id, e.branch, e.seq, e.kind, e.role, e.tokens, e.pinned,
    coalesce(
        left((SELECT string_agg(p->>'text', ' ') FROM jsonb_array_elements(e.parts) AS p
            WHERE p->>'type' = 'text'), 200),
        'calls ' || (SELECT string_agg(p->>'name', ', ') FROM jsonb_array_elements(e.parts) AS p
            WHERE p->>'type' = 'tool_call'),
        e.parts->0->>'type'
    ) AS label
FROM entry AS e
WHERE e.session_id = $1 AND e.tenant_id = $2
    AND (e.branch, e.seq) > ($6::bigint, $7::bigint)
    AND (e.branch IN (SELECT branch_id FROM branch
            WHERE session_id = $1 AND tenant_id = $2 AND owner_id = $3)
        OR {on_path("e", "$4::bigint[]", "$5::bigint[]")})
ORDER BY e.branch, e.seq
LIMIT $8
"""
# Every branch of the family, with where it forks, who writes it and its last seq (an
# ordered scan of the key from the end): what the page's parents and children are
# worked out from, with no lookup per entry (one planned on lagging statistics as a
# scan of the family per entry made a page O(page x tree)).
_BRANCHES_SQL = """
SELECT b.branch_id, b.parent_branch, b.fork_seq, b.owner_id,
    (SELECT e.seq FROM entry AS e
        WHERE e.session_id = b.session_id AND e.tenant_id = b.tenant_id
            AND e.branch = b.branch_id
        ORDER BY e.seq DESC LIMIT 1) AS tip
FROM branch AS b
WHERE b.session_id = $1 AND b.tenant_id = $2
"""
_IDS_SQL = """
SELECT branch, seq, id FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND branch = ANY($3::bigint[]) AND seq = ANY($4::bigint[])
"""


@dataclass(frozen=True, slots=True)
class TreeRow:
    id: uuid.UUID
    branch: int
    seq: int
    kind: str
    role: str
    tokens: int
    pinned: bool
    label: str | None
    parent_id: uuid.UUID | None
    children: int


async def tree_page(
    driver: Driver,
    tenant_id: str,
    family_id: str,
    session_id: str,
    base: tree.Path | None,
    after: tuple[int, int],
    limit: int,
) -> list[TreeRow]:
    """A page of the session's tree after ``(branch, seq)``; ``base``: the path
    its first branch forked from (a fork's), whose entries are in its tree too.
    Each entry with its parent's id and how many children it has in this tree."""
    branches, ends = ([], []) if base is None else base.segments(1, tree.OPEN)
    rows = await driver.fetch(
        _PAGE_SQL, family_id, tenant_id, session_id, branches, ends, after[0], after[1], limit
    )
    if not rows:
        return []
    family = {r["branch_id"]: r for r in await driver.fetch(_BRANCHES_SQL, family_id, tenant_id)}

    def reach(branch: int) -> int:
        """The last seq of ``branch`` in this session's tree (0: none of it)."""
        found = family.get(branch)
        if found is None or found["tip"] is None:
            return 0
        if found["owner_id"] == session_id:
            return int(found["tip"])
        if base is not None and branch in base.branches:
            i = base.branches.index(branch)
            end = base.ends[i] if i < len(base.ends) else tree.OPEN
            return min(int(found["tip"]), end)
        return 0

    forks: dict[tuple[int, int], int] = {}
    for b in family.values():
        first = b["fork_seq"] + 1
        if b["parent_branch"] is not None and reach(b["branch_id"]) >= first:
            key = (b["parent_branch"], b["fork_seq"])
            forks[key] = forks.get(key, 0) + 1

    def parent_of(branch: int, seq: int) -> tuple[int, int] | None:
        found = family.get(branch)
        if seq <= 1:
            return None
        if found is None or found["parent_branch"] is None or seq - 1 > found["fork_seq"]:
            return branch, seq - 1
        return found["parent_branch"], found["fork_seq"]

    ids = {(r["branch"], r["seq"]): r["id"] for r in rows}
    wanted = {p for r in rows if (p := parent_of(r["branch"], r["seq"])) and p not in ids}
    if wanted:
        found_ids = await driver.fetch(
            _IDS_SQL,
            family_id,
            tenant_id,
            sorted({b for b, _ in wanted}),
            sorted({s for _, s in wanted}),
        )
        ids.update({(r["branch"], r["seq"]): r["id"] for r in found_ids})
    out = []
    for r in rows:
        branch, seq = r["branch"], r["seq"]
        parent = parent_of(branch, seq)
        children = forks.get((branch, seq), 0) + (1 if reach(branch) > seq else 0)
        out.append(
            TreeRow(
                id=r["id"],
                branch=branch,
                seq=seq,
                kind=r["kind"],
                role=r["role"],
                tokens=r["tokens"],
                pinned=r["pinned"],
                label=r["label"],
                parent_id=None if parent is None else ids.get(parent),
                children=children,
            )
        )
    return out
