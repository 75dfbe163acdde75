"""The model's view, rendered once on write and assembled on read.

Each entry is rendered when it is stored: its OpenAI message and its Anthropic
blocks, as JSON text. Reading a context then costs no JSON parsing and no
rendering: :func:`assemble_openai` and :func:`assemble_anthropic` splice the
stored fragments in the order :func:`~app.engine.window.context.plan_pairing` gives.
The only fragments parsed on read are the rare ones that must change: an
assistant whose abandoned calls are dropped, and a system message that arrives
mid-conversation (Anthropic's ``role: "system"`` message where the request allows
one, else user text in the user's turn).

The result is, byte for byte, the JSON of the engine's own renderers over
:func:`~app.engine.window.context.pair_tool_calls`; the tests hold it to that.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import orjson

from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry
from app.engine.window.context import Linked, plan_pairing


class Viewable(Linked, Protocol):
    @property
    def view_openai(self) -> str: ...
    @property
    def view_anthropic(self) -> str: ...


def render_view(entry: Entry) -> tuple[str, str]:
    """The entry's OpenAI message and its Anthropic blocks, as JSON text."""
    openai = orjson.dumps(openai_format.render_message(entry)).decode()
    anthropic = orjson.dumps(anthropic_format.entry_blocks(entry)).decode()
    return openai, anthropic


def placeholder_entry(
    tool_call_id: str | None, tool_name: str | None, is_error: bool, text: str
) -> Entry:
    """What a pruned tool result becomes in the model's view: its call still
    answered, its output replaced by ``text``."""
    return Entry(
        role="tool",
        parts=[{"type": "text", "text": text}],
        tool_call_id=tool_call_id,
        tool_name=tool_name,
        is_error=is_error,
        content_form="string",
    )


# A call id no client sends (and a valid Anthropic id, so it is not rewritten).
SENTINEL = "compactd-placeholder-call-id-2063"


class PlaceholderViews:
    """The rendered view of pruned tool results, built by template: render once
    with a sentinel id, then splice each real id in. Byte for byte what
    :func:`render_view` gives for :func:`placeholder_entry`, at a fraction of
    the cost, so a read or a prune over thousands of outputs stays cheap. The
    placeholder text must not contain :data:`SENTINEL` (the config refuses it)."""

    def __init__(self, text: str) -> None:
        self.text = text
        quoted = orjson.dumps(SENTINEL).decode()
        self._templates = {
            is_error: tuple(
                view.split(quoted)
                for view in render_view(placeholder_entry(SENTINEL, None, is_error, text))
            )
            for is_error in (False, True)
        }

    def render(self, tool_call_id: str | None, is_error: bool) -> tuple[str, str]:
        """The OpenAI message and Anthropic blocks of a pruned result, as JSON text."""
        if tool_call_id is None:
            return render_view(placeholder_entry(None, None, is_error, self.text))
        openai, anthropic = self._templates[is_error]
        return (
            orjson.dumps(tool_call_id).decode().join(openai),
            orjson.dumps(anthropic_format.model_id(tool_call_id)).decode().join(anthropic),
        )


def _has_text_or_call(content: Any, calls: list[Any]) -> bool:
    """As :func:`~app.engine.window.context.pair_tool_calls` decides: words, calls, or a part
    kept opaquely (an assistant's refusal; another format's block is a text here)."""
    if calls:
        return True
    if isinstance(content, str):
        return content != ""
    return isinstance(content, list) and any(b.get("type") != "text" or b["text"] for b in content)


# The blocks of an assistant's view that say nothing on their own (see pair_tool_calls).
_SILENT_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def assemble_openai(items: Sequence[Viewable]) -> tuple[bytes, list[int]]:
    """The OpenAI ``messages`` array as JSON, and the indices of the items in it."""
    fragments: list[str] = []
    used: list[int] = []
    for step in plan_pairing(items):
        fragment = items[step.at].view_openai
        if step.drop:
            msg = orjson.loads(fragment)
            calls = [c for c in msg.get("tool_calls", []) if c["id"] not in step.drop]
            if not _has_text_or_call(msg.get("content"), calls):
                continue
            if calls:
                msg["tool_calls"] = calls
            else:
                msg.pop("tool_calls", None)
            fragment = orjson.dumps(msg).decode()
        fragments.append(fragment)
        used.append(step.at)
    return ("[" + ",".join(fragments) + "]").encode(), used


def _inner(blocks_json: str) -> str:
    return blocks_json[1:-1]


_OPENING = orjson.dumps({"type": "text", "text": anthropic_format.OPENING_TEXT}).decode()


def assemble_anthropic(
    items: Sequence[Viewable], *, system_messages: bool = False
) -> tuple[bytes, bytes, list[int]]:
    """The Anthropic ``system`` and ``messages`` arrays as JSON, and the indices used.

    Mirrors :func:`~app.engine.formats.anthropic_format.render_messages`: leading system
    entries make the top-level system, later ones ``<system>`` user text or, with
    ``system_messages``, ``role: "system"`` messages in place; the messages then
    alternate by :func:`~app.engine.formats.anthropic_format.alternate_runs`, the rule
    :func:`~app.engine.formats.anthropic_format.alternate` applies (one message per run
    of a role, tool results first in it, the user's turn first).
    """
    system: list[str] = []
    # role, then the block fragments with whether each is a tool result
    messages: list[tuple[str, list[tuple[str, bool]]]] = []
    used: list[int] = []
    for step in plan_pairing(items):
        item = items[step.at]
        role = item.role
        blocks = item.view_anthropic
        if role in ("system", "developer"):
            read = orjson.loads(blocks)
            texts = [b["text"] for b in read if b["type"] == "text"]
            if not messages:
                system.extend(
                    orjson.dumps({"type": "text", "text": t}).decode() for t in texts if t
                )
                used.append(step.at)
                continue
            if system_messages:
                used.append(step.at)
                keys: dict[str, Any] = {
                    k: v
                    for b in read
                    if b["type"] == anthropic_format.MESSAGE_KEYS
                    for k, v in b.items()
                    if k != "type"
                }
                said = anthropic_format.system_message(texts, keys)
                if said is not None:  # the whole message, its run's one part
                    messages.append(("system", [(orjson.dumps(said).decode(), False)]))
                continue
            wrapped = "<system>\n" + "\n".join(texts) + "\n</system>"
            role, blocks = "user", orjson.dumps([{"type": "text", "text": wrapped}]).decode()
        elif step.drop:
            kept = [
                b
                for b in orjson.loads(blocks)
                if b["type"] != "tool_use" or b["id"] not in step.drop
            ]
            if all(b["type"] in _SILENT_BLOCKS for b in kept):
                continue  # as pair_tool_calls: no words, no calls, no opaque blocks left
            blocks = orjson.dumps(kept).decode()
        used.append(step.at)
        result = role == "tool"
        if result:
            role = "user"
        elif blocks == "[]":
            continue
        messages.append((role, [(_inner(blocks), result)]))
    runs = anthropic_format.alternate_runs(
        messages, is_result=lambda part: part[1], opening=(_OPENING, False)
    )
    system_json = "[" + ",".join(system) + "]"
    messages_json = ",".join(
        parts[0][0]
        if role == "system"
        else '{"role":'
        + orjson.dumps(role).decode()
        + ',"content":['
        + ",".join(fragment for fragment, _ in parts)
        + "]}"
        for role, parts in runs
    )
    return system_json.encode(), ("[" + messages_json + "]").encode(), used
