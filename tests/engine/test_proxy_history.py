"""Matching a proxied request's history against the stored one (engine.proxy_history)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.model import Entry
from app.engine.proxy_history import (
    EMPTY_CHAIN,
    RAW_TAIL_MESSAGES,
    Diverged,
    Known,
    Matched,
    canonical,
    digest,
    extend,
    first_difference,
    match,
    raw_known,
)
from app.engine.proxy_wire import PARSERS
from tests.engine.strategies import anthropic_conversations, openai_conversations

OPENAI = PARSERS["openai"]
ANTHROPIC = PARSERS["anthropic"]


def entries_of(messages: list[Any], parse: Any) -> list[Entry]:
    return [e for i, m in enumerate(messages) for e in parse(m, f"messages[{i}]")]


def stored(messages: list[Any], parse: Any) -> Known:
    """What a session that stored ``messages`` knows (no raw digest yet)."""
    entries = entries_of(messages, parse)
    return Known(len(entries), extend(EMPTY_CHAIN, (digest(e) for e in entries)))


def resend_openai(message: dict[str, Any]) -> dict[str, Any]:
    """The message as an SDK may send it back: key order reversed, null fields added,
    a string as one text block, reasoning dropped, cache markers added."""
    m = copy.deepcopy(message)
    m.pop("reasoning_content", None)
    content = m.get("content")
    if isinstance(content, str) and content:
        m["content"] = [{"type": "text", "text": content, "cache_control": {"type": "ephemeral"}}]
    elif isinstance(content, list) and len(content) == 1 and content[0].get("type") == "text":
        m["content"] = content[0]["text"]
    if m["role"] == "assistant":
        m.update(refusal=None, annotations=[], audio=None, function_call=None)
        for call in m.get("tool_calls") or []:
            call.pop("index", None)
    return dict(reversed(list(m.items())))


def resend_anthropic(message: dict[str, Any]) -> dict[str, Any]:
    m = copy.deepcopy(message)
    content = m["content"]
    if isinstance(content, str):
        m["content"] = [{"type": "text", "text": content}] if content else []
    else:
        kept = []
        for block in content:
            if block["type"] in ("thinking", "redacted_thinking"):
                continue  # agents may drop earlier turns' thinking
            block = {**block, "citations": None}
            if block["type"] == "tool_use":
                block["input"] = dict(reversed(list(block["input"].items())))
            kept.append(block)
        m["content"] = kept
    return m


def test_canonical_ignores_what_sdks_add_or_drop() -> None:
    sent: dict[str, Any] = {
        "role": "assistant",
        "content": "Hi",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "ls", "arguments": '{"b": 1, "a": 2}'},
            }
        ],
    }
    back = {
        "tool_calls": [
            {
                "type": "function",
                "id": "c1",
                "function": {"arguments": '{"a":2,"b":1}', "name": "ls"},
            }
        ],
        "refusal": None,
        "annotations": [],
        "content": [{"type": "text", "text": "Hi"}],
        "role": "assistant",
        "reasoning_content": "thinking it over",
    }
    assert canonical(OPENAI(sent, "m")[0]) == canonical(OPENAI(back, "m")[0])
    # An empty text is nothing: "" and None and [] are one.
    content: Any
    for content in ("", None, []):
        assert digest(OPENAI({"role": "assistant", "content": content}, "m")[0]) == digest(
            OPENAI({"role": "assistant"}, "m")[0]
        )
    # What the model reads does count.
    for changed in (
        {**sent, "content": "Hi!"},
        {**sent, "tool_calls": [{**sent["tool_calls"][0], "id": "c2"}]},
        {**sent, "role": "user", "tool_calls": None},
    ):
        changed = {k: v for k, v in changed.items() if v is not None}
        assert digest(OPENAI(changed, "m")[0]) != digest(OPENAI(sent, "m")[0])


def test_the_same_text_in_either_format_is_the_same_message() -> None:
    openai = OPENAI({"role": "user", "content": "List the files."}, "m")
    anthropic = ANTHROPIC(
        {"role": "user", "content": [{"type": "text", "text": "List the files."}]}, "m"
    )
    assert [digest(e) for e in openai] == [digest(e) for e in anthropic]


@settings(max_examples=60, deadline=None)
@given(openai_conversations(), st.data())
def test_openai_history_resent_by_an_sdk_matches(messages: list[Any], data: st.DataObject) -> None:
    history = messages[1:] if messages[0]["role"] in ("system", "developer") else messages
    k = data.draw(st.integers(0, len(history)))
    known = stored(history[:k], OPENAI)
    request = [resend_openai(m) for m in history[:k]] + history[k:]
    found = match(request, known, OPENAI)
    assert isinstance(found, Matched)
    assert found.new_from == k
    # Once the new messages are stored, the chain is the one over the whole request.
    assert found.end.chain == stored(history, OPENAI).chain


@settings(max_examples=60, deadline=None)
@given(anthropic_conversations(), st.data())
def test_anthropic_history_resent_by_an_sdk_matches(
    messages: list[Any], data: st.DataObject
) -> None:
    k = data.draw(st.integers(0, len(messages)))
    known = stored(messages[:k], ANTHROPIC)
    request = [resend_anthropic(m) for m in messages[:k]] + messages[k:]
    found = match(request, known, ANTHROPIC)
    assert isinstance(found, Matched)
    assert found.new_from == k


@settings(max_examples=60, deadline=None)
@given(openai_conversations(), st.data())
def test_an_edited_or_dropped_message_diverges_where_it_differs(
    messages: list[Any], data: st.DataObject
) -> None:
    known = stored(messages, OPENAI)
    digests = [digest(e) for e in entries_of(messages, OPENAI)]
    i = data.draw(st.integers(0, len(messages) - 1))
    edited = copy.deepcopy(messages)
    if data.draw(st.booleans()):
        edited[i] = {"role": "user", "content": f"an edit of message {i} \u2713"}
    else:
        del edited[i]
    found = match(edited, known, OPENAI)
    if isinstance(found, Matched):
        # Only possible when the edit rebuilt the very same message (a drop never does).
        assert entries_of(edited, OPENAI) == entries_of(messages, OPENAI)
        return
    assert isinstance(found, Diverged)
    index, at = first_difference(edited, OPENAI, digests)
    assert index <= i
    assert [digest(e) for e in entries_of(edited[:index], OPENAI)] == digests[:at]


def test_a_shorter_history_diverges() -> None:
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    known = stored(messages, OPENAI)
    found = match(messages[:2], known, OPENAI)
    assert found == Diverged(3, shorter=True)
    digests = [digest(e) for e in entries_of(messages, OPENAI)]
    assert first_difference(messages[:2], OPENAI, digests) == (2, 2)


def test_a_stored_history_that_ends_inside_a_message_diverges() -> None:
    # Stored through the /v1 API as two messages; re-sent as one Anthropic message whose
    # tool results and text make two entries.
    parts = [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a"}]},
    ]
    known = stored(parts, ANTHROPIC)
    request = [
        parts[0],
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a"},
                {"type": "text", "text": "and now?"},
            ],
        },
    ]
    assert match(request, known, ANTHROPIC) == Diverged(2, inside_message=1)


def test_the_raw_fast_path_skips_the_prefix_the_last_call_sent() -> None:
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(12)
    ]
    first = match(history[:9], Known(), OPENAI)
    assert isinstance(first, Matched)
    assert not first.fast
    # All nine stored, then the reply: what the proxy records after the call.
    reply = OPENAI(history[9], "reply")
    chain = extend(first.end.chain, (digest(e) for e in reply))
    known = raw_known(first, history[:9], first.end.entries + 1, chain)
    assert known.raw_count == 9 - RAW_TAIL_MESSAGES

    second = match(history, known, OPENAI)
    assert isinstance(second, Matched)
    assert second.fast
    assert second.new_from == 10
    assert second.boundaries[0].messages == 9 - RAW_TAIL_MESSAGES
    assert second.end.chain == stored(history, OPENAI).chain

    # The agent changed an early message: the fast path misses, and the full match finds it.
    edited = [{"role": "user", "content": "m0, edited"}, *history[1:]]
    third = match(edited, known, OPENAI)
    assert isinstance(third, Diverged)

    # Re-serialised differently but the same messages: the fast path misses, the match holds.
    resent = [dict(reversed(list(m.items()))) for m in history]
    fourth = match(resent, known, OPENAI)
    assert isinstance(fourth, Matched)
    assert not fourth.fast
    assert fourth.new_from == 10


def test_a_message_the_store_refuses_is_named_with_the_request_offset() -> None:
    import pytest

    from app.engine.model import InvalidMessage

    with pytest.raises(InvalidMessage) as refused:
        match(
            [{"role": "user", "content": "ok"}, {"role": "robot", "content": "x"}],
            Known(),
            OPENAI,
            2,
        )
    assert refused.value.path == "messages[3].role"
