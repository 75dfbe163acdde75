"""Content blocks and parts compactd keeps without modelling them, exactly as sent.

The providers' APIs return and accept content that is neither text, an image, reasoning,
a client tool call nor its result, and that compactd has no reason to read:

- Anthropic: the blocks of server-run tools, which the API runs inside one assistant
  turn (``server_tool_use`` and its ``web_search_tool_result``, ``web_fetch_tool_result``,
  ``code_execution_tool_result``...; ``mcp_tool_use`` and ``mcp_tool_result``), a
  ``container_upload`` and a ``compaction`` block; a user's ``document``,
  ``search_result`` and an ``image`` from the Files API (``source.type`` ``file``); and in
  a ``tool_result``'s content, ``document``, ``search_result``, ``tool_reference`` and
  ``browser_state``.
- OpenAI chat: a user's ``file`` and ``input_audio`` parts, an assistant's ``refusal``.

Refusing them killed a proxied session: the reply passed through, and every later call
carrying it back was refused. Each one is stored as one *opaque part*::

    {"type": "opaque", "format": "anthropic" | "openai", "block": {...}, "extra"?: {...}}

``block`` is the block or part as the client sent it, but for an Anthropic block's
``cache_control``, kept in ``extra`` like every other part's client keys: the stored
history gives it back, the model's view does not (the agent moves its cache markers
from call to call, and the API allows four). Rendered in the format it came in, an
opaque part is that block again, unchanged. Rendered in the other format it becomes a
short text, :func:`placeholder` (an assistant's refusal: its own words), so that the
message stays valid there: neither API takes the other's blocks.

Server tool blocks are not client tool calls: the API runs the tool and puts its result
in the same assistant message, so nothing here pairs them, and the pairing of client
tool calls and results (:mod:`app.engine.window.context`) does not see them. They count as
content: an assistant message that keeps them after its abandoned calls are dropped is
kept. Their tokens are an estimate, see :func:`app.engine.accounting.tokens.count_opaque_block`.
"""

from __future__ import annotations

from typing import Any, Literal

from app.engine.model import InvalidMessage, Part

OPAQUE = "opaque"

OpaqueFormat = Literal["anthropic", "openai"]

# Anthropic blocks taken as opaque, by the role of the message that holds them. A
# server tool's result is ``<tool>_tool_result`` (any name but the client's
# ``tool_result``), so that a server tool the API adds later is stored too.
ANTHROPIC_USER_BLOCKS = frozenset({"document", "search_result", "container_upload"})
ANTHROPIC_ASSISTANT_BLOCKS = frozenset(
    {"server_tool_use", "mcp_tool_use", "container_upload", "compaction"}
)
ANTHROPIC_RESULT_BLOCKS = frozenset(
    {"document", "search_result", "tool_reference", "browser_state"}
)
SERVER_RESULT_SUFFIX = "_tool_result"
# An image whose source compactd does not model (a Files API ``file_id``) is kept too.
ANTHROPIC_OPAQUE_IMAGE_SOURCES = frozenset({"file"})

# OpenAI chat content parts taken as opaque, by role. ``response_item`` and
# ``response_part`` carry what the Responses API sends that chat has no form for (a
# reasoning item with its ``encrypted_content``, an ``input_file`` part...), under their
# own names, as the proxy's Responses route translates it (app.engine.proxy.responses_format).
RESPONSE_ITEM = "response_item"
RESPONSE_PART = "response_part"
OPENAI_USER_PARTS = frozenset({"file", "input_audio", RESPONSE_PART})
OPENAI_TOOL_PARTS = frozenset({RESPONSE_PART})
OPENAI_ASSISTANT_PARTS = frozenset({"refusal", RESPONSE_ITEM, RESPONSE_PART})

_PROVIDER = {"anthropic": "Anthropic", "openai": "OpenAI"}
_NOUN = {"anthropic": "block", "openai": "part"}


def is_server_result(kind: Any) -> bool:
    """Whether ``kind`` names a server tool's result block (``web_search_tool_result``...)."""
    return (
        isinstance(kind, str)
        and kind.endswith(SERVER_RESULT_SUFFIX)
        and len(kind) > len(SERVER_RESULT_SUFFIX)
    )


