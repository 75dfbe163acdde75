"""HTTP routes for webhooks (see docs/events.md)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from app.core.database import EngineDep
from app.core.openapi import problems
from app.core.outbound import check_tenant_url
from app.core.settings import SettingsDep
from app.core.tenancy import TenantDep
from app.webhooks.schemas import (
    DeliveryOut,
    DeliveryPage,
    WebhookCreate,
    WebhookCreated,
    WebhookList,
    WebhookOut,
    WebhookPatch,
)
from app.webhooks.service import WebhookService

router = APIRouter(prefix="/v1/webhooks", tags=["webhooks"])


@router.post("", status_code=status.HTTP_201_CREATED, responses=problems(409, 422))
async def create_webhook(
    body: WebhookCreate, engine: EngineDep, tenant: TenantDep, settings: SettingsDep
) -> WebhookCreated:
    """Subscribe a URL to the tenant's events (or make it a blocking hook). The answer
    holds the signing secret, shown this once. A URL that reaches no public address
    is refused unless the operator allows it (COMPACTD_OUTBOUND_ALLOW; docs/security.md)."""
    check_tenant_url("url", body.url, settings)
    return await WebhookService(engine, tenant).create(body)


@router.get("", responses=problems())
async def list_webhooks(engine: EngineDep, tenant: TenantDep) -> WebhookList:
    """The tenant's webhooks, oldest first (at most 100 exist)."""
    return await WebhookService(engine, tenant).list()


@router.get("/{webhook_id}", responses=problems(404, 422))
async def read_webhook(webhook_id: uuid.UUID, engine: EngineDep, tenant: TenantDep) -> WebhookOut:
    return await WebhookService(engine, tenant).get(webhook_id)


@router.patch("/{webhook_id}", responses=problems(404, 422))
async def patch_webhook(
    webhook_id: uuid.UUID, body: WebhookPatch, engine: EngineDep, tenant: TenantDep
) -> WebhookOut:
    """Enable a webhook again (after it was disabled for failing), or disable it."""
    return await WebhookService(engine, tenant).set_enabled(webhook_id, body.enabled)


@router.delete(
    "/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=problems(404, 422)
)
async def delete_webhook(webhook_id: uuid.UUID, engine: EngineDep, tenant: TenantDep) -> Response:
    """Delete a webhook; its pending deliveries are skipped."""
    await WebhookService(engine, tenant).delete(webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{webhook_id}/test", status_code=status.HTTP_202_ACCEPTED, responses=problems(404, 409, 422)
)
async def test_webhook(webhook_id: uuid.UUID, engine: EngineDep, tenant: TenantDep) -> DeliveryOut:
    """Queue a signed `webhook.test` delivery to the webhook; its log shows how it went."""
    return await WebhookService(engine, tenant).test(webhook_id)


@router.get("/{webhook_id}/deliveries", responses=problems(404, 422))
async def list_deliveries(
    webhook_id: uuid.UUID,
    engine: EngineDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> DeliveryPage:
    """The webhook's delivery log, newest first: each delivery's event, status,
    attempts and the receiver's last answer."""
    return await WebhookService(engine, tenant).deliveries(webhook_id, limit=limit, cursor=cursor)
