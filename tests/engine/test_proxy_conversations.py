"""The rules of conversations an agent did not plan as one (app.engine.proxy.conversations)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from app.engine.formats.openai_format import parse_message
from app.engine.model import Entry
from app.engine.proxy import conversations as rules
from app.engine.proxy.history import Departure, Stored, digest, first_difference
from app.sessions.schemas import SESSION_ID_PATTERN

WHEN = datetime(2027, 1, 5, 12, 0, tzinfo=UTC)


def parse(raw: Any, path: str) -> list[Entry]:
    return [parse_message(raw, path)]


def stored(messages: list[dict[str, Any]]) -> list[Stored]:
    return [Stored.of(e) for i, m in enumerate(messages) for e in parse(m, f"m[{i}]")]


USER: dict[str, Any] = {"role": "user", "content": "Fix the bug."}
REPLY: dict[str, Any] = {"role": "assistant", "content": "Fixed."}
CALL: dict[str, Any] = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "run", "arguments": "{}"}}
    ],
}
RESULT: dict[str, Any] = {"role": "tool", "tool_call_id": "c1", "content": "ok"}


@given(st.from_regex(SESSION_ID_PATTERN, fullmatch=True), st.binary(max_size=64))
def test_a_child_id_is_a_session_id_of_its_parent(parent: str, first: bytes) -> None:
    child = rules.child_id(parent, WHEN, first)
    assert re.fullmatch(SESSION_ID_PATTERN, child)
    assert len(child) <= 128
    assert child.startswith(parent[:115] + ":")
    assert child == rules.child_id(parent, WHEN, first)  # the same side conversation's


def test_a_child_id_tells_conversations_and_parents_apart() -> None:
    a = digest(parse(USER, "m")[0])
    b = digest(parse({"role": "user", "content": "Title?"}, "m")[0])
    ids = {
        rules.child_id("s", WHEN, a),
        rules.child_id("s", WHEN, b),
        rules.child_id("t", WHEN, a),
        rules.child_id("s", WHEN + timedelta(microseconds=1), a),  # made again
    }
    assert len(ids) == 4


def test_a_provisional_conversation_is_one_exchange_of_calls_without_tools() -> None:
    def entries(*messages: dict[str, Any]) -> list[Entry]:
        return [parse(m, "m")[0] for m in messages]

    assert rules.provisional(entries(USER), tools_declared=False)
    assert rules.provisional(entries(USER, REPLY), tools_declared=False)
    assert not rules.provisional(entries(USER, REPLY), tools_declared=True)
    assert not rules.provisional(entries(USER, REPLY, USER), tools_declared=False)
    assert not rules.provisional(entries(USER, CALL), tools_declared=False)
    assert not rules.provisional(entries(REPLY), tools_declared=False)
    # OpenCode's title request: its instruction and the conversation's first words.
    assert rules.provisional(entries(USER, USER), tools_declared=False)
    assert rules.provisional(entries(USER, USER, REPLY), tools_declared=False)
    assert not rules.provisional(entries(USER, USER, USER, USER, REPLY), tools_declared=False)
    assert not rules.provisional(entries(USER, REPLY, REPLY), tools_declared=False)
    assert not rules.provisional([], tools_declared=False)


def test_where_a_departing_call_goes() -> None:
    assert rules.place(3, provisional=True, declares_tools=True) == "branch"
    assert rules.place(1, provisional=False, declares_tools=False) == "branch"
    assert rules.place(0, provisional=True, declares_tools=True) == "takeover"
    assert rules.place(0, provisional=True, declares_tools=False) == "side"
    assert rules.place(0, provisional=False, declares_tools=True) == "side"
    assert rules.declares_tools({"tools": [{"name": "run"}]})
    assert not rules.declares_tools({"tools": []})
    assert not rules.declares_tools({})


def test_a_departure_is_after_the_last_whole_shared_message() -> None:
    history = [USER, CALL, RESULT, REPLY]
    found = first_difference([USER, CALL, {**RESULT, "content": "edited"}], parse, stored(history))
    assert found == Departure(messages=2, entries=2)
    assert first_difference([USER], parse, stored(history)) == Departure(1, 1)
    assert first_difference([REPLY], parse, stored(history)) == Departure(0, 0)
    # Past the stored history inside a message: that message is not shared.
    assert first_difference([USER, CALL], parse, stored([USER])) == Departure(1, 1)
