"""The Responses API's items read as chat messages and written back (pure)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.formats import openai_format
from app.engine.model import InvalidMessage
from app.engine.proxy.history import digest
from app.engine.proxy.responses_format import (
    ResponsesStream,
    custom_tools,
    read_request,
    reply_of,
    to_items,
    to_message,
)
from app.engine.proxy.stream import SseEvents
from app.engine.proxy.wires import wire_of
from app.engine.window.context import pair_tool_calls

TOOLS = [
    {"type": "function", "name": "shell", "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
]

REASONING = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "thinking"}],
    "encrypted_content": "gAAAAB" + "x" * 200,
}


def _model_view(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the proxy sends: each item stored as an entry, rendered for the model."""
    entries = [
        openai_format.parse_message(to_message(i, f"input[{n}]"), "m") for n, i in enumerate(items)
    ]
    return [openai_format.render_message(e) for e in entries]


def _without_ids(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("id", "status")}


def test_a_codex_history_comes_back_as_the_same_items() -> None:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
        REASONING,
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": '{"cmd":["ls"]}'},
        {"type": "function_call_output", "call_id": "c1", "output": "a.py\nb.py"},
        {
            "type": "custom_tool_call",
            "call_id": "c2",
            "name": "apply_patch",
            "input": "*** Begin Patch",
        },
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done!"},
        {
            "type": "local_shell_call",
            "call_id": "c3",
            "action": {"type": "exec", "command": ["ls"]},
            "status": "completed",
        },
        {"type": "local_shell_call_output", "call_id": "c3", "output": "x"},
        {
            "type": "web_search_call",
            "id": "ws_1",
            "status": "completed",
            "action": {"type": "search"},
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Fixed."}],
        },
    ]
    back = to_items(_model_view(items), custom_tools(TOOLS))
    expected = [
        items[0],
        REASONING,  # opaque items whole, their id kept
        items[2],
        items[3],
        items[4],
        items[5],
        items[6],  # unmodelled calls and outputs are themselves
        items[7],
        items[8],
        _without_ids(items[9]),
    ]
    assert back == expected


def test_an_item_is_one_message_and_the_reply_matches_the_next_input() -> None:
    output = [
        {**REASONING, "status": None},
        {
            "type": "function_call",
            "id": "fc_1",
            "status": "completed",
            "call_id": "c1",
            "name": "shell",
            "arguments": "{}",
        },
    ]
    reply = reply_of(
        {
            "object": "response",
            "status": "completed",
            "output": output,
            "usage": {"input_tokens": 3, "output_tokens": 1},
        }
    )
    assert reply.finish_reason == "tool_calls"
    stored = [openai_format.parse_message(m, "reply") for m in reply.messages]
    # Codex sends the items back without their ids and nulls.
    resent = [
        REASONING,
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
    ]
    again = [openai_format.parse_message(to_message(i, "input"), "m") for i in resent]
    assert [digest(e) for e in stored] == [digest(e) for e in again]


