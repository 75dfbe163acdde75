"""The agent's recall tools (search and read-back of the archive: docs/how-it-works.md,
"Recall"): their definitions in each provider's format, a model's call of one read as the model produced it,
and the result text kept within a token cap with a note of how to read on.

Pure: no database. app.recall.tool_calls runs the calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

Format = Literal["openai", "anthropic"]

SEARCH = "history_search"
READ = "history_read"
NAMES = (SEARCH, READ)

# What a result holds at most when neither the call nor the session says.
DEFAULT_RESULT_TOKENS = 4_000
MAX_RESULT_TOKENS = 32_000
MIN_RESULT_TOKENS = 200
# Entries a history_read reads at most in one call.
READ_LIMIT = 50

_ROLES = ["system", "developer", "user", "assistant", "tool"]
_KINDS = ["message", "compaction", "continue", "branch_summary"]

_SEARCH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {
            "type": "string",
            "description": "Words, or an identifier, path, error name or phrase as written; "
            "a place in a file as path:line (registry.py:135); a command's words with words "
            "of its output find that output.",
        },
        "role": {"type": "string", "enum": _ROLES, "description": "Only entries of this role."},
        "tool": {"type": "string", "description": "Only this tool's calls and outputs."},
        "kind": {"type": "string", "enum": _KINDS, "description": "Only entries of this kind."},
        "from_seq": {"type": "integer", "minimum": 1, "description": "Only at this seq or after."},
        "to_seq": {"type": "integer", "minimum": 1, "description": "Only at this seq or before."},
        "compaction": {
            "type": "string",
            "description": "Only what this compaction (its id) replaced.",
        },
        "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Hits (10)."},
        "cursor": {"type": "string", "description": "The next page of an earlier search."},
    },
    "required": ["query"],
    "additionalProperties": False,
}

_READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "from_seq": {
            "type": "integer",
            "minimum": 1,
            "description": "The first entry to read (its seq).",
        },
        "to_seq": {
            "type": "integer",
            "minimum": 1,
            "description": "The last entry to read (default: as many as fit).",
        },
        "compaction": {
            "type": "string",
            "description": "Read what this compaction (its id) replaced, from from_seq on.",
        },
    },
    "additionalProperties": False,
}

_DESCRIPTIONS = {
    SEARCH: (
        "Search this conversation's whole history, including the parts that were compacted "
        "into a summary and old tool outputs: files, commands, errors, identifiers, "
        "numbers, anything said. Returns the best matching entries with their seq and a "
        "snippet; read one whole with history_read."
    ),
    READ: (
        "Read entries of this conversation's history as they were stored, by seq (the "
        "numbers history_search and the summaries give), or the entries a compaction "
        "replaced. Use it when a summary leaves out a detail you need."
    ),
}
_SCHEMAS = {SEARCH: _SEARCH_SCHEMA, READ: _READ_SCHEMA}


def definitions(fmt: Format) -> list[dict[str, Any]]:
    """The tools as the provider's API takes them in a request's ``tools``."""
    if fmt == "anthropic":
        return [
            {"name": name, "description": _DESCRIPTIONS[name], "input_schema": _SCHEMAS[name]}
            for name in NAMES
        ]
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": _DESCRIPTIONS[name],
                "parameters": _SCHEMAS[name],
            },
        }
        for name in NAMES
    ]


class ToolCallError(ValueError):
    """A call that cannot be run; its message is the tool result the model gets."""


@dataclass(frozen=True, slots=True)
class Call:
    """One tool call, read from either format."""

    format: Format
    id: str
    name: str
    arguments: dict[str, Any]


def read_call(raw: Any) -> Call:
    """A tool call exactly as the model produced it: an OpenAI ``tool_calls`` item
    (``{"id", "type": "function", "function": {"name", "arguments": "<JSON>"}}``) or an
    Anthropic ``tool_use`` block (``{"type": "tool_use", "id", "name", "input"}``).
    Raises :class:`ValueError` for what is neither (the route's 422), and
    :class:`ToolCallError` for a call of these tools whose arguments are wrong (a tool
    result that says so)."""
    if not isinstance(raw, Mapping):
        raise ValueError("must be a tool call object")
    if raw.get("type") == "tool_use":
        call_id, name, arguments = raw.get("id"), raw.get("name"), raw.get("input", {})
        fmt: Format = "anthropic"
    elif isinstance(raw.get("function"), Mapping):
        function = raw["function"]
        call_id, name = raw.get("id"), function.get("name")
        text = function.get("arguments", "{}")
        fmt = "openai"
        if not isinstance(text, str):
            raise ValueError("function.arguments must be a JSON string, as the model writes it")
        try:
            arguments = orjson.loads(text) if text.strip() else {}
        except orjson.JSONDecodeError:
            if not isinstance(call_id, str) or not isinstance(name, str):
                raise ValueError("must carry a string id and a function name") from None
            return Call(fmt, call_id, name, {"__invalid__": text[:200]})
    else:
        raise ValueError(
            'must be an OpenAI tool call ({"id", "type": "function", "function": {...}}) '
            'or an Anthropic tool_use block ({"type": "tool_use", "id", "name", "input"})'
        )
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str):
        raise ValueError("must carry a string id and a tool name")
    if not isinstance(arguments, dict):
        return Call(fmt, call_id, name, {"__invalid__": str(arguments)[:200]})
    return Call(fmt, call_id, name, arguments)


@dataclass(frozen=True, slots=True)
class SearchArgs:
    query: str
    role: str | None = None
    tool: str | None = None
    kind: str | None = None
    from_seq: int | None = None
    to_seq: int | None = None
    compaction: uuid.UUID | None = None
    limit: int = 10
    cursor: str | None = None


@dataclass(frozen=True, slots=True)
class ReadArgs:
    from_seq: int | None = None
    to_seq: int | None = None
    compaction: uuid.UUID | None = None


def _int(args: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ToolCallError(f"{key} must be a whole number from {low} to {high}")
    return value


def _text(args: Mapping[str, Any], key: str, choices: list[str] | None = None) -> str | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ToolCallError(f"{key} must be a non-empty string")
    if choices is not None and value not in choices:
        raise ToolCallError(f"{key} must be one of {', '.join(choices)}")
    return value


def _uuid(args: Mapping[str, Any], key: str) -> uuid.UUID | None:
    value = _text(args, key)
    if value is None:
        return None
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ToolCallError(f"{key} must be a compaction id (a UUID)") from None


_SEQ = 2**62


def _check_known(args: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    if "__invalid__" in args:
        raise ToolCallError(f"the arguments are not a JSON object: {args['__invalid__']!r}")
    unknown = sorted(set(args) - set(schema["properties"]))
    if unknown:
        raise ToolCallError(f"unknown arguments: {', '.join(unknown)}")


def search_args(args: Mapping[str, Any]) -> SearchArgs:
    _check_known(args, _SEARCH_SCHEMA)
    query = _text(args, "query")
    if query is None:
        raise ToolCallError("query is required: what to look for")
    if len(query) > 500:
        raise ToolCallError("query must hold at most 500 characters")
    return SearchArgs(
        query=query,
        role=_text(args, "role", _ROLES),
        tool=_text(args, "tool"),
        kind=_text(args, "kind", _KINDS),
        from_seq=_int(args, "from_seq", 1, _SEQ),
        to_seq=_int(args, "to_seq", 1, _SEQ),
        compaction=_uuid(args, "compaction"),
        limit=_int(args, "limit", 1, 20) or 10,
        cursor=_text(args, "cursor"),
    )


def read_args(args: Mapping[str, Any]) -> ReadArgs:
    _check_known(args, _READ_SCHEMA)
    found = ReadArgs(
        from_seq=_int(args, "from_seq", 1, _SEQ),
        to_seq=_int(args, "to_seq", 1, _SEQ),
        compaction=_uuid(args, "compaction"),
    )
    if found.from_seq is None and found.compaction is None:
        raise ToolCallError("give from_seq (the first entry to read), or a compaction id")
    if found.from_seq is not None and found.to_seq is not None and found.to_seq < found.from_seq:
        raise ToolCallError("to_seq is before from_seq")
    return found


@dataclass(slots=True)
class Capped:
    """A result text within its cap."""

    text: str
    tokens: int
    truncated: bool = False


CUT_NOTE = "[cut here: this entry is longer than a result may be]"


def capped(
    blocks: list[str], cap: int, count: Callable[[str], int], *, read_on: Callable[[int], str]
) -> Capped:
    """``blocks`` joined, as many whole ones as fit in ``cap`` tokens, with room kept
    for the note of how to read on (``read_on(i)``: the note when block ``i`` is the
    first left out). A first block that alone does not fit is cut to fit."""
    out: list[str] = []
    for i, block in enumerate(blocks):
        more = i + 1 < len(blocks)
        candidate = "\n".join([*out, block, *([read_on(i + 1)] if more else [])])
        if count(candidate) <= cap:
            out.append(block)
            continue
        if out:
            text = "\n".join([*out, read_on(i)])
            while count(text) > cap and len(out) > 1:
                out.pop()
                text = "\n".join([*out, read_on(i)])
            return Capped(text, count(text), True)
        note = read_on(i + 1) if more else CUT_NOTE
        room = max(0, cap - count(note) - 8)
        cut = block[: room * 4]
        while cut and count(cut + " […]\n" + note) > cap:
            cut = cut[: len(cut) * 9 // 10]
        text = f"{cut} […]\n{note}"
        return Capped(text, count(text), True)
    text = "\n".join(out)
    return Capped(text, count(text), False)
