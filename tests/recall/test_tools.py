"""The agent's recall tools: their definitions validate as the official SDKs' tool
types; a model's call of each, in either format, is run through the API and its
result stays within its cap and tells how to read on; bad arguments come back as a
tool result that says what was wrong, and a body that is no tool call is a 422."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types
import httpx
import openai.types.chat
import pydantic
import pytest

from app.engine.accounting import tokens
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import append_ok

MANUAL = {"compaction": {"auto": False, "keep_recent_tokens": 300}, "prune": {"auto": False}}


def openai_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def anthropic_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_1", "name": name, "input": arguments}


async def run(client: httpx.AsyncClient, sid: str, call: Any, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/tool-calls", json={"tool_call": call, **body})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def seeded(app: Any, client: httpx.AsyncClient, sid: str) -> str:
    """A session whose early history (a failing migration, a config path) a
    compaction has replaced; its id."""
    await make_session(client, id=sid, config=MANUAL)
    for k in range(12):
        call = {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"cat step{k}.log"})},
        }
        output = (
            "django.core.exceptions.ImproperlyConfigured: settings/prod_quux.py lacks SECRET_KEY"
            if k == 2
            else f"log line {k} " * 60
        )
        await append_ok(
            client,
            sid,
            [
                {"role": "user", "content": f"Step {k}: look at the log."},
                {"role": "assistant", "content": "Reading.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": output},
            ],
        )
    r = await client.post(f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    cid: str = r.json()["id"]
    return cid


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
async def test_the_definitions_are_the_sdks_tool_types(client: httpx.AsyncClient, fmt: str) -> None:
    r = await client.get("/v1/tools", params={"format": fmt})
    assert r.status_code == 200, r.text
    tools = r.json()["tools"]
    assert [t["function"]["name"] if fmt == "openai" else t["name"] for t in tools] == [
        "history_search",
        "history_read",
    ]
    adapter = pydantic.TypeAdapter(
        openai.types.chat.ChatCompletionToolParam if fmt == "openai" else anthropic.types.ToolParam
    )
    for tool in tools:
        adapter.validate_python(tool, strict=True)
        schema = tool["function"]["parameters"] if fmt == "openai" else tool["input_schema"]
        assert schema["type"] == "object"


async def test_a_search_call_finds_what_the_compaction_replaced(
    app: Any, client: httpx.AsyncClient
) -> None:
    cid = await seeded(app, client, "s")
    context = (await client.get("/v1/sessions/s/context")).json()
    assert "prod_quux" not in json.dumps(context["messages"])  # compacted away
    # The summary says where what it replaced is, and with which tools.
    job = (await client.get(f"/v1/sessions/s/compactions/{cid}")).json()
    summary = context["messages"][0]["content"]
    assert (
        f"(seq 1 to {job['first_kept_seq'] - 1}) are still stored: search them with the "
        "history_search tool and read them back with history_read "
        "(from_seq=1)."
    ) in summary
    for call in (
        openai_call("history_search", query="ImproperlyConfigured"),
        anthropic_call("history_search", query="settings/prod_quux.py", compaction=cid),
    ):
        result = await run(client, "s", call)
        assert not result["is_error"], result
        assert "prod_quux" in result["content"]
        assert "[seq 9 " in result["content"]  # step 2's output is entry 9
    # The result as the agent appends it, in the call's format.
    openai_result = await run(client, "s", openai_call("history_search", query="SECRET_KEY"))
    assert openai_result["message"]["role"] == "tool"
    assert openai_result["message"]["tool_call_id"] == "call_1"
    anthropic_result = await run(client, "s", anthropic_call("history_search", query="SECRET_KEY"))
    assert anthropic_result["message"]["type"] == "tool_result"
    assert anthropic_result["message"]["tool_use_id"] == "toolu_1"


async def test_a_read_stays_within_its_cap_and_says_how_to_read_on(
    app: Any, client: httpx.AsyncClient
) -> None:
    cid = await seeded(app, client, "r")
    whole = await run(client, "r", openai_call("history_read", from_seq=7, to_seq=9))
    assert not whole["truncated"]
    assert whole["content"].startswith("[seq 7] user: Step 2")
    assert "ImproperlyConfigured" in whole["content"]
    for cap in (200, 500, 1_000):
        result = await run(
            client, "r", anthropic_call("history_read", compaction=cid, from_seq=1), max_tokens=cap
        )
        assert result["tokens"] <= cap
        assert result["tokens"] == tokens.count_text(result["content"], "o200k_base")
        assert result["truncated"]
        assert "call history_read with from_seq=" in result["content"]
    # The session's cap applies when the call sets none.
    r = await client.patch("/v1/sessions/r", json={"config": {"recall": {"result_tokens": 300}}})
    assert r.status_code == 200, r.text
    result = await run(client, "r", openai_call("history_read", from_seq=1))
    assert result["tokens"] <= 300
    assert result["truncated"]


@pytest.mark.parametrize(
    ("call", "says"),
    [
        (openai_call("history_search"), "query is required"),
        (openai_call("history_search", query="x", limit=500), "limit must be"),
        (openai_call("history_search", query="x", role="wizard"), "role must be one of"),
        (openai_call("history_read"), "give from_seq"),
        (openai_call("history_read", from_seq=5, to_seq=2), "to_seq is before from_seq"),
        (openai_call("history_read", compaction="nope"), "compaction must be"),
        (openai_call("history_read", from_seq=1, wat=1), "unknown arguments: wat"),
        (anthropic_call("history_delete", seq=1), "unknown tool 'history_delete'"),
        (
            {"id": "c", "type": "function", "function": {"name": "history_read", "arguments": "{"}},
            "not a JSON object",
        ),
    ],
)
async def test_bad_arguments_come_back_as_a_result_that_says_so(
    client: httpx.AsyncClient, call: dict[str, Any], says: str
) -> None:
    await make_session(client, id="b")
    await append_ok(client, "b", [{"role": "user", "content": "hello"}])
    result = await run(client, "b", call)
    assert result["is_error"]
    assert says in result["content"], result["content"]


async def test_an_unknown_compaction_is_a_result_that_says_so(client: httpx.AsyncClient) -> None:
    await make_session(client, id="u")
    await append_ok(client, "u", [{"role": "user", "content": "hello"}])
    call = openai_call("history_read", compaction="00000000-0000-0000-0000-000000000000")
    result = await run(client, "u", call)
    assert result["is_error"]
    assert "does not exist" in result["content"] or "not" in result["content"]


@pytest.mark.parametrize(
    "body",
    [
        {"tool_call": "history_search"},
        {"tool_call": {"name": "history_search"}},
        {"tool_call": {"type": "tool_use", "name": "history_read"}},
        {"tool_call": openai_call("history_read", from_seq=1), "max_tokens": 5},
        {},
    ],
)
async def test_a_body_that_is_no_tool_call_is_422(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> None:
    await make_session(client, id="x")
    before = (await client.get("/v1/sessions/x")).json()
    r = await client.post("/v1/sessions/x/tool-calls", json=body)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert (await client.get("/v1/sessions/x")).json()["version"] == before["version"]


async def test_an_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/sessions/nobody/tool-calls", json={"tool_call": openai_call("history_read")}
    )
    assert r.status_code == 404
