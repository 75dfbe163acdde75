"""HTTP routes for the context and the overflow verdict."""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Response
from starlette.types import Scope

from app.budget.schemas import Verdict
from app.budget.service import verdict_model
from app.context.schemas import ContextOut
from app.context.service import ContextService
from app.core.database import EngineDep
from app.core.direct import FastRoute, only_query, route_of, tenant_of, without_header
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


async def fast_context(scope: Scope, path: dict[str, Any], _body: bytes) -> Response:
    """:func:`get_context` for its plain form (app.core.direct): no query string, or
    ``format`` alone with a valid value; no Idempotency-Key (the app's body checks read
    it on every route)."""
    fmt = cast("Format | None", only_query(scope, "format", FORMATS))
    tenant = tenant_of(scope)
    without_header(scope, b"idempotency-key")
    engine = scope["app"].state.engine
    body = await ContextService(engine, tenant).build(
        checked_id(path["session_id"]), fmt or "openai"
    )
    return Response(body, media_type="application/json")


def fast_routes() -> list[FastRoute]:
    """The context read's plain form."""
    return [FastRoute(route_of(router.routes, get_context), fast_context)]


@router.get("/overflow", responses=problems(404))
async def get_overflow(session_id: SessionIdPath, engine: EngineDep, tenant: TenantDep) -> Verdict:
    """How full the window is and what to do about it, from running totals."""
    session = await SessionService(engine, tenant).require(checked_id(session_id))
    return verdict_model(session)
