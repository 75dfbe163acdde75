"""The proxy's wire formats: each one adapter of the one pipeline.

A proxied call runs the same steps whatever the API it speaks (docs/proxy.md, "Inside
a call"): read the agent's request, match its history against the stored one, store
what is new, build the context, send the request upstream with the context in place of
the history, pass the reply back, store it. What differs from one API to another is
only this table:

- ``read``: the request body to a :class:`~app.engine.proxy.wire.ProxyRequest` (its
  history, its prompt, whether it streams), or ``InvalidMessage`` naming the field;
- ``parse``: one message of the request's history to the entries it is stored as;
- ``stored``: the request's new messages as the store takes them (in ``store``'s
  format, the one the history is kept and its context built in);
- ``upstream``: the request with the context in place of its history, as JSON;
- ``reply``: a whole response's reply; ``reader``: what reads a streamed one, event by
  event; ``stream_error``: the error event that ends a broken stream for the agent;
- ``replays``: a call sent again is answered with its stored reply (the reply is one
  message: see :func:`app.proxy.replays.replayable`);
- ``recall``: the recall tools can be offered on it (:mod:`app.engine.proxy.recall`).

Three wires: OpenAI chat completions, Anthropic Messages, and the OpenAI Responses API,
whose items are stored as chat messages (:mod:`app.engine.proxy.responses_format`).

Pure: no HTTP, no database.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from app.engine.formats import openai_format
from app.engine.model import Entry
from app.engine.proxy import responses_format
from app.engine.proxy.history import ParseMessage
from app.engine.proxy.stream import AnthropicStream, OpenAIStream, ServerSentEvent, stream_error
from app.engine.proxy.wire import (
    PARSERS,
    Api,
    ProxyRequest,
    Reply,
    Wire,
    read_request,
    reply_of,
    upstream_bytes,
)


class StreamReader(Protocol):
    """Reads a streamed reply as its events pass on to the agent."""

    failed: str | None

    def feed(self, event: ServerSentEvent) -> bool: ...
    @property
    def complete(self) -> bool: ...
    @property
    def unfinished(self) -> bool: ...
    def reply(self) -> Reply: ...


@dataclass(frozen=True, slots=True)
class WireFormat:
    """One API on the proxy (see the module's docstring)."""

    name: Wire
    store: Api
    read: Callable[[Any], ProxyRequest]
    parse: ParseMessage
    stored: Callable[[list[Any]], list[Any]]
    upstream: Callable[[ProxyRequest, bytes, bytes | None], bytes]
    reply: Callable[[Any], Reply]
    reader: Callable[[ProxyRequest], StreamReader]
    stream_error: Callable[[str], bytes]
    replays: bool = True
    recall: bool = True


def _as_is(messages: list[Any]) -> list[Any]:
    return messages


def _responses_parse(raw: Any, path: str) -> list[Entry]:
    return [openai_format.parse_message(responses_format.to_message(raw, path), path)]


def _responses_stored(items: list[Any]) -> list[Any]:
    return [responses_format.to_message(item, "input") for item in items]


def _responses_upstream(request: ProxyRequest, messages: bytes, system: bytes | None) -> bytes:
    return responses_format.upstream_bytes(request, messages)


WIRES: dict[Wire, WireFormat] = {
    "openai": WireFormat(
        name="openai",
        store="openai",
        read=lambda body: read_request("openai", body),
        parse=PARSERS["openai"],
        stored=_as_is,
        upstream=upstream_bytes,
        reply=lambda data: reply_of("openai", data),
        reader=lambda request: OpenAIStream(request.wants_usage),
        stream_error=lambda message: stream_error("openai", message),
    ),
    "anthropic": WireFormat(
        name="anthropic",
        store="anthropic",
        read=lambda body: read_request("anthropic", body),
        parse=PARSERS["anthropic"],
        stored=_as_is,
        upstream=upstream_bytes,
        reply=lambda data: reply_of("anthropic", data),
        reader=lambda request: AnthropicStream(),
        stream_error=lambda message: stream_error("anthropic", message),
    ),
    # A reply is several items (several messages): a call sent again cannot be told from
    # an edited history, and is answered anew; the recall tools are not offered yet.
    "responses": WireFormat(
        name="responses",
        store="openai",
        read=responses_format.read_request,
        parse=_responses_parse,
        stored=_responses_stored,
        upstream=_responses_upstream,
        reply=responses_format.reply_of,
        reader=lambda request: responses_format.ResponsesStream(),
        stream_error=responses_format.stream_error,
        replays=False,
        recall=False,
    ),
}


def wire_of(request: ProxyRequest) -> WireFormat:
    return WIRES[request.wire]
