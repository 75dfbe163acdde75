"""A real HTTP server that plays the upstream LLM in tests, scripted per test.

One uvicorn server (a small Starlette app) runs per test session in a background
thread on a free loopback port. Each test gets its own :class:`Upstream`: a URL prefix
of its own on that server, with its own script and its own record of requests, so
tests share no state and start in no time.

Routes, under the test's ``upstream.url`` (``http://127.0.0.1:PORT/<id>/v1``):

* ``POST /chat/completions`` answers in the OpenAI chat-completions shape;
* ``POST /messages`` answers in the Anthropic Messages shape;
* ``POST /responses`` answers in the OpenAI Responses shape (``input`` items in,
  ``output`` items out: a ``message`` with ``output_text``, ``function_call`` items, or
  ``custom_tool_call`` items for a tool the request declares of type ``custom``).

A request with ``"stream": true`` gets its answer as server-sent events, exactly as
each API streams it: OpenAI ``chat.completion.chunk`` objects (``delta`` content and
``tool_calls``, the usage-only chunk when ``stream_options.include_usage`` asks for it,
``data: [DONE]``); Anthropic ``message_start``, ``content_block_start``, ``ping``,
``content_block_delta`` (``text_delta``, ``input_json_delta``), ``content_block_stop``,
``message_delta`` and ``message_stop``; Responses ``response.created``,
``response.in_progress``, per output item ``response.output_item.added``, its
``response.content_part.added``, ``response.output_text.delta`` and ``.done``,
``response.content_part.done`` (or ``response.function_call_arguments.delta`` and
``.done``), ``response.output_item.done``, then ``response.completed`` with the whole
response and its usage.

Requests are first checked as the real APIs do (JSON with ``model`` and
``messages``; Anthropic's ``anthropic-version`` header and ``max_tokens``; the key
when ``upstream.api_key`` is set; the prompt's size when ``upstream.context_limit`` is
set, refused with the API's own context-overflow error), and refused with a 400 or 401
in the API's error shape without consuming the script. Otherwise each request takes the
next scripted action (:class:`Reply`, :class:`ToolCalls`, :class:`Status`,
:class:`Empty`, :class:`Garbage`, :class:`Hang`, :class:`Drip`, :class:`Close`,
:class:`BreakStream`, :class:`SlowStream`); when the script is spent, it gets a
deterministic summary built from the request (:func:`default_summary`), or, with
``upstream.behaviour = "agent"``, the demo's agent-like answer (:func:`agent_action`);
``upstream.respond``, when set, decides the answer from the request before either.

Register the fixtures in ``tests/conftest.py``::

    from tests.upstream_server import upstream_fixture, upstream_server_fixture  # noqa: F401

and take ``upstream: Upstream`` in a test.

**Demo mode.** ``python -m tests.upstream_server --port 8900`` serves the agent-like
script on its own, without a key, at ``http://127.0.0.1:8900/v1`` (OpenAI base URL)
and ``http://127.0.0.1:8900`` (Anthropic base URL), streaming too: to a request that
offers tools and whose last message is not a tool result, a call of its first tool
with arguments made from the tool's schema; otherwise a short text answer.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

try:
    import pytest
except ImportError:  # pragma: no cover - the demo mode needs only the service's dependencies
    pytest = None  # type: ignore[assignment]

# Scripted actions


@dataclass(frozen=True, slots=True)
class Reply:
    """200 with ``text`` as the answer. ``usage`` replaces the reported usage, in the
    API's own shape (``prompt_tokens``... or ``input_tokens``...)."""

    text: str
    usage: Mapping[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None


@dataclass(frozen=True, slots=True)
class Status:
    """Answer ``code`` with ``body`` (a JSON object, or text sent as is) and ``headers``.
    Without a body, the API's own error shape for that status is sent."""

    code: int
    body: Mapping[str, Any] | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Empty:
    """200 in the API's shape with no text (``content: ""`` or ``content: []``)."""


@dataclass(frozen=True, slots=True)
class Garbage:
    """200 labelled JSON whose body is not JSON (an HTML page from a proxy, say)."""

    body: str = "<html><body><h1>502 Bad Gateway</h1></body></html>"


@dataclass(frozen=True, slots=True)
class Hang:
    """Wait ``seconds`` (or until the client gives up), then perform ``then`` (by
    default the default summary). Other requests are served meanwhile."""

    seconds: float
    then: Action | None = None


@dataclass(frozen=True, slots=True)
class Drip:
    """Send the answer ``then`` (by default the default summary) ``chunk`` bytes at a
    time, ``interval`` seconds apart: never silent long enough to trip a read timeout,
    yet slow in total."""

    interval: float
    chunk: int = 16
    then: Action | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """Start a 200 that announces a longer body, send part of it, then drop the
    connection: the client sees the peer close mid-response."""


@dataclass(frozen=True, slots=True)
class ToolCalls:
    """200 with tool calls: ``calls`` are ``(name, arguments)`` pairs, made in parallel
    when there are several, after ``text`` if given. ``usage`` as for :class:`Reply`."""

    calls: tuple[tuple[str, Mapping[str, Any] | str], ...]
    text: str | None = None
    usage: Mapping[str, Any] | None = None
    #: The calls' ids (by default made from the request); arguments given as a string
    #: are sent as they are (OpenAI) or parsed (Anthropic's ``input``).
    ids: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class BreakStream:
    """A streamed answer (``then``, by default a short text) cut off after ``events`` of
    its events: the connection drops before the stream's end; ``clean``, the response
    ends there as if that were all (a well-formed end, with no finish reason)."""

    events: int = 3
    then: Reply | ToolCalls | None = None
    clean: bool = False


@dataclass(frozen=True, slots=True)
class SlowStream:
    """A streamed answer (``then``) with ``interval`` seconds between its events."""

    interval: float
    then: Reply | ToolCalls


Action: TypeAlias = (
    Reply | ToolCalls | Status | Empty | Garbage | Hang | Drip | Close | BreakStream | SlowStream
)


# Real error bodies, for Status(...)

OPENAI_CONTEXT_OVERFLOW: dict[str, Any] = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your "
        "messages resulted in 9000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC_CONTEXT_OVERFLOW: dict[str, Any] = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 208310 tokens > 200000 maximum",
    },
}


