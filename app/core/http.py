"""HTTP plumbing: the problem+json handlers, and work sized off the event loop (the
request body limit is :mod:`app.core.limits`'s)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import anyio.to_thread
import asyncpg
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from sqlalchemy.exc import DBAPIError
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.core.database import UNAVAILABLE, unavailable, unavailable_cause
from app.core.errors import PROBLEM_JSON, ProblemError

log = logging.getLogger("compactd")

T = TypeVar("T")

# A validation problem lists this many errors, then says how many it left out: a body
# of a million bad items once took minutes to answer, with a 128 MB list of errors.
MAX_REPORTED_ERRORS = 20

# Work on more than this many bytes of a request runs in a worker thread, off the event
# loop: walking or tokenizing a megabyte costs 0.1-0.5 s of CPU, and on the loop it
# would hold every other request, /healthz included, as long. Below it, a thread's
# hand-off costs more than the work.
OFF_LOOP_BYTES = 64 * 1024


async def run_sized(size: int, work: Callable[..., T], *args: Any) -> T:
    """``work(*args)``: in a worker thread when ``size`` (bytes of input) is over
    ``OFF_LOOP_BYTES``, else here. A thread holding the GIL still lets the loop run
    every switch interval (5 ms), and tiktoken releases it while it encodes."""
    if size <= OFF_LOOP_BYTES:
        return work(*args)
    return await anyio.to_thread.run_sync(work, *args)


def problem_response(error: ProblemError, instance: str | None = None) -> Response:
    return Response(
        orjson.dumps(error.body(instance)),
        status_code=error.status,
        media_type=PROBLEM_JSON,
        headers=error.headers,
    )


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out


class _ValidationProblem(ProblemError):
    status, type, title = 422, "invalid-request", "Invalid request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> Response:
        return problem_response(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = []
        every = exc.errors()
        for e in every[:MAX_REPORTED_ERRORS]:
            msg = e["msg"]
            loc = tuple(e["loc"])
            if e.get("type") == "json_invalid":
                # FastAPI's loc is ("body", <offset>): name the body, keep the offset in the text.
                msg = (
                    f"the body is not valid JSON ({e.get('ctx', {}).get('error', 'parse error')}"
                    f" at character {loc[-1]})"
                )
                loc = ("body",)
            field = _field(loc[1:] if loc[:1] == ("body",) and len(loc) > 1 else loc)
            named = (e.get("ctx") or {}).get("field")
            if e.get("type") == "field_error" and isinstance(named, str):
                # A model-wide validator that refused one field names it (a
                # provider's usage object, read whole: app.budget.schemas).
                field = named if field == "body" else f"{field}.{named}"
            errors.append({"field": field, "detail": msg})
        detail = "; ".join(f"{x['field']}: {x['detail']}" for x in errors)
        extensions: dict[str, Any] = {"errors": errors}
        if omitted := len(every) - len(errors):
            detail += f"; and {omitted:,} more errors not listed"
            extensions["errors_omitted"] = omitted
        return problem_response(_ValidationProblem(detail, **extensions), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        detail, extensions = str(exc.detail), {}
        if isinstance(exc.__cause__, UnicodeDecodeError):
            # FastAPI parses the JSON body before any dependency runs, so invalid
            # UTF-8 surfaces here as a bare "error parsing the body": say what it is.
            bad = exc.__cause__
            byte = bad.object[bad.start : bad.start + 1]
            detail = f"the body is not valid UTF-8 (byte {bad.start} is {byte!r})"
            extensions = {"errors": [{"field": "body", "detail": "invalid UTF-8"}]}
        elif isinstance(exc.__cause__, RecursionError):
            detail = "the body nests arrays and objects too deep to parse"
            extensions = {"errors": [{"field": "body", "detail": "nested too deep"}]}
        error = ProblemError(detail, headers=dict(exc.headers or {}), **extensions)
        error.status = exc.status_code
        error.type = {400: "bad-request", 404: "not-found", 405: "method-not-allowed"}.get(
            exc.status_code, "http-error"
        )
        error.title = {400: "Bad request", 404: "Not found", 405: "Method not allowed"}.get(
            exc.status_code, "HTTP error"
        )
        return problem_response(error, request.url.path)

    async def _unavailable(request: Request, exc: Exception) -> Response:
        """The database cannot be reached (down, restarting, full, or it dropped the
        connection): a 503 with Retry-After. Any other database error is a bug: 500."""
        if (cause := unavailable_cause(exc)) is None:
            raise exc
        log.warning("database unavailable: %s", exc)
        return problem_response(unavailable(cause), request.url.path)

    # DBAPIError covers SQLAlchemy's OperationalError and InterfaceError; the rest
    # are what the driver or the pool raise on the paths SQLAlchemy does not wrap.
    for error in (DBAPIError, *UNAVAILABLE, asyncpg.InterfaceError):
        app.add_exception_handler(error, _unavailable)
