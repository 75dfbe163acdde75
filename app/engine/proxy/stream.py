"""A streamed reply, event by event: passed on as it comes, and accumulated into the one
assistant message the stored history keeps.

Server-sent events are cut at their blank lines (:class:`SseEvents`): each event is
handed on whole, as the bytes the provider sent, as soon as its last line arrives. The
accumulators read the same events:

- OpenAI ``chat.completion.chunk`` objects: the deltas of ``content``, ``refusal``,
  ``reasoning_content`` and ``tool_calls`` (by their ``index``, arguments concatenated;
  a name concatenated too, except a delta's that repeats the name so far, as some
  providers repeat a call's whole name in each of its deltas),
  the ``finish_reason``, and the usage-only chunk that ``stream_options.include_usage``
  adds before ``data: [DONE]`` (dropped when the agent did not ask for it);
- Anthropic events: ``message_start``, ``content_block_start``, ``content_block_delta``
  (``text_delta``, ``input_json_delta``, ``thinking_delta``, ``signature_delta``,
  ``citations_delta``), ``content_block_stop``, ``message_delta``, ``message_stop``,
  ``ping`` and ``error``.

A reply is complete only when its stream says so (``data: [DONE]``, ``message_stop``);
one that breaks off before, or carries an error event, is not (the proxy then stores
none of it). One that ends, even cleanly, before its finish reason is
:attr:`~OpenAIStream.unfinished`: the proxy ends it for the agent with an error event
(:func:`stream_error`), so that its SDK raises rather than hand on half a reply.

Pure: bytes in, decisions and a message out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import orjson

from app.engine.proxy.wire import Reply

_BLANK_LINE = re.compile(rb"\r?\n\r?\n|\r\r")


@dataclass(frozen=True, slots=True)
class ServerSentEvent:
    """One server-sent event: its bytes as received (blank line included), its ``event``
    name and its ``data`` (lines joined), either None when absent."""

    raw: bytes
    name: str | None
    data: str | None


def parse_event(raw: bytes) -> ServerSentEvent:
    name: str | None = None
    data: list[str] = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line or line.startswith(":"):
            continue
        key, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if key == "event":
            name = value
        elif key == "data":
            data.append(value)
    return ServerSentEvent(raw, name, "\n".join(data) if data else None)


class EventTooLarge(ValueError):
    """One event is larger than the bound: the stream is not one an API sends."""


class SseEvents:
    """Cuts a byte stream into events at their blank lines. Holds at most one event's
    bytes (``max_event_bytes``) besides the chunk being fed."""

    def __init__(self, max_event_bytes: int = 16 * 1024 * 1024) -> None:
        self._buffer = b""
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        buffer = self._buffer + chunk if self._buffer else chunk
        events: list[ServerSentEvent] = []
        start = 0
        while True:
            found = _BLANK_LINE.search(buffer, start)
            if found is None:
                break
            events.append(parse_event(buffer[start : found.end()]))
            start = found.end()
        self._buffer = buffer[start:]
        if len(self._buffer) > self.max_event_bytes:
            raise EventTooLarge(f"an event is over {self.max_event_bytes} bytes")
        return events

    def rest(self) -> bytes:
        """What came after the last complete event (a stream cut off mid-event)."""
        rest, self._buffer = self._buffer, b""
        return rest


def _json(data: str | None) -> Any:
    if data is None:
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


@dataclass(slots=True)
class _Call:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class OpenAIStream:
    """Accumulates an OpenAI chat-completions stream (choice 0: the proxy asks for one)."""

    def __init__(self, wants_usage: bool) -> None:
        self.wants_usage = wants_usage
        self.done = False
        self.failed: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._content: list[str] | None = None
        self._refusal: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _Call] = {}

    @staticmethod
    def terminal(event: ServerSentEvent) -> bool:
        return event.data is not None and event.data.strip() == "[DONE]"

    def feed(self, event: ServerSentEvent) -> bool:
        """Take the event in; whether to pass it on to the agent."""
        if event.data is None:
            return True
        if self.terminal(event):
            self.done = True
            return True
        chunk = _json(event.data)
        if not isinstance(chunk, dict):
            return True
        if chunk.get("error") is not None:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else None
            self.failed = str(message or error)
            return True
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = chunk.get("choices")
        if not choices:
            # The usage-only chunk that include_usage adds: the agent sees it if it asked.
            return self.wants_usage or not isinstance(usage, dict)
        for choice in choices if isinstance(choices, list) else ():
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                self._choice(choice)
        return True

    def _choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if isinstance(content, str):
                if self._content is None:
                    self._content = []
                self._content.append(content)
            if isinstance(delta.get("refusal"), str):
                self._refusal.append(delta["refusal"])
            if isinstance(delta.get("reasoning_content"), str):
                self._reasoning.append(delta["reasoning_content"])
            calls = delta.get("tool_calls")
            for position, call in enumerate(calls if isinstance(calls, list) else ()):
                if not isinstance(call, dict):
                    continue
                index = call.get("index", position)
                slot = self._calls.setdefault(
                    index if isinstance(index, int) else position, _Call()
                )
                if isinstance(call.get("id"), str):
                    slot.id = call["id"]
                fn = call.get("function")
                if isinstance(fn, dict):
                    name = fn.get("name")
                    # Some providers (and proxies) repeat the whole name in later deltas.
                    if isinstance(name, str) and name != slot.name:
                        slot.name += name
                    if isinstance(fn.get("arguments"), str):
                        slot.arguments.append(fn["arguments"])
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            self.finish_reason = reason

    @property
    def complete(self) -> bool:
        return self.done and self.failed is None

    @property
    def unfinished(self) -> bool:
        """Whether a stream that ends here ends before its finish: neither its last event
        nor a finish reason came (nor an error event, which says so itself)."""
        return not self.done and self.finish_reason is None and self.failed is None

    def reply(self) -> Reply:
        """The reply, once the stream is :attr:`complete`."""
        return Reply(self.message(), self.finish_reason, self.usage)

    def message(self) -> dict[str, Any]:
        """The reply as one chat message."""
        message: dict[str, Any] = {
            "role": "assistant",
            "content": None if self._content is None else "".join(self._content),
        }
        if self._refusal:
            message["refusal"] = "".join(self._refusal)
        if self._reasoning:
            message["reasoning_content"] = "".join(self._reasoning)
        if self._calls:
            message["tool_calls"] = [
                {
                    "id": call.id or "",
                    "type": "function",
                    "function": {"name": call.name, "arguments": "".join(call.arguments)},
                }
                for _, call in sorted(self._calls.items())
            ]
        return message


class AnthropicStream:
    """Accumulates an Anthropic Messages stream into its message's content blocks."""

    def __init__(self) -> None:
        self.done = False
        self.failed: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}

    @staticmethod
    def terminal(event: ServerSentEvent) -> bool:
        return event.name == "message_stop"

    def feed(self, event: ServerSentEvent) -> bool:
        """Take the event in; whether to pass it on to the agent (always)."""
        data = _json(event.data)
        if not isinstance(data, dict):
            return True
        kind = data.get("type", event.name)
        if kind == "message_start":
            message = data.get("message")
            if isinstance(message, dict):
                if isinstance(message.get("usage"), dict):
                    self.usage = dict(message["usage"])
                for i, block in enumerate(message.get("content") or ()):
                    if isinstance(block, dict):
                        self._blocks[i] = dict(block)
        elif kind == "content_block_start":
            index, block = data.get("index"), data.get("content_block")
            if isinstance(index, int) and isinstance(block, dict):
                self._blocks[index] = dict(block)
        elif kind == "content_block_delta":
            self._delta(data.get("index"), data.get("delta"))
        elif kind == "content_block_stop":
            self._stop(data.get("index"))
        elif kind == "message_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("stop_reason"), str):
                self.finish_reason = delta["stop_reason"]
            usage = data.get("usage")
            if isinstance(usage, dict):
                self.usage = {
                    **(self.usage or {}),
                    **{k: v for k, v in usage.items() if v is not None},
                }
        elif kind == "message_stop":
            self.done = True
        elif kind == "error":
            error = data.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            self.failed = str(message or error)
        return True

    def _delta(self, index: Any, delta: Any) -> None:
        if not isinstance(delta, dict) or index not in self._blocks:
            return
        block = self._blocks[index]
        kind = delta.get("type")
        if kind == "text_delta" and isinstance(delta.get("text"), str):
            block["text"] = block.get("text", "") + delta["text"]
        elif kind == "input_json_delta" and isinstance(delta.get("partial_json"), str):
            self._json.setdefault(index, []).append(delta["partial_json"])
        elif kind == "thinking_delta" and isinstance(delta.get("thinking"), str):
            block["thinking"] = block.get("thinking", "") + delta["thinking"]
        elif kind == "signature_delta" and isinstance(delta.get("signature"), str):
            block["signature"] = delta["signature"]
        elif kind == "citations_delta" and "citation" in delta:
            citations = block.get("citations")
            block["citations"] = [
                *(citations if isinstance(citations, list) else []),
                delta["citation"],
            ]

    def _stop(self, index: Any) -> None:
        pieces = self._json.pop(index, None) if isinstance(index, int) else None
        if pieces is None:
            return
        text = "".join(pieces)
        if not text.strip():
            return  # no input streamed: the start's input ({}) stands
        try:
            self._blocks[index]["input"] = orjson.loads(text)
        except orjson.JSONDecodeError:
            self.failed = f"content block {index}: the streamed tool input is not valid JSON"

    @property
    def complete(self) -> bool:
        return self.done and self.failed is None

    @property
    def unfinished(self) -> bool:
        """Whether a stream that ends here ends before its finish: neither
        ``message_stop`` nor a stop reason came (nor an error event)."""
        return not self.done and self.finish_reason is None and self.failed is None

    def reply(self) -> Reply:
        """The reply, once the stream is :attr:`complete`."""
        return Reply(self.message(), self.finish_reason, self.usage)

    def message(self) -> dict[str, Any]:
        """The reply as one message: its content blocks in index order."""
        return {"role": "assistant", "content": [b for _, b in sorted(self._blocks.items())]}


def stream_error(api: str, message: str) -> bytes:
    """An error event in the API's own stream format (its SDK raises it)."""
    if api == "openai":
        error: dict[str, Any] = {
            "error": {"message": message, "type": "server_error", "param": None, "code": None}
        }
        return b"data: " + orjson.dumps(error) + b"\n\n"
    error = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"
