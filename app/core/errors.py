"""One error base, rendered as RFC 9457 ``application/problem+json``.

Services raise these; a single handler turns them (and request validation
errors) into problem documents. A 500 is only ever a bug.
"""

from __future__ import annotations

from typing import Any

PROBLEM_JSON = "application/problem+json"


class ProblemError(Exception):
    """A client-visible failure with an HTTP status, a type slug and a title."""

    status: int = 400
    type: str = "bad-request"
    title: str = "Bad request"

    def __init__(
        self, detail: str, *, headers: dict[str, str] | None = None, **extensions: Any
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.headers = headers or {}
        self.extensions = extensions

    def body(self, instance: str | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "type": f"https://compactd.dev/problems/{self.type}",
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            doc["instance"] = instance
        doc.update(self.extensions)
        return doc


class BadRequest(ProblemError):
    """The request could not be read at all (not UTF-8, not JSON)."""


class Unauthorized(ProblemError):
    """No API key, or one that is unknown, malformed or revoked."""

    status, type, title = 401, "unauthorized", "Unauthorized"


class NotFound(ProblemError):
    """The resource does not exist (or belongs to another tenant)."""

    status, type, title = 404, "not-found", "Not found"


class Conflict(ProblemError):
    """The request conflicts with the current state (a duplicate id, for example)."""

    status, type, title = 409, "conflict", "Conflict"


class RequestTimeout(ProblemError):
    """The request's head or body did not arrive in time (the connection then closes)."""

    status, type, title = 408, "request-timeout", "Request timeout"


class PreconditionFailed(ProblemError):
    """``If-Match`` named a version that is no longer current."""

    status, type, title = 412, "precondition-failed", "Precondition failed"


class PayloadTooLarge(ProblemError):
    """The request body is over the configured limit."""

    status, type, title = 413, "payload-too-large", "Payload too large"


class UnsupportedMediaType(ProblemError):
    """A body sent to a JSON route without a JSON ``Content-Type`` (none, ``text/plain``,
    a form): it is not read as JSON on a guess."""

    status, type, title = 415, "unsupported-media-type", "Unsupported media type"


class UnprocessableContent(ProblemError):
    """The body is well-formed JSON but its content is invalid."""

    status, type, title = 422, "invalid-request", "Invalid request"


class ServiceUnavailable(ProblemError):
    """A dependency (the database) cannot be reached right now; retry later."""

    status, type, title = 503, "service-unavailable", "Service unavailable"


def invalid(field: str, detail: str) -> UnprocessableContent:
    """A 422 naming the offending field."""
    return UnprocessableContent(f"{field}: {detail}", errors=[{"field": field, "detail": detail}])
