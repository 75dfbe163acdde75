"""OpenAI chat-completions messages to and from the canonical model."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from app.engine.formats import opaque
from app.engine.model import ContentForm, Entry, InvalidMessage, Part

_MESSAGE_KEYS = frozenset(
    {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
)
_TOOL_CALL_KEYS = frozenset({"id", "type", "function"})


def _split_extra(obj: dict[str, Any], known: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in known}


def _string(value: Any, path: str, *, allow_empty: bool = True) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(path, f"must be a string, got {_type_name(value)}")
    if not allow_empty and not value:
        raise InvalidMessage(path, "must not be empty")
    return value


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


_LONG_DIGITS = re.compile(r"\d{19}")
_INT64 = range(-(2**63), 2**63)


def _int64(literal: str, path: str) -> int:
    value = int(literal)
    if value not in _INT64:
        raise InvalidMessage(
            path,
            f"holds the integer {literal[:30]}, outside the 64-bit range, which cannot be stored",
        )
    return value


def parse_arguments(arguments: str, path: str) -> dict[str, Any]:
    """Tool-call arguments must be a JSON object (an empty string means no arguments)."""
    if arguments.strip() == "":
        return {}
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(path, f"is not valid JSON ({exc})") from None
    if _LONG_DIGITS.search(arguments):
        # orjson reads an integer beyond 64 bits as a float, silently: the stored
        # Anthropic view would then change the number. Such an integer is refused, as
        # everywhere else in a body (look again only when a literal could be one).
        json.loads(arguments, parse_int=lambda literal: _int64(literal, path))
    if not isinstance(parsed, dict):
        raise InvalidMessage(path, f"must encode a JSON object, got {_type_name(parsed)}")
    return parsed


# The content parts each role takes: text always; images from users and tools (as
# before: OpenAI-compatible servers take them in tool results); a user's file and
# audio, an assistant's refusal kept opaquely (app.engine.formats.opaque).
_PARTS_BY_ROLE: dict[str, tuple[str, ...]] = {
    "user": ("text", "image_url", *sorted(opaque.OPENAI_USER_PARTS)),
    "tool": ("text", "image_url", *sorted(opaque.OPENAI_TOOL_PARTS)),
    "assistant": ("text", *sorted(opaque.OPENAI_ASSISTANT_PARTS)),
}


def _content_parts(content: Any, path: str, *, role: str) -> tuple[list[Part], ContentForm]:
    if isinstance(content, str):
        return ([{"type": "text", "text": content}] if content else []), "string"
    if content is None:
        return [], "null"
    if not isinstance(content, list):
        raise InvalidMessage(
            path, f"must be a string, a list of parts or null, got {_type_name(content)}"
        )
    allowed = _PARTS_BY_ROLE.get(role, ("text",))
    parts: list[Part] = []
    for i, raw in enumerate(content):
        ppath = f"{path}[{i}]"
        if not isinstance(raw, dict):
            raise InvalidMessage(ppath, f"must be an object, got {_type_name(raw)}")
        kind = raw.get("type")
        if kind not in allowed:
            expected = " or ".join(f"{k!r}" for k in allowed)
            raise InvalidMessage(
                f"{ppath}.type",
                f"unsupported content part type {kind!r} in a {role} message; expected {expected}",
            )
        if kind == "text":
            part: Part = {"type": "text", "text": _string(raw.get("text"), f"{ppath}.text")}
            extra = _split_extra(raw, frozenset({"type", "text"}))
        elif kind == "image_url":
            image = raw.get("image_url")
            if not isinstance(image, dict):
                raise InvalidMessage(f"{ppath}.image_url", "must be an object with a url")
            part = {
                "type": "image",
                "url": _string(image.get("url"), f"{ppath}.image_url.url", allow_empty=False),
            }
            if image.get("detail") is not None:
                part["detail"] = _string(image["detail"], f"{ppath}.image_url.detail")
            extra = _split_extra(raw, frozenset({"type", "image_url"}))
        else:
            opaque.check_openai(raw, ppath)
            parts.append(opaque.opaque_part("openai", raw))
            continue
        if extra:
            part["extra"] = extra
        parts.append(part)
    return parts, "parts"


def parse_message(raw: Any, path: str) -> Entry:
    """One OpenAI chat message to an entry. Raises :class:`InvalidMessage`."""
    if not isinstance(raw, dict):
        raise InvalidMessage(path, f"must be an object, got {_type_name(raw)}")
    role = raw.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise InvalidMessage(
            f"{path}.role",
            f"unknown role {role!r}; expected one of system, developer, user, assistant, tool",
        )
    extra = _split_extra(raw, _MESSAGE_KEYS)
    name = raw.get("name")
    if name is not None:
        _string(name, f"{path}.name")
    form: ContentForm
    parts: list[Part]
    if "content" not in raw:
        parts, form = [], "absent"
    else:
        parts, form = _content_parts(raw["content"], f"{path}.content", role=role)
    entry = Entry(role=role, parts=parts, name=name, content_form=form, extra=extra)

    for key in ("tool_calls", "reasoning_content"):
        if role != "assistant" and raw.get(key) is not None:
            raise InvalidMessage(
                f"{path}.{key}", f"is only allowed on assistant messages, not {role}"
            )
    if role != "tool" and raw.get("tool_call_id") is not None:
        raise InvalidMessage(f"{path}.tool_call_id", "is only allowed on tool messages")

    if role in ("system", "developer", "user") and form in ("null", "absent"):
        raise InvalidMessage(f"{path}.content", f"is required on {role} messages")
    if role == "tool":
        entry.tool_call_id = _string(
            raw.get("tool_call_id"), f"{path}.tool_call_id", allow_empty=False
        )
        if form in ("null", "absent"):
            raise InvalidMessage(f"{path}.content", "is required on tool messages")
    if role == "assistant":
        reasoning = raw.get("reasoning_content")
        if reasoning is not None:
            entry.parts.insert(
                0, {"type": "reasoning", "text": _string(reasoning, f"{path}.reasoning_content")}
            )
        calls = raw.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise InvalidMessage(
                    f"{path}.tool_calls", f"must be a list, got {_type_name(calls)}"
                )
            for i, call in enumerate(calls):
                entry.parts.append(_parse_tool_call(call, f"{path}.tool_calls[{i}]"))
    return entry


def _parse_tool_call(call: Any, path: str) -> Part:
    if not isinstance(call, dict):
        raise InvalidMessage(path, f"must be an object, got {_type_name(call)}")
    if call.get("type", "function") != "function":
        raise InvalidMessage(
            f"{path}.type", f"unsupported tool call type {call.get('type')!r}; expected 'function'"
        )
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise InvalidMessage(f"{path}.function", "must be an object with name and arguments")
    arguments = _string(fn.get("arguments", ""), f"{path}.function.arguments")
    parse_arguments(arguments, f"{path}.function.arguments")
    part: Part = {
        "type": "tool_call",
        "id": _string(call.get("id"), f"{path}.id", allow_empty=False),
        "name": _string(fn.get("name"), f"{path}.function.name", allow_empty=False),
        "arguments": arguments,
    }
    extra = _split_extra(call, _TOOL_CALL_KEYS)
    fn_extra = _split_extra(fn, frozenset({"name", "arguments"}))
    if fn_extra:
        extra["function"] = fn_extra
    if extra:
        part["extra"] = extra
    return part


def _render_content(entry: Entry, *, for_history: bool) -> Any:
    content = [p for p in entry.parts if p["type"] in ("text", "image", opaque.OPAQUE)]
    form = entry.content_form
    if form == "string" or (form in ("null", "absent") and content):
        if all(p["type"] == "text" for p in content):
            return "".join(p["text"] for p in content)
        form = "parts"
    if form in ("null", "absent"):
        return None
    rendered: list[dict[str, Any]] = []
    for p in content:
        if p["type"] == opaque.OPAQUE:
            if p["format"] == "openai":
                rendered.append(opaque.native(p, for_history=for_history))
            else:
                # Another format's block: a short text in its place (app.engine.formats.opaque).
                rendered.append({"type": "text", "text": opaque.placeholder(p)})
            continue
        if p["type"] == "text":
            out: dict[str, Any] = {"type": "text", "text": p["text"]}
        else:
            url = p.get("url") or f"data:{p['media_type']};base64,{p['data']}"
            image: dict[str, Any] = {"url": url}
            if "detail" in p:
                image["detail"] = p["detail"]
            out = {"type": "image_url", "image_url": image}
        if for_history and "extra" in p:
            out.update(p["extra"])
        rendered.append(out)
    return rendered


def render_message(entry: Entry, *, for_history: bool = False) -> dict[str, Any]:
    """An entry as an OpenAI chat message.

    ``for_history`` gives back the unknown keys the client sent with it; the
    model's context never carries them.
    """
    msg: dict[str, Any] = {"role": entry.role}
    content = _render_content(entry, for_history=for_history)
    if content == [] and entry.role != "assistant" and not for_history:
        content = ""  # the API rejects an empty parts list; the history gives back what was sent
    if content is not None or entry.content_form != "absent" or entry.role != "assistant":
        msg["content"] = (
            content if content is not None else ("" if entry.role != "assistant" else None)
        )
    if entry.name is not None:
        msg["name"] = entry.name
    if entry.role == "tool":
        msg["tool_call_id"] = entry.tool_call_id
    if entry.role == "assistant":
        reasoning = [p["text"] for p in entry.parts if p["type"] == "reasoning" and "text" in p]
        if reasoning:
            msg["reasoning_content"] = "\n".join(reasoning)
        calls = []
        for p in entry.tool_calls():
            call: dict[str, Any] = {
                "id": p["id"],
                "type": "function",
                "function": {"name": p["name"], "arguments": p["arguments"]},
            }
            extra = p.get("extra")
            if for_history and extra:
                call.update({k: v for k, v in extra.items() if k != "function"})
                call["function"].update(extra.get("function", {}))
            calls.append(call)
        if calls:
            msg["tool_calls"] = calls
    if for_history and entry.extra:
        msg.update(entry.extra)
    return msg
