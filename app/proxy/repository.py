"""The proxy's SQL: what it knows of a session's stored history (``proxy_history``),
and the message entries stored since (a catch-up read, usually empty)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from app.core.driver import Driver
from app.engine.model import Entry
from app.engine.proxy.history import EMPTY_CHAIN, Known
from app.store.paths import on_session_path

# With whether a message entry was stored since (by the /v1 API, or another process):
# one indexed probe, so that the usual call reads no entry at all. The probe asks for
# the first such entry in seq order, not EXISTS (whose ORDER BY Postgres drops): the
# generic plan (plan_cache_mode), made while the sessions were small, took the entry
# table's (session_id, tenant_id, id) index and filtered every entry of the session,
# 7 ms a call at 10,000 entries; an ordered scan is the primary key's.
_KNOWN_SQL = f"""
SELECT s.version, s.created_at, s.path_branches, s.path_ends,
    coalesce(s.config -> 'recall' ->> 'proxy_tools' = 'true', false) AS recall_tools,
    coalesce(p.tools_declared, false) AS tools_declared,
    p.entry_count, p.last_seq, p.chain, p.raw_count,
    p.raw_digest, p.raw_entry_count, p.raw_chain,
    (
        SELECT e.seq FROM entry AS e
        WHERE e.session_id = s.family_id AND e.tenant_id = s.tenant_id
            AND e.seq > coalesce(p.last_seq, 0) AND e.kind = 'message'
            AND {on_session_path("e")}
        ORDER BY e.seq
        LIMIT 1
    ) IS NOT NULL AS behind
FROM session AS s
LEFT JOIN proxy_history AS p ON p.session_id = s.id AND p.tenant_id = s.tenant_id
WHERE s.id = $1 AND s.tenant_id = $2
"""

# The agent's history is the message entries of the session's path: a compaction's
# summary and its "continue" note are compactd's own entries. Each statement reads the
# session's path from its row (app.engine.tree: a navigation may have moved it).
_ON_PATH = """FROM session AS s JOIN entry AS e
    ON e.session_id = s.family_id AND e.tenant_id = s.tenant_id"""
_MESSAGES_SQL = f"""
SELECT e.seq, e.role, e.parts, e.tool_call_id, e.tool_name, e.is_error, e.name,
    e.content_form, e.erased_bytes IS NOT NULL AS erased
{_ON_PATH}
WHERE s.id = $1 AND s.tenant_id = $2 AND e.seq > $3 AND e.kind = 'message'
    AND {on_session_path("e")}
ORDER BY e.seq
LIMIT $4
"""

# One message entry whole, the keys its client sent that the store keeps aside included.
_MESSAGE_SQL = f"""
SELECT e.seq, e.role, e.parts, e.tool_call_id, e.tool_name, e.is_error, e.name,
    e.content_form, e.erased_bytes IS NOT NULL AS erased, e.extra
{_ON_PATH}
WHERE s.id = $1 AND s.tenant_id = $2 AND e.seq = $3 AND e.kind = 'message'
    AND {on_session_path("e")}
"""

# Ordered, as the probe above: a scan of the primary key from the end.
_LAST_MESSAGE_SQL = f"""
SELECT e.seq
{_ON_PATH}
WHERE s.id = $1 AND s.tenant_id = $2 AND e.seq > $3 AND e.kind = 'message'
    AND {on_session_path("e")}
ORDER BY e.seq DESC
LIMIT 1
"""

# Only forward: two processes' calls on one session may finish in either order.
_SAVE_SQL = """
INSERT INTO proxy_history AS p (session_id, tenant_id, entry_count, last_seq, chain, raw_count,
    raw_digest, raw_entry_count, raw_chain)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (session_id, tenant_id) DO UPDATE SET
    entry_count = EXCLUDED.entry_count, last_seq = EXCLUDED.last_seq, chain = EXCLUDED.chain,
    raw_count = EXCLUDED.raw_count, raw_digest = EXCLUDED.raw_digest,
    raw_entry_count = EXCLUDED.raw_entry_count, raw_chain = EXCLUDED.raw_chain,
    updated_at = now()
WHERE p.last_seq <= EXCLUDED.last_seq
"""

# A call on the session declared tools (app.engine.proxy.conversations): kept through
# the record's resets (a navigation), set once. A new row is an empty record.
_TOOLS_SQL = """
INSERT INTO proxy_history AS p (session_id, tenant_id, entry_count, last_seq, chain, raw_count,
    raw_digest, raw_entry_count, raw_chain, tools_declared)
