"""The official OpenAI SDK, unmodified, through the proxy to the scripted upstream."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx
import openai
import pytest

from app.core.settings import Settings
from tests.proxy.support import (
    api,
    assert_stored,
    assert_valid_upstream,
    openai_client,
    openai_stream_message,
    proxy,
    stored_history,
)
from tests.upstream_server import BreakStream, Reply, SlowStream, Status, ToolCalls, Upstream

SYSTEM: Any = {"role": "system", "content": "You are a careful assistant. Today is 2026-12-10."}
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
]


def tool_result(call: dict[str, Any]) -> dict[str, Any]:
    return {
        "role": "tool",
        "tool_call_id": call["id"],
        "content": f"output of {call['function']['name']} {call['function']['arguments']}\n" * 3,
    }


async def test_plain_replies_store_what_the_agent_sent_and_received(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([Reply("Paris."), Reply("About 2.1 million people.", finish_reason="stop")])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "plain-1") as client:
            history: list[Any] = [{"role": "user", "content": "Capital of France?"}]
            first = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *history], temperature=0.2, max_tokens=50
            )
            assert first.choices[0].message.content == "Paris."
            history.append(first.choices[0].message.model_dump(exclude_unset=True))
            history.append({"role": "user", "content": "How many people live there?"})
            second = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *history], temperature=0.2, max_tokens=50
            )
            history.append(second.choices[0].message.model_dump(exclude_unset=True))

            sent = upstream.requests
            assert len(sent) == 2
            for request in sent:
                assert_valid_upstream(request, "openai", budget=128_000 - 16_384)
                body = request.json
                # The agent's system prompt and every other field go upstream as sent.
                assert body["messages"][0] == SYSTEM
                assert body["temperature"] == 0.2
                assert body["max_tokens"] == 50
                assert body["model"] == "gpt-4o"
            # The context in place of the history: the stored messages as the model sees them.
            assert sent[1].json["messages"][1:] == [
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."},
                {"role": "user", "content": "How many people live there?"},
            ]

            async with api(base) as http:
                await assert_stored(http, "plain-1", "openai", history)
                session = (await http.get("/v1/sessions/plain-1")).json()
            # Created on first use with the request's model; the reply's usage reported.
            assert session["model"] == "gpt-4o"
            assert session["usage_count"] == 2
            assert session["last_usage"]["finish_reason"] == "stop"
            assert session["entry_count"] == 4


async def test_streamed_tool_calls_come_chunk_for_chunk_and_are_stored(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.behaviour = "agent"  # call the first tool, then answer once it has the result
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "stream-1") as client:
            history: list[Any] = [{"role": "user", "content": "What is in README.md?"}]
            chunks: list[Any] = []
            stream = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *history], tools=TOOLS, stream=True
            )
            async for chunk in stream:
                chunks.append(chunk)
            reply = openai_stream_message(chunks)
            assert reply["tool_calls"][0]["function"] == {
                "name": "read_file",
                "arguments": '{"path":"README.md"}',
            }
            # Chunk for chunk: every chunk the upstream sent but the usage-only one, which the
            # proxy asked for and the agent did not.
            upstream_body = upstream.requests[0].json
            assert upstream_body["stream_options"] == {"include_usage": True}
            assert all(c.usage is None for c in chunks)
            assert all(c.choices for c in chunks)
            history += [reply, tool_result(reply["tool_calls"][0])]

            chunks = []
            stream = await client.chat.completions.create(
                model="gpt-4o",
                messages=[SYSTEM, *history],
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
            )
            async for chunk in stream:
                chunks.append(chunk)
            # Asked for: the usage chunk comes last.
            assert chunks[-1].choices == []
            assert chunks[-1].usage is not None
            assert chunks[-1].usage.prompt_tokens > 0
            final = openai_stream_message(chunks)
            assert final["content"].startswith("The tool answered")
            history.append(final)

            for request in upstream.requests:
                assert_valid_upstream(request, "openai", budget=128_000 - 16_384)
                assert request.json["tools"] == TOOLS
            async with api(base) as http:
                await assert_stored(http, "stream-1", "openai", history)
                session = (await http.get("/v1/sessions/stream-1")).json()
            assert session["usage_count"] == 2
            assert session["last_usage"]["finish_reason"] == "stop"


@pytest.mark.parametrize("stream", [False, True])
async def test_parallel_tool_calls(
    db_url: str, settings: Settings, upstream: Upstream, stream: bool
) -> None:
    upstream.script(
        [
            ToolCalls(
                (("read_file", {"path": "a.py"}), ("run", {"command": "pytest -q"})),
                text="Let me look." if stream else None,
            ),
            Reply("Both done."),
        ]
    )
    sid = f"parallel-{stream}"
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, sid) as client:
            history: list[Any] = [{"role": "user", "content": "Check a.py and run the tests."}]
            for _ in range(2):
                if stream:
                    chunks = [
                        c
                        async for c in await client.chat.completions.create(
                            model="gpt-4o", messages=[SYSTEM, *history], tools=TOOLS, stream=True
                        )
                    ]
                    reply = openai_stream_message(chunks)
                else:
                    completion = await client.chat.completions.create(
                        model="gpt-4o", messages=[SYSTEM, *history], tools=TOOLS
                    )
                    reply = completion.choices[0].message.model_dump(exclude_unset=True)
                history.append(reply)
                calls = reply.get("tool_calls") or []
                history += [tool_result(c) for c in calls]
            assert len(history[1]["tool_calls"]) == 2
            assert history[-1]["content"] == "Both done."
            for request in upstream.requests:
                assert_valid_upstream(request, "openai", budget=128_000 - 16_384)
            # The second call's upstream context holds both calls, each answered.
            context = upstream.requests[1].json["messages"][1:]
            assert [c["id"] for c in context[1]["tool_calls"]] == [
                c["id"] for c in history[1]["tool_calls"]
            ]
            assert context[2:] == history[2:4]
            async with api(base) as http:
                await assert_stored(http, sid, "openai", history)


async def test_a_reply_that_breaks_mid_stream_stores_nothing_of_it(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([BreakStream(events=3, then=Reply("A long answer " * 10)), Reply("Whole.")])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "broken-1") as client:
            history: list[Any] = [{"role": "user", "content": "Tell me a story."}]
            with pytest.raises(openai.APIError):
                async for _ in await client.chat.completions.create(
                    model="gpt-4o", messages=history, stream=True
                ):
                    pass
            async with api(base) as http:
                # The agent's message is stored; none of the broken reply.
                await assert_stored(http, "broken-1", "openai", history)
                session = (await http.get("/v1/sessions/broken-1")).json()
                assert session["usage_count"] == 0
            # The agent tries again, as it was: the same history, nothing new.
            again = await client.chat.completions.create(model="gpt-4o", messages=history)
            history.append(again.choices[0].message.model_dump(exclude_unset=True))
            async with api(base) as http:
                await assert_stored(http, "broken-1", "openai", history)


async def test_a_stream_that_ends_cleanly_before_its_finish_reason_raises_and_stores_nothing(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """The upstream ends its response well-formed, but after a few pieces of the text:
    no finish_reason, no ``data: [DONE]``. The agent's SDK raises (it would otherwise
    hand on half a reply as the whole one) and none of it is stored."""
    upstream.script([BreakStream(events=4, then=Reply("A long answer " * 10), clean=True)])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "clean-cut-1") as client:
            history: list[Any] = [{"role": "user", "content": "Tell me a story."}]
            received: list[str] = []

            async def read() -> None:
                async for chunk in await client.chat.completions.create(
                    model="gpt-4o", messages=history, stream=True
                ):
                    received.extend(c.delta.content or "" for c in chunk.choices)

            with pytest.raises(openai.APIError) as raised:
                await read()
            assert "ended before its finish reason" in raised.value.message
            assert "".join(received).startswith("A long answer")  # what came, came
            async with api(base) as http:
                await assert_stored(http, "clean-cut-1", "openai", history)
                session = (await http.get("/v1/sessions/clean-cut-1")).json()
                assert session["usage_count"] == 0


async def test_two_agents_on_two_sessions_at_once(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.behaviour = "agent"
    with proxy(settings, db_url, upstream) as base:

        async def agent(sid: str, task: str) -> list[Any]:
            async with openai_client(base, sid) as client:
                history: list[Any] = [{"role": "user", "content": task}]
                for turn in range(3):
                    completion = await client.chat.completions.create(
                        model="gpt-4o-mini", messages=[SYSTEM, *history], tools=TOOLS
                    )
                    message = completion.choices[0].message.model_dump(exclude_unset=True)
                    history.append(message)
                    if turn == 2:
                        return history  # what was sent and received, no more
                    if not message.get("tool_calls"):
                        history.append({"role": "user", "content": f"{task}: step {turn} again"})
                        continue
                    history += [tool_result(c) for c in message["tool_calls"]]
                raise AssertionError("unreachable")

        one, two = await asyncio.gather(agent("agent-a", "Task A"), agent("agent-b", "Task B"))
        for request in upstream.requests:
            assert_valid_upstream(request, "openai", budget=128_000 - 16_384)
        async with api(base) as http:
            # Each session holds its own agent's history, and nothing of the other's.
            await assert_stored(http, "agent-a", "openai", one)
            await assert_stored(http, "agent-b", "openai", two)


async def test_a_history_that_departs_from_the_stored_one_goes_on_elsewhere(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """No 409 for a history that is not the stored one plus new messages: another first
    message is another conversation (a child session), a departure after a shared
    prefix goes on on a new branch of the session's tree, a shorter history too."""
    upstream.script(
        [Reply("One."), Reply("Two."), Reply("Ten."), Reply("Skipped."), Reply("One again.")]
    )
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "diverged-1") as client:
            history: list[Any] = [{"role": "user", "content": "Count with me."}]
            first = await client.chat.completions.create(model="gpt-4o", messages=history)
            history.append(first.choices[0].message.model_dump(exclude_unset=True))
            history.append({"role": "user", "content": "Go on."})
            second = await client.chat.completions.create(model="gpt-4o", messages=history)
            stored = [*history, second.choices[0].message.model_dump(exclude_unset=True)]

            # Another first message: another conversation, in a child session.
            edited: list[Any] = [
                {"role": "user", "content": "Count backwards with me."},
                *history[1:],
                {"role": "user", "content": "Next?"},
            ]
            backwards = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *edited]
            )
            assert backwards.choices[0].message.content == "Ten."
            edited.append(backwards.choices[0].message.model_dump(exclude_unset=True))

            # The last reply dropped: the first three messages shared, then a new branch.
            skipped = [*history, {"role": "user", "content": "Skip that one."}]
            answer = await client.chat.completions.create(model="gpt-4o", messages=skipped)
            assert answer.choices[0].message.content == "Skipped."
            skipped.append(answer.choices[0].message.model_dump(exclude_unset=True))
            async with api(base) as http:
                await assert_stored(http, "diverged-1", "openai", skipped)

            # A shorter history (not the call before the last sent again, which gets its
            # stored reply: test_a_call_sent_again_gets_its_stored_reply): a rewind to
            # its last message, answered anew on a branch from there.
            shorter = await client.chat.completions.create(model="gpt-4o", messages=history[:1])
            assert shorter.choices[0].message.content == "One again."
        assert len(upstream.requests) == 5
        assert upstream.requests[2].json["messages"][1]["content"] == "Count backwards with me."
        assert [m["content"] for m in upstream.requests[3].json["messages"]] == [
            "Count with me.",
            "One.",
            "Go on.",
            "Skip that one.",
        ]
        assert [m["content"] for m in upstream.requests[4].json["messages"]] == ["Count with me."]
        async with api(base) as http:
            await assert_stored(
                http,
                "diverged-1",
                "openai",
                [history[0], shorter.choices[0].message.model_dump(exclude_unset=True)],
            )
            children = (await http.get("/v1/sessions", params={"parent_id": "diverged-1"})).json()
            assert len(children["sessions"]) == 1
            await assert_stored(http, children["sessions"][0]["id"], "openai", edited)
            # Every branch stays stored in the session's tree: the first path's four
            # entries, the skipped branch's two, the rewind's reply.
            tree = (await http.get("/v1/sessions/diverged-1/tree")).json()
            labels = sorted(e["label"] for e in tree["entries"])
            assert labels == sorted(
                [m["content"] for m in stored] + ["Skip that one.", "Skipped.", "One again."]
            )


