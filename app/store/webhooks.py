"""Webhooks' SQL: subscriptions, the deliveries the dispatcher claims and records
(app.webhooks.dispatcher), and the hooks a compaction or a navigation calls."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from app.core.driver import Driver, Record, record_of
from app.store import events


@dataclass(slots=True)
class WebhookRow:
    tenant_id: str
    id: uuid.UUID
    url: str
    secret: str
    types: list[str]
    session_id: str | None
    hook: bool
    timeout_seconds: float
    description: str | None
    enabled: bool
    failures: int
    disabled_reason: str | None
    created_at: datetime


@dataclass(slots=True)
class DeliveryRow:
    session_id: str
    tenant_id: str
    id: uuid.UUID
    webhook_id: uuid.UUID
    event_id: str
    type: str
    payload: Any
    status: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None
    last_error: str | None
    last_attempt_at: datetime | None
    created_at: datetime


_WEBHOOK_COLUMNS = ", ".join(f"w.{name}" for name in WebhookRow.__dataclass_fields__)
_DELIVERY_COLUMNS = ", ".join(f"d.{name}" for name in DeliveryRow.__dataclass_fields__)

_CREATE_SQL = f"""
INSERT INTO webhook AS w (tenant_id, id, url, secret, types, session_id, hook, timeout_seconds,
    description)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
RETURNING {_WEBHOOK_COLUMNS}
"""
_LIST_SQL = f"""
SELECT {_WEBHOOK_COLUMNS} FROM webhook AS w WHERE w.tenant_id = $1
ORDER BY w.created_at, w.id LIMIT $2
"""
_COUNT_SQL = "SELECT count(*) FROM webhook WHERE tenant_id = $1"
_GET_SQL = f"SELECT {_WEBHOOK_COLUMNS} FROM webhook AS w WHERE w.tenant_id = $1 AND w.id = $2"
_DELETE_SQL = "DELETE FROM webhook WHERE tenant_id = $1 AND id = $2"
_ENABLE_SQL = f"""
UPDATE webhook AS w SET enabled = $3, failures = 0,
    disabled_reason = CASE WHEN $3 THEN NULL ELSE 'disabled through the API' END
WHERE w.tenant_id = $1 AND w.id = $2
RETURNING {_WEBHOOK_COLUMNS}
"""

# The hooks a session's compaction or navigation calls, oldest first.
_HOOKS_SQL = f"""
SELECT {_WEBHOOK_COLUMNS} FROM webhook AS w
WHERE w.tenant_id = $1 AND w.hook AND w.enabled
    AND (w.session_id IS NULL OR w.session_id = $2)
    AND (cardinality(w.types) = 0 OR $3 = ANY(w.types))
ORDER BY w.created_at, w.id
"""

# Due deliveries, leased for ``$2`` seconds (next_attempt_at moves past the lease:
# a dispatcher that dies leaves them to be claimed again then).
_CLAIM_SQL = f"""
UPDATE webhook_delivery AS d SET next_attempt_at = now() + make_interval(secs => $2),
    attempts = d.attempts + 1
FROM (
    SELECT session_id, tenant_id, id FROM webhook_delivery
    WHERE status = 'pending' AND next_attempt_at <= now() AND NOT (tenant_id = ANY($3::text[]))
    ORDER BY next_attempt_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
) AS due
WHERE d.session_id = due.session_id AND d.tenant_id = due.tenant_id AND d.id = due.id
RETURNING {_DELIVERY_COLUMNS}
"""

_TARGET_SQL = """
SELECT url, secret, enabled FROM webhook WHERE tenant_id = $1 AND id = $2
"""

_DELIVERED_SQL = """
UPDATE webhook_delivery SET status = $4, last_status = $5, last_error = $6,
    last_attempt_at = now(), next_attempt_at = now() + make_interval(secs => $7)
WHERE session_id = $1 AND tenant_id = $2 AND id = $3
"""
# A delivery claimed for a webhook that is gone or disabled: not sent, so not an
# attempt (the claim counted one); its last attempt's status stays on record.
_SKIPPED_SQL = """
UPDATE webhook_delivery SET status = 'skipped', last_error = $4,
    attempts = greatest(attempts - 1, 0), next_attempt_at = now()
WHERE session_id = $1 AND tenant_id = $2 AND id = $3
"""
# Claimed beyond what the tenant may send at once: back to pending, due in ``$4``
# seconds, the claim's attempt not counted.
_POSTPONED_SQL = """
UPDATE webhook_delivery AS d SET attempts = greatest(d.attempts - 1, 0),
    next_attempt_at = now() + make_interval(secs => $4)
