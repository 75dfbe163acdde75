"""HTTP routes for compactions and the archive of what they replaced."""

from __future__ import annotations

import asyncio
import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, status

from app.compactions.schemas import CompactionOut, CompactionPage, CompactionRequest, SourcePage
from app.compactions.service import CompactionService
from app.core.database import EngineDep
from app.core.openapi import link, problems
from app.core.tenancy import TenantDep
from app.history.schemas import FormatQuery
from app.sessions.router import SessionIdPath, checked_id

router = APIRouter(prefix="/v1/sessions/{session_id}/compactions", tags=["compactions"])

CompactionIdPath = Annotated[uuid.UUID, Path(description="The compaction id.")]


async def compaction_wake(request: Request) -> asyncio.Event | None:
    """Wakes this process's workers when a job is enqueued (others get NOTIFY)."""
    wake: asyncio.Event | None = getattr(request.app.state, "compaction_wake", None)
    return wake


WakeDep = Annotated[asyncio.Event | None, Depends(compaction_wake)]

_COMPACTION = "/v1/sessions/{session_id}/compactions/{compaction_id}"
# Where a requested compaction leads: OpenAPI links, for clients and stateful fuzzers.
COMPACTION_LINKS = {
    name: link(
        _COMPACTION + suffix,
        method,
        text,
        session_id="$response.body#/session_id",
        compaction_id="$response.body#/id",
    )
    for name, (method, suffix, text) in {
        "GetCompaction": ("get", "", "Follow the compaction."),
        "CancelCompaction": ("post", "/cancel", "Cancel the compaction."),
        "CompactionSource": ("get", "/source", "Read the entries it replaced."),
    }.items()
}


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    responses={202: {"links": COMPACTION_LINKS}, **problems(404, 409, 413, 422)},
)
async def request_compaction(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    wake: WakeDep,
    body: CompactionRequest | None = None,
) -> CompactionOut:
    """Compact the session's history now, in the background. A session with a
    queued or running compaction gets that one back. ``wait`` holds the answer
    until the compaction finishes (or the wait ends)."""
    service = CompactionService(engine, tenant, wake)
    return await service.request(checked_id(session_id), body or CompactionRequest())


@router.get("", responses=problems(404, 422))
async def list_compactions(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> CompactionPage:
    """The session's compactions, newest first."""
    return await CompactionService(engine, tenant).list(
        checked_id(session_id), limit=limit, cursor=cursor
    )


@router.get("/{compaction_id}", responses=problems(404, 422))
async def get_compaction(
    session_id: SessionIdPath, compaction_id: CompactionIdPath, engine: EngineDep, tenant: TenantDep
) -> CompactionOut:
    """One compaction: its status, and when done, its summary and figures."""
    return await CompactionService(engine, tenant).get(checked_id(session_id), compaction_id)


@router.post("/{compaction_id}/cancel", responses=problems(404, 409, 422))
async def cancel_compaction(
    session_id: SessionIdPath, compaction_id: CompactionIdPath, engine: EngineDep, tenant: TenantDep
) -> CompactionOut:
    """Cancel a queued compaction, or stop a running one before it commits."""
    return await CompactionService(engine, tenant).cancel(checked_id(session_id), compaction_id)


@router.get("/{compaction_id}/source", responses=problems(404, 409, 422))
async def compaction_source(
    session_id: SessionIdPath,
    compaction_id: CompactionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    format: FormatQuery = "openai",
    after_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> SourcePage:
    """The entries this compaction replaced, exactly as stored, a page at a time."""
    return await CompactionService(engine, tenant).source(
        checked_id(session_id), compaction_id, after_seq=after_seq, limit=limit, fmt=format
    )