VALUES ($1, $2, 0, 0, $3, 0, NULL, 0, $3, true)
ON CONFLICT (session_id, tenant_id) DO UPDATE SET tools_declared = true
"""

_PARENT_SQL = "SELECT parent_id FROM session WHERE id = $1 AND tenant_id = $2"


@dataclass(frozen=True, slots=True)
class KnownRow:
    """The session's version, and what the proxy recorded of its history (through
    ``last_seq``; 0 and the empty chain when nothing was); ``behind``: message entries
    were stored after ``last_seq``. ``created_at`` tells a session deleted and made
    again under the same id from the one it replaced."""

    version: int
    known: Known
    last_seq: int
    behind: bool
    created_at: datetime
    path: tuple[tuple[int, ...], tuple[int, ...]] = ((0,), ())  # the session's (app.engine.tree)
    recall_tools: bool = False  # config recall.proxy_tools (app.engine.proxy.recall)
    tools_declared: bool = False  # a proxied call on the session declared tools


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A stored message entry; ``erased``: pruning cleared its content (``prune.erase``)."""

    seq: int
    entry: Entry
    erased: bool = False


def _json(value: Any) -> Any:
    return orjson.loads(value) if isinstance(value, str) else value


def _entry(row: Any, with_extra: bool = False) -> StoredMessage:
    return StoredMessage(
        row["seq"],
        Entry(
            role=row["role"],
            parts=_json(row["parts"]) or [],
            tool_call_id=row["tool_call_id"],
            tool_name=row["tool_name"],
            is_error=row["is_error"],
            name=row["name"],
            content_form=row["content_form"],
            extra=(_json(row["extra"]) or {}) if with_extra else {},
        ),
        row["erased"],
    )


class ProxyRepository:
    def __init__(self, tenant_id: str) -> None:
        self.tenant_id = tenant_id

    async def known(self, driver: Driver, session_id: str) -> KnownRow | None:
        """None when the session does not exist."""
        row = await driver.fetchrow(_KNOWN_SQL, session_id, self.tenant_id)
        if row is None:
            return None
        path = (tuple(row["path_branches"]), tuple(row["path_ends"]))
        if row["entry_count"] is None:
            return KnownRow(
                row["version"],
                Known(),
                0,
                row["behind"],
                row["created_at"],
                path,
                row["recall_tools"],
                row["tools_declared"],
            )
        return KnownRow(
            row["version"],
            Known(
                entry_count=row["entry_count"],
                chain=bytes(row["chain"]),
                raw_count=row["raw_count"],
                raw_digest=None if row["raw_digest"] is None else bytes(row["raw_digest"]),
                raw_entry_count=row["raw_entry_count"],
                raw_chain=bytes(row["raw_chain"]),
            ),
            row["last_seq"],
            row["behind"],
            row["created_at"],
            path,
            row["recall_tools"],
            row["tools_declared"],
        )

    async def messages_after(
        self, driver: Driver, session_id: str, seq: int, limit: int
    ) -> list[StoredMessage]:
        """The message entries after ``seq``, oldest first, at most ``limit``."""
        rows = await driver.fetch(_MESSAGES_SQL, session_id, self.tenant_id, seq, limit)
        return [_entry(r) for r in rows]

    async def message_at(self, driver: Driver, session_id: str, seq: int) -> StoredMessage | None:
        """The message entry ``seq``, with the keys its client sent (None if it is not one)."""
        row = await driver.fetchrow(_MESSAGE_SQL, session_id, self.tenant_id, seq)
        return None if row is None else _entry(row, with_extra=True)

    async def last_message_after(self, driver: Driver, session_id: str, seq: int) -> int | None:
        """The seq of the session's last message entry after ``seq``, if any."""
        value: int | None = await driver.fetchval(
            _LAST_MESSAGE_SQL, session_id, self.tenant_id, seq
        )
        return value

    async def note_tools(self, driver: Driver, session_id: str) -> None:
        """Record that a call on the session declared tools."""
        await driver.execute(_TOOLS_SQL, session_id, self.tenant_id, EMPTY_CHAIN)

    async def parent_of(self, driver: Driver, session_id: str) -> tuple[bool, str | None]:
        """Whether the session exists, and its parent's id."""
        row = await driver.fetchrow(_PARENT_SQL, session_id, self.tenant_id)
        return (False, None) if row is None else (True, row["parent_id"])

    async def save(self, driver: Driver, session_id: str, known: Known, last_seq: int) -> None:
        await driver.execute(
            _SAVE_SQL,
            session_id,
            self.tenant_id,
            known.entry_count,
            last_seq,
            known.chain,
            known.raw_count,
            known.raw_digest,
            known.raw_entry_count,
            known.raw_chain or EMPTY_CHAIN,
        )
