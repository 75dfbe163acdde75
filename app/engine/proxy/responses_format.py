"""The OpenAI Responses API on the proxy: its items read as chat messages, and back.

Codex (and any client of ``client.responses.create``) sends its whole history as
``input``, a list of *items*: messages, ``function_call`` and ``function_call_output``,
``custom_tool_call`` and its output, ``reasoning`` (with ``encrypted_content``, opaque),
and item types compactd does not model. The proxy stores and matches the history in one
shape whatever the wire (:mod:`app.engine.proxy.wire`), so each item is read as one OpenAI
chat message, and the managed context, rendered as chat messages, is written back as
items. One item is one message, both ways, so that a reply's output items, stored, are
exactly the messages its next request's input items read as:

============================  ===============================================================
item                          chat message
============================  ===============================================================
``message`` (any role)        that role's message; ``input_text``/``output_text`` parts are
                              text, ``input_image`` with a URL an ``image_url``; any other
                              part is kept opaque (``{"type": "response_part", ...}``)
``function_call``             an assistant message with that one tool call
``custom_tool_call``          an assistant tool call whose arguments are ``{"input": ...}``;
                              written back as a custom call when the request declares a
                              ``custom`` tool of that name
``*_output`` of a call        a ``tool`` message answering its ``call_id``
other ``*_call`` with a       an assistant tool call named by the item's type, whose
``call_id``                   arguments are the item itself (so a cut never orphans it)
anything else (reasoning,     an assistant message holding the item opaquely
web search, compaction...)    (``{"type": "response_item", "response_item": item}``),
                              counted, written back as it came
============================  ===============================================================

An item's ``id`` and ``status`` are kept with the stored message (the history gives them
back) but not sent upstream again: with ``store: false`` the provider keeps no item to
refer to, and Codex itself sends none but a reasoning item's, which is kept whole.

``instructions`` and the leading ``system``/``developer`` items are the agent's prompt:
sent upstream as they came, never stored. ``previous_response_id`` and ``conversation``
name history the provider keeps: compactd manages the history itself, so a request that
uses them is refused (400) with the reason.

Pure: no HTTP, no database.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from app.engine.formats.opaque import RESPONSE_ITEM, RESPONSE_PART
from app.engine.formats.openai_format import _type_name
from app.engine.model import InvalidMessage
from app.engine.proxy.stream import ServerSentEvent, _json
from app.engine.proxy.wire import ProxyRequest, Reply, UnreadableReply, read_head

_ROLES = ("user", "assistant", "system", "developer")
_PROMPT_ROLES = ("system", "developer")
# Keys of an item that the message it is read as models; the rest are kept aside.
_MESSAGE_KEYS = frozenset({"type", "role", "content"})
_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments"})
_CUSTOM_KEYS = frozenset({"type", "call_id", "name", "input"})
_OUTPUT_KEYS = frozenset({"type", "call_id", "output"})
_TEXT_PARTS = frozenset({"input_text", "output_text"})


def _kind(item: dict[str, Any]) -> Any:
    """An item's type (an easy input message has none: ``{"role", "content"}``)."""
    return item.get("type", "message" if "role" in item else None)


def _extra(item: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in known}


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(path, f"must be a string, got {_type_name(value)}")
    return value


def _call_id(item: dict[str, Any], path: str) -> str:
    call_id = _text(item.get("call_id"), f"{path}.call_id")
    if not call_id:
        raise InvalidMessage(f"{path}.call_id", "must not be empty")
    return call_id


