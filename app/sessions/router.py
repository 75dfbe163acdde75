"""HTTP routes for sessions."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Path, Query, Response, status

from app.core.database import EngineDep
from app.core.errors import NotFound, invalid
from app.core.openapi import link, problems
from app.core.outbound import check_tenant_url
from app.core.settings import Settings, SettingsDep
from app.core.tenancy import TenantDep
from app.sessions.schemas import (
    SESSION_ID_PATTERN,
    SessionCreate,
    SessionOut,
    SessionPage,
    SessionPatch,
)
from app.sessions.service import SessionService, to_schema

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

# No max_length here: an over-long id is one that cannot exist, so it gets a 404 from
# checked_id like any other impossible id, not a 422 about the path.
SessionIdPath = Annotated[str, Path(description="The session id.")]
IfMatch = Annotated[str | None, Header(description="Expected session version; 412 when stale.")]


_SESSION_ROUTES = {
    "GetSession": ("get", "", "Read the session."),
    "PatchSession": ("patch", "", "Change the session."),
    "DeleteSession": ("delete", "", "Delete the session."),
    "AppendMessages": ("post", "/messages", "Append messages to its history."),
    "ListMessages": ("get", "/messages", "Page through its stored history."),
    "GetContext": ("get", "/context", "Read the context to send to the model."),
    "GetOverflow": ("get", "/overflow", "Read its overflow verdict."),
    "ReportUsage": ("post", "/usage", "Report a model call's usage."),
    "Prune": ("post", "/prune", "Prune old tool outputs."),
    "ReportProviderError": ("post", "/overflow-errors", "Forward a provider's error."),
    "RequestCompaction": ("post", "/compactions", "Compact its history."),
    "ListCompactions": ("get", "/compactions", "List its compactions."),
}
# Where a created session's id leads: OpenAPI links, for clients and stateful fuzzers.
SESSION_LINKS = {
    name: link(
        f"/v1/sessions/{{session_id}}{suffix}", method, text, session_id="$response.body#/id"
    )
    for name, (method, suffix, text) in _SESSION_ROUTES.items()
}


def checked_id(session_id: str) -> str:
    """An id that cannot exist is simply not found (never a 500 from the database)."""
    import re

    if not re.fullmatch(SESSION_ID_PATTERN, session_id):
        raise NotFound(f"session {session_id!r} does not exist")
    return session_id


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={201: {"links": SESSION_LINKS}, **problems(409, 413, 422)},
)
async def create_session(
    body: SessionCreate,
    engine: EngineDep,
    tenant: TenantDep,
    response: Response,
    settings: SettingsDep,
) -> SessionOut:
    """Create a session for a model; the window comes from the catalog unless given."""
    _check_remote_endpoint(body.config, settings)
    session = await SessionService(engine, tenant).create(body)
    response.headers["ETag"] = f'"{session.version}"'
    response.headers["Location"] = f"/v1/sessions/{session.id}"
    return to_schema(session)


@router.get("", responses=problems(422))
async def list_sessions(
    engine: EngineDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=1024)] = None,
    metadata: Annotated[
        list[str] | None,
        Query(description="Filter as key=value (repeatable); values are matched as strings."),
    ] = None,
    parent_id: Annotated[
        str | None,
        Query(
            max_length=128,
            description="Only the children of this session: the side conversations (title "
            "requests, subagents) the proxy stored apart from it.",
        ),
    ] = None,
) -> SessionPage:
    """Sessions in creation order, a page at a time."""
    wanted: dict[str, str] = {}
    for item in metadata or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise invalid("metadata", f"{item!r} is not key=value")
        wanted[key] = value
    return await SessionService(engine, tenant).list(
        limit=limit, cursor=cursor, metadata=wanted, parent_id=parent_id
    )


@router.get("/{session_id}", responses=problems(404))
async def get_session(
    session_id: SessionIdPath, engine: EngineDep, tenant: TenantDep, response: Response
) -> SessionOut:
    """A session with its live accounting; the ETag is its version."""
    session = await SessionService(engine, tenant).require(checked_id(session_id))
    response.headers["ETag"] = f'"{session.version}"'
    return to_schema(session)


@router.patch("/{session_id}", responses=problems(404, 412, 413, 422))
async def patch_session(
    session_id: SessionIdPath,
    body: SessionPatch,
    engine: EngineDep,
    tenant: TenantDep,
    response: Response,
    settings: SettingsDep,
    if_match: IfMatch = None,
) -> SessionOut:
    """Change the model, window, config overrides or metadata."""
    _check_remote_endpoint(body.config, settings)
    session = await SessionService(engine, tenant).patch(checked_id(session_id), body, if_match)
    response.headers["ETag"] = f'"{session.version}"'
    return to_schema(session)


@router.delete(
    "/{session_id}", status_code=status.HTTP_204_NO_CONTENT, responses=problems(404, 412)
)
async def delete_session(
    session_id: SessionIdPath, engine: EngineDep, tenant: TenantDep, if_match: IfMatch = None
) -> None:
    """Delete a session and all of its data."""
    await SessionService(engine, tenant).delete(checked_id(session_id), if_match)


def _check_remote_endpoint(config: dict[str, Any] | None, settings: Settings) -> None:
    """A remote endpoint the outbound policy refuses as written is a 422 now, not a
    failed compaction later (app.core.outbound; it is checked again at every request)."""
    compaction = (config or {}).get("compaction")
    if isinstance(compaction, dict):
        check_tenant_url(
            "config.compaction.remote_endpoint", compaction.get("remote_endpoint"), settings
        )
