"""Shared OpenAPI pieces: the problem document and per-route error responses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from app.core.errors import PROBLEM_JSON
from app.core.http import MAX_REPORTED_ERRORS


class FieldError(BaseModel):
    field: str
    detail: str


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[FieldError] | None = Field(
        None, description=f"The fields that were rejected (the first {MAX_REPORTED_ERRORS})."
    )
    errors_omitted: int | None = Field(
        None, description="How many more rejected fields there were than are listed."
    )
    current_version: int | None = Field(None, description="On 412: the session's current version.")


_DESCRIPTIONS = {
    400: "The request could not be read.",
    404: "The session (or route) does not exist.",
    409: "The request conflicts with the current state.",
    412: "If-Match does not name the current version.",
    413: "The body is over the size limit.",
    415: "The body was not sent as JSON (`Content-Type: application/json`).",
    422: "The body or a parameter is invalid; nothing was stored.",
    503: "The database is unavailable; retry after the Retry-After delay.",
}


def problems(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each status rendered as problem+json."""
    return {
        code: {"model": Problem, "description": _DESCRIPTIONS[code], "content": {PROBLEM_JSON: {}}}
        for code in (*codes, 503)
    }


def link(path: str, method: str, description: str, **parameters: str) -> dict[str, Any]:
    """An OpenAPI link to the operation at ``method path``, its parameters taken from
    this response (runtime expressions such as ``$response.body#/id``)."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {
        "operationRef": f"#/paths/{pointer}/{method.lower()}",
        "parameters": parameters,
        "description": description,
    }


def _add_app_wide_responses(method: str, operation: dict[str, Any]) -> None:
    """Statuses any route can answer, whatever its own ``responses=`` says.

    The app-wide dependency refuses a NUL in any query parameter, declared or not
    (422), on a route that takes any input (one that takes none, such as ``/healthz``,
    is not checked: no 422); on POST, PUT and PATCH it reads the body, which must be
    UTF-8 (400), sent as JSON to a route that reads one (415), and the body limit
    applies (413).
    """
    responses: dict[str, Any] = operation.setdefault("responses", {})
    takes_input = bool(operation.get("parameters")) or "requestBody" in operation
    codes = [422] if takes_input else []
    if method.lower() in ("post", "put", "patch"):
        codes += [400, 413]
        if "application/json" in operation.get("requestBody", {}).get("content", {}):
            codes.append(415)
    for code in codes:
        responses.setdefault(str(code), {"description": _DESCRIPTIONS[code]})
    operation["responses"] = dict(sorted(responses.items()))


def install_problem_openapi(app: FastAPI, *also: Callable[[dict[str, Any]], None]) -> None:
    """Document every 4xx/5xx as ``application/problem+json`` with the Problem schema,
    then apply ``also`` (further edits of the generated spec, e.g. the auth scheme).

    FastAPI files a ``responses=`` model under ``application/json`` and adds its own
    422 (``HTTPValidationError``) to routes with parameters; this service sends
    neither shape, so clients generated from the spec would parse errors wrongly.
    """
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        spec = generate()
        if fresh:
            for path, item in spec.get("paths", {}).items():
                if path.startswith("/proxy/"):
                    continue  # the providers' own error shapes, as the proxy documents them
                for method, operation in item.items():
                    _add_app_wide_responses(method, operation)
                    for code, response in operation.get("responses", {}).items():
                        if code[:1] in ("4", "5"):
                            response["content"] = {
                                PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}
                            }
                            if code == "422":
                                response["description"] = _DESCRIPTIONS[422]
            schemas = spec.get("components", {}).get("schemas", {})
            for unused in ("HTTPValidationError", "ValidationError"):
                schemas.pop(unused, None)
            for edit in also:
                edit(spec)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
