"""Matching a proxied request's history against the stored one (engine.proxy_history)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.model import Entry
from app.engine.proxy.history import (
    EMPTY_CHAIN,
    RAW_TAIL_MESSAGES,
    Diverged,
    Known,
    Matched,
    Stored,
    canonical,
    contentless,
    digest,
    extend,
    first_difference,
    match,
    raw_known,
    replays,
    start,
)
from app.engine.proxy.wire import PARSERS
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
    digests = [Stored.of(e) for e in entries_of(messages, OPENAI)]
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
    assert [Stored.of(e) for e in entries_of(edited[:index], OPENAI)] == digests[:at]


def test_a_shorter_history_diverges() -> None:
    messages = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    known = stored(messages, OPENAI)
    found = match(messages[:2], known, OPENAI)
    assert found == Diverged(3, shorter=True)
    digests = [Stored.of(e) for e in entries_of(messages, OPENAI)]
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

    # The fast path's check asked for first (as the proxy does, before it decides where
    # to parse the rest) gives the same match.
    for request in (history, edited, resent):
        begin = start(request, known)
        assert begin.fast == (request is history)
        assert begin.messages == (9 - RAW_TAIL_MESSAGES if begin.fast else 0)
        given_first, by_itself = (
            match(request, known, OPENAI, begin=begin),
            match(request, known, OPENAI),
        )
        if isinstance(by_itself, Matched):
            assert isinstance(given_first, Matched)
            assert given_first.raw.digest() == by_itself.raw.digest()
            given_first.raw = by_itself.raw  # the digests' own objects: the same state
        assert given_first == by_itself


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


def test_a_call_sent_again_is_the_stored_history_less_its_last_reply() -> None:
    history: list[Any] = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
    ]
    known = stored(history, OPENAI)
    last = OPENAI(history[3], "reply")[0]
    again = match(history[:3], known, OPENAI)
    assert isinstance(again, Diverged)
    assert replays(again, known, (), last)
    # The same call re-serialised by an SDK is the same call.
    resent = match([resend_openai(m) for m in history[:3]], known, OPENAI)
    assert isinstance(resent, Diverged)
    assert replays(resent, known, (), last)
    # Shorter by more than the reply, or ending in another history: not that call.
    for request in (history[:2], history[:1], [*history[:2], {"role": "user", "content": "3"}]):
        found = match(request, known, OPENAI)
        assert isinstance(found, Diverged)
        assert not replays(found, known, (), last)
    # The stored history's last message is the agent's own, not a reply.
    mine = stored(history[:3], OPENAI)
    found = match(history[:2], mine, OPENAI)
    assert isinstance(found, Diverged)
    assert not replays(found, mine, (), OPENAI(history[2], "user")[0])
    # Another reply than the stored one.
    assert not replays(again, known, (), OPENAI({"role": "assistant", "content": "4"}, "r")[0])


def _tool_turn(i: int, output: str) -> list[Any]:
    call = {"id": f"call_{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": output},
    ]


def test_entries_pruning_erased_are_matched_blind() -> None:
    """An erased tool output, read back after the proxy's record (stored through /v1,
    say), no longer holds the text the agent re-sends: it is matched by the call it
    answers, and the chain goes on with what the agent sent."""
    head: list[Any] = [{"role": "user", "content": "read them"}]
    turns = [m for i in range(3) for m in _tool_turn(i, f"the long output {i}\n" * 50)]
    history = [*head, *turns, {"role": "assistant", "content": "Read."}]
    known = stored(head, OPENAI)
    entries = entries_of(history[1:], OPENAI)
    erased = [1, 3]  # the first two outputs
    placeholder = {"role": "tool", "content": "[Old tool result content cleared]"}
    tail = [
        Stored.of(
            OPENAI({**placeholder, "tool_call_id": e.tool_call_id}, "x")[0] if k in erased else e,
            erased=k in erased,
        )
        for k, e in enumerate(entries)
    ]
    request = [*history, {"role": "user", "content": "and now?"}]
    found = match(request, known, OPENAI, 0, tail)
    assert isinstance(found, Matched)
    assert found.new_from == len(history)
    # The chain goes on with the text the agent sent.
    assert found.boundary(len(history)).chain == stored(history, OPENAI).chain
    # An erased output answering another call, or another text where none was erased.
    for k, changed in ((2, {"tool_call_id": "call_9"}), (6, {"content": "other"})):
        edited = [*request]
        edited[k] = {**edited[k], **changed}
        assert isinstance(match(edited, known, OPENAI, 0, tail), Diverged)
        every = [Stored.of(e) for e in entries_of(head, OPENAI)] + tail
        assert first_difference(edited, OPENAI, every) == (k, k)
    assert (
        first_difference(request, OPENAI, [Stored.of(e) for e in entries_of(head, OPENAI)] + tail)[
            1
        ]
        == len(entries) + 1
    )
    # The call before the last reply, sent again, is still a replay with a tail.
    last = entries[-1]
    again = match(history[:-1], known, OPENAI, 0, tail)
    assert isinstance(again, Diverged)
    assert replays(again, known, tail, last)


def test_a_reply_with_nothing_to_send_back_is_contentless() -> None:
    empty: Any
    for empty in (
        {"role": "assistant", "content": []},
        {
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}],
        },
    ):
        assert all(contentless(e) for e in ANTHROPIC(empty, "r"))
    for empty in ({"role": "assistant", "content": ""}, {"role": "assistant", "content": None}):
        assert contentless(OPENAI(empty, "r")[0])
    for full in (
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": None, "tool_calls": _tool_turn(0, "")[0]["tool_calls"]},
    ):
        assert not contentless(OPENAI(full, "r")[0])


def test_a_server_tool_block_sent_back_without_its_nulls_is_the_same_message() -> None:
    # The Anthropic SDK's model_dump() writes caller/page_age as null;
    # model_dump(exclude_none=True), and many agents, leave them out.
    dumped: dict[str, Any] = {
        "role": "assistant",
        "content": [
            {
                "type": "server_tool_use",
                "id": "srvtoolu_1",
                "name": "web_search",
                "input": {"query": "pg_auto_failover"},
                "caller": None,
            },
            {
                "type": "web_search_tool_result",
                "tool_use_id": "srvtoolu_1",
                "content": [
                    {
                        "type": "web_search_result",
                        "url": "https://example.org",
                        "title": "Example",
                        "encrypted_content": "abc",
                        "page_age": None,
                    }
                ],
            },
            {"type": "text", "text": "Found it."},
        ],
    }
    without_nulls = copy.deepcopy(dumped)
    del without_nulls["content"][0]["caller"]
    del without_nulls["content"][1]["content"][0]["page_age"]
    assert digest(ANTHROPIC(dumped, "m")[0]) == digest(ANTHROPIC(without_nulls, "m")[0])
    changed = copy.deepcopy(dumped)
    changed["content"][0]["input"]["query"] = "citus"
    assert digest(ANTHROPIC(changed, "m")[0]) != digest(ANTHROPIC(dumped, "m")[0])
