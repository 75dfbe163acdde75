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
from typing import Any, NamedTuple, Protocol

from app.engine.model import Entry


class Linked(Protocol):
    """What pairing needs to know of an entry, stored or not."""

    @property
    def role(self) -> str: ...
    @property
    def tool_call_id(self) -> str | None: ...
    @property
    def call_ids(self) -> tuple[str, ...]: ...


_KEEP_ALL: frozenset[str] = frozenset()
_plain = tuple.__new__  # Step(i) without its Python-level __new__: a third of the cost


class Step(NamedTuple):
    """Emit item ``at``, without the tool calls in ``drop``."""

    at: int
    drop: frozenset[str] = _KEEP_ALL


def plan_pairing(items: Sequence[Linked]) -> list[Step]:
    """The order in which to emit the items so no tool call or result is orphaned.

    Each result goes right behind its call; a result whose call is absent is left
    out; an assistant's calls that were never answered are dropped when the
    conversation moved on (the entry itself goes when nothing else is left of it,
    which the caller decides, see :func:`pair_tool_calls`); the final assistant's
    unanswered calls are kept, pending.
    """
    # The hot loop of every context read: one pass to find the results and the last
    # turn, one to order; a step without drops is built without NamedTuple's __new__.
    results: dict[str, int] = {}
    # Calls before the last entry that is not a tool result were abandoned if
    # unanswered; calls of the final assistant may still be running.
    last_turn = -1
    for i, item in enumerate(items):
        if item.role != "tool":
            last_turn = i
        elif (link := item.tool_call_id) is not None and link not in results:
            results[link] = i

    steps: list[Step] = []
    emit = steps.append
    for i, item in enumerate(items):
        role = item.role
        if role == "tool":
            continue  # emitted behind its call, or left out as an orphan
        calls = item.call_ids if role == "assistant" else ()
        if not calls:
            emit(_plain(Step, (i, _KEEP_ALL)))
            continue
        answered = [c for c in calls if c in results]
        missing = len(answered) < len(calls) and i != last_turn
        emit(
            Step(i, frozenset(calls).difference(answered))
            if missing
            else _plain(Step, (i, _KEEP_ALL))
        )
        for c in answered:
            emit(_plain(Step, (results.pop(c), _KEEP_ALL)))
    return steps


def pair_tool_calls(entries: Sequence[Entry]) -> list[Entry]:
    """The entries reordered and trimmed so no tool call or result is orphaned."""
    out: list[Entry] = []
    for step in plan_pairing(entries):
        entry = entries[step.at]
        if step.drop:
            kept = [p for p in entry.parts if p["type"] != "tool_call" or p["id"] not in step.drop]
            # Nothing left to say: no words, no calls and no opaque blocks (a server
            # tool's use and result, app.engine.formats.opaque); reasoning alone means nothing.
            if not any(
                p["type"] in ("tool_call", "opaque") or (p["type"] == "text" and p["text"])
                for p in kept
            ):
                continue
            entry = replace(entry, parts=kept)
        out.append(entry)
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
    That is all the alternation OpenAI asks: its chat API takes two user (or two
    assistant) messages in a row, agents send them so, and the view keeps them
    as sent (a summary followed by a kept user message included). Anthropic is
    stricter, see :func:`check_anthropic_roles`.
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


def check_anthropic_roles(
    messages: Iterable[dict[str, Any]], *, system_messages: bool = False
) -> list[PairingError]:
    """Roles that do not alternate strictly user, assistant, user, … from a user
    turn: the Messages API once refused both, Bedrock and other compatible
    endpoints still do. With ``system_messages``, a ``role: "system"`` message
    (mid-conversation) may stand where the API takes one: right after a user
    message, and followed by the assistant's or by nothing."""
    problems: list[PairingError] = []
    msgs = list(messages)
    previous: Any = "assistant"  # as if before the first message, so it must be the user's
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role == "system" and system_messages:
            after = msgs[i + 1].get("role") if i + 1 < len(msgs) else "assistant"
            if i == 0 or msgs[i - 1].get("role") != "user" or after != "assistant":
                problems.append(
                    PairingError(
                        i, "a system message must follow a user message and precede the assistant's"
                    )
                )
            continue  # the turns alternate around it
        if role not in ("user", "assistant"):
            problems.append(PairingError(i, f"role {role!r} is neither user nor assistant"))
        elif role == previous:
            problems.append(
                PairingError(
                    i,
                    "the first message must be the user's"
                    if i == 0
                    else f"two {role} messages in a row: roles must alternate",
                )
            )
        previous = role
    return problems


def check_anthropic_pairing(
    messages: Iterable[dict[str, Any]], *, allow_pending: bool = True, system_messages: bool = False
) -> list[PairingError]:
    """Problems the Anthropic Messages API (or a compatible endpoint) would reject;
    empty when valid.

    Roles alternate, the user's first (:func:`check_anthropic_roles`). Each
    ``tool_result`` must answer a ``tool_use`` of the assistant message right
    before it, and every ``tool_use`` must be answered in the next user message.
    """
    msgs = list(messages)
    problems = check_anthropic_roles(msgs, system_messages=system_messages)
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
