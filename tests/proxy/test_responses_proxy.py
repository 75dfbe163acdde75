"""The official OpenAI SDK's Responses API (``client.responses.create``), unmodified,
through the proxy to the scripted upstream: what Codex speaks."""

from __future__ import annotations

from typing import Any, cast

import openai
import pytest

from app.core.settings import Settings
from tests.proxy.support import api, openai_client, proxy, settled, stored_history
from tests.upstream_server import BreakStream, Reply, ToolCalls, Upstream

INSTRUCTIONS = "You are a coding agent. Use the shell."
PROMPT: Any = {
    "type": "message",
    "role": "developer",
    "content": [{"type": "input_text", "text": "<permissions>workspace-write</permissions>"}],
}
TOOLS: Any = [
    {
        "type": "function",
        "name": "shell",
        "description": "Run a command.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
        },
    }
]
REASONING: Any = {
    "type": "reasoning",
    "id": "rs_0123",
    "summary": [{"type": "summary_text", "text": "**Listing files**"}],
    "encrypted_content": "gAAAAABo" + "Zx9" * 300,
}


def _user(text: str) -> Any:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_a_tool_round_trip_stores_every_item_and_sends_the_prompt_as_it_came(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([ToolCalls((("shell", {"command": ["ls"]}),)), Reply("Two files.")])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "resp-plain") as client:
            # An earlier turn, with the model's reasoning item (opaque, encrypted).
            earlier: list[Any] = [
                _user("Hello."),
                REASONING,
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "Hi."}],
                },
            ]
            history: list[Any] = [*earlier, _user("What is in the repo?")]
            first = await client.responses.create(
                model="gpt-5-codex",
                instructions=INSTRUCTIONS,
                input=[PROMPT, *history],
                tools=TOOLS,
                store=False,
                parallel_tool_calls=False,
                include=["reasoning.encrypted_content"],
            )
            call = first.output[0]
            assert call.type == "function_call"
            assert call.name == "shell"
            # Codex keeps the items it got, adds its reasoning's and the tool's output.
            history += [
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": "shell",
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "a.py\nb.py"},
            ]
            second = await client.responses.create(
                model="gpt-5-codex",
                instructions=INSTRUCTIONS,
                input=[PROMPT, *history],
                tools=TOOLS,
                store=False,
                parallel_tool_calls=False,
                include=["reasoning.encrypted_content"],
            )
            assert second.output_text == "Two files."
            assert second.usage is not None
            assert second.usage.input_tokens > 0

            sent = upstream.requests
            assert [r.path for r in sent] == ["/v1/responses", "/v1/responses"]
            body = sent[1].json
            # The prompt and every field the agent set go as they came; the history's
            # items come back as the agent sent them (a reasoning item whole).
            assert body["instructions"] == INSTRUCTIONS
            assert body["tools"] == TOOLS
            assert body["store"] is False
            assert body["include"] == ["reasoning.encrypted_content"]
            assert body["input"] == [PROMPT, *history]

        async with api(base) as rest:
            await settled(rest, "resp-plain", 7)
            stored = await stored_history(rest, "resp-plain", "openai")
            assert stored == [
                {"role": "user", "content": [{"type": "text", "text": "Hello."}]},
                {
                    "role": "assistant",
                    "content": [{"type": "response_item", "response_item": REASONING}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "Hi."}]},
                {"role": "user", "content": [{"type": "text", "text": "What is in the repo?"}]},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call.call_id,
                            "type": "function",
                            "function": {"name": "shell", "arguments": call.arguments},
                        }
                    ],
                    # The item's own id and status, as the upstream sent them.
                    "id": call.id,
                    "status": "completed",
                },
                {"role": "tool", "tool_call_id": call.call_id, "content": "a.py\nb.py"},
                {
                    "role": "assistant",
                    "content": [
                        {
                            "type": "text",
                            "text": "Two files.",
                            "annotations": [],
                            "logprobs": [],
                        }
                    ],
                    "id": "msg_upstream_test",
                    "status": "completed",
                },
            ]
            session = (await rest.get("/v1/sessions/resp-plain")).json()
            assert session["last_usage"]["input_tokens"] > 0, session


