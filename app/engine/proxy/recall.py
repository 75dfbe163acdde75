"""The proxy's recall rounds: the recall tools offered to the model beside the agent's
own, and answered by compactd (session config ``recall.proxy_tools``).

A proxied call then goes upstream with ``history_search`` and ``history_read`` added
to its ``tools`` (a tool the agent declares under one of those names stays the
agent's, and compactd leaves its calls alone). When the model's reply calls them,
compactd runs those calls and asks again with the context followed by the model's
calls and their results: one **round**. The agent gets the reply of the last round,
which calls none of these tools: a reply that still does after :data:`ROUNDS` rounds
has those calls left out. So the agent's history never holds a call it cannot
answer, and what it sends back on its next call matches what compactd stored.

The rounds are not stored: they re-read the stored history, and the reply that uses
them is. Every round's upstream request is whole (not streamed), since compactd must
read it before the agent gets anything; a streamed call gets the last round's reply
as the events the API streams.

This module is the pure part: the request offered, the calls read from a reply, the
messages a round adds, the reply the agent gets. app.proxy.recall makes the calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from app.engine.proxy.wire import Api, ProxyRequest

# Upstream requests of one call at most (the first and the rounds after it).
ROUNDS = 4
# What the model reads with the results of the round before the last.
LAST_ROUND_NOTE = "[That was the last history lookup for this turn: answer now with what you have.]"


@dataclass(frozen=True, slots=True)
class Offered:
    """The request as it goes upstream with the recall tools, and the tools' names
    compactd answers (those the agent does not declare itself)."""

    request: ProxyRequest
    names: frozenset[str]


def tool_names(api: Api, tools: Any) -> set[str]:
    """The names of the tools a request declares."""
    names: set[str] = set()
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, Mapping):
            continue
        if api == "openai":
            function = tool.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
        else:
            name = tool.get("name")
        if isinstance(name, str):
            names.add(name)
    return names


def definition_name(api: Api, definition: Mapping[str, Any]) -> str:
    if api == "openai":
        return str(definition["function"]["name"])
    return str(definition["name"])


def offer(request: ProxyRequest, definitions: Sequence[Mapping[str, Any]]) -> Offered | None:
    """``request`` with the recall tools added to its ``tools`` and not streamed; None
    when the agent declares every one of them itself."""
    own = tool_names(request.api, request.body.get("tools"))
    added = [d for d in definitions if definition_name(request.api, d) not in own]
    if not added:
        return None
    body = dict(request.body)
    tools = body.get("tools")
    body["tools"] = [*(tools if isinstance(tools, list) else ()), *added]
    body.pop("stream", None)
    body.pop("stream_options", None)
    offered = ProxyRequest(
        api=request.api,
        body=body,
        model=request.model,
        messages=request.messages,
        offset=request.offset,
        system=request.system,
        stream=False,
        wants_usage=False,
        wire=request.wire,
    )
    return Offered(offered, frozenset(definition_name(request.api, d) for d in added))


def calls(api: Api, message: Mapping[str, Any], names: frozenset[str]) -> list[dict[str, Any]]:
    """The reply's calls of the tools named ``names``, each as the model produced it (an
    OpenAI ``tool_calls`` item, an Anthropic ``tool_use`` block)."""
    return [c for c in _all_calls(api, message) if _call_name(api, c) in names]


def _all_calls(api: Api, message: Mapping[str, Any]) -> list[dict[str, Any]]:
    if api == "openai":
        found = message.get("tool_calls")
        return [c for c in found if isinstance(c, dict)] if isinstance(found, list) else []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _call_name(api: Api, call: Mapping[str, Any]) -> str | None:
    if api == "openai":
        function = call.get("function")
        name = function.get("name") if isinstance(function, Mapping) else None
    else:
        name = call.get("name")
    return name if isinstance(name, str) else None


def round_messages(
    api: Api,
    message: Mapping[str, Any],
    answered: Sequence[tuple[Mapping[str, Any], str, bool]],
) -> list[dict[str, Any]]:
    """What a round adds after the context: the model's message with only the calls
    compactd answered (its other calls left out: the model makes them again once it
    has what it looked up), then their results (``(call, text, is_error)``)."""
    kept = [call for call, _, _ in answered]
    if api == "openai":
        assistant: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
        assistant["tool_calls"] = kept
        results: list[dict[str, Any]] = [
            {"role": "tool", "tool_call_id": call.get("id"), "content": text}
            for call, text, _ in answered
        ]
        return [assistant, *results]
    content = message.get("content")
    blocks = [
        b
        for b in (content if isinstance(content, list) else ())
        if not (isinstance(b, dict) and b.get("type") == "tool_use") or b in kept
    ]
    return [
        {"role": "assistant", "content": blocks},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.get("id"),
                    "content": text,
                    **({"is_error": True} if is_error else {}),
                }
                for call, text, is_error in answered
            ],
        },
    ]


def without_calls(api: Api, message: Mapping[str, Any], names: frozenset[str]) -> dict[str, Any]:
    """The reply with its calls of the tools named ``names`` left out."""
    if api == "openai":
        kept = [c for c in _all_calls(api, message) if _call_name(api, c) not in names]
        out = dict(message)
        if kept:
            out["tool_calls"] = kept
        else:
            out.pop("tool_calls", None)
        return out
    content = message.get("content")
    blocks = [
        b
        for b in (content if isinstance(content, list) else ())
        if not (isinstance(b, dict) and b.get("type") == "tool_use" and _call_name(api, b) in names)
    ]
    return {**message, "content": blocks}


def extended(messages: bytes, extra: Iterable[Mapping[str, Any]]) -> bytes:
    """A JSON array of messages (the context, as sent) with ``extra`` after them."""
    tail = orjson.dumps(list(extra))
    if tail == b"[]":
        return messages
    if messages.strip() == b"[]":
        return tail
    return messages.rstrip()[:-1] + b"," + tail[1:]