def context_overflow(api: str) -> Status:
    """The 400 each API sends when the prompt does not fit the model's window."""
    body = ANTHROPIC_CONTEXT_OVERFLOW if api == "anthropic" else OPENAI_CONTEXT_OVERFLOW
    return Status(400, body=body)


_OPENAI_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: (
        "requests",
        "rate_limit_exceeded",
        "Rate limit reached for gpt-4o-mini on requests per min (RPM): Limit 3, Used 3, "
        "Requested 1. Please try again in 20s.",
    ),
    500: (
        "server_error",
        None,
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
_ANTHROPIC_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    404: ("not_found_error", "model: not found"),
    413: ("request_too_large", "Request exceeds the maximum size"),
    429: (
        "rate_limit_error",
        "This request would exceed the rate limit for your organization of 50 requests per minute.",
    ),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


def error_body(api: str, code: int, message: str | None = None) -> dict[str, Any]:
    """The error object ``api`` sends with ``code``."""
    if api != "anthropic":
        kind, err_code, default = _OPENAI_ERRORS.get(code, ("server_error", None, "Error."))
        return {
            "error": {"message": message or default, "type": kind, "param": None, "code": err_code}
        }
    kind, default = _ANTHROPIC_ERRORS.get(code, ("api_error", "Error."))
    return {
        "type": "error",
        "error": {"type": kind, "message": message or default},
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy",
    }


# What the server saw


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request as it arrived. ``path`` is below the test's prefix (``/v1/messages``),
    header names are lower-case, ``json`` is the parsed body (``None`` if not JSON) and
    ``at`` is ``time.monotonic()`` on arrival; ``query`` the query string (``beta=true``)."""

    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    at: float
    query: str = ""


class Upstream:
    """One test's view of the upstream server: its URL, script and record."""

    def __init__(self, url: str, *, keep: int | None = None) -> None:
        self.url = url
        #: When set, requests must carry it (Bearer or ``x-api-key``) or get a 401.
        self.api_key: str | None = None
        #: When the script is spent: "summary" (:func:`default_summary`) or "agent"
        #: (:func:`agent_action`, the demo's script).
        self.behaviour: str = "summary"
        #: When set, a request whose prompt is larger (:func:`prompt_tokens`) gets the
        #: API's context-overflow error, as a model with that window would answer.
        self.context_limit: int | None = None
        #: When set, decides the answer to a request the script has none for, from the API
        #: ("openai", "anthropic" or "responses") and the request's body; None falls
        #: through to ``behaviour``. Called on the server's thread: it must not block.
        self.respond: Callable[[str, dict[str, Any]], Action | None] | None = None
        self._lock = threading.Condition()
        self._script: deque[Action] = deque()
        # ``keep``: the demo server remembers its last requests only.
        self._requests: deque[RecordedRequest] = deque(maxlen=keep)

    def script(self, actions: Iterable[Action]) -> None:
        """Queue ``actions``, one per request in arrival order, after any queued."""
        with self._lock:
            self._script.extend(actions)

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    @property
    def pending(self) -> int:
        """Scripted actions not yet consumed."""
        with self._lock:
            return len(self._script)

    def wait_for(self, count: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until ``count`` requests have arrived (from a test, through
        ``asyncio.to_thread``); raises ``TimeoutError`` after ``timeout`` seconds."""
        with self._lock:
            if not self._lock.wait_for(lambda: len(self._requests) >= count, timeout):
                raise TimeoutError(f"{len(self._requests)} of {count} requests arrived")
            return list(self._requests)

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self._requests.append(request)
            self._lock.notify_all()

    def _next(self) -> Action | None:
        with self._lock:
            return self._script.popleft() if self._script else None


class UpstreamServer:
    """The shared server: hands each test an :class:`Upstream` with its own prefix."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._upstreams: dict[str, Upstream] = {}
        self._ids = itertools.count(1)
        #: What the routes without a test prefix (``/v1/...``) play: the demo's upstream.
        self.default: Upstream | None = None

    def new(self) -> Upstream:
        key = f"t{next(self._ids)}"
        upstream = Upstream(f"{self.root}/{key}/v1")
        with self._lock:
            self._upstreams[key] = upstream
        return upstream

    def drop(self, upstream: Upstream) -> None:
        with self._lock:
            for key, known in list(self._upstreams.items()):
                if known is upstream:
                    del self._upstreams[key]

    def get(self, key: str) -> Upstream | None:
        with self._lock:
            return self._upstreams.get(key)


# The app


def default_summary(prompt: str) -> str:
    """The answer when the script is spent: depends only on the prompt, and
    quotes none of it (a reply that echoes the prompt is refused as unusable)."""
    digest = hashlib.sha256(prompt.encode()).hexdigest()[:12]
    return (
        f"## Goal\nContinue the task (prompt {digest}).\n\n"
        f"## Progress\nSummary of a prompt of {len(prompt)} characters."
    )


def _prompt_text(body: dict[str, Any]) -> str:
    parts: list[str] = []
    for message in body.get("messages", []):
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
            )
    return "\n".join(parts)


def _json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(data), status_code=status, media_type="application/json", headers=headers
    )


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's size as this server counts it (about four characters a token, of
    the messages, system prompt and tools as JSON): another tokenizer than
    compactd's, as a real provider's is."""
    sized = [body.get("messages"), body.get("system"), body.get("tools")]
    if "input" in body:  # the Responses API's history and prompt
        sized += [body.get("input"), body.get("instructions")]
    return max(1, len(orjson.dumps(sized)) // 4)


def _ids(body: dict[str, Any], prefix: str, count: int) -> list[str]:
    """Tool call ids, unique to the request (its history) and the call's position."""
    seed = hashlib.sha256(orjson.dumps(body.get("messages", body.get("input")))).hexdigest()
    return [
        f"{prefix}{hashlib.sha256(f'{seed}:{i}'.encode()).hexdigest()[:20]}" for i in range(count)
    ]


