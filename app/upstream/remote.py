"""A remote summarization endpoint (the ``compaction.remote_endpoint``
config: docs/configuration.md, "Per-session config").

A session whose config sets ``compaction.remote_endpoint`` has every summarizer
request of its compactions sent there instead of to the upstream LLM: ``POST
<url>`` with the JSON body ``{"systemPrompt": ..., "prompt": ...}``, answered
with a JSON object holding at least ``{"summary": "<text>"}`` (other keys are
ignored). The endpoint chooses its own model; compactd sends none.

Its failures are :class:`~app.upstream.client.UpstreamError` of the same kinds as
the upstream LLM's, so that the summarizer retries, backs off and falls back to
the extractive summary the same way:

=============  =========  ====================================================
kind           retryable  when
=============  =========  ====================================================
timeout        yes        no whole answer within ``timeout_seconds``; 408
connection     yes        refused, reset, or closed before the answer ended
rate_limited   yes        429
server         yes        5xx
client         no         any other 4xx, a redirect, a URL that cannot be sent or
                          that the outbound policy refuses (app.core.outbound)
malformed      no         a 2xx whose body is not JSON, not an object, has no
                          string ``summary``, or is larger than
                          ``max_response_bytes``
=============  =========  ====================================================

A 4xx or 5xx whose body says the prompt overflowed a context window is
``client`` with ``overflow`` set, as from the upstream LLM: the summarizer then
sends the history in smaller pieces.

The URL may carry a credential (in its query or user part): no message, log line
or stored record quotes it; they name the endpoint by its host
(:attr:`RemoteEndpoint.label`, ``remote:<host>``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any, Final

import httpx
import orjson

from app.core import metrics
from app.core.outbound import refused_cause
from app.engine.accounting.overflow_errors import OverflowMatch, classify
from app.upstream.client import (
    MAX_EXCERPT_CHARS,
    Completion,
    ErrorKind,
    UpstreamError,
    parse_retry_after,
)

MAX_URL_CHARS: Final = 2_048
MAX_RESPONSE_BYTES: Final = 1_000_000
LABEL_PREFIX: Final = "remote:"
_API: Final = "remote"  # the metrics' api label


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a remote endpoint, or None: it must be an absolute
    ``http`` or ``https`` URL with a host, at most :data:`MAX_URL_CHARS` long."""
    if len(url) > MAX_URL_CHARS:
        return f"must be at most {MAX_URL_CHARS} characters"
    if url != url.strip() or any(c.isspace() or not c.isprintable() for c in url):
        return "must not contain spaces or control characters"
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "is not a valid URL"
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return "must be an absolute http:// or https:// URL"
    return None


def label_of(url: str) -> str:
    """``remote:<host>`` (with its port when the URL names one): what a summary made
    there records as its model. Never the path or query, which may hold a key."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return f"{LABEL_PREFIX}?"
    host = parsed.host or "?"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    return f"{LABEL_PREFIX}{host}" + (f":{parsed.port}" if parsed.port is not None else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class RemoteEndpoint:
    """Where to POST the summarizer's requests, and how long to wait for each."""

    url: str
    timeout_seconds: float
    max_response_bytes: int = MAX_RESPONSE_BYTES

    def __post_init__(self) -> None:
        problem = url_problem(self.url)
        if problem is not None:
            raise ValueError(f"url {problem}")
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise ValueError("timeout_seconds must be a positive number")
        if self.max_response_bytes < 1:
            raise ValueError("max_response_bytes must be at least 1")

    def __repr__(self) -> str:
        return f"RemoteEndpoint({self.label!r}, timeout_seconds={self.timeout_seconds!r})"

    @property
    def label(self) -> str:
        return label_of(self.url)


class _TooLarge(Exception):
    pass


async def summarize_remote(
    http: httpx.AsyncClient, endpoint: RemoteEndpoint, *, system: str, prompt: str
) -> Completion:
    """One summary from ``endpoint``: its ``summary`` as the completion's text, and
    the endpoint's label as its model (no usage is reported).

    Raises :class:`UpstreamError`, and nothing else, on any failure; each call is
    counted in ``compactd_upstream_calls`` (api ``remote``) by its outcome."""
    started = time.perf_counter()
    outcome = "ok"
    try:
        return await _summarize(http, endpoint, system=system, prompt=prompt)
    except UpstreamError as error:
        outcome = error.kind
        raise
    finally:
        metrics.UPSTREAM_CALLS.labels(_API, outcome).inc()
        metrics.UPSTREAM_SECONDS.labels(_API).observe(time.perf_counter() - started)


