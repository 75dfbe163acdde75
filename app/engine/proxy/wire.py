"""The proxy's requests and replies in each provider's wire format.

A proxied call is the agent's own request: compactd reads its history and system prompt
out of it, and sends the provider the same request with the managed context in place of
the history. Every other field (tools, tool_choice, sampling parameters, max_tokens,
metadata...) goes upstream as the agent wrote it.

The system prompt is the agent's, not the history's: OpenAI's leading ``system`` and
``developer`` messages, Anthropic's top-level ``system``. It is neither matched nor
stored; it goes upstream as sent, and with the tool schemas it is the session's
overhead (tokens every request carries that no stored entry counts). Agents rebuild it
on every call (a date, a directory listing), and it must never be summarized away.

Pure: no HTTP, no database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from app.engine.accounting import tokens
from app.engine.accounting.overflow_errors import OverflowMatch
from app.engine.formats import anthropic_format, openai_format
from app.engine.formats.openai_format import _type_name
from app.engine.model import Entry, InvalidMessage
from app.engine.proxy.history import ParseMessage

Api = Literal["openai", "anthropic"]
# The proxy's routes: an API, or OpenAI's Responses, stored as "openai" (its items read as
# chat messages: app.engine.proxy.responses_format).
Wire = Literal["openai", "anthropic", "responses"]


def _openai_parse(raw: Any, path: str) -> list[Entry]:
    return [openai_format.parse_message(raw, path)]


PARSERS: dict[Api, ParseMessage] = {
    "openai": _openai_parse,
    "anthropic": anthropic_format.parse_message,
}


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """An agent's request, read.

    ``messages`` is its history without the system prompt; ``offset`` is how many
    messages (OpenAI's leading system ones) come before it in the request's own
    ``messages``, so that an error can name the agent's index. ``system`` is the system
    prompt as sent: the leading messages (OpenAI) or the ``system`` field (Anthropic).
    """

    api: Api
    body: dict[str, Any]
    model: str
    messages: list[Any]
    offset: int
    system: Any
    stream: bool
    wants_usage: bool  # OpenAI: the agent asked for the usage chunk of a stream
    # The route it came by (app.engine.proxy.wires): ``api``, or "responses" for OpenAI's
    # Responses API, whose ``input`` items are its ``messages``, stored as chat messages
    # (``api`` "openai").
    wire: Wire

    @property
    def responses(self) -> bool:
        return self.wire == "responses"

    @property
    def field(self) -> str:
        """The body's field that holds the history."""
        return "input" if self.responses else "messages"

    def path(self, index: int) -> str:
        """The request's own path of history message ``index``."""
        return f"{self.field}[{index + self.offset}]"


def read_head(body: Any) -> tuple[dict[str, Any], str, bool]:
    """What every API's request has: the body an object, its ``model`` and its
    ``stream``; or :class:`InvalidMessage` naming the field."""
    if not isinstance(body, dict):
        raise InvalidMessage("body", f"must be a JSON object, got {_type_name(body)}")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise InvalidMessage("model", "is required: the model's name")
    if len(model) > 200:
        raise InvalidMessage("model", f"is {len(model)} characters; at most 200")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidMessage("stream", f"must be a boolean, got {_type_name(stream)}")
    return body, model, stream


def read_request(api: Api, body: Any) -> ProxyRequest:
    """The agent's request, or :class:`InvalidMessage` naming the field that makes it
    unusable. The messages themselves are parsed later, only those that must be."""
    body, model, stream = read_head(body)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidMessage("messages", f"must be a list of messages, got {_type_name(messages)}")
    if api == "anthropic":
        system = body.get("system")
        if system is not None and not isinstance(system, str | list):
            raise InvalidMessage("system", "must be a string or a list of text blocks")
        _at_least_one(messages)
        return ProxyRequest(api, body, model, messages, 0, system, stream, False, api)
    n = body.get("n")
    if n is not None and (type(n) is not int or n != 1):  # True == 1 in Python, 1.0 too
        raise InvalidMessage(
            "n",
            "must be 1 through the compactd proxy: it stores one reply per call, and the "
            "agent's next request must carry that one",
        )
    offset = 0
    while (
        offset < len(messages)
        and isinstance(messages[offset], dict)
        and messages[offset].get("role") in ("system", "developer")
    ):
        offset += 1
    _at_least_one(messages)
    options = body.get("stream_options")
    wants_usage = isinstance(options, dict) and options.get("include_usage") is True
    return ProxyRequest(
        api, body, model, messages[offset:], offset, messages[:offset], stream, wants_usage, api
    )


def _at_least_one(messages: list[Any]) -> None:
    """As the providers refuse a request with no message (nothing is stored of it)."""
    if not messages:
        raise InvalidMessage("messages", "must hold at least one message")


def system_text(request: ProxyRequest) -> str:
    """The system prompt's text (for counting)."""
    system = request.system
    if isinstance(system, str):
        return system
    texts: list[str] = []
    instructions = request.body.get("instructions") if request.responses else None
    if isinstance(instructions, str) and instructions:
        texts.append(instructions)
    for item in system or ():
        if not isinstance(item, dict):
            continue
        content = item.get("content") if request.api == "openai" else item
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, dict) and isinstance(content.get("text"), str):
            texts.append(content["text"])
        elif isinstance(content, list):
            texts.extend(
                b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
            )
    return "\n".join(texts)