def _digest(data: Any) -> str:
    return hashlib.sha256(orjson.dumps(data)).hexdigest()[:24]


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@dataclass(frozen=True, slots=True)
class _Answer:
    """One answer, in either API's shape, whole or streamed."""

    api: str
    body: dict[str, Any]
    text: str | None
    calls: tuple[tuple[str, Mapping[str, Any] | str], ...] = ()
    usage: Mapping[str, Any] | None = None
    model: str | None = None
    finish_reason: str | None = None
    ids: tuple[str, ...] | None = None

    @property
    def call_ids(self) -> list[str]:
        if self.ids is not None:
            return list(self.ids)
        prefix = "toolu_" if self.api == "anthropic" else "call_"
        return _ids(self.body, prefix, len(self.calls))

    @staticmethod
    def arguments(args: Mapping[str, Any] | str) -> str:
        return args if isinstance(args, str) else orjson.dumps(args).decode()

    @staticmethod
    def input(args: Mapping[str, Any] | str) -> dict[str, Any]:
        if isinstance(args, str):
            parsed: dict[str, Any] = orjson.loads(args) if args.strip() else {}
            return parsed
        return dict(args)

    def default_usage(self) -> dict[str, Any]:
        output = max(
            1, len(orjson.dumps([self.text, [self.arguments(a) for _, a in self.calls]])) // 4
        )
        prompt = prompt_tokens(self.body)
        if self.api == "responses":
            return {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": output,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + output,
            }
        if self.api == "openai":
            return {
                "prompt_tokens": prompt,
                "completion_tokens": output,
                "total_tokens": prompt + output,
            }
        return {"input_tokens": prompt, "output_tokens": output}

    def whole(self) -> dict[str, Any]:
        model = self.model or str(self.body.get("model"))
        usage = dict(self.usage or self.default_usage())
        ids = self.call_ids
        if self.api == "responses":
            return self._responses_whole(model, usage, ids)
        if self.api == "openai":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": self.text,
                "refusal": None,
                "annotations": [],
            }
            if self.calls:
                message["tool_calls"] = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": name, "arguments": self.arguments(args)},
                    }
                    for call_id, (name, args) in zip(ids, self.calls, strict=True)
                ]
            return {
                "id": "chatcmpl-upstream-test",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "logprobs": None,
                        "finish_reason": self.finish_reason
                        or ("tool_calls" if self.calls else "stop"),
                    }
                ],
                "usage": usage,
                "service_tier": "default",
                "system_fingerprint": "fp_upstream_test",
            }
        content: list[dict[str, Any]] = [{"type": "text", "text": self.text}] if self.text else []
        content += [
            {"type": "tool_use", "id": call_id, "name": name, "input": self.input(args)}
            for call_id, (name, args) in zip(ids, self.calls, strict=True)
        ]
        return {
            # Unique to the request, as the API's are: Claude Code merges the assistant
            # messages of one id into one turn.
            "id": f"msg_{_digest(self.body.get('messages'))}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": self.finish_reason or ("tool_use" if self.calls else "end_turn"),
            "stop_sequence": None,
            "usage": usage,
        }

    def events(self) -> list[bytes]:
        """The answer as the API streams it, one server-sent event each."""
        if self.api == "responses":
            return self._responses_events()
        return self._openai_events() if self.api == "openai" else self._anthropic_events()

    def _custom_tools(self) -> set[str]:
        tools = self.body.get("tools")
        return {
            t["name"]
            for t in (tools if isinstance(tools, list) else [])
            if isinstance(t, dict) and t.get("type") == "custom" and isinstance(t.get("name"), str)
        }

    def _responses_whole(self, model: str, usage: dict[str, Any], ids: list[str]) -> dict[str, Any]:
        digest = _digest(self.body.get("input"))
        output: list[dict[str, Any]] = []
        if self.text is not None and (self.text or not self.calls):
            text = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            output.append(
                {
                    "id": "msg_upstream_test",
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [text],
                }
            )
        custom = self._custom_tools()
        for i, (call_id, (name, args)) in enumerate(zip(ids, self.calls, strict=True)):
            if name in custom:
                text_input = args if isinstance(args, str) else str(args.get("input", ""))
                output.append(
                    {
                        "id": f"ctc_{digest}{i}",
                        "type": "custom_tool_call",
                        "status": "completed",
                        "call_id": call_id,
                        "name": name,
                        "input": text_input,
                    }
                )
            else:
                output.append(
                    {
                        "id": f"fc_{digest}{i}",
                        "type": "function_call",
                        "status": "completed",
                        "arguments": self.arguments(args),
                        "call_id": call_id,
                        "name": name,
                    }
                )
        return {
            "id": f"resp_{digest}",
            "object": "response",
            "created_at": int(time.time()),
            "status": "completed",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": self.body.get("instructions"),
            "max_output_tokens": self.body.get("max_output_tokens"),
            "model": model,
            "output": output,
            "parallel_tool_calls": self.body.get("parallel_tool_calls", True),
            "previous_response_id": self.body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": self.body.get("store", True),
            "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": self.body.get("tool_choice", "auto"),
            "tools": self.body.get("tools") or [],
            "top_p": 1.0,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
        }

    def _responses_events(self) -> list[bytes]:
        whole = self.whole()
        out: list[bytes] = []

        def event(data: dict[str, Any]) -> None:
            data = {**data, "sequence_number": len(out)}
            out.append(f"event: {data['type']}\ndata: ".encode() + orjson.dumps(data) + b"\n\n")

        pending = {**whole, "status": "in_progress", "output": [], "usage": None}
        event({"type": "response.created", "response": pending})
        event({"type": "response.in_progress", "response": pending})
        for index, item in enumerate(whole["output"]):
            at = {"item_id": item["id"], "output_index": index}
            if item["type"] == "message":
                event(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "status": "in_progress", "content": []},
                    }
                )
                part = item["content"][0]
                empty = {**part, "text": ""}
                event(
                    {"type": "response.content_part.added", **at, "content_index": 0, "part": empty}
                )
                for piece in _pieces(part["text"], 12):
                    event(
                        {
                            "type": "response.output_text.delta",
                            **at,
                            "content_index": 0,
                            "delta": piece,
                            "logprobs": [],
                        }
                    )
                event(
                    {
                        "type": "response.output_text.done",
                        **at,
                        "content_index": 0,
                        "text": part["text"],
                        "logprobs": [],
                    }
                )
                event(
                    {"type": "response.content_part.done", **at, "content_index": 0, "part": part}
                )
            else:
                field_name = "input" if item["type"] == "custom_tool_call" else "arguments"
                kind = (
                    "response.custom_tool_call_input"
                    if item["type"] == "custom_tool_call"
                    else "response.function_call_arguments"
                )
                event(
                    {
                        "type": "response.output_item.added",
                        "output_index": index,
                        "item": {**item, "status": "in_progress", field_name: ""},
                    }
                )
                for piece in _pieces(item[field_name], 8):
                    event({"type": f"{kind}.delta", **at, "delta": piece})
                event({"type": f"{kind}.done", **at, field_name: item[field_name]})
            event({"type": "response.output_item.done", "output_index": index, "item": item})
        event({"type": "response.completed", "response": whole})
        return out

    def _openai_events(self) -> list[bytes]:
        whole = self.whole()
        options = self.body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        base = {
            "id": "chatcmpl-upstream-test",
            "object": "chat.completion.chunk",
            "created": whole["created"],
            "model": whole["model"],
            "service_tier": "default",
            "system_fingerprint": whole["system_fingerprint"],
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data: dict[str, Any] = {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                data["usage"] = None
            return b"data: " + orjson.dumps(data) + b"\n\n"

        out: list[bytes] = []
        calls = whole["choices"][0]["message"].get("tool_calls") or []
        if self.text:
            out.append(chunk({"role": "assistant", "content": "", "refusal": None}))
            out.extend(chunk({"content": piece}) for piece in _pieces(self.text, 12))
        for i, call in enumerate(calls):
            head = {
                "index": i,
                "id": call["id"],
                "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""},
            }
            if i == 0 and not self.text:
                out.append(chunk({"role": "assistant", "content": None, "tool_calls": [head]}))
            else:
                out.append(chunk({"tool_calls": [head]}))
            out.extend(
                chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                for piece in _pieces(call["function"]["arguments"], 8)
            )
        if not out:
            out.append(chunk({"role": "assistant", "content": "", "refusal": None}))
        out.append(chunk({}, whole["choices"][0]["finish_reason"]))
        if include_usage:
            out.append(
                b"data: " + orjson.dumps({**base, "choices": [], "usage": whole["usage"]}) + b"\n\n"
            )
        out.append(b"data: [DONE]\n\n")
        return out

    def _anthropic_events(self) -> list[bytes]:
        whole = self.whole()

        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"

        usage = whole["usage"]
        start_usage = {
            "input_tokens": usage.get("input_tokens", 0),
            "cache_creation_input_tokens": usage.get("cache_creation_input_tokens", 0),
            "cache_read_input_tokens": usage.get("cache_read_input_tokens", 0),
            "output_tokens": 1,
        }
        message = {**whole, "content": [], "stop_reason": None, "usage": start_usage}
        out = [event("message_start", {"type": "message_start", "message": message})]
        for index, block in enumerate(whole["content"]):
            if block["type"] == "text":
                start: dict[str, Any] = {"type": "text", "text": ""}
                deltas = [{"type": "text_delta", "text": p} for p in _pieces(block["text"], 12)]
            else:
                start = {**block, "input": {}}
                arguments = orjson.dumps(block["input"]).decode()
                deltas = [{"type": "input_json_delta", "partial_json": ""}] + [
                    {"type": "input_json_delta", "partial_json": p} for p in _pieces(arguments, 8)
                ]
            out.append(
                event(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": start},
                )
            )
            if index == 0:
                out.append(event("ping", {"type": "ping"}))
            out.extend(
                event(
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": d},
                )
                for d in deltas
            )
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": index}))
        out.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": usage.get("output_tokens", 0)},
                },
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        return out

    def response(
        self, cut_after: int | None = None, interval: float = 0.0, *, clean: bool = False
    ) -> Response:
        if self.body.get("stream") is not True:
            return _json_response(self.whole())
        return _StreamResponse(self.events(), cut_after, interval, clean=clean)


def _reply(api: str, body: dict[str, Any], reply: Reply) -> Response:
    return _Answer(
        api, body, reply.text, (), reply.usage, reply.model, reply.finish_reason
    ).response()


class _DropConnection(Exception):
    """Raised after a partial response so that uvicorn closes the socket."""


class _CutResponse(Response):
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        partial = b'{"id": "cut", "choices": [{"index": 0, "message": {"content": "Summ'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"4096")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": partial, "more_body": True})
        raise _DropConnection


