"""Fast routes: the plain form of the hottest requests, answered without FastAPI's
dependency solving.

A context read is what every agent sends before every model call. FastAPI's pipeline
around its handler (matching the route through the included routers, solving its
dependencies, its wrappers and exit stacks) cost about 135 us of CPU of the read's 530 us,
more than the window's assembly. A :class:`FastRoute` stands at the head of the app's
router for one FastAPI route: it answers the plain form of its request (its exact path,
its expected query parameters with valid values, its tenant resolved) by calling the same
service; any other form (a parameter to validate or refuse, a header the route's checks
read) goes on through the router to the FastAPI route, which answers it as always. So
every error a client can provoke is still FastAPI's answer, and a test runs each request
both ways (tests/context/test_direct_routes.py).

Being a route, it runs inside everything the router does: the middleware (request id and
log line, API key, limits), the app's exception handlers, and the route's scope (its
template labels the metrics and the log line).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.datastructures import URLPath
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import Message, Receive, Scope, Send

# A handler answers the request (its path parameters and its body in hand), or raises
# NotPlain for the FastAPI route to answer it.
Handler = Callable[[Scope, dict[str, Any], bytes], Awaitable[Response]]

# Set on a request a fast route passed on: the router's next pass skips that route.
_PASSED = "compactd.fast_route_passed"


class NotPlain(Exception):
    """Raised by a handler (before any work) for a request that is not the plain form."""


class FastRoute(BaseRoute):
    """``route``'s plain form, answered by ``handler``; matched as ``route`` matches
    (its method only: another method is the FastAPI route's 405)."""

    def __init__(self, route: APIRoute, handler: Handler, *, reads_body: bool = False) -> None:
        self.route = route
        self.handler = handler
        self.reads_body = reads_body

    @property
    def path(self) -> str:
        return self.route.path

    @property
    def path_format(self) -> str:
        return self.route.path_format

    def url_path_for(self, name: str, /, **path_params: Any) -> URLPath:
        raise NoMatchFound(name, path_params)  # a URL names the FastAPI route

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] != "http" or scope.get(_PASSED) is self:
            return Match.NONE, {}
        match, child = self.route.matches(scope)
        return (Match.FULL, child) if match is Match.FULL else (Match.NONE, {})

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        if self.reads_body:
            body, receive = await _read_whole(receive)
        try:
            response = await self.handler(scope, scope["path_params"], body)
        except NotPlain:
            # The router again, past this route: the FastAPI route answers (the body
            # given to it again).
            scope[_PASSED] = self
            await scope["router"].app(scope, receive, send)
            return
        await response(scope, receive, send)


def install(app: FastAPI, routes: Iterable[FastRoute]) -> None:
    """``routes`` at the head of the app's router, in their order."""
    app.router.routes[:0] = list(routes)


def route_of(routes: Iterable[BaseRoute], endpoint: Callable[..., Any]) -> APIRoute:
    """The FastAPI route of ``endpoint`` among ``routes`` (a router's)."""
    return next(r for r in routes if isinstance(r, APIRoute) and r.endpoint is endpoint)


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
