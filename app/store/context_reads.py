"""The reads of a context: the session and its view's prune marks from one snapshot,
and the view's entries as stored fragments in the model's order (never the parts)."""

from __future__ import annotations

from typing import Any

from app.core.driver import Driver, Record
from app.store.paths import OnPath, on_path, on_session_path
from app.store.session_row import STATE_COLUMNS, SessionState, state_of

# $5 and $6 of the statements below that take a path.
_PATH_56 = on_path("", "$5::bigint[]", "$6::bigint[]")

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