class _StreamResponse(Response):
    """Server-sent events, each sent as it is made; ``cut_after`` drops the connection
    after that many of them (``clean``: ends the response there, well-formed)."""

    def __init__(
        self,
        events: list[bytes],
        cut_after: int | None = None,
        interval: float = 0.0,
        *,
        clean: bool = False,
    ) -> None:
        self.events, self.cut_after, self.interval = events, cut_after, interval
        self.clean = clean
        self.status_code = 200

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for i, data in enumerate(self.events):
            if self.cut_after is not None and i >= self.cut_after:
                if self.clean:
                    break
                raise _DropConnection
            await send({"type": "http.response.body", "body": data, "more_body": True})
            await asyncio.sleep(self.interval)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _DripResponse(Response):
    def __init__(self, inner: Response, interval: float, chunk: int) -> None:
        self.inner, self.interval, self.chunk = inner, interval, max(1, chunk)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inner = self.inner
        start = {"type": "http.response.start", "status": inner.status_code}
        await send({**start, "headers": inner.raw_headers})
        body = bytes(inner.body)
        for offset in range(0, len(body), self.chunk):
            await asyncio.sleep(self.interval)
            piece = body[offset : offset + self.chunk]
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _QuietDrop(logging.Filter):
    """uvicorn logs the exception it closed the connection for; this one is on purpose."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _DropConnection))


async def _wait(request: Request, seconds: float) -> None:
    """Sleep ``seconds``, or less if the client disconnects first."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    waiter = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()


