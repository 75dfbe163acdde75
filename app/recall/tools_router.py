"""HTTP routes for the agent's recall tools: their definitions, and running a call."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from app.core.database import EngineDep
from app.core.openapi import problems
from app.core.tenancy import TenantDep
from app.recall import agent_tools
from app.recall.tool_calls import ToolCallService
from app.sessions.router import SessionIdPath, checked_id

router = APIRouter(tags=["recall"])


class ToolDefinitions(BaseModel):
    format: Literal["openai", "anthropic"]
    tools: list[dict[str, Any]] = Field(
        description="Add these to the tools of the agent's model requests, as they are."
    )


class ToolCallRequest(BaseModel):
    tool_call: dict[str, Any] = Field(
        description="The call exactly as the model produced it: an OpenAI `tool_calls` item "
        '(`{"id", "type": "function", "function": {"name", "arguments"}}`) or an Anthropic '
        '`tool_use` block (`{"type": "tool_use", "id", "name", "input"}`).'
    )
    max_tokens: int | None = Field(
        None,
        ge=agent_tools.MIN_RESULT_TOKENS,
        le=agent_tools.MAX_RESULT_TOKENS,
        description="The most the result may hold; default: the session's "
        "`recall.result_tokens` (4,000).",
    )


class ToolCallResult(BaseModel):
    tool_call_id: str
    name: str
    format: Literal["openai", "anthropic"]
    is_error: bool = Field(description="The call could not be run; `content` says why.")
    content: str = Field(description="The tool result's text.")
    tokens: int = Field(description="Its tokens, counted for the session's model.")
    truncated: bool = Field(description="Cut to fit: `content` ends with how to read on.")
    message: dict[str, Any] = Field(
        description="The result as the agent appends it: an OpenAI `tool` message, or an "
        "Anthropic `tool_result` block (for its next user message)."
    )


@router.get("/v1/tools", responses=problems(422))
async def tool_definitions(
    format: Annotated[
        Literal["openai", "anthropic"], Query(description="The provider's tool format.")
    ] = "openai",
) -> ToolDefinitions:
    """The recall tools an agent adds to its own: `history_search` (the whole history,
    compacted parts included) and `history_read` (entries by seq, or what a compaction
    replaced). Run the model's calls of them with `POST …/tool-calls`."""
    return ToolDefinitions(format=format, tools=agent_tools.definitions(format))


@router.post(
    "/v1/sessions/{session_id}/tool-calls",
    response_model=ToolCallResult,
    responses=problems(404, 422),
)
async def run_tool_call(
    session_id: SessionIdPath,
    body: ToolCallRequest,
    engine: EngineDep,
    tenant: TenantDep,
) -> Response:
    """Run one recall tool call for the agent and answer its result, within the token
    cap. A call with bad arguments is answered too, as a result that says what was
    wrong (`is_error`), for the model to try again; a body that is no tool call is 422."""
    ran = await ToolCallService(engine, tenant).run(
        checked_id(session_id), body.tool_call, body.max_tokens
    )
    return Response(orjson.dumps(ran.document()), media_type="application/json")
