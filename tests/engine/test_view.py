"""The context assembled from fragments stored on write equals the engine's own render."""

from __future__ import annotations

from dataclasses import dataclass

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry
from app.engine.window.context import check_anthropic_pairing, pair_tool_calls
from app.engine.window.view import assemble_anthropic, assemble_openai, render_view
from tests.engine.strategies import call_part, messy_histories, text_part, tool_entry


@dataclass(frozen=True)
class Stored:
    """An entry as the context read sees it: light columns and two fragments."""

    role: str
    tool_call_id: str | None
    call_ids: tuple[str, ...]
    view_openai: str
    view_anthropic: str


def stored(entries: list[Entry]) -> list[Stored]:
    out = []
    for e in entries:
        openai, anthropic = render_view(e)
        out.append(Stored(e.role, e.tool_call_id, e.call_ids, openai, anthropic))
    return out


@st.composite
def histories(draw: st.DrawFn) -> list[Entry]:
    """Messy histories, sometimes with a system message mid-way or an empty assistant."""
    entries = draw(messy_histories())
    if draw(st.booleans()):
        at = draw(st.integers(0, len(entries)))
        entries.insert(at, Entry(role="developer", parts=[text_part("mid"), text_part("")]))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(entries)))
        entries.insert(at, Entry(role="assistant", parts=[text_part(""), call_part("gone")]))
    return entries


@settings(max_examples=300, deadline=None)
@given(histories())
def test_openai_assembly_equals_the_render(entries: list[Entry]) -> None:
    expected = [openai_format.render_message(e) for e in pair_tool_calls(entries)]
    body, _ = assemble_openai(stored(entries))
    assert orjson.loads(body) == expected


@settings(max_examples=300, deadline=None)
@given(histories())
def test_anthropic_assembly_equals_the_render(entries: list[Entry]) -> None:
    system, messages = anthropic_format.render_messages(pair_tool_calls(entries))
    system_json, messages_json, _ = assemble_anthropic(stored(entries))
    assert orjson.loads(system_json) == system
    assert orjson.loads(messages_json) == messages


def test_abandoned_call_is_dropped_from_the_stored_fragment() -> None:
    entries = [
        Entry(role="user", parts=[text_part("go")], content_form="string"),
        Entry(role="assistant", parts=[text_part("trying"), call_part("a"), call_part("b")]),
        tool_entry("a"),
        Entry(role="user", parts=[text_part("next")], content_form="string"),
    ]
    body, used = assemble_openai(stored(entries))
    messages = orjson.loads(body)
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["a"]
    assert used == [0, 1, 2, 3]
    _, anthropic_body, _ = assemble_anthropic(stored(entries))
    uses = [b["id"] for b in orjson.loads(anthropic_body)[1]["content"] if b["type"] == "tool_use"]
    assert uses == ["a"]


@given(
    call_id=st.text(min_size=1, max_size=40),
    text=st.text(min_size=1, max_size=60),
    is_error=st.booleans(),
)
def test_placeholder_template_renders_as_the_engine_does(
    call_id: str, text: str, is_error: bool
) -> None:
    from app.engine.window.view import PlaceholderViews, placeholder_entry

    expected = render_view(placeholder_entry(call_id, "bash", is_error, text))
    assert PlaceholderViews(text).render(call_id, is_error) == expected


def test_anthropic_turns_of_one_role_become_one_message() -> None:
    """A summary then a kept user message, results then two user messages, two
    assistant replies: one message per run of a role, tool results first."""
    summary = Entry(role="user", parts=[text_part("<summary>so far</summary>")])
    entries = [
        summary,
        Entry(role="user", parts=[text_part("and now this")], content_form="string"),
        Entry(role="assistant", parts=[text_part("on it"), call_part("a")]),
        tool_entry("a"),
        Entry(role="user", parts=[text_part("also")]),
        Entry(role="developer", parts=[text_part("be quick")]),
        Entry(role="assistant", parts=[text_part("first")]),
        Entry(role="assistant", parts=[text_part("second")]),
    ]
    _, messages_json, used = assemble_anthropic(stored(entries))
    messages = orjson.loads(messages_json)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert [b.get("text") for b in messages[0]["content"]] == [
        "<summary>so far</summary>",
        "and now this",
    ]
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "text", "text"]
    assert messages[2]["content"][2]["text"] == "<system>\nbe quick\n</system>"
    assert [b["text"] for b in messages[3]["content"]] == ["first", "second"]
    assert used == list(range(len(entries)))  # every entry counted, none twice
    _, rendered = anthropic_format.render_messages(pair_tool_calls(entries))
    assert rendered == messages
    assert check_anthropic_pairing(messages, allow_pending=False) == []


def test_an_anthropic_view_opens_with_the_user() -> None:
    entries = [
        Entry(role="system", parts=[text_part("rules")]),
        Entry(role="assistant", parts=[text_part("hello, how can I help?")]),
        Entry(role="user", parts=[text_part("fix it")]),
    ]
    system_json, messages_json, used = assemble_anthropic(stored(entries))
    messages = orjson.loads(messages_json)
    assert orjson.loads(system_json) == [{"type": "text", "text": "rules"}]
    assert messages[0] == {
        "role": "user",
        "content": [{"type": "text", "text": anthropic_format.OPENING_TEXT}],
    }
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert used == [0, 1, 2]
