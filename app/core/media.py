"""What a route takes, for the app-wide checks of every request (app.main): whether it
takes any input at all, and whether a body was sent as JSON.

A body sent to a JSON route without a JSON ``Content-Type`` (none, ``text/plain``, or
curl's default ``application/x-www-form-urlencoded`` for ``-d``) is a 415 that says so,
rather than FastAPI's reading it as bytes and refusing it as "not a valid dictionary".
JSON is ``application/json`` or any ``application/*+json``, with any parameters
(``charset=utf-8``): what FastAPI itself parses as JSON.
"""

from __future__ import annotations

from fastapi.dependencies.utils import get_flat_params
from fastapi.routing import APIRoute
from starlette.routing import BaseRoute

from app.core.errors import UnsupportedMediaType


def is_json(content_type: str | None) -> bool:
    """``content_type`` names JSON (``application/json``, ``application/*+json``), with
    or without parameters."""
    if not content_type:
        return False
    media = content_type.partition(";")[0].strip().lower()
    kind, _, subtype = media.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def takes_input(route: BaseRoute) -> bool:
    """Whether the route declares any parameter (path, query, header, cookie) or body;
    one that takes none (``/healthz``, ``/metrics``) has nothing to refuse as invalid.
    Worked out once per route (routes are not hashable: kept on the route itself)."""
    if not isinstance(route, APIRoute):
        return True
    known: bool | None = route.__dict__.get(_TAKES_INPUT)
    if known is None:
        known = bool(get_flat_params(route.dependant)) or route.body_field is not None
        route.__dict__[_TAKES_INPUT] = known
    return known


_TAKES_INPUT = "_compactd_takes_input"


def require_json_body(route: BaseRoute | None, content_type: str | None, body: bytes) -> None:
    """A 415 for a body sent to a route that reads a JSON body, without a JSON
    ``Content-Type``. An empty body is left to the route's own validation."""
    if not body or not isinstance(route, APIRoute) or route.body_field is None:
        return
    if is_json(content_type):
        return
    got = f"`{content_type}`" if content_type else "no Content-Type"
    raise UnsupportedMediaType(
        f"the body must be JSON, sent with `Content-Type: application/json` (got {got})",
        errors=[{"field": "Content-Type", "detail": "must be application/json"}],
    )
