"""What the client raises: a problem the API answered with, or no answer at all."""

from __future__ import annotations

from typing import Any

import httpx


class CompactdError(Exception):
    """The base of every error this client raises."""


class CompactdConnectionError(CompactdError):
    """compactd could not be reached (or the connection broke) on every attempt; the
    last transport error is the ``__cause__``."""


class ProblemError(CompactdError):
    """compactd answered 4xx or 5xx: the RFC 9457 problem document's fields.

    ``errors`` lists the offending fields of a 422 (``[{"field": ..., "detail": ...}]``);
    ``body`` is the whole document, extensions included. An answer that is not a
    problem document (a proxy's HTML page, say) gets ``type`` ``about:blank``, the
    status's reason phrase as ``title`` and the start of the body as ``detail``.
    """

    def __init__(
        self,
        *,
        status: int,
        type: str,
        title: str,
        detail: str | None,
        errors: list[dict[str, Any]] | None = None,
        body: dict[str, Any] | None = None,
        headers: httpx.Headers | None = None,
    ) -> None:
        super().__init__(f"{status} {title}: {detail}" if detail else f"{status} {title}")
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.errors = errors or []
        self.body = body or {}
        self.headers = headers or httpx.Headers()

    @classmethod
    def from_response(cls, response: httpx.Response) -> ProblemError:
        """The error for ``response``, of the subclass that names its status."""
        kind = _BY_STATUS.get(response.status_code, ProblemError)
        try:
            doc = response.json()
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or "title" not in doc:
            return kind(
                status=response.status_code,
                type="about:blank",
                title=response.reason_phrase or "Error",
                detail=response.text[:500] or None,
                headers=response.headers,
            )
        errors = doc.get("errors")
        return kind(
            status=int(doc.get("status", response.status_code)),
            type=str(doc.get("type", "about:blank")),
            title=str(doc["title"]),
            detail=None if doc.get("detail") is None else str(doc["detail"]),
            errors=errors if isinstance(errors, list) else None,
            body=doc,
            headers=response.headers,
        )


class NotFoundError(ProblemError):
    """404: no such session or compaction (or it belongs to another tenant)."""


class ConflictError(ProblemError):
    """409: a duplicate session id, or a compaction that cannot be cancelled now."""


class PreconditionFailedError(ProblemError):
    """412: ``if_match`` named a version that is no longer the session's."""


class InvalidRequestError(ProblemError):
    """422: the request's content is invalid; ``errors`` names the fields."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    404: NotFoundError,
    409: ConflictError,
    412: PreconditionFailedError,
    422: InvalidRequestError,
}
