"""OpenAI Responses API items read as the chat messages compactd stores, and back.

compactd's routes speak OpenAI chat messages (and Anthropic's); an agent on the
Responses API (the OpenAI Agents SDK's sessions hold its input items) stores each item
as one chat message, the same way compactd's own Responses proxy does
(``app/engine/proxy/responses_format.py``), so that a session written by either reads
the same:

- a ``message`` item is that role's message (``input_text``/``output_text`` parts are
  text parts, an ``input_image`` with a URL an ``image_url`` part; any other part is kept
  whole as ``{"type": "response_part", "response_part": part}``);
- a ``function_call`` is an assistant message with that one tool call, a
  ``custom_tool_call`` one whose arguments are ``{"input": ...}``;
- a call's output (``function_call_output``, ``custom_tool_call_output``) is a ``tool``
  message answering its ``call_id``;
- another ``*_call`` item with a ``call_id`` is an assistant tool call named by the
  item's type whose arguments are the item itself (its output likewise);
- anything else (``reasoning`` with its ``encrypted_content``, a web search...) is an
  assistant message holding the item whole (``{"type": "response_item",
  "response_item": item}``), written back exactly as it came.

The other keys of an item (``id``, ``status``) stay with the stored message: the
history gives them back, the model's context does not.

Pure: no HTTP, no dependency.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

RESPONSE_ITEM = "response_item"
RESPONSE_PART = "response_part"

_ROLES = ("user", "assistant", "system", "developer")
_MESSAGE_KEYS = frozenset({"type", "role", "content"})
_CALL_KEYS = frozenset({"type", "call_id", "name", "arguments"})
_CUSTOM_KEYS = frozenset({"type", "call_id", "name", "input"})
_OUTPUT_KEYS = frozenset({"type", "call_id", "output"})
_TEXT_PARTS = frozenset({"input_text", "output_text"})
_IMAGE_KEYS = frozenset({"type", "image_url", "detail"})


def _dumps(value: Any) -> str:
    """Compact JSON, as the proxy writes it (so both store the same text)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _kind(item: Mapping[str, Any]) -> Any:
    """An item's type (an easy input message has none: ``{"role", "content"}``)."""
    return item.get("type", "message" if "role" in item else None)


