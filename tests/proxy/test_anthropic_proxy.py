"""The official Anthropic SDK, unmodified, through the proxy to the scripted upstream."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest

from app.core.settings import Settings
from tests.proxy.support import (
    anthropic_client,
    anthropic_message,
    api,
    assert_stored,
    assert_valid_upstream,
    proxy,
    settled,
)
from tests.upstream_server import BreakStream, Empty, Reply, ToolCalls, Upstream

MODEL = "claude-sonnet-4-6"
BUDGET = 200_000 - 32_000
SYSTEM: Any = [
    {"type": "text", "text": "You are a coding agent."},
    {"type": "text", "text": "The repository is compactd.", "cache_control": {"type": "ephemeral"}},
]
TOOLS: Any = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
    {
        "name": "grep",
        "description": "Search the files.",
        "input_schema": {
            "type": "object",
            "properties": {"pattern": {"type": "string"}},
            "required": ["pattern"],
        },
    },
]


def results(reply: dict[str, Any]) -> dict[str, Any]:
    uses = [b for b in reply["content"] if b["type"] == "tool_use"]
    return {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": u["id"], "content": f"{u['name']}: ok\n" * 4}
            for u in uses
        ],
    }


async def test_plain_replies(db_url: str, settings: Settings, upstream: Upstream) -> None:
    upstream.script([Reply("Paris."), Reply("About 2.1 million.")])
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, "claude-plain") as client:
            history: list[Any] = [{"role": "user", "content": "Capital of France?"}]
            first = await client.messages.create(
                model=MODEL,
                max_tokens=64,
                system="Be brief.",
                messages=history,
                stop_sequences=["END"],
            )
            history.append(anthropic_message(first))
            history.append({"role": "user", "content": "Its population?"})
            second = await client.messages.create(
                model=MODEL,
                max_tokens=64,
                system="Be brief.",
                messages=history,
                stop_sequences=["END"],
            )
            history.append(anthropic_message(second))
        assert second.content[0].type == "text"
        for request in upstream.requests:
            assert_valid_upstream(request, "anthropic", budget=BUDGET)
            assert request.json["system"] == "Be brief."
            assert request.json["stop_sequences"] == ["END"]
            assert request.json["max_tokens"] == 64
        assert upstream.requests[1].json["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "Capital of France?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Paris."}]},
            {"role": "user", "content": [{"type": "text", "text": "Its population?"}]},
        ]
        async with api(base) as http:
            await assert_stored(http, "claude-plain", "anthropic", history)
            session = (await http.get("/v1/sessions/claude-plain")).json()
        assert session["model"] == MODEL
        assert session["usage_count"] == 2
        assert session["last_usage"]["finish_reason"] == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_use_parallel_and_streamed(
    db_url: str, settings: Settings, upstream: Upstream, stream: bool
) -> None:
    upstream.script(
        [
            ToolCalls(
                (("read_file", {"path": "app/main.py"}), ("grep", {"pattern": "proxy"})),
                text="Let me look.",
            ),
            ToolCalls((("read_file", {"path": "README.md"}),)),
            Reply("All read."),
        ]
    )
    sid = f"claude-tools-{stream}"
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, sid) as client:
            history: list[Any] = [{"role": "user", "content": "Where is the proxy wired?"}]
            events: list[str] = []
            for _ in range(3):
                message: Any
                if stream:
                    async with client.messages.stream(
                        model=MODEL, max_tokens=512, system=SYSTEM, messages=history, tools=TOOLS
                    ) as streamed:
                        async for event in streamed:
                            events.append(event.type)
                        message = await streamed.get_final_message()
                else:
                    message = await client.messages.create(
                        model=MODEL, max_tokens=512, system=SYSTEM, messages=history, tools=TOOLS
                    )
                reply = anthropic_message(message)
                history.append(reply)
                if message.stop_reason == "tool_use":
                    history.append(results(reply))
        assert [b["type"] for b in history[1]["content"]] == ["text", "tool_use", "tool_use"]
        if stream:
            # Event for event, as the upstream streamed them.
            assert {"message_start", "content_block_start", "content_block_stop"} <= set(events)
            assert "message_stop" in events
        for request in upstream.requests:
            assert_valid_upstream(request, "anthropic", budget=BUDGET)
            # The agent's system prompt (its cache marker too) and tools go upstream as sent.
            assert request.json["system"] == SYSTEM
            assert request.json["tools"] == TOOLS
        async with api(base) as http:
            await assert_stored(http, sid, "anthropic", history)
            session = (await http.get(f"/v1/sessions/{sid}")).json()
        assert session["usage_count"] == 3
        assert session["overhead_tokens"] > 0  # the system prompt and the tools


def markers_of(messages: list[Any]) -> list[tuple[int, Any]]:
    """Each cache breakpoint in ``messages``: the index of its message, and the marker."""
    return [
        (i, block["cache_control"])
        for i, message in enumerate(messages)
        if isinstance(message["content"], list)
        for block in message["content"]
        if "cache_control" in block
    ]


async def test_resent_history_with_sdk_objects_and_moved_cache_markers_matches(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Agents send the SDK's own blocks back and move their cache markers along: the
    history still matches, and is stored once."""
    upstream.script([ToolCalls((("grep", {"pattern": "x"}),)), Reply("Done."), Reply("Bye.")])
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, "claude-resend") as client:
            history: list[Any] = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Find x.", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ]
            expected: list[Any] = [history[0]]
            first = await client.messages.create(
                model=MODEL, max_tokens=100, messages=history, tools=TOOLS
            )
            history.append({"role": "assistant", "content": first.content})  # SDK objects
            expected.append(anthropic_message(first))
            answer = results(anthropic_message(first))
            history.append(answer)
            expected.append(answer)
            # The marker moves to the newest message.
            history[0] = {"role": "user", "content": [{"type": "text", "text": "Find x."}]}
            answer["content"][-1]["cache_control"] = {"type": "ephemeral"}
            second = await client.messages.create(
                model=MODEL, max_tokens=100, messages=history, tools=TOOLS
            )
            history.append({"role": "assistant", "content": second.content})
            expected.append(anthropic_message(second))
            history.append({"role": "user", "content": "Thanks."})
            expected.append(history[-1])
            await client.messages.create(model=MODEL, max_tokens=100, messages=history)
        for request in upstream.requests:
            assert_valid_upstream(request, "anthropic", budget=BUDGET)
        # The agent's cache breakpoints reach the provider where it put them, on the
        # context's last message, so its prompt cache keeps working through compactd.
        first_sent, second_sent, third_sent = (r.json["messages"] for r in upstream.requests)
        assert markers_of(first_sent) == [(0, {"type": "ephemeral"})]
        assert markers_of(second_sent) == [(len(second_sent) - 1, {"type": "ephemeral"})]
        # Its marker, left on an earlier message, goes on the context's last one: the
        # context is cached as far as it reaches.
        assert markers_of(third_sent) == [(len(third_sent) - 1, {"type": "ephemeral"})]
        async with api(base) as http:
            stored = await settled(http, "claude-resend", 6)
            assert stored["entry_count"] == 6  # each message once (and the last reply)
        assert len(upstream.requests) == 3


