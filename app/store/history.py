"""Pages of a session's stored history, as the API reads it back: whole entries
(their parts and the client's own keys), each with the time pruning hid it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core.driver import Driver, record_of
from app.engine import tree
from app.store.paths import OnPath, on_path


@dataclass(slots=True)
class HistoryRow:
    """A stored entry as the history shows it."""

    id: uuid.UUID
    seq: int
    kind: str
    role: str
    parts: list[dict[str, Any]]
    tool_call_id: str | None
    tool_name: str | None
    is_error: bool
    name: str | None
    content_form: str
    extra: dict[str, Any] | None
    source_format: str
    tokens: int
    created_at: datetime
    erased_bytes: int | None
    omitted_lines: int | None
    omitted_bytes: int | None
    pruned_at: datetime | None  # when pruning hid it, if it did


_PAGE_SQL = f"""
SELECT e.id, e.seq, e.kind, e.role, e.parts, e.tool_call_id, e.tool_name, e.is_error, e.name,
    e.content_form, e.extra, e.source_format, e.tokens, e.created_at, e.erased_bytes,
    e.omitted_lines, e.omitted_bytes, m.pruned_at
FROM entry AS e
LEFT JOIN prune_mark AS m ON m.session_id = $6 AND m.tenant_id = e.tenant_id
    AND m.branch = e.branch AND m.seq = e.seq
WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.seq > $3
    AND {on_path("e", "$4::bigint[]", "$5::bigint[]")}
    {{replaced}}
ORDER BY e.seq
LIMIT $7
"""
# What a compaction replaces: the messages, without the system entries, the pinned
# entries (the context keeps both) and summaries.
_REPLACED = "AND e.kind <> 'compaction' AND e.role NOT IN ('system', 'developer') AND NOT e.pinned"
_PAGE = {
    replaced_only: _PAGE_SQL.replace("{replaced}", _REPLACED if replaced_only else "")
    for replaced_only in (False, True)
}


async def page(
    driver: Driver,
    tenant_id: str,
    at: OnPath,
    after_seq: int,
    limit: int,
    *,
    before_seq: int | None = None,
    replaced_only: bool = False,
) -> list[HistoryRow]:
    """The path's entries after ``after_seq`` (and before ``before_seq``), oldest
    first. ``replaced_only``: what a compaction replaces (see ``_REPLACED``)."""
    branches, ends = at.args(after_seq + 1, tree.OPEN if before_seq is None else before_seq)
    if not branches:
        return []
    records = await driver.fetch(
        _PAGE[replaced_only],
        at.family_id,
        tenant_id,
        after_seq,
        branches,
        ends,
        at.session_id,
        limit,
    )
    return [record_of(HistoryRow, r) for r in records]