async def test_a_stream_passes_event_for_event_and_stores_the_completed_reply(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([Reply("Streamed answer, in several pieces.")])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "resp-stream") as client:
            stream = await client.responses.create(
                model="gpt-5-codex", input=[_user("hi")], stream=True, store=False
            )
            kinds = [event.type async for event in cast(Any, stream)]
        assert kinds[0] == "response.created"
        assert kinds[-1] == "response.completed"
        assert "response.output_text.delta" in kinds
        async with api(base) as rest:
            await settled(rest, "resp-stream", 2)
            history = await rest.get(
                "/v1/sessions/resp-stream/messages", params={"format": "openai"}
            )
            texts = [e["message"]["content"] for e in history.json()["entries"]]
            assert texts[0] == [{"type": "text", "text": "hi"}]
            assert texts[1][0]["text"] == "Streamed answer, in several pieces."


async def test_a_broken_stream_stores_nothing_of_its_reply_and_the_sdk_raises(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.script([BreakStream(events=4)])
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "resp-broken") as client:
            stream = await client.responses.create(
                model="gpt-5-codex", input=[_user("hi")], stream=True, store=False
            )
            with pytest.raises(openai.APIError, match="broke off"):
                async for _ in cast(Any, stream):
                    pass
        async with api(base) as rest:
            await settled(rest, "resp-broken", 1)
            entries = (await rest.get("/v1/sessions/resp-broken/messages")).json()["entries"]
            assert [e["message"]["role"] for e in entries] == ["user"]


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"input": [{"type": "function_call", "name": "shell", "arguments": "{}"}]}, "input[0]"),
    ],
)
async def test_what_compactd_cannot_serve_is_a_clear_400(
    db_url: str, settings: Settings, upstream: Upstream, extra: dict[str, Any], field: str
) -> None:
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "resp-bad") as client:
            with pytest.raises(openai.BadRequestError) as caught:
                await client.responses.create(
                    model="gpt-5-codex", **{"input": [_user("hi")], **extra}
                )
        assert field in str(caught.value)
        assert upstream.requests == []
        async with api(base) as rest:
            got = await rest.get("/v1/sessions/resp-bad/messages")
            assert got.status_code == 404 or got.json()["entries"] == []


async def test_a_remote_compaction_request_is_answered_with_compactds_own(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Codex's ``POST /responses/compact``: compactd stores the history, compacts it
    (no upstream call) and answers with the context as items: the summary, then the
    history it kept."""
    history: list[Any] = []
    for turn in range(8):
        history += [
            _user(f"Step {turn}: fix the bug in module_{turn}.py; the test fails with E{turn}."),
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"Fixed module_{turn}.py. " * 20}],
            },
        ]
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as rest:
            made = await rest.post(
                "/v1/sessions",
                json={
                    "id": "resp-compact",
                    "model": "gpt-5-codex",
                    "config": {"compaction": {"keep_recent_tokens": 200, "auto": False}},
                },
            )
            assert made.status_code == 201, made.text
            answer = await rest.post(
                "/proxy/openai/v1/responses/compact",
                headers={"X-Compactd-Session": "resp-compact", "Authorization": "Bearer sk-x"},
                json={"model": "gpt-5-codex", "instructions": INSTRUCTIONS, "input": history},
            )
            assert answer.status_code == 200, answer.text
            assert answer.headers["x-compactd-compacted"] == "true"
            body = answer.json()
            assert body["object"] == "response.compaction"
            output = body["output"]
            assert 0 < len(output) < len(history)
            content = output[0]["content"]
            summary = content if isinstance(content, str) else content[0]["text"]
            assert "module_0.py" in summary  # what was summarized away is named in it
            assert output[-1] == history[-1]  # the recent history kept as it came
            listed = (await rest.get("/v1/sessions/resp-compact/compactions")).json()
            assert len(listed["compactions"]) == 1, listed
            entries = (await rest.get("/v1/sessions/resp-compact/messages")).json()["entries"]
            assert len([e for e in entries if e["kind"] == "message"]) == len(history)
    assert upstream.requests == []  # never the upstream's compaction
