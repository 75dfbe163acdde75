"""``/mcp``: compactd's recall tools, ``history_search`` and ``history_read``, served
over MCP's Streamable HTTP transport with the official SDK (``mcp``).

The tools are app.recall's: the same definitions as ``GET /v1/tools`` and the same
run as ``POST /v1/sessions/{id}/tool-calls`` (app.recall.tool_calls), so the limits and
the result texts are theirs. Only the way in differs:

- **The tenant** is the API key's, resolved by app.keys.auth before the request is
  admitted to the limits (app.core.limits), as on ``/v1``: ``Authorization: Bearer``
  or the proxy's ``X-Compactd-Key``. Without a key where keys exist: a 401
  problem+json, and no MCP message is read.
- **The session** is the ``X-Compactd-Session`` header's. A client that cannot set
  headers passes ``session_id`` in the call instead: the tools it lists then ask for
  it (the only difference from ``/v1/tools``). A session the tenant does not have
  (another tenant's, or none) is a tool result saying so (``isError``), never an HTTP
  404: an MCP client reads a 404 on its endpoint as "your MCP session expired".
- **Resources**: the session's compactions, each its summary and what it replaced
  (app.mcp.resources).
- **Stateless, JSON answers**: the SDK's low-level server (the definitions are
  app.recall's JSON schemas as they are; the high-level server would derive schemas
  from Python signatures) behind ``StreamableHTTPSessionManager(stateless=True,
  json_response=True)``. Every POST is answered whole by whichever worker process
  receives it (app.serving.supervisor runs several), and no stream stays open: a GET
  (the optional server-to-client stream) and a DELETE (ending a session there is
  none of) are answered 405, as the transport's specification allows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from app import __version__
from app.core.errors import PayloadTooLarge, ProblemError
from app.core.http import problem_response
from app.engine.formats.storable import find_unstorable
from app.mcp import resources
from app.recall import agent_tools
from app.recall.tool_calls import ToolCallService
from app.sessions.router import checked_id

SESSION_HEADER = "x-compactd-session"
SESSION_ARGUMENT = "session_id"
# An MCP message is one small JSON-RPC request (a search's query is at most 500
# characters): a larger body is refused (413) before it is parsed.
MAX_BODY_BYTES = 64 * 1024
# Arrays and objects in a call's arguments hold at most this many items.
MAX_ARGUMENT_ITEMS = 100

INSTRUCTIONS = (
    "compactd keeps this conversation's whole history, including what was compacted into "
    "a summary. Search it with history_search and read entries back with history_read."
)

_SESSION_PROPERTY = {
    "type": "string",
    "description": "The compactd session whose history to use (this client sends no "
    "X-Compactd-Session header).",
}


def tools(with_session_argument: bool) -> list[types.Tool]:
    """The recall tools as ``GET /v1/tools`` defines them; with a required
    ``session_id`` argument for a client that sends no session header."""
    out = []
    for tool in agent_tools.definitions("anthropic"):
        schema: dict[str, Any] = tool["input_schema"]
        if with_session_argument:
            schema = {
                **schema,
                "properties": {**schema["properties"], SESSION_ARGUMENT: _SESSION_PROPERTY},
                "required": [*schema.get("required", []), SESSION_ARGUMENT],
            }
        out.append(
            types.Tool(
                name=tool["name"],
                description=tool["description"],
                input_schema=schema,
                annotations=types.ToolAnnotations(
                    read_only_hint=True, idempotent_hint=True, open_world_hint=False
                ),
            )
        )
    return out


def _request(ctx: ServerRequestContext[Any, Any]) -> Request:
    request = ctx.request
    if not isinstance(request, Request):  # pragma: no cover - only served over HTTP here
        raise MCPError(types.INTERNAL_ERROR, "compactd's MCP server is served over HTTP only")
    return request


def _tenant(request: Request) -> str:
    tenant: str | None = request.scope.get("state", {}).get("tenant")
    if tenant is None:  # pragma: no cover - app.keys.auth covers /mcp: fail closed
        raise MCPError(types.INVALID_REQUEST, "no API key was checked for this request")
    return tenant


async def _list_tools(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListToolsResult:
    header = _request(ctx).headers.get(SESSION_HEADER)
    return types.ListToolsResult(tools=tools(with_session_argument=header is None))


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=f"Error: {text}")], is_error=True)


def _session(request: Request, arguments: dict[str, Any]) -> str:
    """The call's session: the header's, else the ``session_id`` argument's (taken out
    of the arguments). Raises :class:`ValueError` with the tool result's text."""
    header = request.headers.get(SESSION_HEADER)
    argument = arguments.pop(SESSION_ARGUMENT, None)
    if argument is not None and not isinstance(argument, str):
        raise ValueError(f"{SESSION_ARGUMENT} must be a string")
    if header is not None and argument is not None and argument != header:
        raise ValueError(
            f"{SESSION_ARGUMENT} {argument!r} is not this connection's session "
            f"({header!r}, from its X-Compactd-Session header)"
        )
    session = header if header is not None else argument
    if not session:
        raise ValueError(
            "no session: the MCP client sends none in an X-Compactd-Session header, "
            f"so pass {SESSION_ARGUMENT}"
        )
    return session


