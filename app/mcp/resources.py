"""``/mcp``'s resources: a session's compactions, each readable as its summary and
what it replaced (the dropped entries, read back as ``history_read`` reads them, within
the session's ``recall.result_tokens``, and the paths, commands, errors and identifiers
they named).

``compactd://sessions/{session_id}/compactions/{compaction_id}`` names one. The list
is the ``X-Compactd-Session`` header's session's compactions, newest first, a page of
:data:`PAGE` at a time; a client that sends no session header gets the template and
builds the address itself. Another tenant's session or compaction is not found (a
JSON-RPC error, ``INVALID_PARAMS``, which is how MCP answers an unknown resource).
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from app.compactions.schemas import CompactionOut, DroppedValues
from app.compactions.service import CompactionService
from app.core.errors import ProblemError
from app.recall import agent_tools
from app.recall.tool_calls import ToolCallService
from app.sessions.router import checked_id

log = logging.getLogger(__name__)


@asynccontextmanager
async def _answered() -> AsyncIterator[None]:
    """A refusal as the JSON-RPC error a client acts on: the session or compaction not
    the tenant's (or an odd id) is invalid params; the database or the service being
    busy (503, 429) an internal error that says so, worth retrying; anything else an
    internal error with a fixed text, logged (never the exception's own words)."""
    try:
        yield
    except MCPError:
        raise
    except ProblemError as exc:
        code = (
            types.INVALID_PARAMS if exc.status < 500 and exc.status != 429 else types.INTERNAL_ERROR
        )
        raise MCPError(code, exc.detail) from None
    except Exception:
        log.exception("an MCP resource request failed")
        raise MCPError(types.INTERNAL_ERROR, "the resource could not be read; try again") from None


PAGE = 20
TEMPLATE = "compactd://sessions/{session_id}/compactions/{compaction_id}"
MIME = "text/markdown"
_URI = re.compile(r"compactd://sessions/(?P<session>[^/]+)/compactions/(?P<compaction>[^/]+)")


def uri(session_id: str, compaction_id: uuid.UUID) -> str:
    return TEMPLATE.format(session_id=session_id, compaction_id=compaction_id)


def _describe(job: CompactionOut) -> str:
    replaced = f"entries before seq {job.first_kept_seq}" if job.first_kept_seq else "nothing"
    sizes = (
        f", {job.tokens_before} → {job.tokens_after} context tokens"
        if job.tokens_before is not None and job.tokens_after is not None
        else ""
    )
    return (
        f"A {job.reason} compaction ({job.summarizer_used or job.summarizer}): {replaced}{sizes}."
    )


async def list_resources(
    request: Request, engine: AsyncEngine, tenant: str, cursor: str | None
) -> types.ListResourcesResult:
    session = request.headers.get("x-compactd-session")
    if session is None:
        return types.ListResourcesResult(resources=[])
    async with _answered():
        page = await CompactionService(engine, tenant).list(
            checked_id(session), limit=PAGE, cursor=cursor
        )
    return types.ListResourcesResult(
        resources=[
            types.Resource(
                uri=uri(session, job.id),
                name=f"compaction {job.id}",
                title=job.short_summary or f"Compaction of {job.created_at:%Y-%m-%d %H:%M} UTC",
                description=_describe(job),
                mime_type=MIME,
            )
            for job in page.compactions
            if job.status == "succeeded"
        ],
        next_cursor=page.next_cursor,
    )


def templates() -> types.ListResourceTemplatesResult:
    return types.ListResourceTemplatesResult(
        resource_templates=[
            types.ResourceTemplate(
                uri_template=TEMPLATE,
                name="compaction",
                title="A compaction of a session",
                description="Its summary and what it replaced: the entries, read back, and "
                "the paths, commands, errors and identifiers they named.",
                mime_type=MIME,
            )
        ]
    )


def _named(kind: str, values: DroppedValues) -> str | None:
    if not values.count:
        return None
    more = (
        f" (and {values.count - len(values.first)} more)"
        if values.count > len(values.first)
        else ""
    )
    return f"- {kind}: " + ", ".join(f"`{v}`" for v in values.first) + more


async def read_resource(engine: AsyncEngine, tenant: str, address: str) -> types.ReadResourceResult:
    found = _URI.fullmatch(address)
    if found is None:
        raise MCPError(types.INVALID_PARAMS, f"no such resource: {address!r} (see {TEMPLATE})")
    session = found["session"]
    try:
        compaction = uuid.UUID(found["compaction"])
    except ValueError:
        raise MCPError(types.INVALID_PARAMS, f"no such resource: {address!r}") from None
    async with _answered():  # the session, or the compaction, not the tenant's: not found
        job = await CompactionService(engine, tenant).get(checked_id(session), compaction)
    parts = [f"# Compaction {job.id}", _describe(job), "", "## Summary", job.summary or "(none)"]
    dropped = job.details.dropped if job.details else None
    if dropped is not None:
        named = [
            _named(kind, values)
            for kind, values in (
                ("paths", dropped.paths),
                ("commands", dropped.commands),
                ("errors", dropped.errors),
                ("identifiers", dropped.identifiers),
                ("numbers", dropped.numbers),
                ("URLs", dropped.urls),
            )
        ]
        if any(named):
            parts += ["", "## Named in what it replaced", *[n for n in named if n]]
    if job.status == "succeeded" and job.first_kept_seq is not None:
        # What it replaced, as history_read reads it (within the session's cap).
        call: dict[str, Any] = {
            "type": "tool_use",
            "id": "resource",
            "name": agent_tools.READ,
            "input": {"compaction": str(job.id), "from_seq": 1},
        }
        async with _answered():
            ran = await ToolCallService(engine, tenant).run(session, call, None)
        parts += ["", "## What it replaced", ran.content]
    return types.ReadResourceResult(
        contents=[types.TextResourceContents(uri=address, mime_type=MIME, text="\n".join(parts))]
    )
