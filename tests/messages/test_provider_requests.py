"""Appends that take the request as the agent has it: a top-level system and
tools, the provider request's other fields, ``?format=``, and messages built
from the official SDKs' own objects."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from anthropic.types import (
    Message,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
    Usage,
)
from anthropic.types import message_create_params as anthropic_params
from openai.types.chat import ChatCompletionMessage, ChatCompletionMessageFunctionToolCall
from openai.types.chat import completion_create_params as openai_params
from openai.types.chat.chat_completion_message_function_tool_call import Function

from app.core.tenancy import DEFAULT_TENANT
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS, count_tools
from app.messages.schemas import IGNORED_REQUEST_FIELDS, AppendRequest
from app.messages.service import AppendService
from tests.compactions.helpers import conversation, drain
from tests.conftest import make_session
from tests.helpers import assert_problem, get_session, history

TOOLS_ANTHROPIC: list[dict[str, Any]] = [
    {
        "name": "bash",
        "description": "Run a shell command and return its output.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "The command."}},
            "required": ["command"],
        },
        "cache_control": {"type": "ephemeral"},
    },
    {
        "name": "read",
        "description": "Read a file.",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    },
]
TOOLS_OPENAI: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": t["name"],
            "description": t["description"],
            "parameters": t["input_schema"],
        },
    }
    for t in TOOLS_ANTHROPIC
]
SYSTEM_BLOCKS: list[dict[str, Any]] = [
    {"type": "text", "text": "You are a careful coding agent."},
    {"type": "text", "text": "Repository: compactd.", "cache_control": {"type": "ephemeral"}},
]


async def post(
    client: httpx.AsyncClient, sid: str, body: dict[str, Any], **params: str
) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/messages", json=body, params=params)


async def post_ok(
    client: httpx.AsyncClient, sid: str, body: dict[str, Any], **params: str
) -> dict[str, Any]:
    r = await post(client, sid, body, **params)
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


def user(text: str, fmt: str = "anthropic") -> dict[str, Any]:
    return {
        "role": "user",
        "content": text if fmt == "openai" else [{"type": "text", "text": text}],
    }


async def test_an_anthropic_request_with_system_and_tools_appends_as_sent(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="a", model="claude-sonnet-4-5")
    request = {
        "model": "claude-sonnet-4-5",
        "max_tokens": 4096,
        "temperature": 0.2,
        "stop_sequences": ["\n\nHuman:"],
        "tool_choice": {"type": "auto"},
        "metadata": {"user_id": "u-1"},
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "stream": False,
        "system": SYSTEM_BLOCKS,
        "tools": TOOLS_ANTHROPIC,
        "messages": [user("List the files.")],
    }
    body = await post_ok(client, "a", {**request, "format": "anthropic"})
    assert [e["role"] for e in body["entries"]] == ["system", "user"]
    assert [e["seq"] for e in body["entries"]] == [1, 2]
    overhead = count_tools(TOOLS_ANTHROPIC, "o200k_base")
    session = await get_session(client, "a")
    assert session["overhead_tokens"] == overhead
    # No report yet: the estimate is the stored context plus the overhead.
    assert (
        body["overflow"]["estimated_tokens"]
        == body["context_tokens"] + overhead + REPLY_PRIMING_TOKENS
    )
    assert body["version"] == 2  # one append, one version, overhead and all

    # The history gives the system back as sent, cache_control and all; the
    # model's context has its text and nothing else.
    stored = await history(client, "a", fmt="anthropic")
    assert stored[0]["message"] == {"role": "system", "content": SYSTEM_BLOCKS}
    ctx = (await client.get("/v1/sessions/a/context", params={"format": "anthropic"})).json()
    assert ctx["system"] == [{"type": "text", "text": b["text"]} for b in SYSTEM_BLOCKS]
    assert ctx["tokens"]["breakdown"]["overhead"] >= overhead


async def test_the_same_system_resent_stores_nothing_and_a_changed_one_stores_one_entry(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s", model="claude-sonnet-4-5")
    first = await post_ok(
        client, "s", {"format": "anthropic", "system": SYSTEM_BLOCKS, "messages": [user("one")]}
    )
    assert [e["role"] for e in first["entries"]] == ["system", "user"]
    # Re-sent with every call: the same texts, cache_control moved, stores nothing.
    moved = [{"type": "text", "text": b["text"]} for b in SYSTEM_BLOCKS]
    moved[0]["cache_control"] = {"type": "ephemeral"}
    systems: list[Any] = [SYSTEM_BLOCKS, moved]
    for system in systems:
        again = await post_ok(
            client,
            "s",
            {
                "format": "anthropic",
                "system": system,
                "messages": [{"role": "assistant", "content": "ok"}, user("next")],
            },
        )
        assert [e["role"] for e in again["entries"]] == ["assistant", "user"]
    # A changed system prompt is stored once, before the new messages...
    changed = "You are a careful coding agent. Be brief."
    body = await post_ok(
        client, "s", {"format": "anthropic", "system": changed, "messages": [user("three")]}
    )
    assert [e["role"] for e in body["entries"]] == ["system", "user"]
    # ...and then not again, as a string or as the one block it equals.
    same: list[Any] = [changed, [{"type": "text", "text": changed}]]
    for system in same:
        body = await post_ok(
            client, "s", {"format": "anthropic", "system": system, "messages": [user("four")]}
        )
        assert [e["role"] for e in body["entries"]] == ["user"]
    # Going back to the first one is a change too.
    body = await post_ok(
        client, "s", {"format": "anthropic", "system": SYSTEM_BLOCKS, "messages": [user("five")]}
    )
    assert [e["role"] for e in body["entries"]] == ["system", "user"]
    roles = [e["role"] for e in await history(client, "s")]
    assert roles.count("system") == 3
    # An empty system stores nothing.
    body = await post_ok(
        client, "s", {"format": "anthropic", "system": "", "messages": [user("six")]}
    )
    assert [e["role"] for e in body["entries"]] == ["user"]


async def test_a_system_message_appended_as_a_message_counts_as_the_sessions_system(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="m")
    await post_ok(
        client,
        "m",
        {"messages": [{"role": "system", "content": "Be brief."}, user("hi", "openai")]},
    )
    body = await post_ok(
        client, "m", {"system": "Be brief.", "messages": [user("again", "openai")]}
    )
    assert [e["role"] for e in body["entries"]] == ["user"]


async def test_an_openai_request_with_tools_and_a_system_string(client: httpx.AsyncClient) -> None:
    await make_session(client, id="o")
    request = {
        "model": "gpt-4o",
        "temperature": 0,
        "top_p": 1,
        "max_completion_tokens": 1000,
        "stop": ["END"],
        "stream": True,
        "stream_options": {"include_usage": True},
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "seed": 7,
        "user": "u-1",
        "tools": TOOLS_OPENAI,
        "system": "You are a careful coding agent.",
        "messages": [user("List the files.", "openai")],
    }
    body = await post_ok(client, "o", request)
    assert [e["role"] for e in body["entries"]] == ["system", "user"]
    assert (await get_session(client, "o"))["overhead_tokens"] == count_tools(
        TOOLS_OPENAI, "o200k_base"
    )
    stored = await history(client, "o")
    assert stored[0]["message"] == {"role": "system", "content": "You are a careful coding agent."}
    assert stored[1]["message"] == user("List the files.", "openai")  # nothing else kept

    # Without tools the overhead stays; with an empty list it is 0.
    await post_ok(client, "o", {"messages": [user("more", "openai")]})
    assert (await get_session(client, "o"))["overhead_tokens"] > 0
    body = await post_ok(client, "o", {"tools": [], "messages": [user("none", "openai")]})
    assert (await get_session(client, "o"))["overhead_tokens"] == 0
    assert body["overflow"]["estimated_tokens"] == body["context_tokens"] + REPLY_PRIMING_TOKENS


def sdk_fields(params: Any) -> set[str]:
    return set(params.__required_keys__ | params.__optional_keys__)


@pytest.mark.parametrize(
    ("fmt", "params"),
    [
        ("openai", openai_params.CompletionCreateParamsStreaming),
        ("openai", openai_params.CompletionCreateParamsNonStreaming),
        ("anthropic", anthropic_params.MessageCreateParamsStreaming),
        ("anthropic", anthropic_params.MessageCreateParamsNonStreaming),
    ],
)
def test_the_ignored_fields_cover_the_installed_sdks_request(fmt: str, params: Any) -> None:
    """Every field of the SDK's create request is either what the append reads
    (messages, system, tools) or ignored: a request passed as it is never fails
    on a field the SDK may send."""
    missing = sdk_fields(params) - {"messages", "system", "tools"} - IGNORED_REQUEST_FIELDS[fmt]
    assert not missing


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"messages": [user("x", "openai")], "temprature": 0.2}, ("temprature",)),
        # a field of the other provider's request: the hint says which format it is
        (
            {"messages": [user("x", "openai")], "stop_sequences": ["x"]},
            ("stop_sequences", "anthropic"),
        ),
        (
            {"format": "anthropic", "messages": [user("x")], "max_completion_tokens": 5},
            ("max_completion_tokens", "openai"),
        ),
        ({"messages": [user("x", "openai")], "system": 5}, ("system",)),
        (
            {"format": "anthropic", "messages": [user("x")], "system": [{"type": "image"}]},
            ("system[0].type",),
        ),
        (
            {
                "format": "anthropic",
                "messages": [user("x")],
                "system": [{"text": 1, "type": "text"}],
            },
            ("system[0].text",),
        ),
        ({"messages": [user("x", "openai")], "tools": "bash"}, ("tools",)),
        ({"messages": [user("x", "openai")], "tools": ["bash"]}, ("tools",)),
    ],
)
async def test_bad_request_fields_are_422s_naming_them_and_store_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], names: tuple[str, ...]
) -> None:
    await make_session(client, id="b")
    before = await get_session(client, "b")
    assert_problem(await post(client, "b", body), 422, *names)
    assert await get_session(client, "b") == before


async def test_format_as_a_query_parameter_like_every_route(client: httpx.AsyncClient) -> None:
    await make_session(client, id="f")
    anthropic_turn = {
        "messages": [
            user("Read it."),
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "read", "input": {}}],
            },
        ]
    }
    body = await post_ok(client, "f", anthropic_turn, format="anthropic")
    assert [e["role"] for e in body["entries"]] == ["user", "assistant"]
    assert (await history(client, "f", fmt="anthropic"))[1]["message"] == anthropic_turn[
        "messages"
    ][1]
    # The body may say it too; the same in both is fine.
    body = await post_ok(
        client,
        "f",
        {
            "format": "anthropic",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}],
                }
            ],
        },
        format="anthropic",
    )
    assert [e["role"] for e in body["entries"]] == ["tool"]
    # Two different ones are a 422 naming both; nothing is stored.
    before = await get_session(client, "f")
    r = await post(
        client, "f", {"format": "openai", "messages": [user("x", "openai")]}, format="anthropic"
    )
    assert_problem(r, 422, "format", "openai", "anthropic")
    r = await post(client, "f", {"messages": [user("x", "openai")]}, format="gemini")
    assert_problem(r, 422, "format")
    assert await get_session(client, "f") == before
    # The reads take it the same way.
    for path in ("messages", "context"):
        r = await client.get(f"/v1/sessions/f/{path}", params={"format": "anthropic"})
        assert r.status_code == 200, r.text
        r = await client.get(f"/v1/sessions/f/{path}", params={"format": "gemini"})
        assert_problem(r, 422, "format")


async def test_the_query_format_bounds_tool_arguments_like_the_bodys(
    client: httpx.AsyncClient,
) -> None:
    """The oversized-arguments check reads the format from the query too: an
    Anthropic batch is not read as OpenAI tool calls."""
    await make_session(client, id="q")
    batch = {
        "messages": [
            user("go"),
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "x", "input": {"k": list(range(50))}}
                ],
            },
        ]
    }
    await post_ok(client, "q", batch, format="anthropic")


async def test_messages_built_from_openai_sdk_objects_are_stored_faithfully(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="sdk")
    with_calls = ChatCompletionMessage(
        role="assistant",
        content=None,
        refusal=None,
        tool_calls=[
            ChatCompletionMessageFunctionToolCall(
                id="call_1",
                type="function",
                function=Function(name="bash", arguments='{"command": "ls"}'),
            )
        ],
    )
    plain = ChatCompletionMessage(role="assistant", content="There are two files.", annotations=[])
    messages = [
        user("List the files.", "openai"),
        with_calls.model_dump(),
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py\nb.py\n"},
        plain.model_dump(),
    ]
    assert messages[1]["audio"] is None
    assert messages[1]["function_call"] is None
    body = await post_ok(client, "sdk", {"messages": messages})
    assert [e["role"] for e in body["entries"]] == ["user", "assistant", "tool", "assistant"]
    # Given back as sent: the SDK's null fields it does not model (refusal,
    # annotations, audio, function_call) included; a modelled optional field sent
    # as null (tool_calls) is not kept, as for any message (README, Input rules).
    sent = [{k: v for k, v in m.items() if not (k == "tool_calls" and v is None)} for m in messages]
    assert [e["message"] for e in await history(client, "sdk")] == sent
    # The model sees none of the SDK's null fields.
    ctx = (await client.get("/v1/sessions/sdk/context")).json()
    assert ctx["messages"][1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "ls"}'},
            }
        ],
    }
    assert ctx["messages"][3] == {"role": "assistant", "content": "There are two files."}


async def test_messages_built_from_anthropic_sdk_objects_are_stored_faithfully(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="sdk", model="claude-sonnet-4-5")
    reply = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=[
            ThinkingBlock(type="thinking", thinking="Read it first.", signature="sig=="),
            RedactedThinkingBlock(type="redacted_thinking", data="opaque"),
            TextBlock(type="text", text="Reading.", citations=None),
            ToolUseBlock(type="tool_use", id="toolu_1", name="read", input={"path": "a.py"}),
        ],
        stop_reason="tool_use",
        stop_sequence=None,
        usage=Usage(input_tokens=10, output_tokens=5),
    )
    blocks = [block.model_dump() for block in reply.content]
    assert blocks[2]["citations"] is None
    assert blocks[3]["caller"] is None
    assistant = {"role": reply.role, "content": blocks}
    messages = [
        user("Read a.py."),
        assistant,
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "print(1)"}],
        },
    ]
    body = await post_ok(
        client, "sdk", {"format": "anthropic", "system": SYSTEM_BLOCKS, "messages": messages}
    )
    assert [e["role"] for e in body["entries"]] == ["system", "user", "assistant", "tool"]
    stored = [e["message"] for e in await history(client, "sdk", fmt="anthropic")]
    assert stored[1:] == messages
    ctx = (await client.get("/v1/sessions/sdk/context", params={"format": "anthropic"})).json()
    shown = ctx["messages"][1]["content"]
    assert shown[2] == {"type": "text", "text": "Reading."}
    assert shown[3] == {
        "type": "tool_use",
        "id": "toolu_1",
        "name": "read",
        "input": {"path": "a.py"},
    }


async def test_the_service_sets_the_overhead_it_is_given(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The proxy's path: the overhead it counted (tools and an unstored system
    prompt) is set with the append, and wins over the body's tools."""
    await make_session(client, id="p")
    service = AppendService(app.state.engine, DEFAULT_TENANT)
    body = AppendRequest(messages=[user("hi", "openai")], tools=TOOLS_OPENAI)
    _, version, replayed = await service.append(
        "p", body, idempotency_key=None, if_match=None, overhead_tokens=1234
    )
    assert not replayed
    session = await get_session(client, "p")
    assert (session["overhead_tokens"], session["version"]) == (1234, version)
    # None leaves it to the body's tools.
    await service.append("p", body, idempotency_key=None, if_match=None)
    assert (await get_session(client, "p"))["overhead_tokens"] == count_tools(
        TOOLS_OPENAI, "o200k_base"
    )


async def test_an_idempotency_key_covers_system_and_tools(client: httpx.AsyncClient) -> None:
    await make_session(client, id="i")
    body = {"system": "Be brief.", "tools": TOOLS_OPENAI, "messages": [user("hi", "openai")]}
    headers = {"Idempotency-Key": "k1"}
    first = await client.post("/v1/sessions/i/messages", json=body, headers=headers)
    assert first.status_code == 201, first.text
    # A retry, with a different temperature (ignored), replays the first answer.
    retry = await client.post(
        "/v1/sessions/i/messages", json={**body, "temperature": 0.5}, headers=headers
    )
    assert retry.headers.get("idempotent-replayed") == "true"
    assert retry.json() == first.json()
    for changed in ({**body, "system": "Be long."}, {**body, "tools": []}):
        r = await client.post("/v1/sessions/i/messages", json=changed, headers=headers)
        assert_problem(r, 422, "Idempotency-Key")
    assert len(await history(client, "i")) == 2


@pytest.mark.parametrize("index", [0, 1])
async def test_the_documented_append_examples_are_accepted(
    client: httpx.AsyncClient, index: int
) -> None:
    await make_session(client, id="doc")
    example = AppendRequest.model_json_schema()["examples"][index]
    await post_ok(client, "doc", example)


