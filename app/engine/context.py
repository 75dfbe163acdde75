"""Building the model's view of the history, with every tool call paired.

The history is validated on write (a tool result must answer a stored call),
yet the view must be valid on its own whatever window it is built from:
:func:`pair_tool_calls` is the one place that guarantees it. It moves each
result right behind its call (OpenAI and Anthropic both require that), drops a
result whose call is not in the view, and drops a call that was never answered
when the conversation moved on without it. A call still waiting at the very end
of the history is kept: the agent is running it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from app.engine.model import Entry


def pair_tool_calls(entries: Sequence[Entry]) -> list[Entry]:
    """The entries reordered and trimmed so no tool call or result is orphaned."""
    results: dict[str, Entry] = {}
    for e in entries:
        if e.role == "tool" and e.tool_call_id is not None:
            results.setdefault(e.tool_call_id, e)
    # Index of the last entry that is not a tool result: calls before it that
    # have no result were abandoned; calls of the final assistant may be pending.
    last_turn = max((i for i, e in enumerate(entries) if e.role != "tool"), default=-1)

    out: list[Entry] = []
    for i, entry in enumerate(entries):
        if entry.role == "tool":
            continue  # emitted behind its call, or dropped as an orphan
        calls = entry.tool_calls() if entry.role == "assistant" else []
        if not calls:
            out.append(entry)
            continue
        answered = [c for c in calls if c["id"] in results]
        if len(answered) < len(calls) and i != last_turn:
            kept_parts = [p for p in entry.parts if p["type"] != "tool_call" or p["id"] in results]
            if not any(p["type"] in ("text", "tool_call") for p in kept_parts):
                continue
            entry = replace(entry, parts=kept_parts)
        out.append(entry)
        for call in answered:
            out.append(results.pop(call["id"]))
    return out


@dataclass(frozen=True, slots=True)
class PairingError:
    index: int
    problem: str


def check_openai_pairing(
    messages: Iterable[dict[str, Any]], *, allow_pending: bool = True
) -> list[PairingError]:
    """Problems an OpenAI chat request would be rejected for; empty when valid.

    Every assistant ``tool_calls`` must be followed at once by one tool message per
    call, and every tool message must answer a call of the assistant before it.
    """
    msgs = list(messages)
    problems: list[PairingError] = []
    i = 0
    while i < len(msgs):
        m = msgs[i]
        if m["role"] == "tool":
            problems.append(
                PairingError(i, f"tool result {m.get('tool_call_id')!r} has no preceding call")
            )
            i += 1
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            wanted = [c["id"] for c in m["tool_calls"]]
            j = i + 1
            seen: list[str] = []
            while j < len(msgs) and msgs[j]["role"] == "tool":
                seen.append(msgs[j]["tool_call_id"])
                j += 1
            missing = [c for c in wanted if c not in seen]
            extra = [c for c in seen if c not in wanted]
            if extra:
                problems.append(
                    PairingError(i, f"tool results {extra} answer no call of this message")
                )
            if len(seen) != len(set(seen)):
                problems.append(PairingError(i, "a tool call is answered twice"))
            if missing and not (allow_pending and j == len(msgs)):
                problems.append(PairingError(i, f"tool calls {missing} have no result"))
            i = j
            continue
        i += 1
    return problems


def check_anthropic_pairing(
    messages: Iterable[dict[str, Any]], *, allow_pending: bool = True
) -> list[PairingError]:
    """Problems the Anthropic Messages API would reject; empty when valid.

    Each ``tool_result`` must answer a ``tool_use`` of the assistant message right
    before it, and every ``tool_use`` must be answered in the next user message.
    """
    msgs = list(messages)
    problems: list[PairingError] = []
    for i, m in enumerate(msgs):
        content = m["content"] if isinstance(m["content"], list) else []
        if m["role"] == "assistant":
            uses = [b["id"] for b in content if b["type"] == "tool_use"]
            if not uses:
                continue
            if i + 1 == len(msgs):
                if not allow_pending:
                    problems.append(PairingError(i, f"tool_use {uses} has no result"))
                continue
            nxt = msgs[i + 1]
            ncontent = nxt["content"] if isinstance(nxt["content"], list) else []
            answered = [b["tool_use_id"] for b in ncontent if b["type"] == "tool_result"]
            # Like OpenAI's check: results still coming in the final message are pending.
            partial = (
                allow_pending
                and i + 2 == len(msgs)
                and len(answered) == len(set(answered))
                and set(answered) <= set(uses)
                and all(b["type"] == "tool_result" for b in ncontent)
                and isinstance(nxt["content"], list)
            )
            if nxt["role"] != "user" or (sorted(answered) != sorted(uses) and not partial):
                problems.append(PairingError(i, f"tool_use {uses} answered by {answered}"))
        else:
            results = [b["tool_use_id"] for b in content if b["type"] == "tool_result"]
            if not results:
                continue
            prev = msgs[i - 1] if i > 0 else None
            pcontent = prev["content"] if prev and isinstance(prev["content"], list) else []
            uses = [b["id"] for b in pcontent if b["type"] == "tool_use"]
            if prev is None or prev["role"] != "assistant" or any(r not in uses for r in results):
                problems.append(
                    PairingError(i, f"tool_result {results} without a matching tool_use")
                )
            first_other = next(
                (k for k, b in enumerate(content) if b["type"] != "tool_result"), len(content)
            )
            if any(b["type"] == "tool_result" for b in content[first_other:]):
                problems.append(
                    PairingError(i, "tool_result blocks must come first in the message")
                )
    return problems
