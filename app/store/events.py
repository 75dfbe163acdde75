"""The event log: what happened to each session, durable, in order, resumable.

:func:`emit` writes an event in the caller's transaction, with the change it
reports (an event is there exactly when its change is), and in the same statement a
pending delivery for every webhook of the tenant that wants it (app.webhooks), then
notifies :data:`CHANNEL` (at the commit) so that streams and the dispatcher wake.

Order. An event's place is ``(txid, id)``: the writing transaction's id, then a
sequence. Readers read only what transactions older than every transaction still
running wrote (``txid`` below the snapshot's ``xmin``): all of those have ended, so
nothing can later commit before a place already read, and a reader that resumes
after an event (``Last-Event-ID``) gets everything after it exactly once. An event
is readable as soon as every transaction that began before its own has ended
(usually at once; at most a statement timeout later).

An event's public id is ``"<txid>-<id>"``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from app.core.driver import Driver
from app.engine.accounting import budget

# Written with every event (the payload: its tenant and session, tab-separated),
# listened to by the streams' hub and the webhook dispatcher.
CHANNEL = "compactd_events"

# The tenant's own events (a webhook disabled, say): no session.
TENANT = ""

# Types a webhook may subscribe to (or ``<family>.*``, or none: all).
TYPES = (
    "session.verdict",
    "session.pruned",
    "session.navigated",
    "compaction.queued",
    "compaction.started",
    "compaction.retrying",
    "compaction.succeeded",
    "compaction.failed",
    "compaction.cancelled",
    "hook.called",
    "webhook.disabled",
    "webhook.test",
)

_EMIT_SQL = """
WITH e AS (
    INSERT INTO event (session_id, tenant_id, type, data) VALUES ($1, $2, $3, $4::jsonb)
    RETURNING session_id, tenant_id, txid, id, type, data, created_at
), d AS (
    INSERT INTO webhook_delivery (session_id, tenant_id, id, webhook_id, event_id, type,
        payload, status, next_attempt_at)
    SELECT e.session_id, e.tenant_id, gen_random_uuid(), w.id, e.txid || '-' || e.id, e.type,
        jsonb_build_object('id', e.txid || '-' || e.id, 'type', e.type,
            'session_id', nullif(e.session_id, ''),
            'created_at', to_char(e.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
            'data', e.data),
        'pending', now()
    FROM e JOIN webhook AS w ON w.tenant_id = e.tenant_id AND w.enabled AND NOT w.hook
        AND (w.session_id IS NULL OR w.session_id = e.session_id)
        AND (cardinality(w.types) = 0 OR e.type = ANY(w.types)
            OR split_part(e.type, '.', 1) || '.*' = ANY(w.types))
    RETURNING 1
)
SELECT e.txid, e.id, (SELECT count(*) FROM d) AS deliveries,
    pg_notify('compactd_events', e.tenant_id || E'\t' || e.session_id) AS notified
FROM e
"""

# What every transaction still running began after: everything below it is final.
_HORIZON = "(pg_snapshot_xmin(pg_current_snapshot())::text)::bigint"

_SESSION_SQL = f"""
SELECT txid, id, session_id, type, data::text AS data, created_at FROM event
WHERE session_id = $1 AND tenant_id = $2 AND (txid, id) > ($3, $4) AND txid < {_HORIZON}
ORDER BY txid, id
LIMIT $5
"""

_TENANT_SQL = f"""
SELECT txid, id, session_id, type, data::text AS data, created_at FROM event
WHERE tenant_id = $1 AND (txid, id) > ($2, $3) AND txid < {_HORIZON}
    AND ($4::text[] IS NULL OR type = ANY($4::text[]))
ORDER BY txid, id
LIMIT $5
"""

# The place of the newest event readable now: a stream that starts "now" starts there.
_LATEST_SESSION_SQL = f"""
SELECT txid, id FROM event WHERE session_id = $1 AND tenant_id = $2 AND txid < {_HORIZON}
ORDER BY txid DESC, id DESC LIMIT 1
"""
_LATEST_TENANT_SQL = f"""
SELECT txid, id FROM event WHERE tenant_id = $1 AND txid < {_HORIZON}
ORDER BY txid DESC, id DESC LIMIT 1
"""

_EXPIRE_SQL = """
WITH old AS (
    SELECT session_id, tenant_id, txid, id FROM event
    WHERE created_at < now() - make_interval(secs => $1)
    LIMIT $2
)
DELETE FROM event AS e USING old
WHERE e.session_id = old.session_id AND e.tenant_id = old.tenant_id
    AND e.txid = old.txid AND e.id = old.id
"""

_ID = re.compile(r"^([0-9]{1,19})-([0-9]{1,19})$")


@dataclass(frozen=True, slots=True, order=True)
class Place:
    """Where an event is in the log (see the module's docstring)."""

    txid: int
    id: int

    def __str__(self) -> str:
        return f"{self.txid}-{self.id}"


START = Place(0, 0)


def parse_place(text: str) -> Place | None:
    """The place an event id names; None when it names none."""
    found = _ID.match(text.strip())
    if found is None:
        return None
    txid, seq = int(found.group(1)), int(found.group(2))
    if txid >= 2**63 or seq >= 2**63:
        return None
    return Place(txid, seq)


@dataclass(frozen=True, slots=True)
class Event:
    place: Place
    session_id: str
    type: str
    data: str  # JSON
    created_at: datetime

    def document(self) -> bytes:
        """The event as JSON: its id, type, session, time and data (as a delivery's)."""
        return orjson.dumps(
            {
                "id": str(self.place),
                "type": self.type,
                "session_id": self.session_id or None,
                "created_at": timestamp(self.created_at),
                "data": orjson.Fragment(self.data),
            }
        )


def timestamp(at: datetime) -> str:
    """An event's time as its JSON says it everywhere: UTC, microseconds, ``Z``
    (what _EMIT_SQL's ``to_char`` writes for a delivery)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def emit(
    driver: Driver, tenant_id: str, session_id: str, type_: str, data: dict[str, Any]
) -> Place:
    """Write an event (and its webhook deliveries) in the caller's transaction."""
    row = await driver.fetchrow(
        _EMIT_SQL, session_id, tenant_id, type_, orjson.dumps(data, default=str).decode()
    )
    assert row is not None
    return Place(row["txid"], row["id"])


def _events(rows: list[Any]) -> list[Event]:
    return [
        Event(Place(r["txid"], r["id"]), r["session_id"], r["type"], r["data"], r["created_at"])
        for r in rows
    ]


async def session_after(
    driver: Driver, tenant_id: str, session_id: str, after: Place, limit: int
) -> list[Event]:
    rows = await driver.fetch(_SESSION_SQL, session_id, tenant_id, after.txid, after.id, limit)
    return _events(rows)


async def tenant_after(
    driver: Driver, tenant_id: str, after: Place, limit: int, types: list[str] | None = None
) -> list[Event]:
    rows = await driver.fetch(_TENANT_SQL, tenant_id, after.txid, after.id, types, limit)
    return _events(rows)


async def latest(driver: Driver, tenant_id: str, session_id: str | None) -> Place:
    """The place of the newest readable event (the session's, or the tenant's)."""
    if session_id is None:
        row = await driver.fetchrow(_LATEST_TENANT_SQL, tenant_id)
    else:
        row = await driver.fetchrow(_LATEST_SESSION_SQL, session_id, tenant_id)
    return START if row is None else Place(row["txid"], row["id"])


async def expire(driver: Driver, older_than_seconds: float, batch: int = 1000) -> int:
    """Delete up to ``batch`` events older than ``older_than_seconds``; how many."""
    status = await driver.execute(_EXPIRE_SQL, older_than_seconds, batch)
    return int(status.rsplit(" ", 1)[-1])


async def verdict_changed(
    driver: Driver,
    tenant_id: str,
    session_id: str,
    before: budget.Verdict,
    after: budget.Verdict,
    cause: str,
) -> None:
    """A ``session.verdict`` event when the verdict's action changed (``cause``: the
    write that changed it)."""
    if before.action == after.action:
        return
    await emit(
        driver,
        tenant_id,
        session_id,
        "session.verdict",
        {
            "from": before.action,
            "to": after.action,
            "cause": cause,
            "estimated_tokens": after.estimated_tokens,
            "usable_tokens": after.usable_tokens,
            "threshold_tokens": after.threshold_tokens,
            "fraction": round(after.fraction, 4),
        },
    )
