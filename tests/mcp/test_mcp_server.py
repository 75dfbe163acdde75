"""``/mcp`` over real HTTP, with the official ``mcp`` client (Streamable HTTP): a real
uvicorn server with API keys and a compaction worker inside it, a session whose early
history a compaction has replaced, and the recall tools asked for what only that part
holds. The tools are the ``/v1/tools`` ones and their results are the
``…/tool-calls`` ones, word for word; a tenant sees only its own sessions."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from app.main import create_app
from tests.e2e.server import running
from tests.helpers import append_ok, assert_problem
from tests.ops.conftest import AUTH_SETTINGS, bearer, create_key

SID = "mcp-recall"
# Nothing automatic; a compaction keeps only the last few hundred tokens.
MANUAL = {"compaction": {"auto": False, "keep_recent_tokens": 300}, "prune": {"auto": False}}
BURIED = "django.core.exceptions.ImproperlyConfigured: settings/prod_quux.py lacks SECRET_KEY"


@pytest.fixture
def served(db_url: str) -> Iterator[str]:
    """compactd over real HTTP, keys required, one compaction worker inside it."""
    settings = AUTH_SETTINGS.model_copy(
        update={"compaction_workers": 1, "compaction_poll_seconds": 0.2}
    )
    with running(create_app(settings, database_url=db_url)) as base:
        yield base


async def seed(http: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """A session whose early history (a failing Django setting, step 2's output) a
    compaction has replaced; the compaction, once the server's worker is done."""
    r = await http.post("/v1/sessions", json={"id": sid, "model": "gpt-4o", "config": MANUAL})
    assert r.status_code == 201, r.text
    for k in range(12):
        call = {
            "id": f"c{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": json.dumps({"command": f"cat step{k}.log"})},
        }
        output = BURIED if k == 2 else f"log line {k} " * 60
        await append_ok(
            http,
            sid,
            [
                {"role": "user", "content": f"Step {k}: look at the log."},
                {"role": "assistant", "content": "Reading.", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": output},
            ],
        )
    r = await http.post(f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    deadline = time.monotonic() + 60
    while True:
        job: dict[str, Any] = (await http.get(f"/v1/sessions/{sid}/compactions/{cid}")).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            assert job["status"] == "succeeded", job
            return job
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)


@asynccontextmanager
async def mcp_session(base: str, **headers: str) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session on ``base``/mcp, sending ``headers``."""
    async with (
        create_mcp_http_client(headers=headers, timeout=httpx2.Timeout(30)) as http,
        streamable_http_client(f"{base}/mcp", http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def text(result: types.CallToolResult) -> str:
    assert [c.type for c in result.content] == ["text"], result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def api_result(http: httpx.AsyncClient, sid: str, name: str, **args: Any) -> dict[str, Any]:
    """The same call through ``POST …/tool-calls``."""
    call = {"type": "tool_use", "id": "toolu_1", "name": name, "input": args}
    r = await http.post(f"/v1/sessions/{sid}/tool-calls", json={"tool_call": call})
    assert r.status_code == 200, r.text
    found: dict[str, Any] = r.json()
    return found


async def test_recall_over_mcp_finds_and_reads_the_compacted_part(served: str, db_url: str) -> None:
    key = await create_key(db_url, "acme")
    async with httpx.AsyncClient(base_url=served, headers=bearer(key), timeout=60) as http:
        job = await seed(http, SID)
        context = (await http.get(f"/v1/sessions/{SID}/context")).json()
        assert "prod_quux" not in json.dumps(context["messages"])  # compacted away
        assert job["first_kept_seq"] > 9  # step 2's output is entry 9
        definitions = (await http.get("/v1/tools", params={"format": "anthropic"})).json()
        searched = await api_result(http, SID, "history_search", query="ImproperlyConfigured")
        read = await api_result(http, SID, "history_read", from_seq=9, to_seq=9)

    async with mcp_session(served, **bearer(key), **{"X-Compactd-Session": SID}) as session:
        listed = await session.list_tools()
        # The tools are /v1/tools', definition for definition, and read-only.
        assert [
            {"name": t.name, "description": t.description, "input_schema": t.input_schema}
            for t in listed.tools
        ] == definitions["tools"]
        assert all(t.annotations and t.annotations.read_only_hint for t in listed.tools)

        result = await session.call_tool("history_search", {"query": "ImproperlyConfigured"})
        assert not result.is_error
        found = text(result)
        assert "prod_quux" in found
        assert "[seq 9 · tool (bash) · compacted]" in found, found
        assert found == searched["content"]  # the tool-calls route's text, word for word

        result = await session.call_tool("history_read", {"from_seq": 9, "to_seq": 9})
        assert not result.is_error
        assert text(result) == read["content"]
        assert text(result).startswith("[seq 9] tool (bash): " + BURIED)

        # Bad arguments: the API's own words, as a result the model can act on.
        result = await session.call_tool("history_search", {"role": "robot"})
        assert result.is_error
        assert text(result) == "Error: query is required: what to look for"
        result = await session.call_tool("history_search", {"query": "a\x00b"})
        assert result.is_error
        assert "NUL" in text(result), text(result)


async def test_the_compactions_as_resources(served: str, db_url: str) -> None:
    """The header's session's compactions are resources: each reads as its summary,
    the specifics its replaced entries named, and those entries read back."""
    key = await create_key(db_url, "acme")
    other = await create_key(db_url, "globex")
    async with httpx.AsyncClient(base_url=served, headers=bearer(key), timeout=60) as http:
        job = await seed(http, SID)
    address = f"compactd://sessions/{SID}/compactions/{job['id']}"
    async with mcp_session(served, **bearer(key), **{"X-Compactd-Session": SID}) as session:
        listed = await session.list_resources()
        assert [r.uri for r in listed.resources] == [address]
        assert listed.resources[0].mime_type == "text/markdown"
        templates = await session.list_resource_templates()
        assert [t.uri_template for t in templates.resource_templates] == [
            "compactd://sessions/{session_id}/compactions/{compaction_id}"
        ]
        read = await session.read_resource(address)
        [contents] = read.contents
        assert isinstance(contents, types.TextResourceContents)
        page = contents.text
        assert job["summary"] in page
        assert "## What it replaced\n[seq 1] user: Step 0: look at the log." in page, page
        assert "`settings/prod_quux.py`" in page.split("## Named in what it replaced")[1], page
    async with mcp_session(served, **bearer(key)) as session:  # no session header
        assert (await session.list_resources()).resources == []
    async with mcp_session(served, **bearer(other), **{"X-Compactd-Session": SID}) as session:
        with pytest.raises(MCPError, match="does not exist"):
            await session.read_resource(address)
        with pytest.raises(MCPError, match="does not exist"):
            await session.list_resources()


async def test_the_session_argument_and_the_proxy_key_header(served: str, db_url: str) -> None:
    """A client that sends no session header names the session in each call (its tools
    ask for ``session_id``); the key may come in the proxy's ``X-Compactd-Key``."""
    key = await create_key(db_url, "acme")
    async with httpx.AsyncClient(base_url=served, headers=bearer(key), timeout=60) as http:
        await seed(http, SID)
    async with mcp_session(served, **{"X-Compactd-Key": key}) as session:
        listed = await session.list_tools()
        for tool in listed.tools:
            assert tool.input_schema["properties"]["session_id"]["type"] == "string"
            assert "session_id" in tool.input_schema["required"]
        result = await session.call_tool("history_search", {"query": "SECRET_KEY"})
        assert result.is_error
        assert "X-Compactd-Session" in text(result)
        assert "session_id" in text(result)
        result = await session.call_tool(
            "history_search", {"query": "SECRET_KEY", "session_id": SID}
        )
        assert not result.is_error
        assert "prod_quux" in text(result), text(result)
    async with mcp_session(served, **{"X-Compactd-Key": key, "X-Compactd-Session": SID}) as s:
        result = await s.call_tool("history_search", {"query": "x", "session_id": "elsewhere"})
        assert result.is_error
        assert "X-Compactd-Session" in text(result), text(result)


async def test_no_key_is_401_and_another_tenants_session_is_not_found(
    served: str, db_url: str
) -> None:
    key = await create_key(db_url, "acme")
    other = await create_key(db_url, "globex")
    async with httpx.AsyncClient(base_url=served, headers=bearer(key), timeout=60) as http:
        await seed(http, SID)
    initialize: dict[str, Any] = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(base_url=served, timeout=30) as anon:
        # No key, a forged one, a revoked-looking one: 401 problem+json, as on /v1.
        for headers in ({}, bearer("cpd_nope"), {"X-Compactd-Key": "cpd_abcdefabcdef_" + "x" * 43}):
            r = await anon.post("/mcp", json=initialize, headers={**accept, **headers})
            assert_problem(r, 401)
            assert r.headers["www-authenticate"].startswith("Bearer")
        # With a key: the same request is answered.
        r = await anon.post("/mcp", json=initialize, headers={**accept, **bearer(key)})
        assert r.status_code == 200, r.text
        assert r.json()["result"]["serverInfo"]["name"] == "compactd"
        # No stream is ever opened: GET and DELETE are 405.
        for method in ("GET", "DELETE"):
            r = await anon.request(method, "/mcp", headers={**accept, **bearer(key)})
            assert r.status_code == 405, r.text
            assert r.headers["allow"] == "POST"
        # A body over the MCP limit is refused before it is parsed.
        big = {**initialize, "params": {**initialize["params"], "pad": "x" * 70_000}}
        r = await anon.post("/mcp", json=big, headers={**accept, **bearer(key)})
        assert_problem(r, 413, "MCP message")
    # The official client, without a key, gets no further than its first request.
    with pytest.raises(ExceptionGroup) as raised:
        async with mcp_session(served, **{"X-Compactd-Session": SID}) as session:
            await session.list_tools()
    assert raised.group_contains(MCPError, depth=None)
    # Another tenant's key: the session does not exist for it, in the tool's result.
    async with mcp_session(served, **bearer(other), **{"X-Compactd-Session": SID}) as session:
        for name, args in (
            ("history_search", {"query": "SECRET_KEY"}),
            ("history_read", {"from_seq": 1}),
        ):
            result = await session.call_tool(name, args)
            assert result.is_error
            assert text(result) == f"Error: session {SID!r} does not exist"
    async with mcp_session(served, **bearer(other)) as session:
        result = await session.call_tool("history_read", {"from_seq": 1, "session_id": SID})
        assert result.is_error
        assert "does not exist" in text(result)


async def test_a_stalled_mcp_request_times_out_and_stalls_no_one(db_url: str) -> None:
    """An MCP request whose body stops arriving is answered 408 once the request
    timeout has passed, as an API request is, while another tenant's MCP calls are
    answered meanwhile."""
    settings = AUTH_SETTINGS.model_copy(update={"request_timeout_seconds": 1.0})
    key = await create_key(db_url, "acme")
    other = await create_key(db_url, "globex")
    with running(create_app(settings, database_url=db_url)) as base:
        async with httpx.AsyncClient(base_url=base, headers=bearer(other), timeout=30) as http:
            r = await http.post("/v1/sessions", json={"id": "busy", "model": "gpt-4o"})
            assert r.status_code == 201, r.text
        port = int(base.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Accept: application/json, text/event-stream\r\n"
            + f"Authorization: Bearer {key}\r\nContent-Length: 1000\r\n\r\n".encode()
            + b'{"jsonrpc": "2.0", '
        )
        await writer.drain()
        started = time.monotonic()
        async with mcp_session(base, **bearer(other), **{"X-Compactd-Session": "busy"}) as s:
            result = await s.call_tool("history_search", {"query": "anything"})
            assert not result.is_error
            assert text(result).startswith("No entry matches 'anything'.")
        answered = time.monotonic() - started
        head = await asyncio.wait_for(reader.read(4096), 10)
        waited = time.monotonic() - started
        writer.close()
        assert head.startswith(b"HTTP/1.1 408 "), head
        assert b"application/problem+json" in head
        # Not before its timeout: the deadline, not the call meanwhile, ended it.
        assert waited >= 0.9, (answered, waited)
        print(
            f"MCP call answered in {answered:.2f} s; the stalled request's 408 after {waited:.2f} s"
        )