async def _perform(
    api: str,
    request: Request,
    body: dict[str, Any],
    action: Action | None,
    behaviour: str = "summary",
) -> Response:
    match action:
        case None if behaviour == "agent":
            return await _perform(api, request, body, agent_action(api, body))
        case None:
            return _reply(api, body, Reply(default_summary(_prompt_text(body))))
        case Reply():
            return _reply(api, body, action)
        case ToolCalls(calls=calls, text=text, usage=usage, ids=ids):
            return _Answer(api, body, text, calls, usage, ids=ids).response()
        case BreakStream(events=events, then=then, clean=clean):
            answer = _answer_of(api, body, then or Reply("This answer will not arrive whole."))
            return answer.response(cut_after=events, clean=clean)
        case SlowStream(interval=interval, then=then):
            return _answer_of(api, body, then).response(interval=interval)
        case Status(code=code, body=payload, headers=headers):
            if payload is None:
                payload = error_body(api, code)
            if isinstance(payload, str):
                return Response(payload, status_code=code, headers=dict(headers))
            return _json_response(dict(payload), code, headers)
        case Empty():
            return _reply(api, body, Reply(""))
        case Garbage(body=text):
            return Response(text, status_code=200, media_type="application/json")
        case Hang(seconds=seconds, then=then):
            await _wait(request, seconds)
            return await _perform(api, request, body, then)
        case Drip(interval=interval, chunk=chunk, then=then):
            inner = await _perform(api, request, body, then)
            return _DripResponse(inner, interval, chunk)
        case Close():
            return _CutResponse()
    raise AssertionError(f"unknown action {action!r}")