async def test_proxy_errors_come_in_openai_s_shape(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([Status(429, headers={"Retry-After": "20"})])
    with proxy(settings, db_url, upstream) as base:
        async with openai.AsyncOpenAI(
            base_url=f"{base}/proxy/openai/v1", api_key="sk-x", max_retries=0
        ) as no_session:
            with pytest.raises(openai.BadRequestError) as missing:
                await no_session.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
                )
        assert "X-Compactd-Session" in missing.value.message
        assert missing.value.body["param"] == "X-Compactd-Session"  # type: ignore[index]

        async with openai_client(base, "errors-1") as client:
            with pytest.raises(openai.BadRequestError) as bad:
                await client.chat.completions.create(
                    model="gpt-4o", messages=[cast(Any, {"role": "robot", "content": "hi"})]
                )
            assert bad.value.body["param"] == "messages[0].role"  # type: ignore[index]

            # An upstream error passes through with its status, body and headers.
            with pytest.raises(openai.RateLimitError) as limited:
                await client.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "hi"}]
                )
            assert "Rate limit reached" in limited.value.message
            assert limited.value.response.headers["retry-after"] == "20"


async def test_history_stored_through_the_v1_api_counts_as_stored(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """A session filled through /v1 (before the first proxied call, and between two)
    is matched as it is: the proxy catches up on what it did not store itself, and
    nothing is stored twice."""
    upstream.script([Reply("Seen."), Reply("Seen again.")])
    earlier: list[Any] = [
        {"role": "user", "content": "Remember the number 7."},
        {"role": "assistant", "content": "Noted: 7."},
    ]
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as http:
            r = await http.post("/v1/sessions", json={"id": "mixed-1", "model": "gpt-4o"})
            assert r.status_code == 201
            r = await http.post("/v1/sessions/mixed-1/messages", json={"messages": earlier})
            assert r.status_code == 201
        history = [*earlier, {"role": "user", "content": "What was it?"}]
        async with openai_client(base, "mixed-1") as client:
            first = await client.chat.completions.create(model="gpt-4o", messages=history)
            history.append(first.choices[0].message.model_dump(exclude_unset=True))
            async with api(base) as http:
                await assert_stored(http, "mixed-1", "openai", history)
                noted = [{"role": "user", "content": "A note the agent logged itself."}]
                r = await http.post("/v1/sessions/mixed-1/messages", json={"messages": noted})
                assert r.status_code == 201
            history += [*noted, {"role": "user", "content": "And now?"}]
            second = await client.chat.completions.create(model="gpt-4o", messages=history)
            history.append(second.choices[0].message.model_dump(exclude_unset=True))
        async with api(base) as http:
            await assert_stored(http, "mixed-1", "openai", history)
        assert upstream.requests[1].json["messages"][-2:] == history[-3:-1]


async def test_an_agent_that_hangs_up_mid_stream_leaves_nothing_of_the_reply(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """The agent stops reading a slow stream and closes its connection: the reply is
    not stored, the session's turn is given back, and the agent's retry goes through."""
    upstream.script([SlowStream(0.2, Reply("A slow story " * 20)), Reply("Short.")])
    history: list[Any] = [{"role": "user", "content": "Tell me a slow story."}]
    with proxy(settings, db_url, upstream) as base:
        async with (
            httpx.AsyncClient(base_url=base, timeout=30) as raw,
            raw.stream(
                "POST",
                "/proxy/openai/v1/chat/completions",
                json={"model": "gpt-4o", "messages": history, "stream": True},
                headers={"X-Compactd-Session": "hangup-1", "Authorization": "Bearer sk-x"},
            ) as streamed,
        ):
            assert streamed.status_code == 200
            async for _ in streamed.aiter_bytes():
                break  # the first event, then the agent hangs up
        async with openai_client(base, "hangup-1") as client:
            again = await client.chat.completions.create(model="gpt-4o", messages=history)
        assert again.choices[0].message.content == "Short."
        history.append(again.choices[0].message.model_dump(exclude_unset=True))
        async with api(base) as http:
            await assert_stored(http, "hangup-1", "openai", history)


@pytest.mark.parametrize("erase", [False, True])
@pytest.mark.parametrize("stored_by", ["proxy", "v1"])
async def test_a_pruned_history_still_matches_what_the_agent_re_sends(
    db_url: str, settings: Settings, upstream: Upstream, erase: bool, stored_by: str
) -> None:
    """Pruning hides old tool outputs (and with ``prune.erase`` clears their stored
    text); the agent still re-sends them whole. Its history matches: no 409, and only
    its new messages are stored. The tool calls were made through the proxy, or stored
    through /v1 before the agent's first proxied call (the proxy then reads them back,
    pruned)."""
    sid = f"pruned-{erase}-{stored_by}"
    calls = tuple(("read_file", {"path": f"f{i}.py"}) for i in range(4))
    if stored_by == "proxy":
        upstream.script([ToolCalls(calls), Reply("All four read.")])
    upstream.script([Reply("Done.")])
    history: list[Any] = [{"role": "user", "content": "Read the four files."}]
    config = {"prune": {"erase": erase, "protect_tokens": 100, "minimum_tokens": 10}}
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as http:
            r = await http.post(
                "/v1/sessions", json={"id": sid, "model": "gpt-4o", "config": config}
            )
            assert r.status_code == 201, r.text
        async with openai_client(base, sid) as client:
            if stored_by == "proxy":
                first = await client.chat.completions.create(model="gpt-4o", messages=history)
                history.append(first.choices[0].message.model_dump(exclude_unset=True))
            else:
                made = [
                    {
                        "id": f"call_{i}",
                        "type": "function",
                        "function": {"name": n, "arguments": "{}"},
                    }
                    for i, (n, _) in enumerate(calls)
                ]
                history.append({"role": "assistant", "content": None, "tool_calls": made})
            for i, call in enumerate(history[-1]["tool_calls"]):
                text = "".join(f"line {j} of the output of call {i}\n" for j in range(300))
                history.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            if stored_by == "proxy":
                second = await client.chat.completions.create(model="gpt-4o", messages=history)
                history.append(second.choices[0].message.model_dump(exclude_unset=True))
            async with api(base) as http:
                if stored_by == "v1":
                    r = await http.post(f"/v1/sessions/{sid}/messages", json={"messages": history})
                    assert r.status_code == 201, r.text
                await assert_stored(http, sid, "openai", history)
                r = await http.post(f"/v1/sessions/{sid}/prune", json={"protect_turns": 0})
                assert r.status_code == 200, r.text
                assert len(r.json()["pruned"]) >= 3, r.json()
                pruned = await stored_history(http, sid, "openai")
            # The stored text is cleared only when the session asks for it.
            cleared = [i for i, m in enumerate(pruned) if m != history[i]]
            if erase:
                assert len(cleared) >= 3
            else:
                assert cleared == []
            before = len(history)
            history.append({"role": "user", "content": "Now summarize them."})
            last = await client.chat.completions.create(model="gpt-4o", messages=history)
            history.append(last.choices[0].message.model_dump(exclude_unset=True))
        assert last.choices[0].message.content == "Done."
        async with api(base) as http:
            # What was stored stays as it was; only the new messages are added.
            await assert_stored(http, sid, "openai", [*pruned, *history[before:]])
        # The model got the context: the pruned outputs as placeholders.
        sent = upstream.requests[-1].json["messages"]
        assert sum("cleared" in str(m.get("content")) for m in sent) >= 3


async def test_request_checks_come_in_openai_s_shape_and_store_nothing(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    hello: Any = [{"role": "user", "content": "hi"}]
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "checked-1") as client:
            # n must be the integer 1 (True == 1 in Python, and was let through).
            for n in (True, 2):
                with pytest.raises(openai.BadRequestError) as refused:
                    await client.chat.completions.create(
                        model="gpt-4o", messages=hello, n=cast(Any, n)
                    )
                assert refused.value.body["param"] == "n"  # type: ignore[index]
                assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
            with pytest.raises(openai.BadRequestError) as empty:
                await client.chat.completions.create(model="gpt-4o", messages=[])
            assert empty.value.body["param"] == "messages"  # type: ignore[index]
            assert "at least one message" in empty.value.message
        async with api(base) as http:
            missing = await http.post(
                "/proxy/openai/v1/chat/completions",
                json={"model": "gpt-4o"},
                headers={"X-Compactd-Session": "checked-1"},
            )
            assert missing.status_code == 400
            assert missing.json()["error"]["param"] == "messages"
            assert (await http.get("/v1/sessions/checked-1")).status_code == 404
        assert upstream.requests == []
