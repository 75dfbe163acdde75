"""Anthropic Messages API messages to and from the canonical model."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import orjson

from app.engine.formats import opaque
from app.engine.formats.openai_format import _split_extra, _string, _type_name
from app.engine.model import ContentForm, Entry, InvalidMessage, Part

_DATA_URL_PREFIX = "data:"


def _image_part(raw: dict[str, Any], path: str) -> Part:
    source = raw.get("source")
    if not isinstance(source, dict):
        raise InvalidMessage(f"{path}.source", "must be an object")
    kind = source.get("type")
    if kind == "base64":
        return {
            "type": "image",
            "media_type": _string(
                source.get("media_type"), f"{path}.source.media_type", allow_empty=False
            ),
            "data": _string(source.get("data"), f"{path}.source.data", allow_empty=False),
        }
    if kind == "url":
        return {
            "type": "image",
            "url": _string(source.get("url"), f"{path}.source.url", allow_empty=False),
        }
    raise InvalidMessage(
        f"{path}.source.type", f"unsupported image source {kind!r}; expected 'base64' or 'url'"
    )


def _image(block: dict[str, Any], path: str) -> Part:
    """An image block: modelled when its source is base64 or a URL, kept opaquely when
    it is one compactd does not model (a Files API ``file_id``)."""
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") in opaque.ANTHROPIC_OPAQUE_IMAGE_SOURCES:
        opaque.check_anthropic(block, path)
        return opaque.opaque_part("anthropic", block)
    return _with_extra(_image_part(block, path), block, frozenset({"type", "source"}))


def _form_of(content: Any) -> ContentForm:
    return "string" if isinstance(content, str) else "parts"


def _with_extra(part: Part, raw: dict[str, Any], known: frozenset[str]) -> Part:
    extra = _split_extra(raw, known)
    if extra:
        part["extra"] = extra
    return part


def _blocks(content: Any, path: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise InvalidMessage(
            path, f"must be a string or a list of content blocks, got {_type_name(content)}"
        )
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise InvalidMessage(f"{path}[{i}]", f"must be an object, got {_type_name(block)}")
    return content


_RESULT_OPAQUE = sorted(opaque.ANTHROPIC_RESULT_BLOCKS)


def _result_content(content: Any, path: str) -> list[Part]:
    if content is None:
        return []
    parts: list[Part] = []
    for i, block in enumerate(_blocks(content, path)):
        bpath = f"{path}[{i}]"
        if block.get("type") == "text":
            parts.append(
                _with_extra(
                    {"type": "text", "text": _string(block.get("text"), f"{bpath}.text")},
                    block,
                    frozenset({"type", "text"}),
                )
            )
        elif block.get("type") == "image":
            parts.append(_image(block, bpath))
        elif block.get("type") in opaque.ANTHROPIC_RESULT_BLOCKS:
            opaque.check_anthropic(block, bpath)
            parts.append(opaque.opaque_part("anthropic", block))
        else:
            allowed = ", ".join(repr(k) for k in ("text", "image", *_RESULT_OPAQUE))
            raise InvalidMessage(
                f"{bpath}.type",
                f"unsupported tool_result content type {block.get('type')!r}; expected {allowed}",
            )
    return parts


def parse_system(raw: Any, path: str = "system") -> Entry | None:
    """A request's top-level ``system`` as one system entry: a string, or a list
    of text blocks whose other keys (``cache_control``, ``citations``) are kept
    for the stored history, never shown to the model. None when it holds no
    block (an empty string or list)."""
    if isinstance(raw, str):
        if not raw:
            return None
        return Entry(role="system", parts=[{"type": "text", "text": raw}], content_form="string")
    if not isinstance(raw, list):
        raise InvalidMessage(
            path, f"must be a string or a list of text blocks, got {_type_name(raw)}"
        )
    parts: list[Part] = []
    for i, block in enumerate(raw):
        bpath = f"{path}[{i}]"
        if not isinstance(block, dict):
            raise InvalidMessage(bpath, f"must be an object, got {_type_name(block)}")
        if block.get("type") != "text":
            raise InvalidMessage(
                f"{bpath}.type", f"system blocks must be text blocks, got {block.get('type')!r}"
            )
        text = _string(block.get("text"), f"{bpath}.text")
        parts.append(
            _with_extra({"type": "text", "text": text}, block, frozenset({"type", "text"}))
        )
    return Entry(role="system", parts=parts, content_form="parts") if parts else None


def system_texts(parts: list[Part]) -> list[str]:
    """What makes two system prompts the same: their text blocks' texts, in
    order (a string is one block; ``cache_control`` and other keys do not count)."""
    return [p["text"] for p in parts if p.get("type") == "text"]


_EXPECTED = {
    "user": ", ".join(["text", "image", "tool_result", *sorted(opaque.ANTHROPIC_USER_BLOCKS)]),
    "assistant": ", ".join(
        [
            "text",
            "thinking",
            "redacted_thinking",
            "tool_use",
            *sorted(opaque.ANTHROPIC_ASSISTANT_BLOCKS),
            "a server tool's <name>_tool_result",
        ]
    ),
}


def parse_message(raw: Any, path: str) -> list[Entry]:
    """One Anthropic message to one or more entries (tool results become tool entries)."""
    if not isinstance(raw, dict):
        raise InvalidMessage(path, f"must be an object, got {_type_name(raw)}")
    role = raw.get("role")
    if role not in ("user", "assistant", "system"):
        raise InvalidMessage(
            f"{path}.role", f"unknown role {role!r}; expected user, assistant or system"
        )
    if "content" not in raw:
        raise InvalidMessage(f"{path}.content", "is required")
    extra = _split_extra(raw, frozenset({"role", "content"}))
    form: ContentForm = "string" if isinstance(raw["content"], str) else "parts"
    blocks = _blocks(raw["content"], f"{path}.content")
    if role == "system":
        # A mid-conversation system message: its blocks' other keys (cache_control) are
        # kept for the stored history, as a top-level system's are.
        parts: list[Part] = []
        for i, block in enumerate(blocks):
            if block.get("type") != "text":
                raise InvalidMessage(
                    f"{path}.content[{i}].type", "system content must be text blocks"
                )
            text = _string(block.get("text"), f"{path}.content[{i}].text")
            parts.append(
                _with_extra({"type": "text", "text": text}, block, frozenset({"type", "text"}))
            )
        return [Entry(role="system", parts=parts, content_form=form, extra=extra)]

    entries: list[Entry] = []
    parts = []
    for i, block in enumerate(blocks):
        bpath = f"{path}.content[{i}]"
        kind = block.get("type")
        if kind == "text":
            parts.append(
                _with_extra(
                    {"type": "text", "text": _string(block.get("text"), f"{bpath}.text")},
                    block,
                    frozenset({"type", "text"}),
                )
            )
        elif kind == "image" and role == "user":
            parts.append(_image(block, bpath))
        elif opaque.anthropic_opaque(kind, role):
            # Server tool blocks, documents and the like: kept as sent (app.engine.formats.opaque).
            opaque.check_anthropic(block, bpath)
            parts.append(opaque.opaque_part("anthropic", block))
        elif kind == "thinking" and role == "assistant":
            part: Part = {
                "type": "reasoning",
                "text": _string(block.get("thinking"), f"{bpath}.thinking"),
            }
            if block.get("signature") is not None:
                part["signature"] = _string(block["signature"], f"{bpath}.signature")
            parts.append(_with_extra(part, block, frozenset({"type", "thinking", "signature"})))
        elif kind == "redacted_thinking" and role == "assistant":
            part = {"type": "reasoning", "redacted": _string(block.get("data"), f"{bpath}.data")}
            parts.append(_with_extra(part, block, frozenset({"type", "data"})))
        elif kind == "tool_use" and role == "assistant":
            tool_input = block.get("input", {})
            if not isinstance(tool_input, dict):
                raise InvalidMessage(
                    f"{bpath}.input", f"must be an object, got {_type_name(tool_input)}"
                )
            try:
                arguments = orjson.dumps(tool_input).decode()
            except orjson.JSONEncodeError as exc:  # e.g. an integer beyond 64 bits
                raise InvalidMessage(f"{bpath}.input", f"cannot be stored ({exc})") from None
            part = {
                "type": "tool_call",
                "id": _string(block.get("id"), f"{bpath}.id", allow_empty=False),
                "name": _string(block.get("name"), f"{bpath}.name", allow_empty=False),
                "arguments": arguments,
            }
            parts.append(_with_extra(part, block, frozenset({"type", "id", "name", "input"})))
        elif kind == "tool_result" and role == "user":
            if parts:
                raise InvalidMessage(
                    bpath, "tool_result blocks must come before any other content in a user message"
                )
            is_error = block.get("is_error", False)
            if not isinstance(is_error, bool):
                raise InvalidMessage(f"{bpath}.is_error", "must be a boolean")
            result_extra = _split_extra(
                block, frozenset({"type", "tool_use_id", "content", "is_error"})
            )
            entries.append(
                Entry(
                    role="tool",
                    parts=_result_content(block.get("content"), f"{bpath}.content"),
                    tool_call_id=_string(
                        block.get("tool_use_id"), f"{bpath}.tool_use_id", allow_empty=False
                    ),
                    is_error=is_error,
                    content_form=_form_of(block.get("content")),
                    extra=result_extra,
                )
            )
        else:
            raise InvalidMessage(
                f"{bpath}.type",
                f"unsupported content block {kind!r} in a {role} message; "
                f"expected {_EXPECTED[role]}",
            )
    if parts or not entries:
        entries.append(Entry(role=role, parts=parts, content_form=form, extra=extra))
    elif extra:
        entries[-1].extra = {**entries[-1].extra, "message": extra}
    return entries


def _data_url(url: str) -> tuple[str, str] | None:
    if not url.startswith(_DATA_URL_PREFIX) or ";base64," not in url:
        return None
    header, data = url[len(_DATA_URL_PREFIX) :].split(";base64,", 1)
    return header, data


_MODEL_ID = re.compile(r"[A-Za-z0-9_-]+")


def model_id(call_id: str) -> str:
    """A tool call id as Anthropic accepts it (``^[a-zA-Z0-9_-]+$``).

    Ids from other providers may not fit (Kimi's ``functions.bash:0``); they are
    rewritten in the model's view only, the same way for a call and its result,
    with a hash of the original so that two ids never meet in one rewrite. The
    stored history keeps the id the client sent.
    """
    if _MODEL_ID.fullmatch(call_id):
        return call_id
    digest = hashlib.sha1(call_id.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return re.sub(r"[^A-Za-z0-9_-]", "_", call_id) + "_" + digest


def _render_block(part: Part, *, for_history: bool) -> dict[str, Any] | None:
    kind = part["type"]
    if kind == opaque.OPAQUE:
        if part["format"] == "anthropic":
            return opaque.native(part, for_history=for_history)
        # Another format's part: a short text in its place (app.engine.formats.opaque).
        return {"type": "text", "text": opaque.placeholder(part)}
    if kind == "text":
        if not part["text"] and not for_history:
            return None  # the API rejects empty text blocks
        block: dict[str, Any] = {"type": "text", "text": part["text"]}
    elif kind == "image":
        if "url" in part:
            inline = _data_url(part["url"])
            source = (
                {"type": "base64", "media_type": inline[0], "data": inline[1]}
                if inline
                else {"type": "url", "url": part["url"]}
            )
        else:
            source = {"type": "base64", "media_type": part["media_type"], "data": part["data"]}
        block = {"type": "image", "source": source}
    elif kind == "reasoning":
        if "redacted" in part:
            block = {"type": "redacted_thinking", "data": part["redacted"]}
        elif "signature" in part:
            block = {"type": "thinking", "thinking": part["text"], "signature": part["signature"]}
        elif for_history:
            block = {"type": "thinking", "thinking": part["text"]}
        else:
            return None  # unsigned reasoning from another provider cannot be replayed to Anthropic
    else:  # tool_call
        arguments = part["arguments"]
        block = {
            "type": "tool_use",
            "id": part["id"] if for_history else model_id(part["id"]),
            "name": part["name"],
            "input": orjson.loads(arguments) if arguments.strip() else {},
        }
    if for_history and "extra" in part:
        block.update(part["extra"])
    return block


def _tool_result_block(entry: Entry, *, for_history: bool) -> dict[str, Any]:
    blocks = [b for p in entry.parts if (b := _render_block(p, for_history=for_history))]
    content: Any = blocks
    if entry.content_form == "string" and all(p["type"] == "text" for p in entry.parts):
        content = entry.text()
    block: dict[str, Any] = {
        "type": "tool_result",
        "tool_use_id": entry.tool_call_id
        if for_history or entry.tool_call_id is None
        else model_id(entry.tool_call_id),
        "content": content,
    }
    if entry.is_error:
        block["is_error"] = True
    if for_history and entry.extra:
        block.update({k: v for k, v in entry.extra.items() if k != "message"})
    return block


# The pseudo-block that ends a system entry's stored view when its message had keys of
# its own (Claude Code's per-turn ``output_config``): a view of a system entry is always
# read back (app.engine.window.view), never spliced as it is, and this is not a block of the API.
MESSAGE_KEYS = "message_keys"


def entry_blocks(entry: Entry) -> list[dict[str, Any]]:
    """One entry's blocks as the model sees them: a tool entry is one ``tool_result``,
    a system entry its text blocks (and its message's own keys in a
    :data:`MESSAGE_KEYS` pseudo-block, for a ``role: "system"`` message to carry),
    any other entry its rendered parts."""
    if entry.role == "tool":
        return [_tool_result_block(entry, for_history=False)]
    if entry.role in ("system", "developer"):
        blocks = [{"type": "text", "text": p["text"]} for p in entry.parts if p["type"] == "text"]
        if entry.extra:
            blocks.append({**entry.extra, "type": MESSAGE_KEYS})
        return blocks
    return [b for p in entry.parts if (b := _render_block(p, for_history=False))]


def system_message(texts: Iterable[str], keys: dict[str, Any]) -> dict[str, Any] | None:
    """A mid-conversation ``role: "system"`` message as the model is sent it: its
    non-empty texts as text blocks, then its message's own keys; None when it says
    nothing (the API refuses empty text blocks)."""
    content = [{"type": "text", "text": t} for t in texts if t]
    if not content:
        return None
    return {"role": "system", "content": content, **keys}


# The beta under which an Anthropic request may carry ``role: "system"`` messages
# inside ``messages`` (Claude Code names it in ``anthropic-beta``), in any dated version.
SYSTEM_MESSAGES_BETA = re.compile(r"mid-conversation-system-\d{4}-\d{2}-\d{2}")


def system_messages_allowed(
    messages: Iterable[Any], headers: Iterable[tuple[bytes, bytes]]
) -> bool:
    """Whether an agent's request may be sent system entries after its first message as
    ``role: "system"`` messages (Anthropic's mid-conversation system messages) rather
    than as user text in ``<system>`` tags: its ``anthropic-beta`` header names
    :data:`SYSTEM_MESSAGES_BETA`, or its history holds such a message itself (a model
    that takes them with no beta, Claude Opus 4.8). The agent knows what its model
    takes; a request that shows neither gets the tags, which every endpoint takes."""
    for name, value in headers:
        if name.lower() == b"anthropic-beta" and any(
            SYSTEM_MESSAGES_BETA.fullmatch(beta.strip())
            for beta in value.decode("latin-1").split(",")
        ):
            return True
    return any(isinstance(m, dict) and m.get("role") == "system" for m in messages)


def render_messages(
    entries: list[Entry], *, for_history: bool = False, system_messages: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Entries as Anthropic ``(system, messages)``.

    Leading system and developer entries become the top-level ``system`` blocks;
    later ones become user text wrapped in ``<system>``, or, with
    ``system_messages`` (:func:`system_messages_allowed`), ``role: "system"``
    messages in their place. Tool entries become ``tool_result`` blocks at the head
    of a user message, merged with the user content that follows them, as the API
    requires.
    """
    system: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    open_results: dict[str, Any] | None = None  # the user message collecting tool results
    for entry in entries:
        if entry.role in ("system", "developer"):
            if not messages:
                system.extend(
                    {"type": "text", "text": p["text"]}
                    for p in entry.parts
                    if p["type"] == "text" and p["text"]
                )
                continue
            if system_messages and not for_history:
                open_results = None  # what follows it is not merged before it
                said = system_message(
                    (p["text"] for p in entry.parts if p["type"] == "text"), entry.extra
                )
                if said is not None:
                    messages.append(said)
                continue
            entry = Entry(
                role="user",
                parts=[{"type": "text", "text": f"<system>\n{entry.text()}\n</system>"}],
            )
        if entry.role == "tool":
            block = _tool_result_block(entry, for_history=for_history)
            if open_results is None:
                open_results = {"role": "user", "content": []}
                messages.append(open_results)
            open_results["content"].append(block)
            if for_history and "message" in entry.extra:
                # The message-level keys of a user message that held only tool results.
                open_results.update(entry.extra["message"])
            continue
        blocks = [b for p in entry.parts if (b := _render_block(p, for_history=for_history))]
        if entry.role == "user" and open_results is not None:
            open_results["content"].extend(blocks)
            if for_history and entry.extra:
                open_results.update(entry.extra)  # the keys of the message the results came in
            open_results = None
            continue
        open_results = None
        if not blocks and not for_history:
            continue
        content: Any = blocks
        # The history gives back the string the client sent; the model always gets
        # blocks (the same to the API), so a context can be assembled from stored blocks.
        if (
            for_history
            and entry.content_form == "string"
            and all(b["type"] == "text" for b in blocks)
        ):
            content = entry.text()
        msg: dict[str, Any] = {"role": entry.role, "content": content}
        if for_history and entry.extra:
            msg.update(entry.extra)
        messages.append(msg)
    if for_history:
        return system, messages
    return system, alternate(messages)


# The user turn that opens a view whose first message is the assistant's (the
# agent's own history began that way): Bedrock and other Anthropic-compatible
# endpoints refuse an assistant first ("first message must use the user role").
# The same minimal placeholder LiteLLM inserts; it costs about four tokens that
# no stored entry counts, which calibration absorbs like any framing.
OPENING_TEXT = "."


def alternate(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The model's messages with roles strictly alternating, the user's first.

    Consecutive messages of one role become one (a summary followed by a kept
    user message, the user's own messages sent back to back, a system note
    wrapped as user text): the Messages API would combine them anyway, and
    some compatible endpoints refuse them. In a merged user message the
    ``tool_result`` blocks come first, as the API requires. Merging only drops
    framing, so the stored counts still cover what is sent. A ``role: "system"``
    message (:func:`render_messages`' ``system_messages``) stays as it is, in its
    place between the turns, merged with nothing.
    """
    runs = alternate_runs(
        ((m["role"], [m] if m["role"] == "system" else m["content"]) for m in messages),
        is_result=lambda block: block["type"] == "tool_result",
        opening={"type": "text", "text": OPENING_TEXT},
    )
    return [
        blocks[0] if role == "system" else {"role": role, "content": blocks}
        for role, blocks in runs
    ]


_Block = TypeVar("_Block")


def alternate_runs(
    messages: Iterable[tuple[str, list[_Block]]],
    *,
    is_result: Callable[[_Block], bool],
    opening: _Block,
) -> list[tuple[str, list[_Block]]]:
    """The rule of :func:`alternate` over ``(role, blocks)`` pairs, whatever a block
    is (a dict here, a JSON fragment in :func:`app.engine.window.view.assemble_anthropic`):
    one message per run of a role, its tool results first (a stable partition),
    and ``opening`` as a user turn before an assistant's first message. A system
    message is never merged (its one block is the whole message)."""
    out: list[tuple[str, list[_Block]]] = []
    for role, blocks in messages:
        if out and out[-1][0] == role and role != "system":
            out[-1][1].extend(blocks)
        else:
            out.append((role, list(blocks)))
    if out and out[0][0] != "user":
        out.insert(0, ("user", [opening]))
    return [
        (role, sorted(blocks, key=lambda b: not is_result(b)) if role == "user" else blocks)
        for role, blocks in out
    ]