def _answer_of(api: str, body: dict[str, Any], then: Reply | ToolCalls) -> _Answer:
    if isinstance(then, Reply):
        return _Answer(api, body, then.text, (), then.usage)
    return _Answer(api, body, then.text, then.calls, then.usage, ids=then.ids)


def _invalid(api: str, request: Request, body: Any, upstream: Upstream) -> Response | None:
    """The 400 or 401 the real API would send for this request, if any."""
    if upstream.api_key is not None:
        if api != "anthropic":
            sent = request.headers.get("authorization")
            expected = f"Bearer {upstream.api_key}"
        else:
            sent = request.headers.get("x-api-key")
            expected = upstream.api_key
        if sent != expected:
            return _json_response(error_body(api, 401), 401)
    if api == "anthropic" and not request.headers.get("anthropic-version"):
        return _json_response(error_body(api, 400, "anthropic-version: header is required"), 400)
    if not isinstance(body, dict):
        return _json_response(error_body(api, 400, "The body is not a JSON object."), 400)
    if api == "responses":
        if not isinstance(body.get("model"), str) or not isinstance(body.get("input"), str | list):
            return _json_response(error_body(api, 400, "model and input are required."), 400)
    elif not isinstance(body.get("model"), str) or not isinstance(body.get("messages"), list):
        return _json_response(error_body(api, 400, "model and messages are required."), 400)
    if api == "anthropic" and not isinstance(body.get("max_tokens"), int):
        return _json_response(error_body(api, 400, "max_tokens: Field required"), 400)
    limit = upstream.context_limit
    if limit is not None and (size := prompt_tokens(body)) > limit:
        if api != "anthropic":
            message = (
                f"This model's maximum context length is {limit} tokens. However, your "
                f"messages resulted in {size} tokens. Please reduce the length of the messages."
            )
            overflow = error_body(api, 400, message)
            overflow["error"].update(param="messages", code="context_length_exceeded")
            return _json_response(overflow, 400)
        message = f"prompt is too long: {size} tokens > {limit} maximum"
        return _json_response(error_body(api, 400, message), 400)
    return None


