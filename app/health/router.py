"""Liveness and readiness probes."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncEngine

from app.core import metrics
from app.core.database import driver_connection
from app.core.errors import ServiceUnavailable
from app.core.openapi import problems

router = APIRouter(tags=["ops"])

READY_TIMEOUT_SECONDS = 2.0  # docs/operations.md's promise
# Given up a little before it, so that the answer reaches a probe that waits 2 s; the
# query's own bound comes earlier still (see _current_revision).
_GIVE_UP_SECONDS = READY_TIMEOUT_SECONDS * 0.9
_QUERY_SECONDS = READY_TIMEOUT_SECONDS * 0.75


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
    """The database answers and its schema is at the head migration, within 2 s."""
    from app.core.migrations import head_revision

    # A probe has a short timeout of its own: answer before it, even when every pooled
    # connection is busy or the database answers nothing at all. Giving up waits for
    # nothing either: the probe's cleanup (dropping a connection) ends in the background.
    probe = asyncio.ensure_future(_current_revision(request.app.state.engine))
    done, _ = await asyncio.wait({probe}, timeout=_GIVE_UP_SECONDS)
    if not done:
        probe.cancel()
        _PROBES.add(probe)
        probe.add_done_callback(_forget)
        raise ServiceUnavailable(
            f"the database did not answer within {_GIVE_UP_SECONDS:g} s",
            headers={"Retry-After": "2"},
        )
    error = probe.exception()
    if error is not None:
        cause = error.__cause__ if isinstance(error, ServiceUnavailable) else error
        raise ServiceUnavailable(
            f"the database is not ready: {type(cause or error).__name__}",
            headers={"Retry-After": "2"},
        )
    current = probe.result()
    head = head_revision()
    if current != head:
        raise ServiceUnavailable(
            f"migrations are behind: at {current}, head is {head}", headers={"Retry-After": "5"}
        )
    return Readiness(status="ready", database="ok", migration=head)


async def _current_revision(engine: AsyncEngine) -> str | None:
    # The query's own bound comes first, so that a connection that took it is dropped
    # by the driver path (see driver_connection) rather than by the cancellation.
    async with driver_connection(engine) as driver:
        current: str | None = await driver.fetchval(
            "SELECT version_num FROM alembic_version", timeout=_QUERY_SECONDS
        )
    return current


_PROBES: set[asyncio.Future[str | None]] = set()  # given up on, still cleaning up


def _forget(probe: asyncio.Future[str | None]) -> None:
    _PROBES.discard(probe)
    if not probe.cancelled():
        probe.exception()  # retrieved: it was answered already


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
