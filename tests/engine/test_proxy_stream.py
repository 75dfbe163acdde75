"""Streamed replies passed on event by event and accumulated into one message
(engine.proxy_stream), against the streams the scripted upstream sends as the APIs do."""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.proxy.stream import (
    AnthropicStream,
    EventTooLarge,
    OpenAIStream,
    SseEvents,
    parse_event,
    stream_error,
)
from tests.upstream_server import _Answer

CALLS = (("read_file", {"path": "a.py", "lines": [1, 2]}), ("run", {"command": "ls -la"}))


def answer(api: str, text: str | None, calls: Any = (), **body: Any) -> _Answer:
    return _Answer(
        api, {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}, text, calls
    )


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=30), st.booleans())
def test_events_are_cut_at_their_blank_lines_however_the_bytes_arrive(
    cuts: list[int], crlf: bool
) -> None:
    events = answer("anthropic", "Hello there, world.", CALLS[:1]).events()
    if crlf:
        events = [e.replace(b"\n", b"\r\n") for e in events]
    data = b"".join(events)
    splitter = SseEvents()
    got = [e for piece in chunked(data, cuts) for e in splitter.feed(piece)]
    assert [e.raw for e in got] == events
    assert splitter.rest() == b""
    assert got[0].name == "message_start"


def test_a_stream_cut_mid_event_keeps_the_rest_apart() -> None:
    splitter = SseEvents()
    assert splitter.feed(b'data: {"a": 1}\n\ndata: {"b"') == [parse_event(b'data: {"a": 1}\n\n')]
    assert splitter.rest() == b'data: {"b"'


def test_an_event_over_the_bound_is_refused() -> None:
    splitter = SseEvents(max_event_bytes=100)
    with pytest.raises(EventTooLarge):
        splitter.feed(b"data: " + b"x" * 200)


def test_comments_and_multiline_data() -> None:
    event = parse_event(b": keep-alive\nevent: x\ndata: one\ndata: two\n\n")
    assert (event.name, event.data) == ("x", "one\ntwo")


@pytest.mark.parametrize("wants_usage", [False, True])
@pytest.mark.parametrize(
    ("text", "calls"), [("Hello, world!", ()), (None, CALLS), ("Look:", CALLS)]
)
def test_openai_stream_accumulates_the_reply(
    wants_usage: bool, text: str | None, calls: Any
) -> None:
    made = answer("openai", text, calls, stream=True, stream_options={"include_usage": True})
    reader = OpenAIStream(wants_usage)
    passed: list[bytes] = []
    terminal = []
    for event in SseEvents().feed(b"".join(made.events())):
        if reader.feed(event):
            passed.append(event.raw)
        if reader.terminal(event):
            terminal.append(event)
    assert reader.complete
    whole = made.whole()
    expected = whole["choices"][0]["message"]
    message = reader.message()
    assert message["content"] == expected["content"]
    assert message.get("tool_calls") == expected.get("tool_calls")
    assert reader.finish_reason == whole["choices"][0]["finish_reason"]
    assert reader.usage == whole["usage"]
    # The usage-only chunk reaches the agent only if it asked for it.
    usage_chunks = [p for p in passed if b'"choices":[]' in p]
    assert len(usage_chunks) == (1 if wants_usage else 0)
    assert len(terminal) == 1


def test_openai_stream_without_its_end_or_with_an_error_is_not_complete() -> None:
    events = SseEvents().feed(b"".join(answer("openai", "Hi", stream=True).events()))
    reader = OpenAIStream(False)
    for event in events[:-1]:  # no [DONE]
        reader.feed(event)
    assert not reader.complete
    failed = OpenAIStream(False)
    for event in SseEvents().feed(stream_error("openai", "upstream gone")):
        failed.feed(event)
    failed.feed(events[-1])
    assert failed.failed == "upstream gone"
    assert not failed.complete


@pytest.mark.parametrize(
    ("text", "calls"), [("Hello, world!", ()), (None, CALLS), ("Look:", CALLS)]
)
def test_anthropic_stream_accumulates_the_reply(text: str | None, calls: Any) -> None:
    made = answer("anthropic", text, calls, stream=True)
    reader = AnthropicStream()
    for event in SseEvents().feed(b"".join(made.events())):
        assert reader.feed(event)
    assert reader.complete
    whole = made.whole()
    assert reader.message() == {"role": "assistant", "content": whole["content"]}
    assert reader.finish_reason == whole["stop_reason"]
    assert reader.usage is not None
    assert reader.usage["output_tokens"] == whole["usage"]["output_tokens"]
    assert reader.usage["input_tokens"] == whole["usage"]["input_tokens"]


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


