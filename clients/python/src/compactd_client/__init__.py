"""A small typed client for compactd, sync (:class:`Compactd`) and async
(:class:`AsyncCompactd`), with retries that store a retried append once."""

from compactd_client._async import AsyncCompactd
from compactd_client._base import DEFAULT_URL, KEY_HEADER, SESSION_HEADER
from compactd_client._sync import Compactd
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
    "Compactd",
    "CompactdConnectionError",
    "CompactdError",
    "ConflictError",
    "InvalidRequestError",
    "NotFoundError",
    "PreconditionFailedError",
    "ProblemError",
]