def anthropic_opaque(kind: Any, role: str) -> bool:
    """Whether a block of type ``kind`` in a ``role`` message is stored opaquely."""
    if role == "user":
        return kind in ANTHROPIC_USER_BLOCKS
    if role == "assistant":
        return kind in ANTHROPIC_ASSISTANT_BLOCKS or is_server_result(kind)
    return False


def _text(block: dict[str, Any], key: str, path: str) -> None:
    value = block.get(key)
    if not isinstance(value, str) or not value:
        got = "null" if value is None else type(value).__name__
        detail = "must not be empty" if value == "" else f"must be a string, got {got}"
        raise InvalidMessage(f"{path}.{key}", detail)


def _object(block: dict[str, Any], key: str, path: str) -> None:
    value = block.get(key)
    if not isinstance(value, dict):
        got = "null" if value is None else type(value).__name__
        raise InvalidMessage(f"{path}.{key}", f"must be an object, got {got}")


def check_anthropic(block: dict[str, Any], path: str) -> None:
    """The few fields an opaque Anthropic block cannot do without (the API's required
    ones that say what it is); the rest is the API's to judge."""
    kind = block["type"]
    if kind in ("server_tool_use", "mcp_tool_use"):
        _text(block, "id", path)
        _text(block, "name", path)
        _object(block, "input", path)
    elif is_server_result(kind):
        _text(block, "tool_use_id", path)
    elif kind == "document" or kind == "image":
        _object(block, "source", path)
    elif kind == "container_upload":
        _text(block, "file_id", path)


def check_openai(part: dict[str, Any], path: str) -> None:
    """The object an opaque OpenAI part carries under its type's name, or a refusal's text."""
    kind = part["type"]
    if kind == "refusal":
        value = part.get("refusal")
        if not isinstance(value, str):
            got = "null" if value is None else type(value).__name__
            raise InvalidMessage(f"{path}.refusal", f"must be a string, got {got}")
    else:
        _object(part, kind, path)


def opaque_part(fmt: OpaqueFormat, block: dict[str, Any]) -> Part:
    """The opaque part that stores ``block`` (the client's object is not kept by
    reference: the stored part is a copy)."""
    inner = dict(block)
    part: Part = {"type": OPAQUE, "format": fmt, "block": inner}
    if fmt == "anthropic" and "cache_control" in inner:
        part["extra"] = {"cache_control": inner.pop("cache_control")}
    return part


def block_type(part: Part) -> str:
    kind = part["block"].get("type")
    return kind if isinstance(kind, str) else "unknown"


def native(part: Part, *, for_history: bool) -> dict[str, Any]:
    """The block as it was sent (with its ``cache_control`` for the history)."""
    block = dict(part["block"])
    if for_history and "extra" in part:
        block.update(part["extra"])
    return block


def placeholder(part: Part) -> str:
    """What an opaque part reads as in the other format: ``[Anthropic document block
    omitted]``, ``[OpenAI input_audio part omitted]``; an OpenAI refusal is its text."""
    fmt = part["format"]
    block = part["block"]
    refusal = block.get("refusal") if block.get("type") == "refusal" else None
    if isinstance(refusal, str) and refusal:
        return refusal
    return f"[{_PROVIDER.get(fmt, fmt)} {block_type(part)} {_NOUN.get(fmt, 'block')} omitted]"


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def comparable(part: Part) -> dict[str, Any]:
    """What two copies of an opaque part must share to be the same block sent back:
    its format and its block without null values, at any depth. SDKs differ there (the
    Anthropic SDK's ``model_dump()`` writes ``caller: null`` and ``page_age: null``,
    ``model_dump(exclude_none=True)`` leaves them out, and agents do either); the
    ``cache_control`` an agent moves is in ``extra``, not in the block. For matching a
    re-sent history (:mod:`app.engine.proxy.history`); the stored block keeps its nulls."""
    return {"format": part["format"], "block": _without_nulls(part["block"])}
