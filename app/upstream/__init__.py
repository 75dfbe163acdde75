"""Clients for the upstream LLM that writes compaction summaries (OpenAI or Anthropic API)."""

from app.upstream.client import (
    Completion,
    ErrorKind,
    UpstreamConfig,
    UpstreamError,
    backoff_delay,
    complete,
    parse_retry_after,
)

__all__ = [
    "Completion",
    "ErrorKind",
    "UpstreamConfig",
    "UpstreamError",
    "backoff_delay",
    "complete",
    "parse_retry_after",
]
