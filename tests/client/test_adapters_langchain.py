"""CompactdChatMessageHistory (compactd_client.langchain) as a LangChain app uses its
history: each step reads ``history.messages``, sends them (LangChain's own OpenAI
converter) to the test's scripted upstream through the openai SDK, and adds the reply
as an ``AIMessage`` with its ``usage_metadata``, as LangChain's chat models make it,
then the tool's ``ToolMessage``. A real compactd (uvicorn, its compaction worker inside)
holds the history in a small window: every request stays under it, the history keeps
every message, and the usage the replies carry is reported.
"""

from __future__ import annotations

from typing import Any, cast

import pytest
from compactd_client import Compactd
from compactd_client.langchain import CompactdChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
    convert_to_openai_messages,
)
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionToolParam

from tests.upstream_server import Action, Reply, ToolCalls, Upstream, prompt_tokens

MODEL = "gpt-4o-mini"
CONFIG = {
    "compaction": {"threshold": 0.5, "keep_recent_tokens": 500, "summarizer": "extractive"},
}
TURNS = 12
SYSTEM = "You read the project's notes and answer briefly."
SUMMARY_START = "The conversation history before this point was compacted"
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": "read_note",
            "description": "Read one of the project's notes by its name.",
            "parameters": {
                "type": "object",
                "properties": {"name": {"type": "string"}},
                "required": ["name"],
            },
        },
    }
]


def note(name: str) -> str:
    lines = [f"{name} line {i}: the value of {name}.field{i} is {i * 37 % 101}" for i in range(24)]
    return "\n".join(lines)


def script(api: str, body: dict[str, Any]) -> Action | None:
    """The model: a user's request gets a call of read_note for the note it names; the
    tool's output gets a short answer quoting the note's first line."""
    if api != "openai":
        return None
    last = body["messages"][-1]
    if last["role"] == "tool":
        return Reply(f"Done: {str(last['content']).splitlines()[0]}.")
    name = str(last["content"]).split("note ")[1].split()[0]
    return ToolCalls((("read_note", {"name": name}),))


def ai_message(response: ChatCompletion) -> AIMessage:
    """The reply as LangChain's chat models give it: the message, its usage."""
    reply = response.choices[0].message
    fields: dict[str, Any] = {"role": "assistant", "content": reply.content or ""}
    if reply.tool_calls:
        fields["tool_calls"] = [call.model_dump() for call in reply.tool_calls]
    message = convert_to_messages([fields])[0]
    assert isinstance(message, AIMessage)
    message.id = response.id
    if response.usage is not None:
        message.usage_metadata = {
            "input_tokens": response.usage.prompt_tokens,
            "output_tokens": response.usage.completion_tokens,
            "total_tokens": response.usage.total_tokens,
        }
    return message


def test_a_langchain_loop_runs_past_its_window_on_the_managed_context(
    compactd_url: str, upstream: Upstream
) -> None:
    upstream.respond = script
    produced: list[BaseMessage] = [SystemMessage(SYSTEM)]
    reports = 0
    with (
        OpenAI(base_url=upstream.url, api_key="test-key", max_retries=0) as llm,
        Compactd(compactd_url) as compactd,
    ):
        history = CompactdChatMessageHistory(
            "lc-notes",
            model=MODEL,
            client=compactd,
            config=CONFIG,
            context_window=4_000,
            max_output_tokens=1_000,  # usable: 3,000
        )
        history.add_messages([produced[0]])
        for turn in range(TURNS):
            task = HumanMessage(f"Turn {turn}: read note n{turn} and tell me its first line.")
            history.add_message(task)
            produced.append(task)
            for _ in range(4):
                sent = convert_to_openai_messages(history.messages)
                response = llm.chat.completions.create(
                    model=MODEL, messages=cast(Any, sent), tools=TOOLS
                )
                reply = ai_message(response)
                history.add_message(reply)
                produced.append(reply)
                reports += history.last_usage is not None
                if not reply.tool_calls:
                    break
                [call] = reply.tool_calls
                output = ToolMessage(note(call["args"]["name"]), tool_call_id=str(call["id"]))
                history.add_message(output)
                produced.append(output)
            assert f"n{turn} line 0" in str(reply.content)

        session = compactd.get_session("lc-notes")
        stored = compactd.list_messages("lc-notes", limit=1000)["entries"]
        compactions = compactd.list_compactions("lc-notes")["compactions"]

    requests = [r.json for r in upstream.requests if r.path.endswith("/chat/completions")]
    assert len(requests) == 2 * TURNS
    sizes = [prompt_tokens(body) for body in requests]
    usable = session["usable_tokens"]
    print(f"\nusable {usable}; upstream prompt sizes {sizes}")
    assert max(sizes) <= usable, (sizes, usable)
    everything = convert_to_openai_messages(produced)
    assert prompt_tokens({**requests[-1], "messages": everything}) > usable
    assert any(c["status"] == "succeeded" for c in compactions), compactions
    # The system prompt stays first; the summary follows it; the first turns are gone.
    assert requests[-1]["messages"][0] == {"role": "system", "content": SYSTEM}
    assert SUMMARY_START in str(requests[-1]["messages"][1]["content"])
    assert "Turn 0:" not in str(requests[-1]["messages"][2:])
    # Every reply's usage was reported, against the context it was made on.
    assert session["usage_count"] == 2 * TURNS
    assert session["last_usage"] is not None

    # The history keeps every message, as LangChain converts it (ids included).
    messages = [e["message"] for e in stored if e["kind"] == "message"]
    expected = convert_to_openai_messages(produced, include_id=True)
    assert messages == [{k: v for k, v in m.items() if v is not None} for m in expected]