async def test_a_broken_stream_stores_nothing_and_another_first_message_is_a_child(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([Reply("One."), BreakStream(events=4, then=Reply("Cut " * 20)), Reply("Ten.")])
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, "claude-rules") as client:
            history: list[Any] = [{"role": "user", "content": "Count."}]
            first = await client.messages.create(model=MODEL, max_tokens=64, messages=history)
            history.append(anthropic_message(first))
            history.append({"role": "user", "content": "Again."})
            with pytest.raises(anthropic.APIError):
                async with client.messages.stream(
                    model=MODEL, max_tokens=64, messages=history
                ) as streamed:
                    await streamed.get_final_message()
            async with api(base) as http:
                await assert_stored(http, "claude-rules", "anthropic", history)

            # Another first message: another conversation of the agent, in a child
            # session, answered normally; the named session is left as it was.
            edited = [{"role": "user", "content": "Count to ten."}, *history[1:]]
            answer = await client.messages.create(model=MODEL, max_tokens=64, messages=edited)
            edited.append(anthropic_message(answer))
        assert len(upstream.requests) == 3
        assert upstream.requests[2].json["messages"][0]["content"] == [
            {"type": "text", "text": "Count to ten."}
        ]
        async with api(base) as http:
            await assert_stored(http, "claude-rules", "anthropic", history)
            found = (await http.get("/v1/sessions", params={"parent_id": "claude-rules"})).json()
            assert [c["parent_id"] for c in found["sessions"]] == ["claude-rules"]
            await assert_stored(http, found["sessions"][0]["id"], "anthropic", edited)