FROM unnest($1::text[], $2::text[], $3::uuid[]) AS r(session_id, tenant_id, id)
WHERE d.session_id = r.session_id AND d.tenant_id = r.tenant_id AND d.id = r.id
"""
# A pass's successes, at once.
_SUCCEEDED_ALL_SQL = """
UPDATE webhook_delivery AS d SET status = 'succeeded', last_status = r.status,
    last_error = NULL, last_attempt_at = now(), next_attempt_at = now()
FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int[]) AS r(session_id, tenant_id, id, status)
WHERE d.session_id = r.session_id AND d.tenant_id = r.tenant_id AND d.id = r.id
"""
_RESET_ALL_SQL = """
UPDATE webhook AS w SET failures = 0
FROM unnest($1::text[], $2::uuid[]) AS r(tenant_id, id)
WHERE w.tenant_id = r.tenant_id AND w.id = r.id AND w.failures > 0
"""
# One more failed attempt; disabled at ``$3`` in a row (once: returns the row then).
_FAILURE_SQL = """
UPDATE webhook SET failures = failures + 1,
    enabled = CASE WHEN failures + 1 >= $3 THEN false ELSE enabled END,
    disabled_reason = CASE WHEN failures + 1 >= $3 AND enabled
        THEN $4 ELSE disabled_reason END
WHERE tenant_id = $1 AND id = $2
RETURNING enabled, failures
"""

_LOG_SQL = f"""
SELECT {_DELIVERY_COLUMNS} FROM webhook_delivery AS d
WHERE d.tenant_id = $1 AND d.webhook_id = $2
    AND ($3::timestamptz IS NULL OR (d.created_at, d.id) < ($3, $4))
ORDER BY d.created_at DESC, d.id DESC
LIMIT $5
"""

_TEST_DELIVERY_SQL = f"""
INSERT INTO webhook_delivery AS d (session_id, tenant_id, id, webhook_id, event_id, type,
    payload, status, next_attempt_at)
VALUES ('', $1, $2, $3, $4, 'webhook.test', $5::jsonb, 'pending', now())
RETURNING {_DELIVERY_COLUMNS}
"""

_EXPIRE_SQL = """
WITH old AS (
    SELECT session_id, tenant_id, id FROM webhook_delivery
    WHERE created_at < now() - make_interval(secs => $1) AND status <> 'pending'
    LIMIT $2
)
DELETE FROM webhook_delivery AS d USING old
WHERE d.session_id = old.session_id AND d.tenant_id = old.tenant_id AND d.id = old.id
"""


def _webhook(row: Record) -> WebhookRow:
    return record_of(WebhookRow, row)


def _delivery(row: Record) -> DeliveryRow:
    delivery = record_of(DeliveryRow, row)
    if isinstance(delivery.payload, str):
        delivery.payload = orjson.loads(delivery.payload)
    return delivery


async def create(driver: Driver, row: WebhookRow) -> WebhookRow:
    made = await driver.fetchrow(
        _CREATE_SQL,
        row.tenant_id,
        row.id,
        row.url,
        row.secret,
        row.types,
        row.session_id,
        row.hook,
        row.timeout_seconds,
        row.description,
    )
    assert made is not None
    return _webhook(made)


async def count(driver: Driver, tenant_id: str) -> int:
    value: int = await driver.fetchval(_COUNT_SQL, tenant_id)
    return value


async def listed(driver: Driver, tenant_id: str, limit: int) -> list[WebhookRow]:
    return [_webhook(r) for r in await driver.fetch(_LIST_SQL, tenant_id, limit)]


async def get(driver: Driver, tenant_id: str, webhook_id: uuid.UUID) -> WebhookRow | None:
    row = await driver.fetchrow(_GET_SQL, tenant_id, webhook_id)
    return None if row is None else _webhook(row)


async def delete(driver: Driver, tenant_id: str, webhook_id: uuid.UUID) -> bool:
    # Its pending deliveries are skipped by the dispatcher when they come due (updating
    # them here would take their locks in the other order than the dispatcher does).
    status = await driver.execute(_DELETE_SQL, tenant_id, webhook_id)
    return not status.endswith(" 0")


async def set_enabled(
    driver: Driver, tenant_id: str, webhook_id: uuid.UUID, enabled: bool
) -> WebhookRow | None:
    row = await driver.fetchrow(_ENABLE_SQL, tenant_id, webhook_id, enabled)
    return None if row is None else _webhook(row)


async def hooks(driver: Driver, tenant_id: str, session_id: str, point: str) -> list[WebhookRow]:
    return [_webhook(r) for r in await driver.fetch(_HOOKS_SQL, tenant_id, session_id, point)]


@dataclass(frozen=True, slots=True)
class Claimed:
    delivery: DeliveryRow
    url: str | None  # None: the webhook is gone
    secret: str
    enabled: bool


async def claim(
    driver: Driver, limit: int, lease_seconds: float, busy_tenants: list[str] | None = None
) -> list[Claimed]:
    """Up to ``limit`` due deliveries, leased; none of ``busy_tenants`` (they have as
    many in flight as they may)."""
    rows = await driver.fetch(_CLAIM_SQL, limit, lease_seconds, busy_tenants or [])
    out = []
    for row in rows:
        delivery = _delivery(row)
        target = await driver.fetchrow(_TARGET_SQL, delivery.tenant_id, delivery.webhook_id)
        if target is None:
            out.append(Claimed(delivery, None, "", False))
        else:
            out.append(Claimed(delivery, target["url"], target["secret"], target["enabled"]))
    return out


async def delivered(
    driver: Driver,
    delivery: DeliveryRow,
    *,
    status: str,
    http_status: int | None,
    error: str | None,
    retry_in_seconds: float = 0.0,
) -> None:
    await driver.execute(
        _DELIVERED_SQL,
        delivery.session_id,
        delivery.tenant_id,
        delivery.id,
        status,
        http_status,
        error,
        retry_in_seconds,
    )


async def skipped(driver: Driver, delivery: DeliveryRow, why: str) -> None:
    """A claimed delivery not sent (its webhook is gone or disabled): skipped, and
    the claim's attempt not counted."""
    await driver.execute(_SKIPPED_SQL, delivery.session_id, delivery.tenant_id, delivery.id, why)