async def _call_tool(
    ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
) -> types.CallToolResult:
    request = _request(ctx)
    tenant = _tenant(request)
    engine: AsyncEngine = request.app.state.engine
    arguments = dict(params.arguments or {})
    try:
        session = _session(request, arguments)
    except ValueError as exc:
        return _error(str(exc))
    # What the API refuses in a body (NUL characters, lone surrogates, huge arrays) is
    # refused here too, as a result the model can act on.
    found = find_unstorable(arguments, "arguments", MAX_ARGUMENT_ITEMS)
    if found is not None:
        return _error(f"{found[0]} {found[1]}")
    # The call as a model's tool_use block: app.recall reads and runs it as the
    # tool-calls route does.
    call = {"type": "tool_use", "id": str(ctx.request_id), "name": params.name, "input": arguments}
    try:
        ran = await ToolCallService(engine, tenant).run(checked_id(session), call, None)
    except ProblemError as exc:  # the session is not the tenant's (404), or an odd id
        if exc.status < 500:
            return _error(exc.detail)
        raise MCPError(types.INTERNAL_ERROR, exc.detail) from None
    return types.CallToolResult(
        content=[types.TextContent(text=ran.content)], is_error=ran.is_error
    )


async def _list_resources(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListResourcesResult:
    request = _request(ctx)
    cursor = params.cursor if params is not None else None
    return await resources.list_resources(
        request, request.app.state.engine, _tenant(request), cursor
    )


async def _list_resource_templates(
    ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
) -> types.ListResourceTemplatesResult:
    return resources.templates()


async def _read_resource(
    ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
) -> types.ReadResourceResult:
    request = _request(ctx)
    return await resources.read_resource(request.app.state.engine, _tenant(request), params.uri)


def build_server() -> Server[Any]:
    return Server(
        "compactd",
        version=__version__,
        title="compactd recall",
        instructions=INSTRUCTIONS,
        on_list_tools=_list_tools,
        on_call_tool=_call_tool,
        on_list_resources=_list_resources,
        on_list_resource_templates=_list_resource_templates,
        on_read_resource=_read_resource,
    )


def session_manager() -> StreamableHTTPSessionManager:
    """A manager for one run of the app (the SDK's can run only once)."""
    return StreamableHTTPSessionManager(
        build_server(), json_response=True, stateless=True, max_request_body_size=MAX_BODY_BYTES
    )


@asynccontextmanager
async def running(state: Any) -> AsyncIterator[None]:
    """For the app's lifespan: a session manager in ``state.mcp`` while it runs. The
    manager's task group lives in a task of its own, entered and left there: a
    lifespan may end in another task than it began (pytest's fixtures do), and an
    anyio task group must end in the task that opened it."""
    manager = state.mcp = session_manager()
    stop = asyncio.Event()
    ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def serve() -> None:
        async with manager.run():
            ready.set_result(None)
            await stop.wait()

    task = asyncio.create_task(serve(), name="compactd mcp session manager")
    await asyncio.wait([ready, task], return_when=asyncio.FIRST_COMPLETED)
    if task.done():  # it failed to start: say why
        task.result()
    try:
        yield
    finally:
        stop.set()
        await task


_NOT_ALLOWED = (
    b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Method Not Allowed: '
    b'this server is stateless and answers each POST whole; it opens no stream"}}'
)


class Endpoint:
    """The ASGI app at ``/mcp`` (an instance, not a function: Starlette's route hands a
    function a parsed request, an ASGI app the raw exchange)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            response = Response(
                _NOT_ALLOWED, 405, headers={"Allow": "POST"}, media_type="application/json"
            )
            await response(scope, receive, send)
            return
        if _declared_length(scope) > MAX_BODY_BYTES:
            # As the API answers one (the SDK's own check, for a chunked body, answers
            # a bare 413).
            too_large = PayloadTooLarge(
                f"the request body is over the {MAX_BODY_BYTES}-byte limit of an MCP message",
                headers={"Connection": "close"},
            )
            await problem_response(too_large, scope["path"])(scope, receive, send)
            return
        manager: StreamableHTTPSessionManager = scope["app"].state.mcp
        await manager.handle_request(scope, receive, send)


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:  # pragma: no cover - uvicorn refuses it first
                return 0
    return 0


def route() -> Route:
    """``/mcp`` as a route rather than a mount: a mount would redirect ``/mcp`` to
    ``/mcp/``, which not every MCP client follows for a POST. Not in the OpenAPI
    document: MCP has a specification of its own (docs/mcp.md)."""
    return Route("/mcp", Endpoint(), include_in_schema=False)
