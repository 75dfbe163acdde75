"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy import text

from app.core import metrics
from app.core.errors import ServiceUnavailable
from app.core.openapi import problems

router = APIRouter(tags=["ops"])

READY_TIMEOUT_SECONDS = 2.0


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str
    database: str
    migration: str


@router.get("/healthz")
async def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", responses=problems())
async def readyz(request: Request) -> Readiness:
    """The database answers and its schema is at the head migration."""
    from app.core.migrations import head_revision

    try:
        # A probe has a short timeout of its own: answer before it, even when every
        # pooled connection is busy.
        async with asyncio.timeout(READY_TIMEOUT_SECONDS):
            async with request.app.state.engine.connect() as conn:
                query = text("SELECT version_num FROM alembic_version")
                current = (await conn.execute(query)).scalar()
    except Exception as exc:
        raise ServiceUnavailable(
            f"the database is not ready: {type(exc).__name__}", headers={"Retry-After": "2"}
        ) from None
    head = head_revision()
    if current != head:
        raise ServiceUnavailable(
            f"migrations are behind: at {current}, head is {head}", headers={"Retry-After": "5"}
        )
    return Readiness(status="ready", database="ok", migration=head)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}}}
    },
)
async def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format: requests by route and status with latency histograms,
    compaction jobs by status and reason with their duration and tokens saved,
    upstream LLM calls by outcome, pruning savings, and the database pool."""
    body = b"".join(generate_latest(r) for r in metrics.registries(request.app.state))
    return Response(body, media_type=CONTENT_TYPE_LATEST)
