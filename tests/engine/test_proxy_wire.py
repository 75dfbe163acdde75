"""Reading a proxied request and writing the upstream one (engine.proxy_wire)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.accounting import tokens
from app.engine.accounting.overflow_errors import OverflowMatch, classify
from app.engine.model import InvalidMessage
from app.engine.proxy.stream import AnthropicStream, OpenAIStream, SseEvents
from app.engine.proxy.wire import (
    Api,
    UnreadableReply,
    cache_markers,
    marked,
    overhead_tokens,
    read_request,
    replayed_body,
    replayed_events,
    reply_of,
    retry_target,
    upstream_body,
    upstream_bytes,
)

TOOLS = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]


def test_openai_system_prompt_is_the_leading_system_and_developer_messages() -> None:
    body: dict[str, Any] = {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": "Use tools."},
            {"role": "user", "content": "Hi"},
            {"role": "system", "content": "a later note stays in the history"},
        ],
        "tools": TOOLS,
        "temperature": 0.3,
        "stream": True,
    }
    request = read_request("openai", body)
    assert request.offset == 2
    assert request.system == body["messages"][:2]
    assert request.messages == body["messages"][2:]
    assert request.path(0) == "messages[2]"
    assert request.stream
    assert not request.wants_usage

    sent = upstream_body(request, [{"role": "user", "content": "Hi"}], None)
    assert sent["messages"] == [*body["messages"][:2], {"role": "user", "content": "Hi"}]
    # Every other field as the agent wrote it; a stream asks for its usage.
    assert {k: v for k, v in sent.items() if k not in ("messages", "stream_options")} == {
        k: v for k, v in body.items() if k != "messages"
    }
    assert sent["stream_options"] == {"include_usage": True}
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}  # not changed

    counted = overhead_tokens(request, "o200k_base")
    assert counted == (
        tokens.MESSAGE_OVERHEAD_TOKENS
        + tokens.count_text("Be brief.\nUse tools.")
        + tokens.count_tools(TOOLS)
    )


def test_anthropic_system_prompt_and_the_context_s_own_system_blocks() -> None:
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-6",
        "max_tokens": 100,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "Hi"}],
        "metadata": {"user_id": "u"},
    }
    request = read_request("anthropic", body)
    assert (request.offset, request.system, request.messages) == (0, "Be brief.", body["messages"])
    context = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    assert upstream_body(request, context, None) == {**body, "messages": context}
    # A session that stored system messages (through the /v1 API) adds them after the agent's.
    merged = upstream_body(request, context, [{"type": "text", "text": "stored note"}])
    assert merged["system"] == [
        {"type": "text", "text": "Be brief."},
        {"type": "text", "text": "stored note"},
    ]
    # With none, the agent's system field stays as it was: absent stays absent.
    bare = read_request("anthropic", {k: v for k, v in body.items() if k != "system"})
    assert "system" not in upstream_body(bare, context, None)


_TEXT = st.text(max_size=12)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_OPENAI_SYSTEM: st.SearchStrategy[list[dict[str, Any]]] = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "developer"]), "content": _TEXT | st.just([])}
    ),
    max_size=2,
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": _TEXT | _JSON}
)
_BLOCKS = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _TEXT}), max_size=3)


@st.composite
def _requests(draw: st.DrawFn) -> tuple[Any, bytes, bytes | None]:
    """A request as agents send them (other fields of any JSON, streamed or not, a
    system prompt or none), and a context as read: its messages, and for Anthropic its
    own system blocks (maybe none, maybe an empty array)."""
    api: Api = draw(st.sampled_from(["openai", "anthropic"]))
    body: dict[str, Any] = draw(
        st.dictionaries(
            st.sampled_from(["temperature", "tools", "metadata", "top_p", "stream_options"]),
            _JSON,
            max_size=3,
        )
    )
    body["model"] = "m"
    history = draw(st.lists(_MESSAGE, min_size=1, max_size=3))
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
    if api == "openai":
        body["messages"] = [*draw(_OPENAI_SYSTEM), *history]
    else:
        body["messages"] = history
        system = draw(st.none() | _TEXT | _BLOCKS)
        if system is not None:
            body["system"] = system
    request = read_request(api, body)
    messages = orjson.dumps(draw(st.lists(_MESSAGE, max_size=3)))
    system_blocks = None if api == "openai" else draw(st.none() | _BLOCKS.map(orjson.dumps))
    return request, messages, system_blocks


@given(_requests())
def test_the_upstream_body_is_spliced_as_it_would_be_built(
    case: tuple[Any, bytes, bytes | None],
) -> None:
    """The context's JSON spliced into the agent's request is, byte for byte, the
    request built from the parsed context and serialized."""
    request, messages, system = case
    built = upstream_body(
        request, orjson.loads(messages), None if system is None else orjson.loads(system)
    )
    assert upstream_bytes(request, messages, system) == orjson.dumps(built)


@pytest.mark.parametrize(
    ("api", "body", "field"),
    [
        ("openai", [], "body"),
        ("openai", {"messages": []}, "model"),
        ("openai", {"model": "m", "messages": {}}, "messages"),
        ("openai", {"model": "m", "messages": [], "stream": "yes"}, "stream"),
        ("openai", {"model": "m", "messages": [], "n": 2}, "n"),
        ("anthropic", {"model": "m", "messages": [], "system": 3}, "system"),
        ("anthropic", {"model": "m" * 201, "messages": []}, "model"),
        # bool is int in Python, and True == 1: n must be the integer 1 itself.
        ("openai", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": True}, "n"),
        ("openai", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1.0}, "n"),
        ("openai", {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": "1"}, "n"),
        # The providers refuse a call with no message.
        ("openai", {"model": "m", "messages": []}, "messages"),
        ("openai", {"model": "m"}, "messages"),
        ("anthropic", {"model": "m", "messages": []}, "messages"),
    ],
)
def test_a_request_the_proxy_cannot_use_names_its_field(api: Any, body: Any, field: str) -> None:
    with pytest.raises(InvalidMessage) as refused:
        read_request(api, body)
    assert refused.value.path == field


def test_n_of_one_and_a_history_of_system_messages_only_are_read() -> None:
    hello = [{"role": "user", "content": "hi"}]
    assert read_request("openai", {"model": "m", "messages": hello, "n": 1}).messages == hello
    assert read_request("openai", {"model": "m", "messages": hello, "n": None}).messages == hello
    system = [{"role": "system", "content": "Be brief."}]
    assert read_request("openai", {"model": "m", "messages": system}).messages == []


OPENAI_REPLIES: list[dict[str, Any]] = [
    {"role": "assistant", "content": "Paris.", "refusal": None, "annotations": []},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}},
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path": "a b.py"}'},
            },
        ],
    },
    {"role": "assistant", "content": "Let me look.", "reasoning_content": "Think first."},
    {"role": "assistant", "content": ""},
]
ANTHROPIC_REPLIES: list[dict[str, Any]] = [
    {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "Which file?", "signature": "sig-1"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a.py"}},
            {"type": "tool_use", "id": "t2", "name": "ls", "input": {}},
        ],
    },
    {"role": "assistant", "content": []},
]


@pytest.mark.parametrize("message", OPENAI_REPLIES)
@pytest.mark.parametrize("wants_usage", [False, True])
def test_a_stored_openai_reply_replays_whole_and_streamed(
    message: dict[str, Any], wants_usage: bool
) -> None:
    """A call sent again gets its stored reply: the same message whether whole or
    streamed (as the stream's accumulator reads it back), its usage none."""
    body = replayed_body("openai", message, "gpt-4o", 1_700_000_000)
    assert body["choices"][0]["message"] == message
    assert body["choices"][0]["finish_reason"] == (
        "tool_calls" if "tool_calls" in message else "stop"
    )
    assert body["usage"]["total_tokens"] == 0
    assert reply_of("openai", body).message == message
    reader = OpenAIStream(wants_usage)
    events = SseEvents().feed(
        b"".join(replayed_events("openai", message, "gpt-4o", 1_700_000_000, wants_usage))
    )
    passed = [e for e in events if reader.feed(e)]
    assert reader.complete
    assert reader.finish_reason == body["choices"][0]["finish_reason"]
    expected = {k: v for k, v in message.items() if k not in ("refusal", "annotations")}
    assert reader.message() == expected
    assert (reader.usage is not None) == wants_usage
    assert len(passed) == len(events)


@pytest.mark.parametrize("message", ANTHROPIC_REPLIES)
def test_a_stored_anthropic_reply_replays_whole_and_streamed(message: dict[str, Any]) -> None:
    body = replayed_body("anthropic", message, "claude-sonnet-4-6", 0)
    assert reply_of("anthropic", body).message == message
    uses = [b for b in message["content"] if b["type"] == "tool_use"]
    assert body["stop_reason"] == ("tool_use" if uses else "end_turn")
    reader = AnthropicStream()
    for event in SseEvents().feed(
        b"".join(replayed_events("anthropic", message, "claude-sonnet-4-6", 0, False))
    ):
        reader.feed(event)
    assert reader.complete
    assert reader.finish_reason == body["stop_reason"]
    assert reader.message() == message


def test_replies_in_either_shape() -> None:
    openai = {
        "choices": [
            {
                "message": {"role": "assistant", "content": "Hi", "refusal": None},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1},
    }
    reply = reply_of("openai", openai)
    assert reply.message == {"role": "assistant", "content": "Hi", "refusal": None}
    assert (reply.finish_reason, reply.usage) == ("stop", openai["usage"])
    claude = {
        "content": [{"type": "text", "text": "Hi"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3},
    }
    assert reply_of("anthropic", claude).message == {
        "role": "assistant",
        "content": claude["content"],
    }
    for api, bad in (("openai", {"choices": []}), ("openai", []), ("anthropic", {"content": "x"})):
        with pytest.raises(UnreadableReply):
            reply_of(api, bad)  # type: ignore[arg-type]


def test_the_retry_must_lose_the_overshoot_the_error_states() -> None:
    stated = classify(
        400,
        "This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9000 tokens.",
    )
    assert (stated.requested_tokens, stated.limit_tokens) == (9000, 8192)
    assert retry_target(10_000, stated) == 10_000 - 889  # the 808 over, and a tenth more
    assert retry_target(10_000, OverflowMatch(overflow=True)) == 9_000
    assert retry_target(100, stated) == 0


_BLOCK = st.sampled_from(
    [
        {"type": "text", "text": "words"},
        {"type": "text", "text": ""},
        {"type": "thinking", "thinking": "hm", "signature": "s"},
        {"type": "tool_use", "id": "t", "name": "f", "input": {}},
        {"type": "tool_result", "tool_use_id": "t", "content": "out"},
    ]
)
_MESSAGE = st.fixed_dictionaries(
    {
        "role": st.sampled_from(["user", "assistant", "system"]),
        "content": st.one_of(st.sampled_from(["", "text"]), st.lists(_BLOCK, max_size=3)),
    }
)


@given(st.lists(_MESSAGE, max_size=8), st.integers(0, 4))
def test_cache_breakpoints_go_on_the_last_messages_that_can_carry_them(
    messages: list[dict[str, Any]], count: int
) -> None:
    markers = [{"type": "ephemeral", "n": i} for i in range(count)]
    out = marked(messages, markers)
    placed = [
        (i, b["cache_control"])
        for i, m in enumerate(out)
        if isinstance(m["content"], list)
        for b in m["content"]
        if "cache_control" in b
    ]
    # One per message, in the agent's order, on the last messages able to carry one.
    able = [
        i
        for i, m in enumerate(messages)
        if m["role"] != "system"
        and (
            (isinstance(m["content"], str) and m["content"])
            or (
                isinstance(m["content"], list)
                and any(
                    b["type"] != "thinking" and (b["type"] != "text" or b["text"])
                    for b in m["content"]
                )
            )
        )
    ]
    wanted = able[len(able) - min(count, len(able)) :]
    assert [i for i, _ in placed] == wanted
    assert [m for _, m in placed] == markers[len(markers) - len(wanted) :]
    for i, m in enumerate(out):
        for b in m["content"] if isinstance(m["content"], list) else ():
            if "cache_control" in b:
                assert b["type"] != "thinking"
                assert b["type"] != "text" or b["text"]
        if i not in wanted:
            assert m == messages[i]  # nothing else changes
    assert all("cache_control" not in str(m) for m in messages)  # the input is not changed


def test_the_agents_markers_are_collected_from_its_history() -> None:
    request = read_request(
        "anthropic",
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 10,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}
                    ],
                },
                {"role": "assistant", "content": "b"},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "text",
                            "text": "c",
                            "cache_control": {"type": "ephemeral", "ttl": "1h"},
                        }
                    ],
                },
            ],
        },
    )
    assert cache_markers(request) == [{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}]
    body = orjson.loads(
        upstream_bytes(
            request,
            orjson.dumps(
                [{"role": "user", "content": "summary"}, {"role": "user", "content": "c"}]
            ),
            None,
        )
    )
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "summary", "cache_control": {"type": "ephemeral"}}
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "c", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ],
        },
    ]
