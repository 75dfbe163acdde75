"""SQL for usage reports and pruning, on a bare asyncpg connection (``driver``).

Every function runs inside the caller's transaction, after the session row was
locked (``lock_state``), so the running totals stay exact.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from app.messages.repository import read_marks

_ITEMS_SQL = """
SELECT seq, role, kind, tool_name, tokens, coalesce(view_call_id, tool_call_id), is_error,
    call_id_tokens
FROM entry
WHERE session_id = $1 AND tenant_id = $2 AND seq >= $3 AND seq < $4 AND kind <> 'compaction'
ORDER BY seq DESC
LIMIT $5
"""

_FIRST_CHUNK = 512

# A mark per output, with what its placeholder costs; the placeholder itself is
# rendered when the context is read (the same text for every output), so the
# entry and its stored view stay as they are.
_PRUNE_SQL = """
INSERT INTO prune_mark (session_id, tenant_id, seq, pruned_at, tokens)
SELECT $1, $2, p.seq, $3, p.tokens FROM unnest($4::bigint[], $5::int[]) AS p(seq, tokens)
"""

# prune.erase: the stored output itself becomes the placeholder, and the views with it.
_ERASE_SQL = """
UPDATE entry AS e SET parts = p.parts, view_openai = p.view_openai,
    view_anthropic = p.view_anthropic, erased_bytes = octet_length(e.parts::text)
FROM unnest($3::bigint[], $4::jsonb[], $5::text[], $6::text[])
    AS p(seq, parts, view_openai, view_anthropic)
WHERE e.session_id = $1 AND e.tenant_id = $2 AND e.seq = p.seq AND e.erased_bytes IS NULL
"""

_PRUNED_TOTALS_SQL = """
UPDATE session SET context_tokens = context_tokens - $3,
    context_tool_tokens = context_tool_tokens - $3, pruned_tokens = pruned_tokens + $3,
    prune_count = prune_count + 1, prune_checked_tool_tokens = context_tool_tokens - $3,
    prune_checked_urgent = $5, version = version + 1, updated_at = $4
WHERE id = $1 AND tenant_id = $2
RETURNING version
"""

_CHECKED_SQL = """
UPDATE session SET prune_checked_tool_tokens = context_tool_tokens, prune_checked_urgent = $3
WHERE id = $1 AND tenant_id = $2
"""


def _served_cleared(consumed: str) -> str:
    """A report that measured the served context (``consumed``, a boolean
    parameter) clears it: the next report without context_version is about the
    next context served, or unknown."""
    return ", ".join(
        f"{column} = CASE WHEN {consumed} THEN NULL ELSE {column} END"
        for column in ("served_version", "served_context_tokens", "served_compaction_id")
    )


_USAGE_SQL = f"""
UPDATE session SET calibration_factor = $3, overhead_tokens = $4,
    reported_prompt_tokens = $5, context_tokens_at_report = $8,
    last_usage = $6::jsonb, usage_count = usage_count + 1, version = version + 1,
    updated_at = $7, {_served_cleared("$9::boolean")}
WHERE id = $1 AND tenant_id = $2
RETURNING version
"""


# A report about a context the pivot has replaced: kept as the last usage, but
# neither the calibration nor the estimate's base moves.
_STALE_USAGE_SQL = f"""
UPDATE session SET overhead_tokens = $3, last_usage = $4::jsonb, usage_count = usage_count + 1,
    version = version + 1, updated_at = $5, {_served_cleared("$6::boolean")}
WHERE id = $1 AND tenant_id = $2
RETURNING version
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


class PrunedRow(NamedTuple):
    seq: int
    tokens: int  # the placeholder's


class ErasedRow(NamedTuple):
    seq: int
    parts: str  # JSON text
    view_openai: str
    view_anthropic: str


class BudgetRepository:
    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id

    async def window_items(
        self, driver: Any, session_id: str, start_seq: int, end_seq: int
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
                _ITEMS_SQL, session_id, self.tenant_id, start_seq, upper, chunk
            )
            if not rows:
                break
            marks = await read_marks(driver, self.tenant_id, session_id, rows[-1][0], upper)
            batch = [
                WindowItem(
                    r[0], r[1], r[2], r[3], marks.get(r[0], r[4]), r[0] in marks, r[5], r[6], r[7]
                )
                for r in rows
            ]
            newest_first.extend(batch)
            if len(batch) < chunk or any(i.pruned or i.kind == "summary" for i in batch):
                break
            upper, chunk = batch[-1].seq, chunk * 4
        newest_first.reverse()
        return newest_first

    async def mark_pruned(
        self,
        driver: Any,
        session_id: str,
        rows: list[PrunedRow],
        saved: int,
        now: datetime,
        erased: list[ErasedRow],
        urgent: bool,
    ) -> int:
        """Mark the entries, take ``saved`` off the totals, and clear the stored
        content of ``erased``. Returns the session's new version."""
        await driver.execute(
            _PRUNE_SQL,
            session_id,
            self.tenant_id,
            now,
            [r.seq for r in rows],
            [r.tokens for r in rows],
        )
        if erased:
            await driver.execute(
                _ERASE_SQL,
                session_id,
                self.tenant_id,
                [r.seq for r in erased],
                [r.parts for r in erased],
                [r.view_openai for r in erased],
                [r.view_anthropic for r in erased],
            )
        version: int = await driver.fetchval(
            _PRUNED_TOTALS_SQL, session_id, self.tenant_id, saved, now, urgent
        )
        return version

    async def mark_checked(self, driver: Any, session_id: str, urgent: bool) -> None:
        await driver.execute(_CHECKED_SQL, session_id, self.tenant_id, urgent)

    async def record_stale_usage(
        self,
        driver: Any,
        session_id: str,
        *,
        overhead_tokens: int,
        usage_json: str,
        now: datetime,
        consumed: bool,
    ) -> int:
        version: int = await driver.fetchval(
            _STALE_USAGE_SQL, session_id, self.tenant_id, overhead_tokens, usage_json, now, consumed
        )
        return version

    async def record_usage(
        self,
        driver: Any,
        session_id: str,
        *,
        calibration_factor: float,
        overhead_tokens: int,
        reported_prompt_tokens: int,
        context_tokens_at_report: int,
        usage_json: str,
        now: datetime,
        consumed: bool,
    ) -> int:
        """Record a report that measured the context of ``context_tokens_at_report``
        counted tokens; ``consumed``: that context was the one last served."""
        version: int = await driver.fetchval(
            _USAGE_SQL,
            session_id,
            self.tenant_id,
            calibration_factor,
            overhead_tokens,
            reported_prompt_tokens,
            usage_json,
            now,
            context_tokens_at_report,
            consumed,
        )
        return version