def read_request(body: Any) -> ProxyRequest:
    """The agent's Responses request, its input items read as chat messages; or
    :class:`InvalidMessage` naming the field that makes it unusable."""
    body, model, stream = read_head(body)
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise InvalidMessage(
                key,
                "is not supported through the compactd proxy: it keeps the history itself, "
                "so send the whole history as input (with store: false, as Codex does)",
            )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise InvalidMessage("instructions", f"must be a string, got {_type_name(instructions)}")
    raw = body.get("input")
    if isinstance(raw, str):
        items: list[Any] = [{"role": "user", "content": raw}]
    elif isinstance(raw, list):
        items = raw
    else:
        raise InvalidMessage("input", f"must be a string or a list of items, got {_type_name(raw)}")
    offset = 0
    while (
        offset < len(items)
        and isinstance(items[offset], dict)
        and _kind(items[offset]) == "message"
        and items[offset].get("role") in _PROMPT_ROLES
    ):
        offset += 1
    if offset == len(items):
        raise InvalidMessage("input", "must hold at least one item besides the system prompt")
    # The history is the items as sent: each is read as its chat message only when the
    # proxy parses it (the items an earlier call sent byte for byte never are).
    return ProxyRequest(
        "openai", body, model, items[offset:], offset, items[:offset], stream, False, "responses"
    )


# --- items to chat messages ---------------------------------------------------------


def _part_to_chat(part: Any, path: str) -> dict[str, Any]:
    if not isinstance(part, dict):
        raise InvalidMessage(path, f"must be an object, got {_type_name(part)}")
    kind = part.get("type")
    if kind in _TEXT_PARTS:
        out = {k: v for k, v in part.items() if k != "type"}
        out["type"] = "text"
        out["text"] = _text(part.get("text"), f"{path}.text")
        return out
    if kind == "input_image" and isinstance(part.get("image_url"), str) and part["image_url"]:
        image: dict[str, Any] = {"url": part["image_url"]}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        if set(part) <= {"type", "image_url", "detail"}:
            return {"type": "image_url", "image_url": image}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return dict(part)
    return {"type": RESPONSE_PART, RESPONSE_PART: part}


