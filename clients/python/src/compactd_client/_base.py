"""What the sync and the async client share: configuration, the request a
:class:`~compactd_client._calls.Call` makes, the retry rule and the proxy helpers. Only
the sending (and the sleeping between attempts) differs."""

from __future__ import annotations

import email.utils
import os
import random
import time
import uuid
from typing import Any, Literal

import httpx

from compactd_client._calls import Call
from compactd_client.errors import CompactdConnectionError, ProblemError

DEFAULT_URL = "http://127.0.0.1:8080"
SESSION_HEADER = "X-Compactd-Session"
KEY_HEADER = "X-Compactd-Key"  # on the proxy, whose Authorization is the provider's
Provider = Literal["openai", "anthropic"]
# An event stream's read timeout, at least: four of the server's keep-alive comments.
STREAM_READ_SECONDS = 60.0

# Failures where the request may not have arrived, or its answer was lost: worth another
# attempt. (A bad URL or an unsupported scheme is not.)
RETRYABLE_ERRORS = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds, from either of its forms (seconds, or an HTTP date)."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class BaseClient:
    """Configuration and the retry rule, the same for both clients."""

    def __init__(
        self,
        base_url: str | None,
        *,
        api_key: str | None,
        max_retries: int,
        backoff: float,
        max_backoff: float,
        max_retry_after: float,
    ) -> None:
        self.base_url = (base_url or os.environ.get("COMPACTD_URL") or DEFAULT_URL).rstrip("/")
        self.api_key = api_key if api_key is not None else os.environ.get("COMPACTD_API_KEY")
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.max_retry_after = max_retry_after

    # The proxy: used by the provider SDKs, not by this client.

    def proxy_base_url(self, provider: Provider) -> str:
        """The ``base_url`` to give the provider's SDK: ``OpenAI(base_url=...)`` (which
        adds ``/chat/completions``) or ``Anthropic(base_url=...)`` (which adds
        ``/v1/messages``)."""
        if provider == "openai":
            return f"{self.base_url}/proxy/openai/v1"
        if provider == "anthropic":
            return f"{self.base_url}/proxy/anthropic"
        raise ValueError(f"unknown provider {provider!r}: openai or anthropic")

    def proxy_headers(self, session_id: str) -> dict[str, str]:
        """The headers to add to the SDK's requests (``default_headers=...``): the session
        the conversation is stored in (created on first use with the request's model),
        and compactd's API key if there is one (the SDK's own key is the provider's)."""
        headers = {SESSION_HEADER: session_id}
        if self.api_key:
            headers[KEY_HEADER] = self.api_key
        return headers

    # Requests

    def _build_request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]
    ) -> httpx.Request:
        """The request of ``call``, built once and sent as it is by every attempt."""
        return http.build_request(
            call.method,
            self.base_url + call.path,
            params=call.params,
            json=call.json,
            headers=self._headers(call),
            timeout=self._timeout(http.timeout, call.wait),
        )

    def _headers(self, call: Call[Any]) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if call.method == "POST":
            # One key per logical call, reused by every retry: the server stores a
            # retried append once and answers it with the first answer.
            headers["Idempotency-Key"] = call.idempotency_key or uuid.uuid4().hex
        if call.if_match is not None:
            if_match = call.if_match
            headers["If-Match"] = f'"{if_match}"' if isinstance(if_match, int) else if_match
        if call.headers:
            headers.update(call.headers)
        return headers

    def _timeout(self, http_timeout: httpx.Timeout, wait: float | None) -> httpx.Timeout:
        """The timeout of a request the server may hold ``wait`` seconds (a compaction
        asked to wait for its result): the client's, with time for the wait."""
        read = http_timeout.read
        if not wait or read is None:
            return http_timeout
        return httpx.Timeout(
            connect=http_timeout.connect,
            read=max(read, wait + 30.0),
            write=http_timeout.write,
            pool=http_timeout.pool,
        )

    def _stream_request(
        self, http: httpx.Client | httpx.AsyncClient, call: Call[Any]
    ) -> httpx.Request:
        """The request of an event stream: as :meth:`_build_request`, with a read timeout
        that outlasts the server's keep-alive comments (every 15 s), so that only a dead
        connection times out."""
        read = http.timeout.read
        timeout = httpx.Timeout(
            connect=http.timeout.connect,
            read=None if read is None else max(read, STREAM_READ_SECONDS),
            write=http.timeout.write,
            pool=http.timeout.pool,
        )
        return http.build_request(
            call.method,
            self.base_url + call.path,
            params=call.params,
            headers=self._headers(call),
            timeout=timeout,
        )

    def _delay(self, attempt: int, response: httpx.Response | None) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or None when the failure is
        final: not retryable, retries spent, or a ``Retry-After`` longer than we wait."""
        if attempt >= self.max_retries:
            return None
        if response is not None and not (
            response.status_code == 429 or response.status_code >= 500
        ):
            return None
        # Capped exponential backoff with jitter; the server's Retry-After is a floor.
        delay = min(self.max_backoff, self.backoff * 2.0**attempt) * random.uniform(0.5, 1.0)
        wanted = retry_after_seconds(response.headers) if response is not None else None
        if wanted is not None:
            if wanted > self.max_retry_after:
                return None
            delay = max(delay, wanted)
        return delay

    def _retry_delay(
        self, call: Call[Any], attempt: int, failure: httpx.Response | Exception
    ) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after ``failure`` (an answer
        that is not a success, or a retryable error); raises it when it is final."""
        response = failure if isinstance(failure, httpx.Response) else None
        delay = self._delay(attempt, response)
        if delay is not None:
            return delay
        if isinstance(failure, httpx.Response):
            raise ProblemError.from_response(failure)
        raise CompactdConnectionError(
            f"compactd at {self.base_url} did not answer {call.method} {call.path}: {failure!r}"
        ) from failure
