"""HTTP routes for the stored history."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response, status
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.types import Scope

from app.core.database import EngineDep
from app.core.direct import FastRoute, NotPlain, one_header, only_query, route_of, tenant_of
from app.core.errors import ProblemError
from app.core.openapi import problems
from app.core.settings import SettingsDep
from app.core.tenancy import TenantDep
from app.history.schemas import FORMATS, FormatQuery, HistoryPage
from app.history.service import HistoryService
from app.messages.intake import (
    AppendCall,
    AppendFormat,
    IdempotencyKey,
    check_batch,
    read_append,
)
from app.messages.schemas import AppendRequest, AppendResponse
from app.messages.service import AppendService
from app.sessions.router import IfMatch, SessionIdPath, checked_id

router = APIRouter(prefix="/v1/sessions/{session_id}/messages", tags=["messages"])


async def batch_in_bounds(request: Request, settings: SettingsDep) -> None:
    """The append's own checks before the body is validated (app.messages.intake)."""
    try:
        body = await request.json()  # parsed once already, by FastAPI
    except ValueError:
        return  # the body validation names it
    size = len(await request.body())
    await check_batch(body, request.query_params.get("format"), size, settings)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=AppendResponse,
    responses=problems(404, 412, 413, 422),
    dependencies=[Depends(batch_in_bounds)],
)
async def append_messages(
    request: Request,
    session_id: SessionIdPath,
    body: AppendRequest,
    engine: EngineDep,
    tenant: TenantDep,
    format: AppendFormat = None,
    idempotency_key: IdempotencyKey = None,
    if_match: IfMatch = None,
) -> Response:
    """Append a batch of messages atomically; each is counted once, here.

    The body may be the agent's provider request as it has it: its top-level
    ``system`` is stored as a system entry before the messages (once: not
    again while it is unchanged), its ``tools`` become the session's overhead,
    and its other request fields (model, max_tokens, temperature...) are
    ignored; see ``AppendRequest``."""
    call = AppendCall(body, format, idempotency_key, if_match, len(await request.body()))
    return await _append(engine, tenant, session_id, call)


async def _append(engine: AsyncEngine, tenant: str, session_id: str, call: AppendCall) -> Response:
    document, version, replayed = await AppendService(engine, tenant).append(
        checked_id(session_id),
        call.body,
        idempotency_key=call.idempotency_key,
        if_match=call.if_match,
        body_bytes=call.body_bytes,
        query_format=call.query_format,
    )
    # The service wrote the JSON itself (it is also the idempotency record); the
    # route's response model documents it.
    headers = {"ETag": f'"{version}"'}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(document, status_code=201, media_type="application/json", headers=headers)


async def fast_append(scope: Scope, path: dict[str, Any], raw: bytes) -> Response:
    """:func:`append_messages` for its plain form (app.core.direct): at most ``format``
    in the query, Idempotency-Key and If-Match at most once each, sent as
    ``application/json``, and read by :func:`~app.messages.intake.read_append` without a
    refusal. A request it refuses is not answered here: FastAPI's route runs the same
    checks again, and answers."""
    state = scope["app"].state
    fmt = only_query(scope, "format", FORMATS)
    tenant = tenant_of(scope)
    content_type = one_header(scope, b"content-type")
    if content_type != "application/json":
        raise NotPlain  # FastAPI's to read (the other JSON types) or refuse
    try:
        call = await read_append(
            raw,
            route=scope["route"],
            content_type=content_type,
            query_format=fmt,
            idempotency_key=one_header(scope, b"idempotency-key"),
            if_match=one_header(scope, b"if-match"),
            settings=state.settings,
        )
    except (ProblemError, ValueError, RecursionError):
        raise NotPlain from None
    return await _append(state.engine, tenant, path["session_id"], call)


def fast_routes() -> list[FastRoute]:
    """The append's plain form."""
    return [FastRoute(route_of(router.routes, append_messages), fast_append, reads_body=True)]


@router.get("", responses=problems(404, 422))
async def list_messages(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    after_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    format: FormatQuery = "openai",
) -> HistoryPage:
    """The whole stored history by seq, including pruned and compacted entries."""
    return await HistoryService(engine, tenant).history(
        checked_id(session_id), after_seq=after_seq, limit=limit, fmt=format
    )
