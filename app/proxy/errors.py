"""The proxy's own errors, in the provider's error shape.

An agent behind the proxy runs the provider's SDK, which reads errors in its provider's
shape (``{"error": {"message", "type", "param", "code"}}`` for OpenAI, ``{"type":
"error", "error": {"type", "message"}}`` for Anthropic) and raises a clear exception
from them. compactd's errors are problem documents everywhere else; on the proxy's paths
:class:`ProviderErrorShape` rewrites every one (a missing API key, a body over the
limit, a busy server, a history no rule could place...) into the provider's shape, keeping the
status, the headers and the problem's own fields (``first_difference``...) inside the
error object. Errors the upstream sent pass through untouched: they are not problem
documents.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.errors import PROBLEM_JSON, ProblemError
from app.engine.proxy.wire import Api

PREFIXES: dict[str, Api] = {"/proxy/openai/": "openai", "/proxy/anthropic/": "anthropic"}

_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}
_ANTHROPIC_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}
_PROBLEM_KEYS = frozenset({"type", "title", "status", "detail", "instance"})


class BadGateway(ProblemError):
    """The upstream could not be reached, or broke off its answer."""

    status, type, title = 502, "bad-gateway", "Bad gateway"


class GatewayTimeout(ProblemError):
    """The upstream did not answer in time."""

    status, type, title = 504, "gateway-timeout", "Gateway timeout"


def api_of(path: str) -> Api | None:
    for prefix, api in PREFIXES.items():
        if path.startswith(prefix):
            return api
    return None


def provider_error(api: Api, status: int, problem: dict[str, Any]) -> dict[str, Any]:
    """A problem document as ``api``'s error body."""
    detail = str(problem.get("detail") or problem.get("title") or "error")
    code = str(problem.get("type", "")).rsplit("/", 1)[-1] or None
    extensions = {k: v for k, v in problem.items() if k not in _PROBLEM_KEYS}
    if api == "openai":
        errors = extensions.get("errors")
        param = None
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            param = errors[0].get("field")
        kind = _OPENAI_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        return {
            "error": {"message": detail, "type": kind, "param": param, "code": code, **extensions}
        }
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": detail, "code": code, **extensions}}


class ProviderErrorShape:
    """Rewrites the problem documents answered on the proxy's paths into the provider's
    error shape (see the module's docstring). Plain ASGI; only a problem answer is held
    (they are small), anything else streams through untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        api = api_of(scope["path"]) if scope["type"] == "http" else None
        if api is None:
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []

        async def reshape(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                content_type = dict(message.get("headers", [])).get(b"content-type", b"")
                if content_type.split(b";")[0].strip() == PROBLEM_JSON.encode():
                    held = message
                    return
            elif held is not None and message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                try:
                    problem = orjson.loads(b"".join(chunks))
                except orjson.JSONDecodeError:
                    problem = {"detail": b"".join(chunks).decode("utf-8", "replace")}
                status: int = held["status"]
                body = orjson.dumps(provider_error(api, status, problem))
                headers = [
                    (k, v)
                    for k, v in held.get("headers", [])
                    if k not in (b"content-type", b"content-length")
                ]
                headers += [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ]
                await send({**held, "headers": headers})
                await send({"type": "http.response.body", "body": body, "more_body": False})
                return
            await send(message)

        await self.app(scope, receive, reshape)