def _extra(item: Mapping[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in known and v is not None}


def _text(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{path} must be a string, got {type(value).__name__}")
    return value


def _call_id(item: Mapping[str, Any], path: str) -> str:
    call_id = _text(item.get("call_id"), f"{path}.call_id")
    if not call_id:
        raise ValueError(f"{path}.call_id must not be empty")
    return call_id


def _part_to_chat(part: Any) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise ValueError(f"a content part must be an object, got {type(part).__name__}")
    kind = part.get("type")
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        out = {k: v for k, v in part.items() if k != "type"}
        out["type"] = "text"
        return out
    url = part.get("image_url")
    if kind == "input_image" and isinstance(url, str) and url and set(part) <= _IMAGE_KEYS:
        image: dict[str, Any] = {"url": url}
        if part.get("detail") is not None:
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return dict(part)
    return {"type": RESPONSE_PART, RESPONSE_PART: dict(part)}


def _content_to_chat(content: Any, path: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{path} must be a string or a list of parts")
    return [_part_to_chat(p) for p in content]


def item_to_message(item: Mapping[str, Any], path: str = "item") -> dict[str, Any]:
    """One Responses item as the chat message compactd stores (see the module's
    docstring); ``ValueError`` naming the field when it cannot be one."""
    item = dict(item)
    kind = _kind(item)
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{path}.type is required: the item's type")
    if kind == "message":
        role = item.get("role")
        if role not in _ROLES:
            raise ValueError(f"{path}.role: unknown role {role!r}")
        if "content" not in item:
            raise ValueError(f"{path}.content is required on a message")
        message = {"role": role, "content": _content_to_chat(item["content"], f"{path}.content")}
        return {**_extra(item, _MESSAGE_KEYS), **message}
    if kind in ("function_call", "custom_tool_call"):
        name = _text(item.get("name"), f"{path}.name")
        if kind == "function_call":
            arguments = _text(item.get("arguments", ""), f"{path}.arguments")
            known = _CALL_KEYS
        else:
            arguments = _dumps({"input": _text(item.get("input"), f"{path}.input")})
            known = _CUSTOM_KEYS
        call = {
            "id": _call_id(item, path),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        return {**_extra(item, known), "role": "assistant", "content": None, "tool_calls": [call]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {
            **_extra(item, _OUTPUT_KEYS),
            "role": "tool",
            "tool_call_id": _call_id(item, path),
            "content": _content_to_chat(item.get("output"), f"{path}.output"),
        }
    if "call_id" in item and kind.endswith("_call"):
        call = {
            "id": _call_id(item, path),
            "type": "function",
            "function": {"name": kind, "arguments": _dumps(item)},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if "call_id" in item and kind.endswith("_output"):
        return {"role": "tool", "tool_call_id": _call_id(item, path), "content": _dumps(item)}
    return {"role": "assistant", "content": [{"type": RESPONSE_ITEM, RESPONSE_ITEM: item}]}


def items_to_messages(items: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Responses items as chat messages, one message per item."""
    return [item_to_message(item, f"items[{i}]") for i, item in enumerate(items)]


def _part_to_item(part: Mapping[str, Any], text_type: str) -> dict[str, Any]:
    kind = part.get("type")
    if kind == "text":
        extra = {k: v for k, v in part.items() if k not in ("type", "text")}
        # Only an output_text part carries annotations (the API refuses them elsewhere).
        if text_type != "output_text":
            extra.pop("annotations", None)
        return {"type": text_type, "text": part.get("text", ""), **extra}
    if kind == "image_url":
        image = part.get("image_url") or {}
        out: dict[str, Any] = {"type": "input_image", "image_url": image.get("url")}
        out["detail"] = image.get("detail") or "auto"
        return out
    if kind == RESPONSE_PART and isinstance(part.get(RESPONSE_PART), Mapping):
        return dict(part[RESPONSE_PART])
    return dict(part)  # a refusal, or another part as it is


def _content_to_items(content: Any, text_type: str) -> Any:
    if isinstance(content, list):
        return [_part_to_item(p, text_type) for p in content if isinstance(p, Mapping)]
    return content if isinstance(content, str) else ""


def _self_item(text: str, kind_suffix: str, call_id: Any) -> dict[str, Any] | None:
    """The item a call or output of an unmodelled type was stored as (its own JSON)."""
    if not text.startswith("{"):
        return None
    try:
        item = json.loads(text)
    except ValueError:
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
        parsed = json.loads(arguments)
    except ValueError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {"input"} and isinstance(parsed["input"], str):
        return parsed["input"]
    return None


_KEPT_KEYS = ("id", "status")  # an item's own keys, given back by the history


def messages_to_items(
    messages: Iterable[Mapping[str, Any]], *, custom_tools: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Chat messages (a context or a history page, format ``openai``) as Responses
    input items. ``custom_tools``: the names of free-form (``custom``) tools, whose calls
    were stored as ``{"input": ...}`` arguments. An item's ``id`` and ``status`` come back
    when the message has them (the history keeps them; the context does not). Where the
    SDK's input types ask for a field the stored message lacks, it gets the API's
    default: an output text's ``annotations`` (``[]``), an image's ``detail``
    (``"auto"``)."""
    custom = frozenset(custom_tools)
    items: list[dict[str, Any]] = []
    customs: set[str] = set()  # call ids of custom tool calls, for their outputs
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        kept = {k: message[k] for k in _KEPT_KEYS if message.get(k) is not None}
        if role == "tool":
            call_id = str(message.get("tool_call_id"))
            if isinstance(content, str):
                own = _self_item(content, "_output", call_id)
                if own is not None:
                    items.append(own)
                    continue
            kind = "custom_tool_call_output" if call_id in customs else "function_call_output"
            output = _content_to_items(content, "input_text")
            items.append({"type": kind, "call_id": call_id, "output": output, **kept})
            continue
        if role == "assistant":
            texts: list[dict[str, Any]] = []
            if isinstance(content, str) and content:
                texts.append({"type": "output_text", "text": content, "annotations": []})
            elif isinstance(content, list):
                for part in content:
                    if not isinstance(part, Mapping):
                        continue
                    inner = part.get(RESPONSE_ITEM)
                    if part.get("type") == RESPONSE_ITEM and isinstance(inner, Mapping):
                        items.append(dict(inner))
                    else:
                        converted = _part_to_item(part, "output_text")
                        if converted.get("type") == "output_text":
                            converted.setdefault("annotations", [])
                        texts.append(converted)
            calls = list(message.get("tool_calls") or ())
            if texts:
                own_keys = kept if not calls else {}
                items.append({"type": "message", "role": "assistant", "content": texts, **own_keys})
            for call in calls:
                function = call.get("function") or {}
                name, arguments = function.get("name", ""), function.get("arguments", "")
                call_id = call.get("id")
                call_kept = kept if not texts and len(calls) == 1 else {}
                if name.endswith("_call"):
                    own = _self_item(arguments, "_call", call_id)
                    if own is not None:
                        items.append(own)
                        continue
                free = _custom_input(arguments) if name in custom else None
                if free is not None:
                    customs.add(str(call_id))
                    item = {"type": "custom_tool_call", "call_id": call_id, "name": name}
                    items.append({**item, "input": free, **call_kept})
                else:
                    item = {"type": "function_call", "call_id": call_id, "name": name}
                    items.append({**item, "arguments": arguments, **call_kept})
            continue
        items.append(
            {
                "type": "message",
                "role": role,
                "content": _content_to_items(content, "input_text"),
                **kept,
            }
        )
    return items
