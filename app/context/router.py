"""HTTP routes for the context and the overflow verdict."""

from __future__ import annotations

import re
from typing import cast

from fastapi import APIRouter, Response
from fastapi.routing import APIRoute
from starlette.types import Scope

from app.budget.schemas import Verdict
from app.budget.service import verdict_model
from app.context.schemas import ContextOut
from app.context.service import ContextService
from app.core.database import DbDep, EngineDep
from app.core.direct import DirectRoute, only_query, tenant_of, without_header
from app.core.openapi import problems
from app.core.tenancy import TenantDep
from app.history.schemas import FORMATS, Format, FormatQuery
from app.sessions.router import SessionIdPath, checked_id
from app.sessions.service import SessionService

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["context"])


@router.get("/context", response_model=ContextOut, responses=problems(404, 422))
async def get_context(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    format: FormatQuery = "openai",
) -> Response:
    """The messages to send to the model now, with their token figures."""
    body = await ContextService(engine, tenant).build(checked_id(session_id), format)
    return Response(body, media_type="application/json")


async def direct_context(scope: Scope, found: re.Match[str], _body: bytes) -> Response:
    """:func:`get_context` for its plain form (see app.core.direct): no query string, or
    ``format`` alone with a valid value; no Idempotency-Key (the app's body checks read
    it on every route)."""
    fmt = cast("Format | None", only_query(scope, "format", FORMATS))
    tenant = tenant_of(scope)
    without_header(scope, b"idempotency-key")
    engine = scope["app"].state.engine
    body = await ContextService(engine, tenant).build(
        checked_id(found["session_id"]), fmt or "openai"
    )
    return Response(body, media_type="application/json")


def direct_routes() -> list[DirectRoute]:
    """The context read, matched as FastAPI matches its route."""
    route = next(r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is get_context)
    return [DirectRoute("GET", route.path_regex, route, direct_context)]


@router.get("/overflow", responses=problems(404))
async def get_overflow(session_id: SessionIdPath, db: DbDep, tenant: TenantDep) -> Verdict:
    """How full the window is and what to do about it, from running totals."""
    session = await SessionService(db, tenant).require(checked_id(session_id))
    return verdict_model(session)
