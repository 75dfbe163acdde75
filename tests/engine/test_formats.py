"""Conversion between the OpenAI and Anthropic formats and the canonical model."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.formats import anthropic_format, openai_format
from app.engine.model import Entry
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from tests.engine.strategies import (
    PNG_1x1,
    anthropic_conversations,
    openai_conversations,
)

PROPERTY = settings(max_examples=120, deadline=None)


def parse_openai(messages: list[dict[str, Any]]) -> list[Entry]:
    return [openai_format.parse_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def parse_anthropic(messages: list[dict[str, Any]]) -> list[Entry]:
    entries: list[Entry] = []
    for i, m in enumerate(messages):
        entries += anthropic_format.parse_message(m, f"messages[{i}]")
    return entries


# --- round trips --------------------------------------------------------------------------


@PROPERTY
@given(openai_conversations())
def test_openai_history_round_trip_is_exact(messages: list[dict[str, Any]]) -> None:
    sent = copy.deepcopy(messages)
    entries = parse_openai(messages)
    assert [openai_format.render_message(e, for_history=True) for e in entries] == sent
    assert messages == sent  # parsing does not mutate the client's data
    assert_model_render_drops_unknown_keys(entries)
    assert_anthropic_render_keeps_calls_paired(entries, sent)


def assert_model_render_drops_unknown_keys(entries: list[Entry]) -> None:
    known = {"role", "content", "name", "tool_calls", "tool_call_id", "reasoning_content"}
    for entry in entries:
        msg = openai_format.render_message(entry)
        assert set(msg) <= known
        for call in msg.get("tool_calls", []):
            assert set(call) == {"id", "type", "function"}
            assert set(call["function"]) == {"name", "arguments"}
        if isinstance(msg.get("content"), list):
            for part in msg["content"]:
                assert set(part) in ({"type", "text"}, {"type", "image_url"})


def test_openai_round_trip_example_with_parallel_calls_and_extras() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be terse"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?", "extra": {"a": 1}},
                {
                    "type": "image_url",
                    "image_url": {"url": f"data:image/png;base64,{PNG_1x1}", "detail": "low"},
                },
            ],
            "index": 3,
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "two lookups",
            "tool_calls": [
                {
                    "index": 0,
                    "id": "a",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"x": 1}'},
                },
                {
                    "index": 1,
                    "id": "b",
                    "type": "function",
                    "function": {"name": "g", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": [{"type": "text", "text": "A"}]},
        {"role": "assistant", "content": "done", "extra": {"provider": "x"}},
    ]
    entries = parse_openai(messages)
    assert [openai_format.render_message(e, for_history=True) for e in entries] == messages
    # The model never sees the client's private keys.
    rendered = [openai_format.render_message(e) for e in entries]
    assert "index" not in rendered[1]
    assert "index" not in rendered[2]["tool_calls"][0]
    assert "extra" not in rendered[1]["content"][0]
    assert rendered[2]["reasoning_content"] == "two lookups"


def test_openai_empty_parts_list_is_given_back_as_sent() -> None:
    msg: dict[str, Any] = {"role": "user", "content": []}
    entry = openai_format.parse_message(msg, "m")
    assert openai_format.render_message(entry, for_history=True) == msg
    # The model gets a string it accepts instead of an empty list.
    assert openai_format.render_message(entry)["content"] == ""


@PROPERTY
@given(anthropic_conversations())
def test_anthropic_history_round_trip_is_exact(messages: list[dict[str, Any]]) -> None:
    sent = copy.deepcopy(messages)
    entries = parse_anthropic(messages)
    system, rendered = anthropic_format.render_messages(entries, for_history=True)
    assert system == []
    assert rendered == sent
    assert messages == sent
    assert_openai_render_is_valid(entries, sent)
    assert_tool_input_survives_openai(entries, sent)


def test_anthropic_round_trip_example() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "use ls", "signature": "sig=="},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "running"},
                {"type": "tool_use", "id": "t1", "name": "ls", "input": {"path": "/"}},
                {"type": "tool_use", "id": "t2", "name": "cat", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": "no file",
                    "is_error": True,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [
                        {"type": "text", "text": "a b"},
                        {
                            "type": "image",
                            "source": {
                                "type": "base64",
                                "media_type": "image/png",
                                "data": PNG_1x1,
                            },
                        },
                    ],
                },
                {"type": "text", "text": "and?"},
            ],
            "metadata": {"turn": 2},
        },
        {"role": "assistant", "content": "done"},
    ]
    entries = parse_anthropic(messages)
    assert [e.role for e in entries] == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert entries[2].is_error
    assert not entries[3].is_error
    _, rendered = anthropic_format.render_messages(entries, for_history=True)
    assert rendered == messages


def test_anthropic_message_extras_of_a_results_only_message_survive() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
            "metadata": 1,
        },
    ]
    _, rendered = anthropic_format.render_messages(parse_anthropic(messages), for_history=True)
    assert rendered == messages


def test_anthropic_leading_system_becomes_top_level_and_later_system_is_wrapped() -> None:
    entries = [
        Entry(role="system", parts=[{"type": "text", "text": "rules"}], content_form="string"),
        Entry(role="user", parts=[{"type": "text", "text": "hi"}], content_form="string"),
        Entry(role="developer", parts=[{"type": "text", "text": "late"}], content_form="string"),
    ]
    system, messages = anthropic_format.render_messages(entries)
    assert system == [{"type": "text", "text": "rules"}]
    # The late system note is user text, in the user's turn (roles alternate).
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hi"},
                {"type": "text", "text": "<system>\nlate\n</system>"},
            ],
        }
    ]


def test_anthropic_model_render_drops_unsigned_thinking_and_empty_text() -> None:
    entries = anthropic_format.parse_message(
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "no signature"},
                {"type": "text", "text": ""},
                {"type": "text", "text": "answer"},
            ],
        },
        "m",
    )
    _, messages = anthropic_format.render_messages(entries)
    assert messages == [
        # A view cannot open with the assistant: a minimal user turn goes first.
        {"role": "user", "content": [{"type": "text", "text": anthropic_format.OPENING_TEXT}]},
        {"role": "assistant", "content": [{"type": "text", "text": "answer"}]},
    ]


# --- across formats -----------------------------------------------------------------------


def _block_field(messages: list[dict[str, Any]], kind: str, field: str) -> list[Any]:
    """``field`` of every ``kind`` block in Anthropic messages, in order."""
    return [
        b[field]
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == kind
    ]


def _call_ids(messages: list[dict[str, Any]]) -> list[str]:
    return [c["id"] for m in messages for c in m.get("tool_calls") or []]


def assert_anthropic_render_keeps_calls_paired(
    entries: list[Entry], messages: list[dict[str, Any]]
) -> None:
    """OpenAI -> canonical -> Anthropic: every tool_use answered by the next user message."""
    system, rendered = anthropic_format.render_messages(entries)
    assert check_anthropic_pairing(rendered, allow_pending=False) == []
    uses = _block_field(rendered, "tool_use", "id")
    results = _block_field(rendered, "tool_result", "tool_use_id")
    assert sorted(uses) == sorted(results) == sorted(_call_ids(messages))
    for m in rendered:
        assert m["role"] in ("user", "assistant")
        if isinstance(m["content"], list):
            assert all(b["type"] != "text" or b["text"] for b in m["content"])
    assert all(b["text"] for b in system)


def assert_openai_render_is_valid(entries: list[Entry], messages: list[dict[str, Any]]) -> None:
    """Anthropic -> canonical -> OpenAI: a chat the API accepts, with the same calls."""
    rendered = [openai_format.render_message(e) for e in entries]
    assert check_openai_pairing(rendered, allow_pending=False) == []
    uses = _block_field(messages, "tool_use", "id")
    assert sorted(_call_ids(rendered)) == sorted(uses)
    for m in rendered:
        for call in m.get("tool_calls", []):
            openai_format.parse_arguments(call["function"]["arguments"], "args")


def assert_tool_input_survives_openai(entries: list[Entry], messages: list[dict[str, Any]]) -> None:
    """A tool_use input becomes OpenAI arguments and comes back as the same object."""
    as_openai = [openai_format.render_message(e, for_history=False) for e in entries]
    back = parse_openai(as_openai)
    _, again = anthropic_format.render_messages(back)
    inputs = dict(
        zip(
            _block_field(messages, "tool_use", "id"),
            _block_field(messages, "tool_use", "input"),
            strict=True,
        )
    )
    again_inputs = dict(
        zip(
            _block_field(again, "tool_use", "id"),
            _block_field(again, "tool_use", "input"),
            strict=True,
        )
    )
    assert again_inputs == inputs


# --- images -------------------------------------------------------------------------------


def test_openai_data_url_becomes_anthropic_base64_source() -> None:
    entry = openai_format.parse_message(
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_1x1}"}}
            ],
        },
        "m",
    )
    _, messages = anthropic_format.render_messages([entry])
    assert messages == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG_1x1},
                }
            ],
        }
    ]


def test_openai_http_url_becomes_anthropic_url_source() -> None:
    entry = openai_format.parse_message(
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}],
        },
        "m",
    )
    _, messages = anthropic_format.render_messages([entry])
    assert messages[0]["content"] == [
        {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}
    ]


def test_anthropic_base64_source_becomes_openai_data_url() -> None:
    [entry] = anthropic_format.parse_message(
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/4AAQ"},
                }
            ],
        },
        "m",
    )
    assert openai_format.render_message(entry) == {
        "role": "user",
        "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ"}}],
    }


@PROPERTY
@given(
    st.sampled_from(["image/png", "image/jpeg", "image/webp"]),
    st.text(alphabet="ABCDEFabcdef0123456789+/", min_size=1, max_size=40),
)
def test_image_survives_openai_anthropic_openai(media_type: str, data: str) -> None:
    url = f"data:{media_type};base64,{data}"
    entry = openai_format.parse_message(
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}, "m"
    )
    _, messages = anthropic_format.render_messages([entry])
    [back] = anthropic_format.parse_message(messages[0], "m")
    assert openai_format.render_message(back)["content"] == [
        {"type": "image_url", "image_url": {"url": url}}
    ]