def test_anthropic_thinking_signature_and_a_bad_tool_input() -> None:
    stream = b"".join(
        [
            _event(
                "message_start",
                {"type": "message_start", "message": {"content": [], "usage": {"input_tokens": 5}}},
            ),
            _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "thinking", "thinking": ""},
                },
            ),
            _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": "Let me "},
                },
            ),
            _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "thinking_delta", "thinking": "think."},
                },
            ),
            _event(
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "signature_delta", "signature": "sig=="},
                },
            ),
            _event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            _event(
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                },
            ),
            _event("content_block_stop", {"type": "content_block_stop", "index": 1}),
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 9},
                },
            ),
            _event("message_stop", {"type": "message_stop"}),
        ]
    )
    reader = AnthropicStream()
    for event in SseEvents().feed(stream):
        reader.feed(event)
    assert reader.complete
    assert reader.message()["content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": "sig=="},
        {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},  # no input streamed
    ]
    assert reader.usage == {"input_tokens": 5, "output_tokens": 9}

    broken = AnthropicStream()
    for event in SseEvents().feed(
        _event(
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t", "name": "x", "input": {}},
            },
        )
        + _event(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"a": '},
            },
        )
        + _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        + _event("message_stop", {"type": "message_stop"})
    ):
        broken.feed(event)
    assert broken.failed is not None
    assert not broken.complete


def _call_chunks(*deltas: dict[str, Any]) -> bytes:
    chunks = [
        {"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": [d]}, "finish_reason": None}]}
        for d in deltas
    ]
    chunks.append(
        {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    )
    return b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def test_a_tool_call_name_repeated_in_later_deltas_is_not_doubled() -> None:
    """Some providers (and proxies in front of them) send a call's whole name again in
    each of its deltas: the name is kept once. A name sent in pieces is joined."""
    repeated = _call_chunks(
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "read_file"}},
        {"index": 0, "function": {"name": "read_file", "arguments": '{"path": '}},
        {"index": 0, "function": {"name": "read_file", "arguments": '"a.py"}'}},
        {"index": 1, "id": "c2", "function": {"name": "ls", "arguments": ""}},
        {"index": 1, "function": {"name": "ls", "arguments": "{}"}},
    )
    pieces = _call_chunks(
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "read"}},
        {"index": 0, "function": {"name": "_file", "arguments": '{"path": "a.py"}'}},
        {"index": 1, "id": "c2", "function": {"name": "ls", "arguments": "{}"}},
    )
    for data in (repeated, pieces):
        reader = OpenAIStream(False)
        for event in SseEvents().feed(data):
            reader.feed(event)
        assert reader.complete
        calls = reader.message()["tool_calls"]
        assert [c["function"]["name"] for c in calls] == ["read_file", "ls"]
        assert [c["function"]["arguments"] for c in calls] == ['{"path": "a.py"}', "{}"]
        assert [c["id"] for c in calls] == ["c1", "c2"]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_stream_is_unfinished_until_its_finish_reason_or_its_end(api: str) -> None:
    """Cut anywhere before its finish reason, a stream is unfinished (the proxy then
    ends it with an error event); from the finish reason on, or with an error event of
    its own, it is not."""
    events = SseEvents().feed(b"".join(answer(api, "Hello there", stream=True).events()))
    # Where the finish reason comes (OpenAI's last chunk, Anthropic's message_delta).
    finish = next(
        i
        for i, e in enumerate(events)
        if b'"finish_reason":"stop"' in e.raw or b'"stop_reason":"end_turn"' in e.raw
    )
    for cut in range(len(events) + 1):
        reader = OpenAIStream(False) if api == "openai" else AnthropicStream()
        for event in events[:cut]:
            reader.feed(event)
        assert reader.unfinished == (cut <= finish), cut
    failed = OpenAIStream(False) if api == "openai" else AnthropicStream()
    for event in [*events[:1], *SseEvents().feed(stream_error(api, "upstream gone"))]:
        failed.feed(event)
    assert not failed.unfinished
    assert not failed.complete