# The demo's agent-like script

_PLAUSIBLE_STRINGS = {
    "path": "README.md",
    "file": "README.md",
    "filename": "README.md",
    "file_path": "README.md",
    "command": "ls -la",
    "cmd": "ls -la",
    "query": "context window",
    "q": "context window",
    "pattern": "TODO",
    "url": "https://example.com",
    "city": "Paris",
    "location": "Paris",
    "language": "python",
    "text": "hello",
    "content": "hello",
}


def plausible(schema: Any, name: str = "value") -> Any:
    """A value for a JSON schema: its default or first example or enum value, else one
    made from its type (and, for a string, its property's name)."""
    if not isinstance(schema, dict):
        return f"example {name}"
    if "default" in schema:
        return schema["default"]
    for key in ("examples", "enum"):
        if isinstance(schema.get(key), list) and schema[key]:
            return schema[key][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return plausible(schema[key][0], name)
    kind = schema.get("type", "object" if "properties" in schema else "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") or {}
        wanted = schema.get("required") or list(properties)
        return {key: plausible(properties.get(key), key) for key in wanted if isinstance(key, str)}
    if kind == "array":
        return [plausible(schema["items"], name)] if isinstance(schema.get("items"), dict) else []
    if kind == "integer":
        return int(schema.get("minimum", 1))
    if kind == "number":
        return float(schema.get("minimum", 1.0))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return _PLAUSIBLE_STRINGS.get(name.lower(), f"example {name}")


def _first_tool(api: str, tools: Any) -> tuple[str, Any] | None:
    if not isinstance(tools, list) or not tools or not isinstance(tools[0], dict):
        return None
    tool: dict[str, Any] = tools[0]
    if api != "anthropic":
        fn: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
        name, schema = fn.get("name"), fn.get("parameters")
    else:
        name, schema = tool.get("name"), tool.get("input_schema")
    return (name, schema) if isinstance(name, str) and name else None


def _last_is_tool_result(api: str, messages: list[Any]) -> bool:
    last = messages[-1] if messages else None
    if not isinstance(last, dict):
        return False
    if api == "openai":
        return last.get("role") == "tool"
    if api == "responses":
        return last.get("type") in ("function_call_output", "custom_tool_call_output")
    content = last.get("content")
    return (
        last.get("role") == "user"
        and isinstance(content, list)
        and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


def agent_action(api: str, body: dict[str, Any]) -> Reply | ToolCalls:
    """The demo's script: a call of the first tool offered, with arguments made from
    its schema, unless the last message is a tool result (or no tool is offered): then
    a short text answer."""
    messages = body.get("messages") or []
    if api == "responses":
        given = body.get("input")
        messages = given if isinstance(given, list) else [{"role": "user", "content": given}]
    tool = _first_tool(api, body.get("tools"))
    if tool is not None and not _last_is_tool_result(api, messages):
        name, schema = tool
        arguments = plausible(schema if isinstance(schema, dict) else {"type": "object"})
        return ToolCalls(((name, arguments if isinstance(arguments, dict) else {}),))
    if _last_is_tool_result(api, messages):
        return Reply(
            f"The tool answered ({len(orjson.dumps(messages[-1]))} bytes). "
            "That is all I needed: the task is done."
        )
    return Reply(f"Hello from the scripted model: I read {len(messages)} messages.")


def make_app(server: UpstreamServer) -> Starlette:
    """The Starlette app behind :class:`UpstreamServer`."""

    async def handle(request: Request) -> Response:
        key = request.path_params.get("key")
        upstream = server.default if key is None else server.get(key)
        if upstream is None:
            return _json_response({"error": {"message": "no such test upstream"}}, 404)
        path = request.url.path
        api = (
            "openai"
            if path.endswith("/chat/completions")
            else "responses"
            if path.endswith("/responses")
            else "anthropic"
        )
        raw = await request.body()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        prefix = "" if key is None else f"/{key}"
        upstream._record(
            RecordedRequest(
                path=request.url.path.removeprefix(prefix),
                headers={k.lower(): v for k, v in request.headers.items()},
                body=raw,
                json=body,
                at=time.monotonic(),
                query=request.url.query,
            )
        )
        refusal = _invalid(api, request, body, upstream)
        if refusal is not None:
            return refusal
        action = upstream._next()
        if action is None and upstream.respond is not None:
            action = upstream.respond(api, body)
        return await _perform(api, request, body, action, upstream.behaviour)

    return Starlette(
        routes=[
            Route("/{key}/v1/chat/completions", handle, methods=["POST"]),
            Route("/{key}/v1/messages", handle, methods=["POST"]),
            Route("/{key}/v1/responses", handle, methods=["POST"]),
            Route("/v1/chat/completions", handle, methods=["POST"]),
            Route("/v1/messages", handle, methods=["POST"]),
            Route("/v1/responses", handle, methods=["POST"]),
        ]
    )


# Running it


_QUIET_DROP = _QuietDrop()


def _listening_socket() -> socket.socket:
    # Bound here and handed to uvicorn, so no other process can take the port between
    # choosing it and listening on it.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


if pytest is not None:

    @pytest.fixture(scope="session", name="upstream_server")
    def upstream_server_fixture() -> Iterator[UpstreamServer]:
        """The shared upstream server, started once per test session."""
        sock = _listening_socket()
        port = sock.getsockname()[1]
        server = UpstreamServer(f"http://127.0.0.1:{port}")
        config = uvicorn.Config(
            make_app(server), log_level="warning", lifespan="off", timeout_graceful_shutdown=1
        )
        logging.getLogger("uvicorn.error").addFilter(_QUIET_DROP)
        runner = uvicorn.Server(config)
        thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not runner.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the upstream test server did not start")
            time.sleep(0.005)
        try:
            yield server
        finally:
            runner.should_exit = runner.force_exit = True
            thread.join(timeout=10)
            sock.close()
            logging.getLogger("uvicorn.error").removeFilter(_QUIET_DROP)

    @pytest.fixture(name="upstream")
    def upstream_fixture(upstream_server: UpstreamServer) -> Iterator[Upstream]:
        """This test's upstream LLM: ``upstream.url`` is the ``base_url`` to call."""
        upstream = upstream_server.new()
        yield upstream
        upstream_server.drop(upstream)


def main(argv: list[str] | None = None) -> int:
    """Demo mode: the agent-like script on its own (see the module's docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.upstream_server",
        description="A scripted LLM upstream for demos without an API key: OpenAI chat "
        "completions and Anthropic Messages, whole or streamed. It calls the first tool a "
        "request offers, then answers in text once it has the tool's result.",
    )
    parser.add_argument("--port", type=int, default=8900, help="port to listen on (8900)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument(
        "--log-level", default="info", help="uvicorn's: info shows each request (info)"
    )
    args = parser.parse_args(argv)
    root = f"http://{args.host}:{args.port}"
    server = UpstreamServer(root)
    # It remembers its last few requests only (a long agent's are megabytes each).
    server.default = Upstream(f"{root}/v1", keep=16)
    server.default.behaviour = "agent"
    print(
        f"scripted upstream on {root}\n"
        f"  OpenAI:    base_url={root}/v1  (POST /v1/chat/completions)\n"
        f"  Anthropic: base_url={root}     (POST /v1/messages)\n"
        f"  Responses: base_url={root}/v1  (POST /v1/responses)\n"
        "  any API key is accepted; Ctrl-C stops it",
        flush=True,
    )
    uvicorn.run(make_app(server), host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
