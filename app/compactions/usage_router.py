"""``GET /v1/usage``: what compaction cost and saved the API key's tenant.

A route of its own rather than one under ``/v1/sessions``: the figures belong to
the tenant (every session, deleted ones included, and the hourly spend limit),
and the tenant is the API key's, as on every other route."""

from __future__ import annotations

from fastapi import APIRouter

from app.compactions.schemas import TenantUsage
from app.compactions.service import tenant_usage
from app.core.database import EngineDep
from app.core.openapi import problems
from app.core.settings import SettingsDep
from app.core.tenancy import TenantDep

router = APIRouter(prefix="/v1/usage", tags=["usage"])


@router.get("", responses=problems())
async def get_usage(engine: EngineDep, tenant: TenantDep, settings: SettingsDep) -> TenantUsage:
    """The tenant's summarizer requests and tokens, its compactions and the context
    tokens they saved, since the start and in the current hour (UTC), and the hourly
    spend limit: sums kept as each compaction commits."""
    return await tenant_usage(engine, tenant, settings.summarizer_tokens_per_tenant_hour)