async def postponed(driver: Driver, deliveries: list[DeliveryRow], seconds: float) -> None:
    """Put claimed deliveries back, due in ``seconds``, their claim not counted as an
    attempt: their tenant has as many in flight as it may."""
    await driver.execute(
        _POSTPONED_SQL,
        [d.session_id for d in deliveries],
        [d.tenant_id for d in deliveries],
        [d.id for d in deliveries],
        seconds,
    )


async def all_succeeded(driver: Driver, done: list[tuple[DeliveryRow, int]]) -> None:
    """Record deliveries answered 2xx (with their statuses), and reset their webhooks'
    failure counts: two statements for a whole pass."""
    await driver.execute(
        _SUCCEEDED_ALL_SQL,
        [d.session_id for d, _ in done],
        [d.tenant_id for d, _ in done],
        [d.id for d, _ in done],
        [status for _, status in done],
    )
    hooks = sorted({(d.tenant_id, d.webhook_id) for d, _ in done})
    await driver.execute(_RESET_ALL_SQL, [t for t, _ in hooks], [w for _, w in hooks])


async def failed(driver: Driver, tenant_id: str, webhook_id: uuid.UUID, disable_after: int) -> bool:
    """Count a failed attempt; True when it disabled the webhook (a ``webhook.disabled``
    event says so; its pending deliveries are skipped as they come due)."""
    reason = f"{disable_after} failed attempts in a row"
    row = await driver.fetchrow(_FAILURE_SQL, tenant_id, webhook_id, disable_after, reason)
    if row is None or row["enabled"] or row["failures"] != disable_after:
        return False
    await events.emit(
        driver,
        tenant_id,
        events.TENANT,
        "webhook.disabled",
        {"webhook_id": str(webhook_id), "reason": reason},
    )
    return True


async def log(
    driver: Driver,
    tenant_id: str,
    webhook_id: uuid.UUID,
    limit: int,
    before: tuple[datetime, uuid.UUID] | None,
) -> list[DeliveryRow]:
    created, delivery_id = before if before is not None else (None, None)
    rows = await driver.fetch(_LOG_SQL, tenant_id, webhook_id, created, delivery_id, limit)
    return [_delivery(r) for r in rows]


async def test_delivery(
    driver: Driver, tenant_id: str, webhook_id: uuid.UUID, payload: dict[str, Any]
) -> DeliveryRow:
    row = await driver.fetchrow(
        _TEST_DELIVERY_SQL,
        tenant_id,
        uuid.uuid4(),
        webhook_id,
        payload["id"],
        orjson.dumps(payload).decode(),
    )
    assert row is not None
    await driver.execute(f"SELECT pg_notify('{events.CHANNEL}', $1)", tenant_id)
    return _delivery(row)


async def expire(driver: Driver, older_than_seconds: float, batch: int = 1000) -> int:
    status = await driver.execute(_EXPIRE_SQL, older_than_seconds, batch)
    return int(status.rsplit(" ", 1)[-1])