def _content_to_chat(content: Any, path: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidMessage(
            path, f"must be a string or a list of parts, got {_type_name(content)}"
        )
    return [_part_to_chat(p, f"{path}[{i}]") for i, p in enumerate(content)]


def to_message(item: Any, path: str) -> dict[str, Any]:
    """One input or output item as the chat message it is stored as (see the module's
    docstring)."""
    if not isinstance(item, dict):
        raise InvalidMessage(path, f"must be an object, got {_type_name(item)}")
    kind = _kind(item)
    if not isinstance(kind, str) or not kind:
        raise InvalidMessage(f"{path}.type", "is required: the item's type")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise InvalidMessage(
                f"{path}.role", f"unknown role {role!r}; expected one of {', '.join(_ROLES)}"
            )
        if "content" not in item:
            raise InvalidMessage(f"{path}.content", "is required on a message")
        message = {"role": role, "content": _content_to_chat(item["content"], f"{path}.content")}
        return {**_extra(item, _MESSAGE_KEYS), **message}
    if kind == "function_call":
        call = {
            "id": _call_id(item, path),
            "type": "function",
            "function": {
                "name": _text(item.get("name"), f"{path}.name"),
                "arguments": _text(item.get("arguments", ""), f"{path}.arguments"),
            },
        }
        return {
            **_extra(item, _CALL_KEYS),
            "role": "assistant",
            "content": None,
            "tool_calls": [call],
        }
    if kind == "custom_tool_call":
        arguments = orjson.dumps({"input": _text(item.get("input"), f"{path}.input")}).decode()
        call = {
            "id": _call_id(item, path),
            "type": "function",
            "function": {"name": _text(item.get("name"), f"{path}.name"), "arguments": arguments},
        }
        return {
            **_extra(item, _CUSTOM_KEYS),
            "role": "assistant",
            "content": None,
            "tool_calls": [call],
        }
    if kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        content = _content_to_chat(output, f"{path}.output")
        return {
            **_extra(item, _OUTPUT_KEYS),
            "role": "tool",
            "tool_call_id": _call_id(item, path),
            "content": content,
        }
    if "call_id" in item and kind.endswith("_call"):
        call = {
            "id": _call_id(item, path),
            "type": "function",
            "function": {"name": kind, "arguments": orjson.dumps(item).decode()},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if "call_id" in item and kind.endswith("_output"):
        return {
            "role": "tool",
            "tool_call_id": _call_id(item, path),
            "content": orjson.dumps(item).decode(),
        }
    return {"role": "assistant", "content": [{"type": RESPONSE_ITEM, RESPONSE_ITEM: item}]}


# --- chat messages to items ---------------------------------------------------------


def custom_tools(tools: Any) -> frozenset[str]:
    """The names of the request's ``custom`` (free-form) tools."""
    if not isinstance(tools, list):
        return frozenset()
    return frozenset(
        t["name"]
        for t in tools
        if isinstance(t, dict) and t.get("type") == "custom" and isinstance(t.get("name"), str)
    )


def _part_to_item(part: dict[str, Any], text_type: str) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        return {"type": text_type, "text": part.get("text", "")}
    if kind == "image_url":
        image = part.get("image_url") or {}
        out: dict[str, Any] = {"type": "input_image", "image_url": image.get("url")}
        if image.get("detail") is not None:
            out["detail"] = image["detail"]
        return out
    if kind == RESPONSE_PART and isinstance(part.get(RESPONSE_PART), dict):
        inner: dict[str, Any] = part[RESPONSE_PART]
        return inner
    return dict(part)  # a refusal, or another part as it is


def _content_to_items(content: Any, text_type: str) -> Any:
    if isinstance(content, list):
        return [_part_to_item(p, text_type) for p in content if isinstance(p, dict)]
    return content if isinstance(content, str) else ""


def _self_item(text: str, kind_suffix: str, call_id: str) -> dict[str, Any] | None:
    """The item a call or output of an unmodelled type was stored as (its own JSON)."""
    if not text.startswith("{"):
        return None
    try:
        item = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if (
        isinstance(item, dict)
        and isinstance(item.get("type"), str)
        and item["type"].endswith(kind_suffix)
        and item.get("call_id") == call_id
    ):
        return item
    return None


def _custom_input(arguments: str) -> str | None:
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {"input"} and isinstance(parsed["input"], str):
        return parsed["input"]
    return None


def to_items(messages: Iterable[dict[str, Any]], custom: frozenset[str]) -> list[dict[str, Any]]:
    """The context's chat messages written back as Responses input items."""
    items: list[dict[str, Any]] = []
    customs: set[str] = set()  # call ids of custom tool calls, for their outputs
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        if role == "tool":
            call_id = str(message.get("tool_call_id"))
            if isinstance(content, str):
                own = _self_item(content, "_output", call_id)
                if own is not None:
                    items.append(own)
                    continue
            kind = "custom_tool_call_output" if call_id in customs else "function_call_output"
            output = _content_to_items(content, "input_text")
            items.append({"type": kind, "call_id": call_id, "output": output})
            continue
        if role == "assistant":
            texts: list[dict[str, Any]] = []
            if isinstance(content, str) and content:
                texts.append({"type": "output_text", "text": content})
            elif isinstance(content, list):
                for part in content:
                    if not isinstance(part, dict):
                        continue
                    if part.get("type") == RESPONSE_ITEM and isinstance(
                        part.get(RESPONSE_ITEM), dict
                    ):
                        items.append(part[RESPONSE_ITEM])
                    else:
                        texts.append(_part_to_item(part, "output_text"))
            if texts:
                items.append({"type": "message", "role": "assistant", "content": texts})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                name, arguments = function.get("name", ""), function.get("arguments", "")
                call_id = call.get("id")
                if name.endswith("_call"):
                    own = _self_item(arguments, "_call", call_id)
                    if own is not None:
                        items.append(own)
                        continue
                free = _custom_input(arguments) if name in custom else None
                if free is not None:
                    customs.add(call_id)
                    items.append(
                        {
                            "type": "custom_tool_call",
                            "call_id": call_id,
                            "name": name,
                            "input": free,
                        }
                    )
                else:
                    items.append(
                        {
                            "type": "function_call",
                            "call_id": call_id,
                            "name": name,
                            "arguments": arguments,
                        }
                    )
            continue
        items.append(
            {"type": "message", "role": role, "content": _content_to_items(content, "input_text")}
        )
    return items


def upstream_bytes(request: ProxyRequest, messages: bytes) -> bytes:
    """The agent's request with the context (``messages``, chat messages as JSON) as its
    input, after the agent's own prompt items."""
    body = dict(request.body)
    context = to_items(orjson.loads(messages), custom_tools(body.get("tools")))
    body["input"] = [*request.system, *context]
    return orjson.dumps(body)


# --- replies ------------------------------------------------------------------------


def _finish_reason(response: dict[str, Any], items: list[Any]) -> str:
    if response.get("status") == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return "length" if reason == "max_output_tokens" else str(reason or "incomplete")
    calls = any(
        isinstance(i, dict) and str(i.get("type", "")).endswith("_call") and "call_id" in i
        for i in items
    )
    return "tool_calls" if calls else "stop"


def reply_of(data: Any) -> Reply:
    """The reply in a whole Responses response (``object: "response"``): its output
    items as the messages they are stored as."""
    if not isinstance(data, dict):
        raise UnreadableReply("the body is not a JSON object")
    output = data.get("output")
    if not isinstance(output, list):
        raise UnreadableReply("no output")
    if data.get("status") not in (None, "completed"):
        raise UnreadableReply(f"the response is {data.get('status')!r}, not completed")
    usage = data.get("usage")
    return _reply(output, _finish_reason(data, output), usage if isinstance(usage, dict) else None)


def _reply(output: list[Any], reason: str, usage: dict[str, Any] | None) -> Reply:
    try:
        messages = [to_message(item, f"output[{i}]") for i, item in enumerate(output)]
    except InvalidMessage as exc:
        raise UnreadableReply(f"{exc.path}: {exc.detail}") from None
    if not messages:
        return Reply({"role": "assistant", "content": ""}, reason, usage)
    return Reply(messages[0], reason, usage, tuple(messages[1:]))


class ResponsesStream:
    """Reads a Responses event stream as it passes through: every event goes on to the
    agent as it came; the reply is the ``response.completed`` event's response (its
    output items, or, if it lists none, the items of the ``response.output_item.done``
    events). A stream ending otherwise (``response.failed``, ``response.incomplete``, an
    ``error`` event, or no end at all) stores nothing."""

    def __init__(self) -> None:
        self.done = False
        self.failed: str | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self._response: dict[str, Any] | None = None
        self._items: dict[int, Any] = {}

    def feed(self, event: ServerSentEvent) -> bool:
        """Take the event in; whether to pass it on to the agent (always)."""
        data = _json(event.data)
        if not isinstance(data, dict):
            return True
        kind = data.get("type", event.name)
        if kind == "response.output_item.done":
            index = data.get("output_index")
            if isinstance(index, int):
                self._items[index] = data.get("item")
        elif kind == "response.completed":
            response = data.get("response")
            if isinstance(response, dict):
                self._response = response
                usage = response.get("usage")
                self.usage = usage if isinstance(usage, dict) else None
            self.done = True
        elif kind in ("response.failed", "response.incomplete", "error"):
            self.failed = str(kind)
            self.done = True
        return True

    @property
    def complete(self) -> bool:
        return self.done and self.failed is None and self._response is not None

    @property
    def unfinished(self) -> bool:
        """Whether a stream that ends here ends before its last event."""
        return not self.done

    def reply(self) -> Reply:
        """The completed reply (:attr:`complete` only); :class:`UnreadableReply` if its
        items cannot be stored."""
        response = self._response or {}
        output = response.get("output")
        if not isinstance(output, list) or not output:
            output = [item for _, item in sorted(self._items.items())]
        reason = _finish_reason(response, output)
        self.finish_reason = reason
        return _reply(output, reason, self.usage)


def stream_error(message: str) -> bytes:
    """An error event of a Responses stream (the OpenAI SDK raises it)."""
    error = {
        "type": "error",
        "code": "server_error",
        "message": message,
        "param": None,
        "error": {"type": "server_error", "message": message, "code": None, "param": None},
    }
    return b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"
