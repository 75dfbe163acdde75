"""HTTP routes of the drop-in proxy: the providers' own endpoints, under ``/proxy``.

``OpenAI(base_url=".../proxy/openai/v1")`` and ``Anthropic(base_url=".../proxy/anthropic")``
work unmodified with one header added, ``X-Compactd-Session`` (and ``X-Compactd-Key``
when the service has API keys). What a call does: docs/proxy.md.
"""

from __future__ import annotations

from typing import Any

import anyio
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from app.core.database import EngineDep
from app.core.settings import SettingsDep
from app.core.tenancy import TenantDep
from app.engine.proxy.wire import Wire
from app.keys.auth import OPEN_PROXY_BASES
from app.proxy.answer import Delivery, EventStream
from app.proxy.forward import ProxyClient
from app.proxy.request import SESSION_HEADER
from app.proxy.service import ProxyService

router = APIRouter(prefix="/proxy", tags=["proxy"])

_HEADERS = [
    {
        "name": "X-Compactd-Session",
        "in": "header",
        "required": True,
        "description": "The session this call belongs to (created on first use with the "
        "request's model).",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:\\-]{0,127}$"},
    },
    {
        "name": "X-Compactd-Key",
        "in": "header",
        "required": False,
        "description": "A compactd API key, once the service has keys (the Authorization "
        "and x-api-key headers are the provider's, and go upstream).",
        "schema": {"type": "string"},
    },
]


# The refusals every route of the service makes, sent here in the provider's shape.
_APP_WIDE = {
    "400": "The body is not JSON, or not UTF-8, or lacks the session header",
    "413": "The body is over the size limit",
    "422": "A parameter is invalid (a NUL in the query, say); nothing was stored",
}


