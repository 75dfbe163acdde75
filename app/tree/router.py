"""HTTP routes for the tree: read it, move the leaf, fork."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response, status

from app.compactions.router import WakeDep
from app.core.database import EngineDep
from app.core.openapi import problems
from app.core.tenancy import TenantDep
from app.messages.intake import IdempotencyKey
from app.sessions.router import IfMatch, SessionIdPath, checked_id
from app.sessions.schemas import SessionOut
from app.tree.schemas import ForkRequest, NavigateRequest, NavigateResponse, TreePage
from app.tree.service import TreeService

router = APIRouter(prefix="/v1/sessions/{session_id}", tags=["tree"])


def _json(document: dict[str, object], code: int, replayed: bool, **headers: str) -> Response:
    import orjson

    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(
        orjson.dumps(document), status_code=code, media_type="application/json", headers=headers
    )


@router.get("/tree", responses=problems(404, 422))
async def read_tree(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> TreePage:
    """The session's tree, a page at a time in (branch, seq) order: each entry with
    its parent, kind, role, a short label, its tokens and how many children it has
    in this tree, the active leaf marked; and the active path, as runs of seqs."""
    return await TreeService(engine, tenant).tree(
        checked_id(session_id), limit=limit, cursor=cursor
    )


@router.post(
    "/navigate",
    response_model=NavigateResponse,
    responses={202: {"model": NavigateResponse}, **problems(404, 409, 412, 422)},
)
async def navigate(
    request: Request,
    session_id: SessionIdPath,
    body: NavigateRequest,
    engine: EngineDep,
    tenant: TenantDep,
    wake: WakeDep,
    idempotency_key: IdempotencyKey = None,
    if_match: IfMatch = None,
) -> Response:
    """Move the active leaf to any entry of the session's tree (by id, or by seq on
    the active path). The next append goes after it; the context, the usage and the
    verdict follow the new path. Navigating to the entry before a compaction undoes
    it (the compaction stays in the tree, on its own branch). With ``summarize``,
    the abandoned branch is summarized by the worker first (202): the leaf moves,
    with the summary after the target, once it is written; cancel the job
    (``…/compactions/{id}/cancel``) to call the navigation off."""
    outbound = getattr(request.app.state, "outbound", None)
    hooks = outbound.hooks if outbound is not None else None
    document, code, replayed = await TreeService(engine, tenant, wake, hooks).navigate(
        checked_id(session_id), body, idempotency_key=idempotency_key, if_match=if_match
    )
    return _json(document, code, replayed, ETag=f'"{document["session"]["version"]}"')


@router.post(
    "/fork",
    status_code=status.HTTP_201_CREATED,
    response_model=SessionOut,
    responses=problems(404, 409, 422),
)
async def fork(
    session_id: SessionIdPath,
    engine: EngineDep,
    tenant: TenantDep,
    body: ForkRequest | None = None,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """A new session whose history is this one's active path up to ``at_seq``,
    sharing its storage (nothing is copied but the prune marks of the window), that
    then grows on its own. Deleting either never breaks the other."""
    document, replayed = await TreeService(engine, tenant).fork(
        checked_id(session_id), body or ForkRequest(), idempotency_key=idempotency_key
    )
    return _json(
        document,
        201,
        replayed,
        Location=f"/v1/sessions/{document['id']}",
        ETag=f'"{document["version"]}"',
    )
