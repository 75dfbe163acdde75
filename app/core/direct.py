"""Direct routes: the plain form of the hottest requests, answered without FastAPI's
request pipeline.

A context read is what every agent sends before every model call. FastAPI's pipeline
around its handler (matching the route through the included routers, solving its
dependencies, its wrappers and exit stacks) cost about 135 us of CPU of the read's 530 us,
more than the window's assembly. A :class:`DirectRoute` answers the plain form of such a
request (its exact path, its expected query parameters with valid values, its tenant
resolved) by calling the same service the FastAPI route calls; any other form (a
parameter to validate or refuse, a header the route's checks read) goes on to the FastAPI
route, which answers it as always. So every error a client can provoke is still FastAPI's
answer, and a test runs each request both ways (tests/context/test_direct_routes.py).

Everything outside the app's router still runs for a direct request: the request id and
log line, the API key, the limits. Its metrics carry the FastAPI route's template.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import asyncpg
from sqlalchemy.exc import DBAPIError
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.core.database import UNAVAILABLE, unavailable, unavailable_cause
from app.core.errors import ProblemError
from app.core.http import problem_response

log = logging.getLogger("compactd")

# A handler answers the request (its path's match and its body in hand), or raises
# NotPlain for FastAPI's route to answer it.
Handler = Callable[[Scope, "re.Match[str]", bytes], Awaitable[Response]]


class NotPlain(Exception):
    """Raised by a handler (before any work) for a request that is not the plain form."""


@dataclass(frozen=True)
class DirectRoute:
    """``method`` and a full-path ``pattern``; ``route``: the FastAPI route it stands in
    for (its template labels the metrics and the log line)."""

    method: str
    pattern: re.Pattern[str]
    route: BaseRoute
    handle: Handler
    reads_body: bool = False


class DirectRoutes:
    """The innermost middleware: a request a direct route takes never reaches the router."""

    def __init__(self, app: ASGIApp, *, routes: Sequence[DirectRoute]) -> None:
        self.app = app
        self.routes = tuple(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            method, path = scope["method"], scope["path"]
            for direct in self.routes:
                if method != direct.method or (found := direct.pattern.fullmatch(path)) is None:
                    continue
                body = b""
                if direct.reads_body:
                    body, receive = await _read_whole(receive)
                try:
                    response = await _answer(direct, scope, found, body)
                except NotPlain:
                    break  # FastAPI's route answers it (the body given to it again)
                scope["route"] = direct.route
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


async def _read_whole(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body (app.core.limits hands it over whole, as one message), and a
    ``receive`` that delivers what was read again, then the client's next message."""
    read: list[Message] = []
    while True:
        message = await receive()
        read.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in read if m["type"] == "http.request")

    async def again() -> Message:
        return read.pop(0) if read else await receive()

    return body, again


async def _answer(direct: DirectRoute, scope: Scope, found: re.Match[str], body: bytes) -> Response:
    """The handler's response, with errors answered as the app's exception handlers
    answer them (app.core.http); any other exception goes on to the 500 handler."""
    try:
        return await direct.handle(scope, found, body)
    except ProblemError as exc:
        return problem_response(exc, scope["path"])
    except (DBAPIError, *UNAVAILABLE, asyncpg.InterfaceError) as exc:
        if (cause := unavailable_cause(exc)) is None:
            raise
        log.warning("database unavailable: %s", exc)
        return problem_response(unavailable(cause), scope["path"])


def only_query(scope: Scope, name: str, allowed: frozenset[str]) -> str | None:
    """The value of the one query parameter ``name`` when the query string holds nothing
    else and the value is one of ``allowed`` (as written: none needs percent-encoding);
    None when there is no query string. Anything else is not the plain form."""
    query: bytes = scope["query_string"]
    if not query:
        return None
    key, sep, value = query.decode("latin-1").partition("=")
    if key == name and sep and value in allowed:
        return value
    raise NotPlain


def tenant_of(scope: Scope) -> str:
    """The tenant the API key middleware resolved; none is not the plain form (the
    FastAPI route's dependency refuses it)."""
    tenant: str | None = scope.get("state", {}).get("tenant")
    if tenant is None:
        raise NotPlain
    return tenant


def without_header(scope: Scope, name: bytes) -> None:
    """A request carrying header ``name`` (which the route's checks read) is not the
    plain form."""
    if any(key == name for key, _ in scope["headers"]):
        raise NotPlain


def one_header(scope: Scope, name: bytes) -> str | None:
    """Header ``name`` as FastAPI reads it (latin-1), or None when absent; given twice,
    not the plain form."""
    found = [value for key, value in scope["headers"] if key == name]
    if len(found) > 1:
        raise NotPlain
    return found[0].decode("latin-1") if found else None
