"""One summarising call to the upstream LLM, over the OpenAI or the Anthropic API.

:func:`complete` sends a system prompt and one user prompt, offers no tools, and
returns the text with its usage normalised. Every failure is an
:class:`UpstreamError` whose ``kind`` tells the worker what to do next (retried or
not), and an overflow of the model's window carries ``overflow`` so the caller can
shrink its input. The HTTP client is the caller's; each call has its own total
deadline; the API key never appears in an error; every string taken from the
upstream is made storable (:func:`storable`) at one boundary.

The kinds, when each is retried, and why are written in docs/how-it-works.md,
"The upstream call".
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime
from typing import Any, Final, Literal

import httpx
import orjson

from app.core import metrics
from app.engine.accounting.overflow_errors import OverflowMatch, classify

Api = Literal["openai", "anthropic"]
ErrorKind = Literal[
    "timeout", "connection", "rate_limited", "server", "client", "empty", "malformed"
]
MaxTokensField = Literal["max_tokens", "max_completion_tokens"]

ANTHROPIC_VERSION: Final = "2023-06-01"
MAX_EXCERPT_CHARS: Final = 500
MAX_RETRY_AFTER_SECONDS: Final = 300.0
_REDACTED: Final = "[redacted]"
_SECONDS: Final = re.compile(r"\d{1,10}(?:\.\d{1,6})?")
_OUT_OF_CREDIT: Final = ("insufficient_quota", "enforced_spend_limit_reached")
_TRUNCATED: Final = frozenset({"length", "max_tokens", "model_context_window_exceeded"})


@dataclass(frozen=True, slots=True, kw_only=True)
class UpstreamConfig:
    """Where and how to call the upstream LLM.

    ``base_url`` is the API root: ``https://api.openai.com/v1`` (posts go to
    ``{base_url}/chat/completions``) or ``https://api.anthropic.com/v1`` (posts go to
    ``{base_url}/messages``). ``timeout_seconds`` bounds the whole call.

    ``max_tokens_field`` names the OpenAI output cap. ``max_tokens`` is the default
    because every OpenAI-compatible server reads it (vLLM, llama.cpp, Ollama, LM Studio,
    DeepSeek, OpenRouter), while several of them silently ignore
    ``max_completion_tokens`` and then generate without bound. OpenAI's reasoning models
    (o1, o3, gpt-5) refuse ``max_tokens`` with a 400 and need ``max_completion_tokens``.
    ``temperature`` is sent only when set, since reasoning models refuse it too.
    """

    api: Api
    base_url: str
    timeout_seconds: float
    api_key: str | None = field(default=None, repr=False)
    max_output_tokens: int = 4096
    temperature: float | None = None
    max_tokens_field: MaxTokensField = "max_tokens"

    def __post_init__(self) -> None:
        if self.api not in ("openai", "anthropic"):
            raise ValueError(f"api must be 'openai' or 'anthropic', not {self.api!r}")
        try:
            url = httpx.URL(self.base_url)
        except httpx.InvalidURL:
            url = httpx.URL()
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError("base_url must be an absolute http(s) URL")
        if not (math.isfinite(self.timeout_seconds) and self.timeout_seconds > 0):
            raise ValueError("timeout_seconds must be a positive number")
        if self.max_output_tokens < 1:
            raise ValueError("max_output_tokens must be at least 1")
        if self.api_key is not None and (
            not self.api_key.isascii() or not self.api_key.isprintable() or " " in self.api_key
        ):
            # Checked here so that httpx never has to quote it in an encoding error.
            raise ValueError("api_key must be printable ASCII without spaces")
        if self.max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            raise ValueError("max_tokens_field must be 'max_tokens' or 'max_completion_tokens'")

    @property
    def url(self) -> str:
        path = "chat/completions" if self.api == "openai" else "messages"
        return f"{self.base_url.rstrip('/')}/{path}"


def storable(text: str) -> str:
    """``text`` as Postgres can store it: NUL characters dropped and lone surrogates
    replaced by ``?``, as the summary text always was; anything else is kept."""
    if "\x00" in text:
        text = text.replace("\x00", "")
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


@dataclass(frozen=True, slots=True)
class Completion:
    """The upstream's answer.

    ``usage`` has ``input_tokens`` (the whole prompt, cached parts included) and
    ``output_tokens`` (reasoning included) when the upstream reported them, and
    ``cache_read_tokens``, ``cache_write_tokens`` and ``reasoning_tokens`` when it
    reported those. ``finish_reason`` is the API's own word (``stop``, ``length``,
    ``end_turn``, ``max_tokens``...).
    """

    text: str
    model: str
    usage: dict[str, int]
    finish_reason: str | None

    def __post_init__(self) -> None:
        # Each string came from the upstream and will be stored: cleaned here, once.
        object.__setattr__(self, "text", storable(self.text))
        object.__setattr__(self, "model", storable(self.model))
        if self.finish_reason is not None:
            object.__setattr__(self, "finish_reason", storable(self.finish_reason))
        usage = {storable(k): v for k, v in self.usage.items()}
        object.__setattr__(self, "usage", usage)

    @property
    def truncated(self) -> bool:
        """Whether generation stopped at the output cap rather than by choice."""
        return self.finish_reason in _TRUNCATED


class UpstreamError(Exception):
    """A call to the upstream LLM failed; ``kind`` and ``retryable`` say how.

    ``status`` is the upstream's HTTP status when there was one. ``retry_after`` is
    the delay in seconds the upstream asked for (``retry-after-ms`` or
    ``Retry-After``), for :func:`backoff_delay` to use as a floor. ``overflow`` is set
    only when the upstream said the prompt is too long for the model's context window.
    """

    def __init__(
        self,
        kind: ErrorKind,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        retryable: bool,
        overflow: OverflowMatch | None = None,
    ) -> None:
        # Quoted from the upstream, and recorded on the job: cleaned here, once.
        message = storable(message)
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.retryable = retryable
        self.overflow = overflow

    def __repr__(self) -> str:
        return (
            f"UpstreamError(kind={self.kind!r}, status={self.status!r}, "
            f"retryable={self.retryable!r}, message={self.message!r})"
        )


async def complete(
    http: httpx.AsyncClient, config: UpstreamConfig, *, model: str, system: str, prompt: str
) -> Completion:
    """Ask the upstream for one completion of ``prompt`` under ``system``.

    Raises :class:`UpstreamError`, and nothing else, on any failure. Each call is
    counted in ``compactd_upstream_calls`` by its outcome: ok or the failure's kind.
    """
    started = time.perf_counter()
    outcome = "ok"
    try:
        return await _complete(http, config, model=model, system=system, prompt=prompt)
    except UpstreamError as error:
        outcome = error.kind
        raise
    finally:
        metrics.UPSTREAM_CALLS.labels(config.api, outcome).inc()
        metrics.UPSTREAM_SECONDS.labels(config.api).observe(time.perf_counter() - started)


async def _complete(
    http: httpx.AsyncClient, config: UpstreamConfig, *, model: str, system: str, prompt: str
) -> Completion:
    headers = _headers(config)
    body = _encode(_payload(config, model=model, system=system, prompt=prompt))
    try:
        async with asyncio.timeout(config.timeout_seconds):
            response = await http.post(
                config.url,
                content=body,
                headers=headers,
                timeout=httpx.Timeout(config.timeout_seconds),
            )
    except (TimeoutError, httpx.TimeoutException):
        raise _error(
            config, "timeout", f"no complete answer within {config.timeout_seconds:g} s"
        ) from None
    except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError) as exc:
        raise _error(config, "client", f"the request could not be sent: {_describe(exc)}") from None
    except httpx.TooManyRedirects as exc:
        raise _error(config, "client", _describe(exc)) from None
    except httpx.DecodingError as exc:
        raise _error(config, "malformed", f"undecodable body: {_describe(exc)}") from None
    except httpx.HTTPError as exc:
        # NetworkError (refused, reset, read/write failed), RemoteProtocolError (closed
        # mid-response), ProxyError and anything httpx adds later.
        raise _error(config, "connection", _describe(exc)) from None
    if 200 <= response.status_code < 300:
        return _parse_success(config, model, response)
    raise _status_error(config, response)


# Requests


def _headers(config: UpstreamConfig) -> dict[str, str]:
    headers = {"content-type": "application/json", "accept": "application/json"}
    if config.api == "anthropic":
        headers["anthropic-version"] = ANTHROPIC_VERSION
        if config.api_key:
            headers["x-api-key"] = config.api_key
    elif config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    return headers


def _payload(config: UpstreamConfig, *, model: str, system: str, prompt: str) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": model}
    if config.api == "anthropic":
        payload["max_tokens"] = config.max_output_tokens
        if system:
            payload["system"] = system
        payload["messages"] = [{"role": "user", "content": prompt}]
    else:
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        payload["messages"] = messages
        payload[config.max_tokens_field] = config.max_output_tokens
        payload["stream"] = False
    if config.temperature is not None:
        payload["temperature"] = config.temperature
    return payload


def _encode(payload: dict[str, Any]) -> bytes:
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        # A lone surrogate (legal in a Python str, not in UTF-8) from a stored message.
        return orjson.dumps(_scrub_surrogates(payload))


def _scrub_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {k: _scrub_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub_surrogates(v) for v in value]
    return value


# Successful responses


def _parse_success(config: UpstreamConfig, model: str, response: httpx.Response) -> Completion:
    status = response.status_code
    try:
        data = _loads(response.content)
    except ValueError:
        raise _error(
            config,
            "malformed",
            f"HTTP {status} body is not JSON: {_excerpt(config, response.content)}",
            status=status,
        ) from None
    if not isinstance(data, dict):
        raise _malformed(config, status, "the body is not a JSON object", response)
    if data.get("type") == "error" or (
        data.get("error") and not data.get("choices") and not data.get("content")
    ):
        # OpenRouter and some proxies report upstream failures inside a 200.
        raise _status_error(config, response, embedded=data)
    if config.api == "anthropic":
        text, finish_reason = _anthropic_text(config, response, data)
        usage = _anthropic_usage(data.get("usage"))
    else:
        text, finish_reason = _openai_text(config, response, data)
        usage = _openai_usage(data.get("usage"))
    answered = data.get("model")
    return Completion(
        text=text,
        model=answered if isinstance(answered, str) and answered else model,
        usage=usage,
        finish_reason=finish_reason,
    )


def _openai_text(
    config: UpstreamConfig, response: httpx.Response, data: dict[str, Any]
) -> tuple[str, str | None]:
    status = response.status_code
    choices = data.get("choices")
    if choices is None or choices == []:
        raise _error(config, "empty", "the answer has no choices", status=status)
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise _malformed(config, status, "choices is not a list of objects", response)
    choice = choices[0]
    finish_reason = _str_or_none(choice.get("finish_reason"))
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _malformed(config, status, "choices[0].message is not an object", response)
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):  # content parts, as some compatible servers send
        text = "".join(
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        )
    else:
        raise _malformed(config, status, "choices[0].message.content is not text", response)
    refusal = message.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        raise _error(
            config, "empty", f"the model refused: {_excerpt(config, refusal)}", status=status
        )
    if finish_reason == "content_filter":
        raise _error(config, "empty", "the answer was withheld by a content filter", status=status)
    return _usable(config, text, finish_reason, status), finish_reason


def _anthropic_text(
    config: UpstreamConfig, response: httpx.Response, data: dict[str, Any]
) -> tuple[str, str | None]:
    status = response.status_code
    content = data.get("content")
    finish_reason = _str_or_none(data.get("stop_reason"))
    if content is None:
        content = []
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise _malformed(config, status, "content is not a list of blocks", response)
    if finish_reason == "refusal":
        raise _error(config, "empty", "the model refused (stop_reason refusal)", status=status)
    # Thinking and tool_use blocks carry no summary; only text blocks do.
    text = "".join(
        block["text"]
        for block in content
        if block.get("type") == "text" and isinstance(block.get("text"), str)
    )
    return _usable(config, text, finish_reason, status), finish_reason


def _usable(config: UpstreamConfig, text: str, finish_reason: str | None, status: int) -> str:
    stripped = text.strip()
    if not stripped:
        why = f" (finish_reason {finish_reason})" if finish_reason else ""
        raise _error(config, "empty", f"the answer has no text{why}", status=status)
    return stripped


def _openai_usage(usage: object) -> dict[str, int]:
    if not isinstance(usage, dict):
        return {}
    out = _counts(
        input_tokens=usage.get("prompt_tokens"), output_tokens=usage.get("completion_tokens")
    )
    prompt_details = usage.get("prompt_tokens_details")
    if isinstance(prompt_details, dict):
        out.update(_counts(cache_read_tokens=prompt_details.get("cached_tokens")))
    completion_details = usage.get("completion_tokens_details")
    if isinstance(completion_details, dict):
        out.update(_counts(reasoning_tokens=completion_details.get("reasoning_tokens")))
    return out


def _anthropic_usage(usage: object) -> dict[str, int]:
    if not isinstance(usage, dict):
        return {}
    raw = _counts(
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        cache_read_tokens=usage.get("cache_read_input_tokens"),
        cache_write_tokens=usage.get("cache_creation_input_tokens"),
    )
    if "input_tokens" in raw:
        # Anthropic counts cached prompt tokens apart; the prompt is all three.
        raw["input_tokens"] += raw.get("cache_read_tokens", 0) + raw.get("cache_write_tokens", 0)
    return raw


# Counts are stored as JSON, whose encoder writes 64-bit integers only: a larger one
# (the standard library's fallback parser keeps any size) is not a count we can use.
_MAX_COUNT = 2**63 - 1


def _counts(**values: object) -> dict[str, int]:
    return {
        name: value
        for name, value in values.items()
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _MAX_COUNT
    }


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


# Error responses


def _status_error(
    config: UpstreamConfig, response: httpx.Response, *, embedded: dict[str, Any] | None = None
) -> UpstreamError:
    text = response.content.decode("utf-8", "replace")
    retry_after = parse_retry_after(response.headers, now=time.time())
    if embedded is None:
        status: int | None = response.status_code
        data = _json_object(text)
        label = f"HTTP {status}"
    else:
        # OpenRouter puts the failing provider's status in error.code; without one, the
        # failure is read as the upstream's own (a 5xx).
        data = embedded
        status = _embedded_status(embedded)
        label = f"HTTP {response.status_code} carrying an error"
    detail = f"{label}: {_error_detail(config, data, text)}"
    overflow = classify(status, text)
    if overflow.overflow:
        return _error(
            config, "client", detail, status=status, retry_after=retry_after, overflow=overflow
        )
    effective = 500 if status is None else status
    if effective >= 500:
        return _error(config, "server", detail, status=status, retry_after=retry_after)
    if effective == 429:
        out_of_credit = any(marker in text for marker in _OUT_OF_CREDIT)
        return _error(
            config,
            "rate_limited",
            detail,
            status=status,
            retry_after=retry_after,
            retryable=not out_of_credit,
        )
    if effective == 408:
        return _error(config, "timeout", detail, status=status, retry_after=retry_after)
    if 300 <= effective < 400:
        detail = f"HTTP {status}: redirects are not followed; check base_url"
    return _error(config, "client", detail, status=status, retry_after=retry_after)


def _embedded_status(data: dict[str, Any]) -> int | None:
    error = data.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599:
        return code
    return None


def _loads(raw: bytes | str) -> Any:
    """JSON as the upstream sent it. orjson refuses a lone surrogate (``\\ud800``); the
    standard library reads it (it is cleaned before anything is stored), so one odd
    character does not turn a good reply into a malformed one. ValueError otherwise."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        try:
            return json.loads(raw)
        except RecursionError:
            raise ValueError("nested too deep") from None


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        data = _loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _error_detail(config: UpstreamConfig, data: dict[str, Any] | None, text: str) -> str:
    """The error's own message (with its type or code) when the body has one, else an
    excerpt of the body."""
    if data is not None:
        error = data.get("error")
        if isinstance(error, dict):
            message = error.get("message")
            code = error.get("code") or error.get("type")
            if isinstance(message, str) and message:
                prefix = f"({code}) " if isinstance(code, str) and code else ""
                return _excerpt(config, prefix + message)
        elif isinstance(error, str) and error:
            return _excerpt(config, error)
        for key in ("message", "detail"):
            value = data.get(key)
            if isinstance(value, str) and value:
                return _excerpt(config, value)
    return _excerpt(config, text) if text.strip() else "(empty body)"


