"""HTTP routes for the stored history."""

from __future__ import annotations

import json
import re
from typing import Annotated, cast

from fastapi import APIRouter, Depends, Header, Query, Request, Response, status
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.types import Scope

from app.core.database import DbDep, EngineDep
from app.core.direct import DirectRoute, NotPlain, one_header, only_query, tenant_of
from app.core.errors import invalid
from app.core.http import OFF_LOOP_BYTES, run_sized
from app.core.openapi import problems
from app.core.settings import Settings, SettingsDep
from app.core.tenancy import TenantDep
from app.engine.formats.storable import find_unstorable
from app.history.schemas import FORMAT_DESCRIPTION, FORMATS, Format, FormatQuery, HistoryPage
from app.history.service import HistoryService
from app.messages.schemas import AppendRequest, AppendResponse
from app.messages.service import AppendService, check_batch_size, oversized_arguments
from app.sessions.router import IfMatch, SessionIdPath, checked_id

router = APIRouter(prefix="/v1/sessions/{session_id}/messages", tags=["messages"])


async def batch_in_bounds(request: Request, settings: SettingsDep) -> None:
    """Before the body is validated: at most ``max_batch_messages`` messages, and no
    tool call's arguments holding an array or object over ``max_json_items`` (the
    body's own arrays and objects are checked for every route, in app.main)."""
    try:
        body = await request.json()  # parsed once already, by FastAPI
    except ValueError:
        return  # the body validation names it
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return
    check_batch_size(len(messages), settings.max_batch_messages)
    fmt = request.query_params.get("format") or body.get("format", "openai")
    if fmt == "openai":
        size = len(await request.body())
        found = await run_sized(size, oversized_arguments, messages, settings.max_json_items)
        if found:
            raise invalid(*found)


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
    format: Annotated[
        Format | None,
        Query(
            description=FORMAT_DESCRIPTION + " On an append, the body's `format` says the "
            "same (openai when neither does); given both, they must agree."
        ),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        Header(
            min_length=1,
            max_length=255,
            description="A retry with the same key returns the first response.",
        ),
    ] = None,
    if_match: IfMatch = None,
) -> Response:
    """Append a batch of messages atomically; each is counted once, here.

    The body may be the agent's provider request as it has it: its top-level
    ``system`` is stored as a system entry before the messages (once: not
    again while it is unchanged), its ``tools`` become the session's overhead,
    and its other request fields (model, max_tokens, temperature...) are
    ignored; see ``AppendRequest``."""
    document, version, replayed = await AppendService(engine, tenant).append(
        checked_id(session_id),
        body,
        idempotency_key=idempotency_key,
        if_match=if_match,
        body_bytes=len(await request.body()),
        query_format=format,
    )
    return _appended(document, version, replayed)


def _appended(document: bytes, version: int, replayed: bool) -> Response:
    # The service wrote the JSON itself (it is also the idempotency record); the
    # route's response model documents it.
    headers = {"ETag": f'"{version}"'}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(document, status_code=201, media_type="application/json", headers=headers)


async def direct_append(scope: Scope, found: re.Match[str], raw: bytes) -> Response:
    """:func:`append_messages` for its plain form (see app.core.direct): a JSON body of at
    most ``OFF_LOOP_BYTES`` that passes every check of the FastAPI route (the app's body
    checks in app.main, :func:`batch_in_bounds`, the model), at most ``format`` in the
    query, Idempotency-Key and If-Match at most once each. A check that fails is not
    answered here: FastAPI's route runs them all again, and answers."""
    settings: Settings = scope["app"].state.settings
    fmt = cast("Format | None", only_query(scope, "format", FORMATS))
    tenant = tenant_of(scope)
    key = one_header(scope, b"idempotency-key")
    if_match = one_header(scope, b"if-match")
    if (
        not raw
        or len(raw) > OFF_LOOP_BYTES
        or one_header(scope, b"content-type") != "application/json"
        or (key is not None and not 1 <= len(key) <= 255)
        or (key is not None and "\x00" in key)
    ):
        raise NotPlain
    try:
        raw.decode("utf-8")
        parsed = json.loads(raw)  # as FastAPI parses it (the stdlib's json)
    except (ValueError, RecursionError):
        raise NotPlain from None
    if (
        not isinstance(parsed, dict)
        or find_unstorable(parsed, "", settings.max_json_items)
        or not isinstance(messages := parsed.get("messages"), list)
        or len(messages) > settings.max_batch_messages
        or (
            (fmt or parsed.get("format", "openai")) == "openai"
            and oversized_arguments(messages, settings.max_json_items)
        )
    ):
        raise NotPlain
    try:
        body = AppendRequest.model_validate(parsed)
    except ValidationError:
        raise NotPlain from None
    document, version, replayed = await AppendService(scope["app"].state.engine, tenant).append(
        checked_id(found["session_id"]),
        body,
        idempotency_key=key,
        if_match=if_match,
        body_bytes=len(raw),
        query_format=fmt,
    )
    return _appended(document, version, replayed)


def direct_routes() -> list[DirectRoute]:
    """The append, matched as FastAPI matches its route."""
    route = next(
        r for r in router.routes if isinstance(r, APIRoute) and r.endpoint is append_messages
    )
    return [DirectRoute("POST", route.path_regex, route, direct_append, reads_body=True)]


@router.get("", responses=problems(404, 422))
async def list_messages(
    session_id: SessionIdPath,
    db: DbDep,
    tenant: TenantDep,
    after_seq: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    format: FormatQuery = "openai",
) -> HistoryPage:
    """The whole stored history by seq, including pruned and compacted entries."""
    return await HistoryService(db, tenant).history(
        checked_id(session_id), after_seq=after_seq, limit=limit, fmt=format
    )