async def _summarize(
    http: httpx.AsyncClient, endpoint: RemoteEndpoint, *, system: str, prompt: str
) -> Completion:
    body = _encode({"systemPrompt": system, "prompt": prompt})
    headers = {"content-type": "application/json", "accept": "application/json"}
    seconds = endpoint.timeout_seconds
    try:
        async with (
            asyncio.timeout(seconds),
            http.stream(
                "POST", endpoint.url, content=body, headers=headers, timeout=httpx.Timeout(seconds)
            ) as response,
        ):
            raw = await _read(response, endpoint.max_response_bytes)
    except (TimeoutError, httpx.TimeoutException):
        raise _error(endpoint, "timeout", f"no complete answer within {seconds:g} s") from None
    except _TooLarge:
        raise _error(
            endpoint,
            "malformed",
            f"the answer is larger than {endpoint.max_response_bytes} bytes",
            retryable=False,
        ) from None
    except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError) as exc:
        raise _error(
            endpoint, "client", f"the request could not be sent: {_describe(exc)}"
        ) from None
    except httpx.TooManyRedirects as exc:
        raise _error(endpoint, "client", _describe(exc)) from None
    except httpx.DecodingError as exc:
        raise _error(
            endpoint, "malformed", f"undecodable body: {_describe(exc)}", retryable=False
        ) from None
    except httpx.HTTPError as exc:
        if (refused := refused_cause(exc)) is not None:
            # The outbound policy's refusal (app.core.outbound): no retry reaches it.
            raise _error(endpoint, "client", str(refused), retryable=False) from None
        # Refused, reset, closed mid-answer, a proxy's failure.
        raise _error(endpoint, "connection", _describe(exc)) from None
    status = response.status_code
    if 200 <= status < 300:
        return _parse(endpoint, status, raw)
    raise _status_error(endpoint, response, raw)


async def _read(response: httpx.Response, limit: int) -> bytes:
    """The body, refused (:class:`_TooLarge`) as soon as it passes ``limit`` bytes:
    a huge or endless answer is never held whole."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(endpoint: RemoteEndpoint, status: int, raw: bytes) -> Completion:
    try:
        data = _loads(raw)
    except ValueError:
        raise _error(
            endpoint,
            "malformed",
            f"HTTP {status} body is not JSON: {_excerpt(endpoint, raw)}",
            status=status,
            retryable=False,
        ) from None
    summary = data.get("summary") if isinstance(data, dict) else None
    if not isinstance(summary, str):
        raise _error(
            endpoint,
            "malformed",
            f'HTTP {status} body has no string "summary": {_excerpt(endpoint, raw)}',
            status=status,
            retryable=False,
        )
    return Completion(text=summary.strip(), model=endpoint.label, usage={}, finish_reason=None)


def _status_error(endpoint: RemoteEndpoint, response: httpx.Response, raw: bytes) -> UpstreamError:
    status = response.status_code
    text = raw.decode("utf-8", "replace")
    retry_after = parse_retry_after(response.headers, now=time.time())
    detail = f"HTTP {status}: {_excerpt(endpoint, raw) if text.strip() else '(empty body)'}"
    overflow = classify(status, text)
    if overflow.overflow:
        return _error(endpoint, "client", detail, status=status, overflow=overflow)
    kind: ErrorKind
    if status >= 500:
        kind = "server"
    elif status == 429:
        kind = "rate_limited"
    elif status == 408:
        kind = "timeout"
    else:
        kind = "client"
        if 300 <= status < 400:
            detail = f"HTTP {status}: redirects are not followed; check the endpoint's URL"
    return _error(endpoint, kind, detail, status=status, retry_after=retry_after)


_RETRYABLE: Final[dict[ErrorKind, bool]] = {
    "timeout": True,
    "connection": True,
    "rate_limited": True,
    "server": True,
    "client": False,
    "empty": True,
    "malformed": False,
}


def _error(
    endpoint: RemoteEndpoint,
    kind: ErrorKind,
    detail: str,
    *,
    status: int | None = None,
    retry_after: float | None = None,
    retryable: bool | None = None,
    overflow: OverflowMatch | None = None,
) -> UpstreamError:
    message = _redact(endpoint, f"{endpoint.label} {kind}: {detail}")
    return UpstreamError(
        kind,
        message,
        status=status,
        retry_after=retry_after,
        retryable=_RETRYABLE[kind] if retryable is None else retryable,
        overflow=overflow,
    )


def _encode(payload: dict[str, str]) -> bytes:
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        # A lone surrogate (legal in a Python str, not in UTF-8) from a stored message.
        return orjson.dumps(
            {k: v.encode("utf-8", "replace").decode("utf-8") for k, v in payload.items()}
        )


def _loads(raw: bytes) -> Any:
    """JSON as sent; a lone surrogate that orjson refuses is read by the standard
    library (the summary is made storable by :class:`Completion`). ValueError else."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except RecursionError:
            raise ValueError("nested too deep") from None


def _describe(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _excerpt(endpoint: RemoteEndpoint, raw: bytes) -> str:
    text = " ".join(_redact(endpoint, raw.decode("utf-8", "replace")).split())
    if len(text) > MAX_EXCERPT_CHARS:
        return text[: MAX_EXCERPT_CHARS - 1] + "…"
    return text


def _redact(endpoint: RemoteEndpoint, text: str) -> str:
    """``text`` without the endpoint's URL (nor its query, should it be quoted alone)."""
    text = text.replace(endpoint.url, endpoint.label)
    query = httpx.URL(endpoint.url).query.decode("ascii", "replace")
    if len(query) >= 8:
        text = text.replace(query, "[redacted]")
    return text