def _spec(provider: str, errors: str) -> dict[str, Any]:
    return {
        "parameters": _HEADERS,
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "description": f"The {provider} request, as its SDK sends it.",
                    }
                }
            },
        },
        "responses": {
            "200": {
                "description": f"The {provider} reply, whole or as server-sent events.",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **{
                code: {
                    "description": f"{what}, in the provider's error shape.",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                }
                for code, what in _APP_WIDE.items()
            },
            "4XX": {
                "description": "compactd's own errors in the provider's error shape ("
                + errors
                + "): a missing X-Compactd-Session or an unreadable body (400), a missing "
                "or wrong X-Compactd-Key (401), a body over the limit (413), a session "
                "busy past the timeout (409); and the upstream's errors, passed "
                "through.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
            "5XX": {
                "description": "The upstream's errors, passed through, and compactd's own "
                "(503 when its database is unavailable), in the provider's error shape.",
                "content": {"application/json": {"schema": {"type": "object"}}},
            },
        },
    }


def _service(request: Request, tenant: str, engine: Any, settings: Any) -> ProxyService:
    client: ProxyClient = request.app.state.proxy
    return ProxyService(
        engine=engine,
        client=client,
        settings=settings,
        tenant_id=tenant,
        query=request.scope["query_string"],
    )


async def _call(api: Wire, request: Request, tenant: str, engine: Any, settings: Any) -> Response:
    answer = await _service(request, tenant, engine, settings).call(
        api,
        request.headers.get(SESSION_HEADER),
        await request.body(),
        request.scope["headers"],
    )
    if answer.stream is not None:
        return _Streamed(answer.stream, answer.status, answer.headers, answer.media_type)
    if answer.delivery is not None:
        return _Delivered(answer.delivery, answer.body, answer.status, answer.headers)
    return Response(answer.body, status_code=answer.status, headers=answer.headers)


async def _hung_up(receive: Receive) -> bool:
    """Whether the client has closed its connection already (waits for nothing)."""
    with anyio.CancelScope() as scope:
        scope.cancel()  # receive() answers at once with a disconnect, else is cancelled
        message = await receive()
        return bool(message["type"] == "http.disconnect")
    return False


class _Delivered(Response):
    """A whole reply that is stored only if it goes out to the agent: an agent that hung
    up while the model was answering (its SDK timed out, and may be retrying) never got
    it. Its delivery is told exactly once, however the response ends."""

    def __init__(
        self, delivery: Delivery, body: bytes, status: int, headers: dict[str, str]
    ) -> None:
        super().__init__(body, status_code=status, headers=headers)
        self.delivery = delivery

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sent = False
        try:
            gone = await _hung_up(receive)
            await super().__call__(scope, receive, send)
            sent = not gone
        finally:
            self.delivery(sent)


class _Streamed(StreamingResponse):
    """Server-sent events whose stream is closed once the response ends, however it
    ends (the agent may hang up before the first event, or midway)."""

    def __init__(
        self, stream: EventStream, status: int, headers: dict[str, str], media_type: str
    ) -> None:
        super().__init__(stream, status_code=status, headers=headers, media_type=media_type)
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.stream.aclose()


@router.post(
    "/openai/v1/chat/completions",
    openapi_extra=_spec("OpenAI chat completions", '{"error": {"message", "type", "code"}}'),
)
async def openai_chat_completions(
    request: Request, tenant: TenantDep, engine: EngineDep, settings: SettingsDep
) -> Response:
    """An OpenAI-compatible chat completion through compactd: the request's new messages
    are stored, the session's managed context goes upstream in place of its history, and
    the reply (whole or streamed) comes back as the upstream sent it, then is stored."""
    return await _call("openai", request, tenant, engine, settings)


@router.post(
    "/openai/v1/responses",
    openapi_extra=_spec("OpenAI Responses", '{"error": {"message", "type", "code"}}'),
)
async def openai_responses(
    request: Request, tenant: TenantDep, engine: EngineDep, settings: SettingsDep
) -> Response:
    """An OpenAI Responses call (Codex's API) through compactd: the request's new input
    items are stored, the session's managed context goes upstream as its input (after
    ``instructions`` and the leading system and developer items, the agent's prompt, sent
    as they came), and the reply (whole or streamed, event for event) comes back as the
    upstream sent it, then its output items are stored. ``previous_response_id`` is
    refused (400): compactd keeps the history, so the whole of it is sent each call."""
    return await _call("responses", request, tenant, engine, settings)


@router.post(
    "/openai/v1/responses/compact",
    openapi_extra=_spec("OpenAI Responses compaction", '{"error": {"message", "type", "code"}}'),
)
async def openai_responses_compact(
    request: Request, tenant: TenantDep, engine: EngineDep, settings: SettingsDep
) -> Response:
    """An agent's remote-compaction request (Codex's ``/responses/compact``), answered by
    compactd, never the upstream: the request's new input items are stored, the session
    is compacted on the spot (a readable extractive summary, stored and undoable), and
    the answer's ``output`` is the session's context now as Responses items."""
    answer = await _service(request, tenant, engine, settings).compact(
        request.headers.get(SESSION_HEADER), await request.body(), request.scope["headers"]
    )
    return Response(answer.body, status_code=answer.status, headers=answer.headers)


@router.post(
    "/anthropic/v1/messages",
    openapi_extra=_spec("Anthropic Messages", '{"type": "error", "error": {"type", "message"}}'),
)
async def anthropic_messages(
    request: Request, tenant: TenantDep, engine: EngineDep, settings: SettingsDep
) -> Response:
    """An Anthropic-compatible Messages call through compactd: the request's new messages
    are stored, the session's managed context goes upstream in place of its history, and
    the reply (whole or streamed) comes back as the upstream sent it, then is stored."""
    return await _call("anthropic", request, tenant, engine, settings)


async def reachable() -> Response:
    """An agent's reachability check of a base URL (Claude Code sends ``HEAD`` to its
    ``ANTHROPIC_BASE_URL``): an empty 200, with no session header or key needed, since
    it tells nothing but that the proxy is there."""
    return Response(status_code=200)


for _base in sorted(OPEN_PROXY_BASES):
    router.add_api_route(
        _base.removeprefix(router.prefix),
        reachable,
        methods=["HEAD"],
        # One entry per base in the spec; its twin with a trailing slash answers alike.
        include_in_schema=not _base.endswith("/"),
        response_class=Response,
        responses={200: {"description": "The proxy is there (an empty body)."}},
        summary="Reachability check of a proxy base URL",
    )
