"""Conversations an agent did not plan as one, through the proxy (the official SDKs,
compactd over real HTTP, the scripted upstream): a title request before or after the
real conversation, a subagent, an agent that edits its own history
(app.proxy.conversations)."""

from __future__ import annotations

from typing import Any

import httpx
import openai

from app.core.settings import Settings
from tests.proxy.support import (
    anthropic_client,
    anthropic_message,
    api,
    assert_stored,
    assert_valid_upstream,
    openai_client,
    proxy,
    settled,
    stored_history,
)
from tests.upstream_server import Reply, ToolCalls, Upstream

MODEL = "claude-sonnet-4-6"
TITLE_MODEL = "claude-haiku-4-5"
# Claude Code's title request: its own system prompt, one user message, no tools.
TITLE_SYSTEM = "Summarize this coding conversation in under 50 characters. Answer with the title."
ANTHROPIC_TOOLS: Any = [
    {
        "name": "read_file",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
OPENAI_TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
SYSTEM: Any = {"role": "system", "content": "You are a coding agent."}


def openai_result(call: dict[str, Any]) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call["id"], "content": f"contents of {call['id']}"}


async def agent_turns(client: openai.AsyncOpenAI, history: list[Any], turns: int) -> None:
    """An agent's loop, ``turns`` calls with the tools: each reply, then its tool
    calls' results, appended to ``history``."""
    for _ in range(turns):
        completion = await client.chat.completions.create(
            model="gpt-4o", messages=[SYSTEM, *history], tools=OPENAI_TOOLS
        )
        message = completion.choices[0].message.model_dump(exclude_unset=True)
        history.append(message)
        history += [openai_result(c) for c in message.get("tool_calls") or []]


def sent(messages: list[Any]) -> list[tuple[Any, ...]]:
    """OpenAI messages as the upstream must get them: role, content, calls and results
    (the keys an SDK adds, such as ``refusal``, aside)."""
    return [
        (
            m["role"],
            m.get("content"),
            m.get("tool_call_id"),
            [(c["id"], c["function"]["name"]) for c in m.get("tool_calls") or []],
        )
        for m in messages
    ]


async def children(http: httpx.AsyncClient, parent: str) -> list[dict[str, Any]]:
    r = await http.get("/v1/sessions", params={"parent_id": parent})
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["sessions"]
    return found


async def tree_entries(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await http.get(f"/v1/sessions/{sid}/tree", params={"limit": 1000})
    assert r.status_code == 200, r.text
    entries: list[dict[str, Any]] = r.json()["entries"]
    return entries


async def test_a_title_request_first_then_the_real_call_with_tools(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Claude Code's order: the title request reaches the new session first. The real
    call (tools, another first message) is the agent's conversation: it goes on in the
    named session, and the title exchange moves to a child, both stored exactly."""
    upstream.script(
        [
            Reply("Fix the parser bug"),
            ToolCalls((("read_file", {"path": "app/parser.py"}),), text="Let me look."),
            Reply("Fixed: the parser now accepts empty input."),
        ]
    )
    sid = "claude-title-first"
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, sid) as client:
            title_history: list[Any] = [
                {"role": "user", "content": "Fix the bug in app/parser.py: it rejects ''."}
            ]
            title = await client.messages.create(
                model=TITLE_MODEL, max_tokens=64, system=TITLE_SYSTEM, messages=title_history
            )
            title_history.append(anthropic_message(title))
            async with api(base) as http:
                await assert_stored(http, sid, "anthropic", title_history)

            history: list[Any] = [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "<system-reminder>cwd: /repo</system-reminder>"},
                        {"type": "text", "text": "Fix the bug in app/parser.py: it rejects ''."},
                    ],
                }
            ]
            for _ in range(2):
                message = await client.messages.create(
                    model=MODEL,
                    max_tokens=512,
                    system="You are Claude Code.",
                    messages=history,
                    tools=ANTHROPIC_TOOLS,
                )
                history.append(anthropic_message(message))
                calls = [b for b in message.content if b.type == "tool_use"]
                if not calls:
                    break
                history.append(
                    {
                        "role": "user",
                        "content": [
                            {"type": "tool_result", "tool_use_id": c.id, "content": "def parse"}
                            for c in calls
                        ],
                    }
                )
            assert history[-1]["content"][0]["text"].startswith("Fixed")

            # The title request sent again (an SDK's retry) is answered from the child.
            again = await client.messages.create(
                model=TITLE_MODEL, max_tokens=64, system=TITLE_SYSTEM, messages=title_history[:1]
            )
            assert again.content[0].text == "Fix the parser bug"  # type: ignore[union-attr]

        assert len(upstream.requests) == 3  # the retry was answered from the store
        for request in upstream.requests:
            assert_valid_upstream(request, "anthropic")
        assert "tools" not in upstream.requests[0].json
        assert upstream.requests[2].json["messages"] == history[:-1]  # the main path only

        async with api(base) as http:
            await assert_stored(http, sid, "anthropic", history)
            found = await children(http, sid)
            assert [c["parent_id"] for c in found] == [sid]
            child = found[0]["id"]
            assert child.startswith(f"{sid}:")
            assert len(child) == len(sid) + 13
            await assert_stored(http, child, "anthropic", title_history)
            assert found[0]["model"] == TITLE_MODEL
            parent = (await http.get(f"/v1/sessions/{sid}")).json()
            assert parent["parent_id"] is None
            assert parent["entry_count"] == len(history)
            # The title exchange stays in the named session's tree too, off its path.
            entries = await tree_entries(http, sid)
            off_path = [e for e in entries if not e["on_path"]]
            assert [e["role"] for e in off_path] == ["user", "assistant"]
            assert off_path[0]["parent_id"] is None
            assert sum(1 for e in entries if e["parent_id"] is None) == 2  # two roots


async def test_the_real_call_first_then_the_title_request(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script(
        [ToolCalls((("read_file", {"path": "README.md"}),)), Reply("Read."), Reply("Readme")]
    )
    sid = "opencode-1"
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, sid) as client:
            history: list[Any] = [{"role": "user", "content": "Summarize the README."}]
            await agent_turns(client, history, 2)
            title_history: list[Any] = [
                {"role": "user", "content": "Generate a title for: Summarize the README."}
            ]
            title = await client.chat.completions.create(
                model="gpt-4o-mini",
                messages=[
                    {"role": "system", "content": "You are a title generator."},
                    *title_history,
                ],
            )
            title_history.append(title.choices[0].message.model_dump(exclude_unset=True))
        for request in upstream.requests:
            assert_valid_upstream(request, "openai")
        assert sent(upstream.requests[2].json["messages"][1:]) == sent(title_history[:1])
        async with api(base) as http:
            await assert_stored(http, sid, "openai", history)
            found = await children(http, sid)
            assert len(found) == 1
            assert found[0]["model"] == "gpt-4o-mini"
            assert found[0]["config"]["compaction"]["auto_continue"] is False  # the proxy's
            await assert_stored(http, found[0]["id"], "openai", title_history)
            # Nothing of the title in the named session's tree.
            assert len(await tree_entries(http, sid)) == len(history)


async def test_a_subagent_goes_to_a_child_and_its_next_calls_follow_it(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """A subagent (another first message, tools): a child of its own, where its next
    calls go on; the main conversation goes on in the named session meanwhile."""
    upstream.script(
        [
            ToolCalls((("read_file", {"path": "a.py"}),)),  # main
            ToolCalls((("read_file", {"path": "b.py"}),)),  # subagent
            Reply("b.py defines parse()."),  # subagent
            Reply("Both read."),  # main
        ]
    )
    sid = "claude-task"
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, sid) as client:

            async def turn(history: list[Any]) -> None:
                completion = await client.chat.completions.create(
                    model="gpt-4o", messages=[SYSTEM, *history], tools=OPENAI_TOOLS
                )
                message = completion.choices[0].message.model_dump(exclude_unset=True)
                history.append(message)
                history += [openai_result(c) for c in message.get("tool_calls") or []]

            main: list[Any] = [{"role": "user", "content": "Read a.py, and have b.py read."}]
            sub: list[Any] = [{"role": "user", "content": "Read b.py and report what it has."}]
            await turn(main)
            await turn(sub)
            await turn(sub)
            await turn(main)
        for request in upstream.requests:
            assert_valid_upstream(request, "openai")
        assert sent(upstream.requests[2].json["messages"][1:]) == sent(sub[:-1])
        assert sent(upstream.requests[3].json["messages"][1:]) == sent(main[:-1])
        async with api(base) as http:
            await assert_stored(http, sid, "openai", main)
            found = await children(http, sid)
            assert len(found) == 1  # the subagent's second call found its child
            await assert_stored(http, found[0]["id"], "openai", sub)
            assert found[0]["entry_count"] == len(sub)


async def test_an_edited_history_continues_on_a_branch(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """After three shared messages the agent's history departs from the stored one (a
    rewind, or the agent's own edit): the session follows a new branch from the third
    message, the old branch stays stored, and GET …/messages shows the new path."""
    upstream.script(
        [
            ToolCalls((("read_file", {"path": "big.log"}),)),
            Reply("The log is long."),
            Reply("The errors: none."),
            Reply("Still nothing."),
        ]
    )
    sid = "edited-1"
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, sid) as client:
            history: list[Any] = [{"role": "user", "content": "What does big.log say?"}]
            await agent_turns(client, history, 2)
            # Stored: user, assistant (call), tool, assistant. The agent rewinds to the
            # tool result (its user edited the last turn) and asks something else.
            edited = [*history[:3], {"role": "user", "content": "Only the errors, please."}]
            completion = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *edited], tools=OPENAI_TOOLS
            )
            edited.append(completion.choices[0].message.model_dump(exclude_unset=True))
            assert edited[-1]["content"] == "The errors: none."
            # The next call extends the branch, as on any path.
            edited.append({"role": "user", "content": "Sure?"})
            completion = await client.chat.completions.create(
                model="gpt-4o", messages=[SYSTEM, *edited], tools=OPENAI_TOOLS
            )
            edited.append(completion.choices[0].message.model_dump(exclude_unset=True))
        for request in upstream.requests:
            assert_valid_upstream(request, "openai")
        assert sent(upstream.requests[2].json["messages"][1:]) == sent(edited[:4])
        assert sent(upstream.requests[3].json["messages"][1:]) == sent(edited[:6])
        async with api(base) as http:
            await assert_stored(http, sid, "openai", edited)
            session = await settled(http, sid, len(edited))
            assert session["entry_count"] == len(edited)
            assert await children(http, sid) == []
            entries = await tree_entries(http, sid)
            # Both branches stored: the old reply off the path, the new messages on it,
            # forking after the third message (the tool result).
            off_path = [e for e in entries if not e["on_path"]]
            assert [(e["seq"], e["role"], e["label"]) for e in off_path] == [
                (4, "assistant", "The log is long.")
            ]
            fork = next(e for e in entries if e["seq"] == 3)
            assert fork["children"] == 2
            tree = (await http.get(f"/v1/sessions/{sid}/tree")).json()
            assert [(s["from_seq"], s["to_seq"]) for s in tree["path"]] == [(1, 3), (4, 7)]
            assert len(entries) == 8
            stored = await stored_history(http, sid, "openai")
            assert [m["content"] for m in stored[3:]] == [
                "Only the errors, please.",
                "The errors: none.",
                "Sure?",
                "Still nothing.",
            ]
