"""The canonical message model every format is converted to and from.

An :class:`Entry` is one stored message. Its ``parts`` are plain JSON-ready
dicts (they go to Postgres as they are):

- ``{"type": "text", "text": str}``
- ``{"type": "image", "url": str, "detail"?: str}`` or
  ``{"type": "image", "media_type": str, "data": str, "detail"?: str}``
- ``{"type": "reasoning", "text": str, "signature"?: str}`` or
  ``{"type": "reasoning", "redacted": str}`` (an opaque, encrypted block)
- ``{"type": "tool_call", "id": str, "name": str, "arguments": str}``
- ``{"type": "opaque", "format": "anthropic" | "openai", "block": dict}``: a block or
  part of one format that compactd keeps as sent without modelling it (server tool
  blocks, documents, audio...; see :mod:`app.engine.formats.opaque`)

A tool result is an entry of role ``tool`` with ``tool_call_id`` set; its parts
are its content (text and images). Anthropic's user messages that carry
``tool_result`` blocks are split into one tool entry per block, followed by a
user entry for any other content, so that every format shares one shape.

Any key a client sent that the model does not know is kept in ``extra`` (on the
entry or on a part) and given back in the stored history, never to the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "developer", "user", "assistant", "tool"]

# How the client shaped ``content``, so the stored message is given back as sent.
ContentForm = Literal["string", "parts", "null", "absent"]

Part = dict[str, Any]


@dataclass(slots=True)
class Entry:
    """One message of the history, in the canonical model."""

    role: Role
    parts: list[Part] = field(default_factory=list)
    tool_call_id: str | None = None
    tool_name: str | None = None
    is_error: bool = False
    name: str | None = None
    content_form: ContentForm = "parts"
    extra: dict[str, Any] = field(default_factory=dict)
    tokens: int = 0  # the stored count, once it has been counted on write

    def text(self) -> str:
        """All text parts joined with newlines."""
        return "\n".join(p["text"] for p in self.parts if p["type"] == "text")

    def tool_calls(self) -> list[Part]:
        return [p for p in self.parts if p["type"] == "tool_call"]

    @property
    def call_ids(self) -> tuple[str, ...]:
        """The ids of the tool calls this entry makes (assistant entries only)."""
        return tuple(p["id"] for p in self.parts if p["type"] == "tool_call")


class InvalidMessage(ValueError):
    """A message that cannot be stored, with the JSON path of the offending field."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail
