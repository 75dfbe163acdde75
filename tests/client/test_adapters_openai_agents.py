"""CompactdSession (compactd_client.openai_agents) under a real OpenAI Agents SDK agent:
``Runner.run`` with the SDK's Responses model pointed at the test's scripted upstream,
a real compactd (uvicorn, its compaction worker inside) holding the session in a small
window. The agent runs turn after turn (each: a tool call, the tool's output, an
answer); the session's reads are the managed context, so every request the model got
stays under the window while the stored history keeps every item the agent produced.
"""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from compactd_client import AsyncCompactd
from compactd_client.openai_agents import CompactdSession
from compactd_client.responses_items import items_to_messages, messages_to_items
from openai import AsyncOpenAI

from tests.upstream_server import Action, Reply, ToolCalls, Upstream, prompt_tokens

MODEL = "gpt-4o-mini"
CONFIG = {
    "compaction": {"threshold": 0.5, "keep_recent_tokens": 500, "summarizer": "extractive"},
}
TURNS = 12
SUMMARY_START = "The conversation history before this point was compacted"


def note(name: str) -> str:
    """What the agent's tool answers: a few hundred tokens of text, unique per note."""
    lines = [f"{name} line {i}: the value of {name}.field{i} is {i * 37 % 101}" for i in range(24)]
    return "\n".join(lines)


@function_tool
def read_note(name: str) -> str:
    """Read one of the project's notes by its name."""
    return note(name)


def script(api: str, body: dict[str, Any]) -> Action | None:
    """The model: a user's request gets a call of read_note for the note it names; the
    tool's output gets a short answer quoting the note's first line."""
    if api != "responses":
        return None
    last = body["input"][-1]
    if last.get("type") == "function_call_output":
        first = str(last["output"]).splitlines()[0]
        return Reply(f"Done: {first}.")
    text = last["content"] if isinstance(last["content"], str) else last["content"][0]["text"]
    name = text.split("note ")[1].split()[0]
    return ToolCalls((("read_note", {"name": name}),))


@pytest.fixture(autouse=True)
def _no_tracing() -> None:
    set_tracing_disabled(True)


def agent_for(client: AsyncOpenAI) -> Agent[Any]:
    return Agent(
        name="notes",
        instructions="You read the project's notes and answer briefly.",
        tools=[read_note],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(store=False),
    )


async def test_an_agent_runs_past_its_window_on_the_managed_context(
    compactd_url: str, upstream: Upstream
) -> None:
    upstream.respond = script
    llm = AsyncOpenAI(base_url=upstream.url, api_key="test-key", max_retries=0)
    agent = agent_for(llm)
    async with llm, AsyncCompactd(compactd_url) as compactd:
        session = CompactdSession(
            "agents-notes",
            model=MODEL,
            client=compactd,
            config=CONFIG,
            context_window=4_000,
            max_output_tokens=1_000,  # usable: 3,000
        )
        produced: list[dict[str, Any]] = []
        reports = []
        for turn in range(TURNS):
            task = f"Turn {turn}: read note n{turn} and tell me its first line."
            # The usage: reported by the session's run hooks (even turns), or after the
            # run (odd turns); once per run either way.
            hooks = session.hooks() if turn % 2 == 0 else None
            result = await Runner.run(agent, task, session=session, hooks=hooks)
            assert f"n{turn} line 0" in str(result.final_output)
            produced.append({"content": task, "role": "user"})
            produced += [cast(dict[str, Any], item.to_input_item()) for item in result.new_items]
            # The usage is about the context the first call was sent: the one read,
            # plus this run's input (saved by the SDK before the call).
            served = session.last_context
            assert served is not None
            assert served["messages"][-1] == {"role": "user", "content": task}
            assert session.context_version == served["version"]
            reported = await session.report_usage(result)
            assert (reported is None) == (hooks is not None)  # not twice for one context
            reports.append(session.last_usage)

        state = await compactd.get_session("agents-notes")
        usable = state["usable_tokens"]
        stored = (await compactd.list_messages("agents-notes", limit=1000))["entries"]
        compactions = (await compactd.list_compactions("agents-notes"))["compactions"]

    requests = [r.json for r in upstream.requests if r.path.endswith("/responses")]
    assert len(requests) == 2 * TURNS  # a call, then the answer, each turn
    sizes = [prompt_tokens(body) for body in requests]
    print(f"\nusable {usable}; upstream prompt sizes {sizes}")
    # Every request the model got fits the window: the context was managed.
    assert max(sizes) <= usable, (sizes, usable)
    # Without compactd, the last request would have held the whole conversation.
    whole = prompt_tokens({**requests[-1], "input": produced})
    assert whole > usable, (whole, usable)
    # It was compacted, and the agent's later requests start at the summary.
    assert any(c["status"] == "succeeded" for c in compactions), compactions
    first_text = json.dumps(requests[-1]["input"][0])
    assert SUMMARY_START in first_text
    assert "Turn 0:" not in json.dumps(requests[-1]["input"][1:])
    # The usage reports were read as the Responses API's, against the context served.
    assert all(r is not None and r["usage_format"] == "openai_responses" for r in reports)
    assert state["usage_count"] == TURNS

    # The history keeps every item the agent produced, in order, as the SDK gave them.
    messages = [e["message"] for e in stored if e["kind"] == "message"]
    assert messages == items_to_messages(produced)
    assert messages_to_items(messages)[:4] == [
        {"type": "message", "role": "user", "content": produced[0]["content"]},
        {**produced[1]},
        {**produced[2]},
        {**produced[3]},
    ]