def overhead_tokens(request: ProxyRequest, encoding: tokens.EncodingName) -> int:
    """What the request adds to every call besides its history: the system prompt
    (with the framing of a message) and the tool schemas."""
    total = 0
    text = system_text(request)
    if text:
        total += tokens.MESSAGE_OVERHEAD_TOKENS + tokens.count_text(text, encoding)
    tools = request.body.get("tools")
    if isinstance(tools, list):
        total += tokens.count_tools([t for t in tools if isinstance(t, dict)], encoding)
    return total


# The most cache breakpoints Anthropic takes in one request (system and tools included).
MAX_CACHE_MARKERS = 4
# Blocks that cannot carry a cache breakpoint.
_UNMARKABLE = frozenset({"thinking", "redacted_thinking"})


def cache_markers(request: ProxyRequest) -> list[dict[str, Any]]:
    """The ``cache_control`` objects an Anthropic request's history carries, in order
    (the last :data:`MAX_CACHE_MARKERS`). Agents mark their last message or two, to
    cache the prompt up to there: the context that goes upstream in place of that
    history gets as many, on its own last messages (:func:`marked`)."""
    if request.api != "anthropic":
        return []
    found: list[dict[str, Any]] = []
    for message in request.messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            found += [
                b["cache_control"]
                for b in content
                if isinstance(b, dict) and isinstance(b.get("cache_control"), dict)
            ]
    return found[-MAX_CACHE_MARKERS:]


def _markable(message: dict[str, Any]) -> int | None:
    """The index of the block of ``message`` a breakpoint goes on: its last one that
    can carry one (not thinking, not empty text); None if none can."""
    content = message.get("content")
    if not isinstance(content, list):
        return None
    for i in range(len(content) - 1, -1, -1):
        block = content[i]
        if not isinstance(block, dict) or block.get("type") in _UNMARKABLE:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        return i
    return None


def marked(messages: list[Any], markers: list[dict[str, Any]]) -> list[Any]:
    """The context's Anthropic ``messages`` with the agent's cache breakpoints
    (:func:`cache_markers`) on its last messages, one each, the last marker on the last
    message; system messages are passed over. ``messages`` is not changed."""
    out = list(messages)
    pending = list(markers)
    for at in range(len(out) - 1, -1, -1):
        if not pending:
            break
        message = out[at]
        if not isinstance(message, dict) or message.get("role") == "system":
            continue
        content = message.get("content")
        if isinstance(content, str):
            if not content:
                continue
            content = [{"type": "text", "text": content}]
            message = {**message, "content": content}
        index = _markable(message)
        if index is None:
            continue
        blocks = list(message["content"])
        blocks[index] = {**blocks[index], "cache_control": pending.pop()}
        out[at] = {**message, "content": blocks}
    return out


