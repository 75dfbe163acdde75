"""The indexer: writes the searchable text that appends left to it.

An append writes the searchable text of its first entries itself, up to
``search_text.APPEND_CHARS`` characters, so that Postgres's indexing (words and
trigrams, in the append's statement) stays a bounded part of it. The entries after
those are stored with an empty text and ``search_pending`` set, as are the entries
stored before migration 0010. Until the indexer writes them, search does not find
them and says how many there are (``pending``).

The indexer runs beside the compaction workers, in every process that runs them.
It takes a batch of pending entries at a time (``FOR UPDATE SKIP LOCKED``: processes
share the work and none waits on another), computes each text as the append would
have (app.engine.search_text, from the stored parts, a tool result's after the line
naming its call), and writes it in the same
short transaction, bounded in characters like one append. An append that leaves
text pending wakes it (``NOTIFY`` on :data:`CHANNEL`, which the workers' listener
also listens on).
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core.database import driver_connection, unavailable_cause
from app.core.driver import Driver
from app.engine.search_text import (
    APPEND_CHARS,
    CALL_ARGUMENTS_CHARS,
    MAX_CHARS,
    call_line,
    search_text,
)

log = logging.getLogger("compactd.store.search_index")

# Its own channel: an append that leaves text to index notifies it.
CHANNEL = "compactd_search_index"

# Entries a batch takes: at most an append's worth of characters.
BATCH_ENTRIES = max(1, APPEND_CHARS // MAX_CHARS)

_NOTIFY_SQL = f"SELECT pg_notify('{CHANNEL}', '')"

# In the order of entry_search_pending_idx (partial: it holds only pending entries).
# A tool result comes with its call's arguments (their head), for the line that names
# the call in its text: the call row it answers (indexed by its id), then the call's
# entry at that seq: on the result's branch, else on the latest branch before it
# that holds a call with that id there (a branch's ancestors come before it).
_CLAIM_SQL = f"""
SELECT e.session_id, e.tenant_id, e.branch, e.seq, e.parts::text AS parts, e.tool_name,
    CASE WHEN e.role = 'tool' AND e.tool_call_id IS NOT NULL THEN (
        SELECT left(p->>'arguments', {CALL_ARGUMENTS_CHARS})
        FROM tool_call AS t
        JOIN entry AS c ON c.session_id = t.session_id AND c.tenant_id = t.tenant_id
            AND c.seq = t.call_seq AND c.branch <= e.branch,
        jsonb_array_elements(c.parts) AS p
        WHERE t.session_id = e.session_id AND t.tenant_id = e.tenant_id
            AND t.call_id = e.tool_call_id AND t.result_seq = e.seq
            AND t.result_branch = e.branch
            AND p->>'type' = 'tool_call' AND p->>'id' = t.call_id
        ORDER BY c.branch DESC
        LIMIT 1) END AS arguments
FROM entry AS e
WHERE e.search_pending
ORDER BY e.session_id, e.tenant_id, e.branch, e.seq
LIMIT $1
FOR UPDATE OF e SKIP LOCKED
"""

_WRITE_SQL = """
UPDATE entry AS e SET search_text = r.text, search_pending = false
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::text[])
    AS r(session_id, tenant_id, branch, seq, text)
WHERE e.session_id = r.session_id AND e.tenant_id = r.tenant_id
    AND e.branch = r.branch AND e.seq = r.seq
"""

# The pending entries of one family, for a search's answer.
PENDING_SQL = """
SELECT count(*) FROM entry WHERE session_id = $1 AND tenant_id = $2 AND search_pending
"""


async def wake(driver: Driver) -> None:
    """Wake the indexers (at the commit of the caller's transaction, if any)."""
    await driver.execute(_NOTIFY_SQL)


async def index_once(driver: Driver, limit: int = BATCH_ENTRIES) -> int:
    """Write the searchable text of up to ``limit`` pending entries that no one else
    is writing; the number written (0: none was left)."""
    async with driver.transaction():
        rows = await driver.fetch(_CLAIM_SQL, limit)
        if not rows:
            return 0
        texts = [
            search_text(orjson.loads(r["parts"]), _call(r["tool_name"], r["arguments"]))
            for r in rows
        ]
        await driver.execute(
            _WRITE_SQL,
            [r["session_id"] for r in rows],
            [r["tenant_id"] for r in rows],
            [r["branch"] for r in rows],
            [r["seq"] for r in rows],
            texts,
        )
    return len(rows)


def _call(tool_name: str | None, arguments: str | None) -> str:
    """The line naming a result's call (none for another entry, or a call not found)."""
    return call_line(tool_name, arguments) if tool_name or arguments is not None else ""


async def index_all(engine: AsyncEngine, stop: asyncio.Event | None = None) -> int:
    """Write every pending entry's text, batch after batch until none is left (or
    ``stop`` is set); the number written."""
    done = 0
    async with driver_connection(engine) as driver:
        while not (stop is not None and stop.is_set()) and (written := await index_once(driver)):
            done += written
    return done


class Indexer:
    """The indexing loop of a worker process: batches until none is pending, then
    waits for a wake-up (or ``poll_seconds``)."""

    channel = CHANNEL

    def __init__(self, engine: AsyncEngine, wake: asyncio.Event, poll_seconds: float) -> None:
        self.engine = engine
        self.wake = wake
        self.poll_seconds = poll_seconds

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.wake.clear()  # a wake-up from now on means more to do
            try:
                await index_all(self.engine, stop)
            except Exception as exc:  # the database went away, a bug: keep indexing later
                if unavailable_cause(exc) is not None:
                    log.warning("indexer: the database is unavailable")
                else:
                    log.exception("indexer: a batch failed")
                await _wait(stop, None, min(5.0, self.poll_seconds * 2))
                continue
            await _wait(stop, self.wake, self.poll_seconds)


async def _wait(stop: asyncio.Event, wake: asyncio.Event | None, seconds: float) -> None:
    events = [stop] if wake is None else [stop, wake]
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
