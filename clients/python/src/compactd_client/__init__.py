"""A small typed client for compactd, sync (:class:`Compactd`) and async
(:class:`AsyncCompactd`), with retries that store a retried append once; event streams
that resume by themselves; and :func:`verify_webhook` for a webhook's deliveries."""

from compactd_client._async import AsyncCompactd
from compactd_client._base import DEFAULT_URL, KEY_HEADER, SESSION_HEADER
from compactd_client._events import AsyncEventStream, EventStream
from compactd_client._sync import Compactd
from compactd_client._webhooks import verify_webhook
from compactd_client.errors import (
    CompactdConnectionError,
    CompactdError,
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PreconditionFailedError,
    ProblemError,
)

__all__ = [
    "DEFAULT_URL",
    "KEY_HEADER",
    "SESSION_HEADER",
    "AsyncCompactd",
    "AsyncEventStream",
    "Compactd",
    "CompactdConnectionError",
    "CompactdError",
    "ConflictError",
    "EventStream",
    "InvalidRequestError",
    "NotFoundError",
    "PreconditionFailedError",
    "ProblemError",
    "verify_webhook",
]