def upstream_body(
    request: ProxyRequest, messages: list[Any], system: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """The agent's request with the managed context (``messages``, and for Anthropic the
    context's own ``system`` blocks, if it has any) in place of its history. A stream
    asks OpenAI for its usage chunk, which the proxy needs."""
    body = dict(request.body)
    if request.api == "openai":
        body["messages"] = [*request.system, *messages]
        if request.stream:
            options = body.get("stream_options")
            body["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        return body
    markers = cache_markers(request)
    body["messages"] = marked(messages, markers) if markers else messages
    if system:
        agent = request.system
        if isinstance(agent, str):
            agent = [{"type": "text", "text": agent}] if agent else []
        body["system"] = [*(agent or []), *system]
    return body


def _spliced(head: bytes, tail: bytes) -> orjson.Fragment:
    """Two JSON arrays as one, neither parsed."""
    if head == b"[]":
        return orjson.Fragment(tail)
    if tail == b"[]":
        return orjson.Fragment(head)
    return orjson.Fragment(head[:-1] + b"," + tail[1:])


def upstream_bytes(request: ProxyRequest, messages: bytes, system: bytes | None) -> bytes:
    """:func:`upstream_body` as the JSON that goes upstream, with the context's
    ``messages`` (and Anthropic ``system``) spliced in as the JSON arrays they are read
    as, never parsed and serialized again: the same bytes as
    ``orjson.dumps(upstream_body(request, orjson.loads(messages), ...))``."""
    body = dict(request.body)
    if request.api == "openai":
        body["messages"] = _spliced(orjson.dumps(request.system), messages)
        if request.stream:
            options = body.get("stream_options")
            body["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
        return orjson.dumps(body)
    markers = cache_markers(request)
    if markers:
        # Parsed only then: the breakpoints go on the context's last messages.
        body["messages"] = marked(orjson.loads(messages), markers)
    else:
        body["messages"] = orjson.Fragment(messages)
    if system is not None and system != b"[]":
        agent = request.system
        if isinstance(agent, str):
            agent = [{"type": "text", "text": agent}] if agent else []
        body["system"] = _spliced(orjson.dumps(agent or []), system)
    return orjson.dumps(body)


@dataclass(frozen=True, slots=True)
class Reply:
    """A whole reply: the assistant message to store (as the agent receives it), its
    finish or stop reason, and the usage the provider reported (its own object)."""

    message: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, Any] | None
    # The messages after ``message`` of a reply that is several (a Responses reply's
    # output items, one message each).
    rest: tuple[dict[str, Any], ...] = ()

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [self.message, *self.rest]


class UnreadableReply(ValueError):
    """A 200 whose body is not a reply of the API (it is passed on, and not stored)."""


def reply_of(api: Api, data: Any) -> Reply:
    """The reply in a provider's non-streamed response body."""
    if not isinstance(data, dict):
        raise UnreadableReply("the body is not a JSON object")
    usage = data.get("usage")
    usage = usage if isinstance(usage, dict) else None
    if api == "openai":
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise UnreadableReply("no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise UnreadableReply("choices[0] has no message")
        reason = choices[0].get("finish_reason")
        return Reply(message, reason if isinstance(reason, str) else None, usage)
    content = data.get("content")
    if not isinstance(content, list):
        raise UnreadableReply("no content")
    reason = data.get("stop_reason")
    return Reply(
        {"role": "assistant", "content": content},
        reason if isinstance(reason, str) else None,
        usage,
    )


# A replayed reply (see :func:`replayed_body`) cost the provider nothing this time.
_NO_USAGE: dict[Api, dict[str, int]] = {
    "openai": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    "anthropic": {"input_tokens": 0, "output_tokens": 0},
}
REPLAY_ID: dict[Api, str] = {
    "openai": "chatcmpl-compactd-replay",
    "anthropic": "msg_compactd_replay",
}


def _openai_reply(message: dict[str, Any]) -> dict[str, Any]:
    """A stored OpenAI assistant message as a completion's: its content a string."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        message = {**message, "content": "".join(t for t in texts if isinstance(t, str))}
    return message


def _finish_reason(api: Api, message: dict[str, Any]) -> str:
    if api == "openai":
        return "tool_calls" if message.get("tool_calls") else "stop"
    uses = [b for b in message["content"] if isinstance(b, dict) and b.get("type") == "tool_use"]
    return "tool_use" if uses else "end_turn"


def stored_reply(api: Api, entry: Entry) -> dict[str, Any]:
    """A stored assistant entry as the reply its agent received: OpenAI's assistant
    message, Anthropic's ``{"role": "assistant", "content": [blocks]}`` (with the keys
    the provider sent that the store keeps aside)."""
    if api == "openai":
        return openai_format.render_message(entry, for_history=True)
    _, messages = anthropic_format.render_messages([entry], for_history=True)
    content: Any = messages[0]["content"] if messages else []
    if isinstance(content, str):
        content = [{"type": "text", "text": content}] if content else []
    return {"role": "assistant", "content": content}


def replayed_body(
    api: Api,
    message: dict[str, Any],
    model: str,
    created: int,
    usage: dict[str, Any] | None = None,
    response_id: str | None = None,
) -> dict[str, Any]:
    """A whole response carrying ``message``, a reply already stored (OpenAI's assistant
    message; Anthropic's ``{"role": "assistant", "content": [blocks]}``), for a call sent
    again: its finish reason as the message shows it, its usage none (or ``usage``, the
    provider's, for a reply compactd reshaped: app.engine.proxy.recall)."""
    reason = _finish_reason(api, message)
    usage = dict(usage) if usage is not None else dict(_NO_USAGE[api])
    if api == "openai":
        return {
            "id": response_id or REPLAY_ID[api],
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": _openai_reply(message),
                    "logprobs": None,
                    "finish_reason": reason,
                }
            ],
            "usage": usage,
        }
    return {
        "id": response_id or REPLAY_ID[api],
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": message["content"],
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": usage,
    }


def _sse(data: Any, name: str | None = None) -> bytes:
    head = b"" if name is None else b"event: " + name.encode() + b"\n"
    return head + b"data: " + orjson.dumps(data) + b"\n\n"


def replayed_events(
    api: Api,
    message: dict[str, Any],
    model: str,
    created: int,
    wants_usage: bool,
    usage: dict[str, Any] | None = None,
    response_id: str | None = None,
) -> list[bytes]:
    """:func:`replayed_body` as the API streams it, one server-sent event each (OpenAI's
    usage chunk only if the agent asked for it)."""
    reason = _finish_reason(api, message)
    usage = dict(usage) if usage is not None else dict(_NO_USAGE[api])
    if api == "openai":
        reply = _openai_reply(message)
        base = {
            "id": response_id or REPLAY_ID[api],
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return _sse({**base, "choices": [choice]})

        first: dict[str, Any] = {"role": "assistant"}
        if isinstance(reply.get("content"), str):
            first["content"] = reply["content"]
        out = [chunk(first)]
        for key in ("refusal", "reasoning_content"):
            if isinstance(reply.get(key), str):
                out.append(chunk({key: reply[key]}))
        for index, call in enumerate(reply.get("tool_calls") or ()):
            out.append(chunk({"tool_calls": [{"index": index, **call}]}))
        out.append(chunk({}, reason))
        if wants_usage:
            out.append(_sse({**base, "choices": [], "usage": usage}))
        out.append(b"data: [DONE]\n\n")
        return out
    start = replayed_body(api, {"content": []}, model, created, usage, response_id)
    start["stop_reason"] = None
    out = [_sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(message["content"]):
        out += _anthropic_block(index, block)
    out.append(
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": reason, "stop_sequence": None},
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
            "message_delta",
        )
    )
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def _anthropic_block(index: int, block: dict[str, Any]) -> list[bytes]:
    """One content block as its start, its deltas and its stop."""
    kind = block.get("type")
    deltas: list[dict[str, Any]] = []
    start = dict(block)
    if kind == "text":
        start["text"] = ""
        if block.get("text"):
            deltas.append({"type": "text_delta", "text": block["text"]})
        if "citations" in block:
            start["citations"] = []
            for citation in block["citations"] or ():
                deltas.append({"type": "citations_delta", "citation": citation})
    elif kind == "tool_use":
        start["input"] = {}
        if block.get("input"):
            partial = orjson.dumps(block["input"]).decode()
            deltas.append({"type": "input_json_delta", "partial_json": partial})
    elif kind == "thinking":
        start["thinking"] = ""
        start.pop("signature", None)
        if block.get("thinking"):
            deltas.append({"type": "thinking_delta", "thinking": block["thinking"]})
        if block.get("signature") is not None:
            deltas.append({"type": "signature_delta", "signature": block["signature"]})
    events = [
        _sse(
            {"type": "content_block_start", "index": index, "content_block": start},
            "content_block_start",
        )
    ]
    events += [
        _sse({"type": "content_block_delta", "index": index, "delta": d}, "content_block_delta")
        for d in deltas
    ]
    events.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return events


# When an overflow error does not say by how much the prompt was too long, the retry
# must hold at most this share of the context refused.
UNSTATED_RETRY_SHARE = 0.9
# When it does, the overshoot is removed with this margin (the provider counts with
# another tokenizer than compactd's).
OVERSHOOT_MARGIN = 1.1


def retry_target(sent_tokens: int, match: OverflowMatch) -> int:
    """The most context tokens (as compactd counts them) the retry of a call refused as
    too long should hold: the refused context less the overshoot the error states (with
    a margin), else :data:`UNSTATED_RETRY_SHARE` of it."""
    requested, limit = match.requested_tokens, match.limit_tokens
    if requested is not None and limit is not None and requested > limit:
        return max(0, sent_tokens - math.ceil((requested - limit) * OVERSHOOT_MARGIN))
    return int(sent_tokens * UNSTATED_RETRY_SHARE)
