"""HTTP routes for recall: search a session's whole history."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Query

from app.core.database import EngineDep
from app.core.openapi import problems
from app.core.tenancy import TenantDep
from app.recall.schemas import (
    MAX_LIMIT,
    MAX_QUERY_CHARS,
    MAX_TOOLS,
    Kind,
    Role,
    SearchPage,
    SearchQuery,
)
from app.recall.service import RecallService
from app.sessions.router import SessionIdPath, checked_id

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["recall"])

SEQ = 2**62


@router.get("/search", responses=problems(404, 409, 422))
async def search(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    q: Annotated[
        str,
        Query(
            min_length=1,
            max_length=MAX_QUERY_CHARS,
            description="What to look for: words (any form: `failing` finds `failed`), or "
            "an identifier, a path, an error name or a phrase as written (any case). In "
            "double quotes, looked for as written only.",
        ),
    ],
    role: Annotated[
        list[Role] | None, Query(description="Only entries of these roles (repeatable).")
    ] = None,
    tool: Annotated[
        list[str] | None,
        Query(
            description="Only these tools' entries: their outputs and the assistant "
            f"entries that call them (repeatable, up to {MAX_TOOLS})."
        ),
    ] = None,
    kind: Annotated[
        list[Kind] | None, Query(description="Only entries of these kinds (repeatable).")
    ] = None,
    from_seq: Annotated[
        int | None, Query(ge=1, le=SEQ, description="Only entries at this seq or after.")
    ] = None,
    to_seq: Annotated[
        int | None, Query(ge=1, le=SEQ, description="Only entries at this seq or before.")
    ] = None,
    compaction: Annotated[
        uuid.UUID | None,
        Query(
            description="Only the entries this compaction replaced (as its `/source` "
            "lists them), on the path to its summary."
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT)] = 10,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> SearchPage:
    """Search the session's whole history: every entry of its tree (other branches, the
    path it was forked from), compacted and pruned ones included, tool calls and
    outputs too, as stored. Best first: where the query stands as written, then where
    it is inside a longer word, then where its words match (stemmed, any order, the
    closer the better); each hit with a snippet, its place (seq, branch, on the active
    path or not) and whether it is out of the current context (`compacted`)."""
    return await RecallService(engine, tenant).search(
        checked_id(session_id),
        SearchQuery(
            q=q,
            roles=tuple(role or ()),
            kinds=tuple(kind or ()),
            tools=tuple(tool or ()),
            from_seq=from_seq,
            to_seq=to_seq,
            compaction=compaction,
            limit=limit,
            cursor=cursor,
        ),
    )