REASONING = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Look at the note first."}],
    "encrypted_content": "gAAAAB-opaque",
}
ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "What is in note a?"},
    REASONING,
    {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_a",
        "name": "read_note",
        "arguments": '{"name":"a"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_a", "output": "a line 0"},
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "It says: a line 0.", "annotations": []}],
    },
]


async def test_items_pop_and_clear_keep_every_stored_message(compactd_url: str) -> None:
    """The SDK's items come back from get_items as the model needs them (a reasoning
    item whole, its encrypted content included); pop_item and clear_session change what
    the next run sees while the history keeps everything."""
    async with AsyncCompactd(compactd_url) as compactd:
        session = CompactdSession("agents-pop", model=MODEL, client=compactd)
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items(ITEMS)
        items = await session.get_items()
        assert items == [
            {"type": "message", "role": "user", "content": "What is in note a?"},
            REASONING,
            {k: v for k, v in ITEMS[2].items() if k not in ("id", "status")},
            ITEMS[3],
            {"type": "message", "role": "assistant", "content": ITEMS[4]["content"]},
        ]
        assert await session.get_items(limit=2) == items[-2:]

        # pop: the last item, with its own id; the next read no longer has it
        assert await session.pop_item() == ITEMS[4]
        assert await session.get_items() == items[:-1]
        await session.add_items([{"role": "assistant", "content": "Another answer."}])
        after = await session.get_items()
        assert after[-1] == {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Another answer.", "annotations": []}],
        }
        # ... and the tree keeps the popped answer, on the branch left behind.
        tree = await compactd.get_tree("agents-pop")
        labels = json.dumps(tree["entries"])
        assert len(tree["entries"]) == 6
        assert tree["leaf_seq"] == 5
        assert "It says" in labels

        # clear: a new compactd session; the old one is kept whole.
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.compactd_session_id() == "agents-pop.1"
        await session.add_items([{"role": "user", "content": "Start again."}])
        old = await compactd.list_messages("agents-pop")
        assert len(old["entries"]) == 5
        # A session opened later with the same id goes on where the clear left it.
        again = CompactdSession("agents-pop", model=MODEL, client=compactd)
        assert await again.compactd_session_id() == "agents-pop.1"
        assert await again.get_items() == [
            {"type": "message", "role": "user", "content": "Start again."}
        ]
        # Popping the only message clears again (nothing to step back to).
        assert await again.pop_item() == {
            "type": "message",
            "role": "user",
            "content": "Start again.",
        }
        assert await again.compactd_session_id() == "agents-pop.2"
        assert await again.get_items() == []


async def test_a_pop_after_a_compaction_steps_back_before_it(compactd_url: str) -> None:
    """The compaction's summary entry came after the popped message: the context after
    the pop is the uncompacted one, less that message; the compaction stays stored."""
    turns: list[dict[str, Any]] = []
    for n in range(6):
        turns.append({"role": "user", "content": f"Question {n}."})
        turns.append({"role": "assistant", "content": f"Answer {n}: " + note(f"q{n}")})
    async with AsyncCompactd(compactd_url) as compactd:
        session = CompactdSession(
            "agents-pop-compacted",
            model=MODEL,
            client=compactd,
            config={"compaction": {"keep_recent_tokens": 400, "summarizer": "extractive"}},
        )
        await session.add_items(turns)
        job = await compactd.request_compaction("agents-pop-compacted", wait=20)
        assert job["status"] == "succeeded", job
        compacted = await session.get_items()
        assert SUMMARY_START in json.dumps(compacted[0])
        assert len(compacted) < len(turns)

        popped = await session.pop_item()
        assert popped is not None
        assert popped == {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": turns[-1]["content"], "annotations": []}],
        }
        after = await session.get_items()
        assert SUMMARY_START not in json.dumps(after)
        assert len(after) == len(turns) - 1
        assert (await compactd.list_compactions("agents-pop-compacted"))["compactions"]