async def test_a_system_prompt_a_compaction_pinned_is_still_the_sessions(
    app: Any, client: httpx.AsyncClient
) -> None:
    """After a compaction the system entry is before the window (pinned): the
    same system re-sent still stores nothing, a changed one one entry."""
    await make_session(
        client,
        id="c",
        config={"prune": {"auto": False}, "compaction": {"keep_recent_tokens": 2000}},
    )
    batches = conversation(12)
    system = batches[0][0]
    assert system["role"] == "system"
    for batch in batches:
        await post_ok(client, "c", {"messages": batch})
    r = await client.post("/v1/sessions/c/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    ctx = (await client.get("/v1/sessions/c/context")).json()
    assert ctx["messages"][0] == system  # pinned before the summary
    assert ctx["compaction"] is not None
    body = await post_ok(
        client, "c", {"system": system["content"], "messages": [user("go", "openai")]}
    )
    assert [e["role"] for e in body["entries"]] == ["user"]
    body = await post_ok(client, "c", {"system": "Be terse.", "messages": [user("go", "openai")]})
    assert [e["role"] for e in body["entries"]] == ["system", "user"]
    # The new one is in the window now: it is the one compared.
    body = await post_ok(client, "c", {"system": "Be terse.", "messages": [user("go", "openai")]})
    assert [e["role"] for e in body["entries"]] == ["user"]