async def test_a_stream_that_ends_cleanly_before_message_stop_raises_and_stores_nothing(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """The upstream ends its response well-formed after a few events: no stop reason,
    no ``message_stop``. The SDK raises and none of the reply is stored."""
    upstream.script([BreakStream(events=5, then=Reply("Cut " * 20), clean=True)])
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, "claude-clean-cut") as client:
            history: list[Any] = [{"role": "user", "content": "Count."}]
            with pytest.raises(anthropic.APIError) as raised:
                async with client.messages.stream(
                    model=MODEL, max_tokens=64, messages=history
                ) as streamed:
                    await streamed.get_final_message()
            assert "ended before its finish reason" in raised.value.message
            async with api(base) as http:
                await assert_stored(http, "claude-clean-cut", "anthropic", history)
                session = (await http.get("/v1/sessions/claude-clean-cut")).json()
                assert session["usage_count"] == 0


async def test_two_claude_agents_at_once(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.behaviour = "agent"
    with proxy(settings, db_url, upstream) as base:

        async def agent(sid: str) -> list[Any]:
            async with anthropic_client(base, sid) as client:
                history: list[Any] = [{"role": "user", "content": f"Work on {sid}."}]
                for turn in range(4):
                    async with client.messages.stream(
                        model=MODEL, max_tokens=256, system=SYSTEM, messages=history, tools=TOOLS
                    ) as streamed:
                        message = await streamed.get_final_message()
                    reply = anthropic_message(message)
                    history.append(reply)
                    if turn == 3:
                        return history
                    if message.stop_reason == "tool_use":
                        history.append(results(reply))
                    else:
                        history.append({"role": "user", "content": f"Next step {turn}."})
            raise AssertionError("unreachable")

        one, two = await asyncio.gather(agent("claude-a"), agent("claude-b"))
        for request in upstream.requests:
            assert_valid_upstream(request, "anthropic", budget=BUDGET)
        async with api(base) as http:
            await assert_stored(http, "claude-a", "anthropic", one)
            await assert_stored(http, "claude-b", "anthropic", two)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("keeps_it", [True, False])
async def test_an_empty_reply_is_handled_and_the_next_call_matches(
    db_url: str, settings: Settings, upstream: Upstream, stream: bool, keeps_it: bool
) -> None:
    """The model stops at once: ``content: []``, ``end_turn``. The agent may keep that
    empty message in its history, or drop it (Anthropic refuses an empty assistant
    message before the last): either way its next call is matched, and the stored
    history is what it sent and received."""
    upstream.script([Empty(), Reply("Here it is."), Reply("You are welcome.")])
    sid = f"claude-empty-{stream}-{keeps_it}"
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, sid) as client:
            history: list[Any] = [{"role": "user", "content": "Say something."}]
            empty: anthropic.types.Message
            if stream:
                async with client.messages.stream(
                    model=MODEL, max_tokens=64, messages=history
                ) as streamed:
                    empty = await streamed.get_final_message()
            else:
                empty = await client.messages.create(model=MODEL, max_tokens=64, messages=history)
            assert empty.content == []
            assert empty.stop_reason == "end_turn"
            if keeps_it:
                history.append(anthropic_message(empty))
            for text in ("Please, say something.", "Thanks."):
                history.append({"role": "user", "content": text})
                reply = await client.messages.create(model=MODEL, max_tokens=64, messages=history)
                history.append(anthropic_message(reply))
        assert history[-1]["content"] == [{"type": "text", "text": "You are welcome."}]
        for request in upstream.requests:
            assert_valid_upstream(request, "anthropic", budget=BUDGET)
        async with api(base) as http:
            await assert_stored(http, sid, "anthropic", history)
            session = (await http.get(f"/v1/sessions/{sid}")).json()
        assert session["usage_count"] == 3  # the empty reply's usage is reported too


async def test_a_request_with_no_message_is_refused_in_anthropic_s_shape(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, "claude-no-message") as client:
            with pytest.raises(anthropic.BadRequestError) as refused:
                await client.messages.create(model=MODEL, max_tokens=64, messages=[])
        body = refused.value.body
        assert isinstance(body, dict)
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"] == "messages: must hold at least one message"
        assert upstream.requests == []
        async with api(base) as http:  # nothing stored: not even the session
            assert (await http.get("/v1/sessions/claude-no-message")).status_code == 404