# Building errors


_DEFAULT_RETRYABLE: Final[dict[ErrorKind, bool]] = {
    "timeout": True,
    "connection": True,
    "rate_limited": True,
    "server": True,
    "client": False,
    "empty": True,
    "malformed": True,
}


def _error(
    config: UpstreamConfig,
    kind: ErrorKind,
    detail: str,
    *,
    status: int | None = None,
    retry_after: float | None = None,
    retryable: bool | None = None,
    overflow: OverflowMatch | None = None,
) -> UpstreamError:
    message = _redact(config, f"{config.api} upstream {kind}: {detail}")
    return UpstreamError(
        kind,
        message,
        status=status,
        retry_after=retry_after,
        retryable=_DEFAULT_RETRYABLE[kind] if retryable is None else retryable,
        overflow=overflow,
    )


def _malformed(
    config: UpstreamConfig, status: int, what: str, response: httpx.Response
) -> UpstreamError:
    return _error(
        config,
        "malformed",
        f"{what}: {_excerpt(config, response.content)}",
        status=status,
    )


def _describe(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _excerpt(config: UpstreamConfig, raw: bytes | str) -> str:
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    # Redact before cutting, so that a cut cannot leave half a key behind.
    text = " ".join(_redact(config, text).split())
    if len(text) > MAX_EXCERPT_CHARS:
        return text[: MAX_EXCERPT_CHARS - 1] + "…"
    return text


def _redact(config: UpstreamConfig, text: str) -> str:
    if config.api_key:
        return text.replace(config.api_key, _REDACTED)
    return text


# Retry timing


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds to wait, from ``retry-after-ms`` (OpenAI, Azure) or else ``Retry-After``
    (delay-seconds or an HTTP-date, RFC 9110 §10.2.3), relative to ``now`` (Unix time).

    ``None`` when absent or unreadable. Look-ups are by lower-case name, so pass an
    ``httpx.Headers`` (case-insensitive) or a mapping with lower-case keys.
    """
    millis = (headers.get("retry-after-ms") or "").strip()
    if _SECONDS.fullmatch(millis):
        return float(millis) / 1000
    value = (headers.get("retry-after") or "").strip()
    if not value:
        return None
    if _SECONDS.fullmatch(value):
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    # An HTTP-date is always GMT; a naive result means the zone was "-0000".
    stamp = when.timestamp() if when.tzinfo else when.replace(tzinfo=UTC).timestamp()
    return max(0.0, stamp - now)


def backoff_delay(
    attempt: int,
    *,
    base: float,
    cap: float,
    retry_after: float | None,
    rand: Callable[[], float],
) -> float:
    """Seconds to wait before retrying after the ``attempt``-th failure (1-based).

    Full jitter over a capped exponential: uniform in ``[0, min(cap, base * 2**(attempt
    - 1)))`` using ``rand()`` in ``[0, 1)``. The upstream's ``retry_after``, when
    given, is a floor (itself capped at ``MAX_RETRY_AFTER_SECONDS``, so a hostile or
    mistaken header cannot park a job for a day). So the result is at most
    ``max(cap, MAX_RETRY_AFTER_SECONDS)`` and never below the capped ``retry_after``.
    """
    if base < 0 or cap < 0 or not (math.isfinite(base) and math.isfinite(cap)):
        raise ValueError("base and cap must be finite and non-negative")
    exponent = min(max(attempt, 1) - 1, 64)  # 2.0**64 already dwarfs any cap
    ceiling = min(cap, base * 2.0**exponent)
    r = rand()
    r = min(max(r, 0.0), 1.0) if math.isfinite(r) else 0.0
    delay = r * ceiling
    if retry_after is not None and not math.isnan(retry_after) and retry_after > 0:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_SECONDS))
    return delay
