"""Webhooks of one tenant: create, list, read, delete, pause or enable, test, and
the delivery log."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core import cursors
from app.core.database import driver_connection
from app.core.errors import Conflict, NotFound, invalid
from app.store import events, webhooks
from app.upstream import signing
from app.webhooks.schemas import (
    DeliveryOut,
    DeliveryPage,
    WebhookCreate,
    WebhookCreated,
    WebhookList,
    WebhookOut,
)

MAX_WEBHOOKS = 100


def _out(row: webhooks.WebhookRow) -> WebhookOut:
    return WebhookOut(
        id=row.id,
        url=row.url,
        types=row.types,
        session_id=row.session_id,
        hook=row.hook,
        timeout_seconds=row.timeout_seconds,
        description=row.description,
        enabled=row.enabled,
        failures=row.failures,
        disabled_reason=row.disabled_reason,
        created_at=row.created_at,
    )


def _delivery(row: webhooks.DeliveryRow) -> DeliveryOut:
    return DeliveryOut(
        id=row.id,
        event_id=row.event_id,
        type=row.type,
        session_id=row.session_id or None,
        status=row.status,
        attempts=row.attempts,
        last_status=row.last_status,
        last_error=row.last_error,
        last_attempt_at=row.last_attempt_at,
        next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
        created_at=row.created_at,
        payload=row.payload,
    )


class WebhookService:
    def __init__(self, engine: AsyncEngine, tenant_id: str) -> None:
        self.engine = engine
        self.tenant_id = tenant_id

    async def create(self, body: WebhookCreate) -> WebhookCreated:
        try:
            types = body.checked_types()
        except ValueError as exc:
            raise invalid("types", str(exc)) from None
        async with driver_connection(self.engine) as driver, driver.transaction():
            # One at a time per tenant: the count below holds when the insert is made.
            await driver.execute(
                "SELECT pg_advisory_xact_lock(hashtext('webhook:' || $1))", self.tenant_id
            )
            if await webhooks.count(driver, self.tenant_id) >= MAX_WEBHOOKS:
                raise Conflict(
                    f"this tenant has {MAX_WEBHOOKS} webhooks, the most it may have; delete one"
                )
            secret = signing.new_secret()
            row = await webhooks.create(
                driver,
                webhooks.WebhookRow(
                    tenant_id=self.tenant_id,
                    id=uuid.uuid4(),
                    url=body.url,
                    secret=secret,
                    types=types,
                    session_id=body.session_id,
                    hook=body.hook,
                    timeout_seconds=body.timeout_seconds,
                    description=body.description,
                    enabled=True,
                    failures=0,
                    disabled_reason=None,
                    created_at=datetime.now(UTC),
                ),
            )
        return WebhookCreated(**_out(row).model_dump(), secret=secret)

    async def list(self) -> WebhookList:
        async with driver_connection(self.engine) as driver:
            rows = await webhooks.listed(driver, self.tenant_id, MAX_WEBHOOKS)
        return WebhookList(webhooks=[_out(r) for r in rows])

    async def get(self, webhook_id: uuid.UUID) -> WebhookOut:
        async with driver_connection(self.engine) as driver:
            row = await webhooks.get(driver, self.tenant_id, webhook_id)
        if row is None:
            raise NotFound(f"webhook {webhook_id} does not exist")
        return _out(row)

    async def delete(self, webhook_id: uuid.UUID) -> None:
        async with driver_connection(self.engine) as driver, driver.transaction():
            if not await webhooks.delete(driver, self.tenant_id, webhook_id):
                raise NotFound(f"webhook {webhook_id} does not exist")

    async def set_enabled(self, webhook_id: uuid.UUID, enabled: bool) -> WebhookOut:
        async with driver_connection(self.engine) as driver:
            row = await webhooks.set_enabled(driver, self.tenant_id, webhook_id, enabled)
        if row is None:
            raise NotFound(f"webhook {webhook_id} does not exist")
        return _out(row)

    async def test(self, webhook_id: uuid.UUID) -> DeliveryOut:
        """Queue a ``webhook.test`` delivery (sent by the dispatcher like any other)."""
        async with driver_connection(self.engine) as driver, driver.transaction():
            row = await webhooks.get(driver, self.tenant_id, webhook_id)
            if row is None:
                raise NotFound(f"webhook {webhook_id} does not exist")
            if not row.enabled:
                raise Conflict(f"webhook {webhook_id} is disabled: enable it first (PATCH)")
            now = datetime.now(UTC)
            payload = {
                "id": f"test-{uuid.uuid4()}",
                "type": "webhook.test",
                "session_id": None,
                "created_at": events.timestamp(now),
                "data": {"webhook_id": str(webhook_id), "hook": row.hook},
            }
            delivery = await webhooks.test_delivery(driver, self.tenant_id, webhook_id, payload)
        return _delivery(delivery)

    async def deliveries(
        self, webhook_id: uuid.UUID, *, limit: int, cursor: str | None
    ) -> DeliveryPage:
        before = cursors.decode(cursor) if cursor else None
        async with driver_connection(self.engine) as driver:
            if await webhooks.get(driver, self.tenant_id, webhook_id) is None:
                raise NotFound(f"webhook {webhook_id} does not exist")
            rows = await webhooks.log(driver, self.tenant_id, webhook_id, limit + 1, before)
        page = rows[:limit]
        return DeliveryPage(
            deliveries=[_delivery(r) for r in page],
            next_cursor=cursors.encode(page[-1].created_at, page[-1].id)
            if len(rows) > limit and page
            else None,
        )


__all__ = ["ValidationError", "WebhookService"]