def test_the_prompt_is_instructions_and_leading_system_items() -> None:
    body = {
        "model": "gpt-5",
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "sandbox"}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "later"}],
            },
        ],
        "stream": True,
        "store": False,
    }
    request = read_request(body)
    assert request.responses
    assert request.api == "openai"
    assert request.offset == 1
    assert [m["role"] for m in request.messages] == ["user", "developer"]
    assert request.path(0) == "input[1]"
    assert read_request({"model": "m", "input": "hello"}).messages == [
        {"role": "user", "content": "hello"}
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model": "m", "input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": "m", "input": "x", "conversation": "conv_1"}, "conversation"),
        ({"model": "m", "input": 3}, "input"),
        (
            {"model": "m", "input": [{"type": "message", "role": "developer", "content": "x"}]},
            "input",
        ),
        (
            {"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input[0].call_id",
        ),
        (
            {"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]},
            "input[0].role",
        ),
        ({"input": "x"}, "model"),
    ],
)
def test_unusable_requests_name_their_field(body: dict[str, Any], field: str) -> None:
    """Refused when read, or, for an item, when the proxy parses it (the items an earlier
    call sent byte for byte are not parsed again)."""

    def read_and_parse() -> None:
        request = read_request(body)
        wire = wire_of(request)
        for i, item in enumerate(request.messages):
            wire.parse(item, request.path(i))

    with pytest.raises(InvalidMessage) as caught:
        read_and_parse()
    assert caught.value.path == field


def _events(*data: dict[str, Any]) -> list[bytes]:
    return [f"event: {d['type']}\ndata: ".encode() + orjson.dumps(d) + b"\n\n" for d in data]


def test_a_stream_is_stored_from_its_completed_response() -> None:
    item = {
        "type": "message",
        "role": "assistant",
        "id": "m1",
        "content": [{"type": "output_text", "text": "hi"}],
    }
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2}
    raw = _events(
        {"type": "response.created", "response": {"status": "in_progress", "output": []}},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {
            "type": "response.completed",
            "response": {"status": "completed", "output": [item], "usage": usage},
        },
    )
    reader, events = ResponsesStream(), SseEvents()
    for chunk in raw:
        for event in events.feed(chunk):
            assert reader.feed(event)  # every event goes on
    assert reader.complete
    assert reader.usage == usage
    assert reader.reply().message["content"] == [{"type": "text", "text": "hi"}]

    cut = ResponsesStream()
    for event in SseEvents().feed(b"".join(raw[:2])):
        cut.feed(event)
    assert cut.unfinished
    assert not cut.complete
    failed = ResponsesStream()
    for event in SseEvents().feed(b"".join(_events({"type": "response.failed", "response": {}}))):
        failed.feed(event)
    assert failed.done
    assert not failed.complete
    assert not failed.unfinished


_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
_ids = st.sampled_from(["c1", "c2", "c3", "c4"])


@st.composite
def _turns(draw: Any) -> list[dict[str, Any]]:
    """A plausible Responses history: user turns, assistant items, calls and their outputs."""
    items: list[dict[str, Any]] = []
    for n in range(draw(st.integers(1, 6))):
        items.append(
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": draw(_text)}],
            }
        )
        calls = draw(st.integers(0, 3))
        if draw(st.booleans()):
            items.append({**REASONING, "id": f"rs_{n}"})
        ids = [f"call_{n}_{i}" for i in range(calls)]
        for cid in ids:
            if draw(st.booleans()):
                items.append(
                    {
                        "type": "function_call",
                        "call_id": cid,
                        "name": "shell",
                        "arguments": orjson.dumps({"c": draw(_text)}).decode(),
                    }
                )
            else:
                items.append(
                    {
                        "type": "custom_tool_call",
                        "call_id": cid,
                        "name": "apply_patch",
                        "input": draw(_text),
                    }
                )
        for cid in ids:
            kind = next(i["type"] for i in items if i.get("call_id") == cid)
            items.append({"type": f"{kind}_output", "call_id": cid, "output": draw(_text)})
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": draw(_text) or "ok"}],
            }
        )
    return items


@settings(max_examples=150, deadline=None)
@given(_turns(), st.integers(0, 40))
def test_any_window_of_a_history_is_written_back_with_every_call_paired(
    items: list[dict[str, Any]], start: int
) -> None:
    """Whatever window the context starts at, every output item sent comes after its
    call, of the call's own kind, and every call sent is answered."""
    entries = [openai_format.parse_message(to_message(i, "m"), "m") for i in items]
    window = pair_tool_calls(entries[min(start, len(entries) - 1) :])
    sent = to_items([openai_format.render_message(e) for e in window], custom_tools(TOOLS))
    called = set()
    for item in sent:
        if item["type"].endswith("_call"):
            called.add(item["call_id"])
        if item["type"].endswith("_output"):
            assert item["call_id"] in called, "an output without its call"
            kinds = {i["type"] for i in sent if i.get("call_id") == item["call_id"]}
            assert len({k.removesuffix("_output") for k in kinds}) == 1, kinds
    answered = {i["call_id"] for i in sent if i["type"].endswith("_output")}
    assert called <= answered