def test_clear_and_pop_keep_every_stored_message(compactd_url: str) -> None:
    with Compactd(compactd_url) as compactd:
        history = CompactdChatMessageHistory("lc-clear", model=MODEL, client=compactd)
        assert history.messages == []
        history.add_messages([HumanMessage("One."), AIMessage("Two."), HumanMessage("Three.")])
        popped = history.pop()
        assert isinstance(popped, HumanMessage)
        assert popped.content == "Three."
        assert [m.content for m in history.messages] == ["One.", "Two."]
        history.clear()
        assert history.messages == []
        assert history.compactd_session_id == "lc-clear.1"
        history.add_user_message("Again.")
        assert [m.content for m in history.messages] == ["Again."]
        # The first session keeps all three, on its tree.
        assert len(compactd.get_tree("lc-clear")["entries"]) == 3
        reopened = CompactdChatMessageHistory("lc-clear", model=MODEL, client=compactd)
        assert [m.content for m in reopened.messages] == ["Again."]


@pytest.mark.parametrize("name", ["langchain_core", "agents"])
def test_the_client_imports_without_the_frameworks(name: str) -> None:
    """``import compactd_client`` loads neither framework (each is an optional extra)."""
    import subprocess
    import sys

    code = f"import sys, compactd_client; assert {name!r} not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# Deprecated by langchain-core 1.x (for LangGraph's persistence), still in use and working.
@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_runnable_with_message_history_keeps_its_conversation_in_compactd(
    compactd_url: str, upstream: Upstream
) -> None:
    """LangChain's own wrapper for a chain with a history: it reads the history before
    each call and adds the input and the reply after it."""
    from langchain_core.runnables import RunnableLambda
    from langchain_core.runnables.history import RunnableWithMessageHistory

    upstream.script([Reply("Hello, Ada."), Reply("You are Ada.")])
    with (
        OpenAI(base_url=upstream.url, api_key="test-key", max_retries=0) as llm,
        Compactd(compactd_url) as compactd,
    ):

        def model(messages: list[BaseMessage]) -> AIMessage:
            sent = convert_to_openai_messages(messages)
            return ai_message(llm.chat.completions.create(model=MODEL, messages=cast(Any, sent)))

        chat = RunnableWithMessageHistory(
            RunnableLambda(model),
            lambda session_id: CompactdChatMessageHistory(session_id, model=MODEL, client=compactd),
        )
        config: Any = {"configurable": {"session_id": "lc-runnable"}}
        first = chat.invoke([HumanMessage("I am Ada.")], config=config)
        second = chat.invoke([HumanMessage("Who am I?")], config=config)
        assert first.content == "Hello, Ada."
        assert second.content == "You are Ada."
        stored = compactd.list_messages("lc-runnable")["entries"]
        session = compactd.get_session("lc-runnable")

    # The second call carried the first exchange, read back from compactd.
    last = upstream.requests[-1].json["messages"]
    assert [m["content"] for m in last] == ["I am Ada.", "Hello, Ada.", "Who am I?"]
    assert [e["message"]["content"] for e in stored] == [
        "I am Ada.",
        "Hello, Ada.",
        "Who am I?",
        "You are Ada.",
    ]
    assert session["usage_count"] == 2
