"""``/mcp`` under ``compactd serve --workers 2``: one MCP client session whose every
request is a new connection, taken by either server process, as a load balancer would
spread them. The server is stateless (app.mcp.server), so every call is answered;
a server that kept MCP sessions in a process's memory would answer a request that
reached the other process 404 ("session not found")."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx2
import mcp_types as types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from tests.e2e.serve_workers import ServeWorkers
from tests.helpers import append_ok

CALLS = 24


async def test_one_mcp_session_across_two_server_processes(db_url: str, tmp_path: Path) -> None:
    server = ServeWorkers(db_url, 2, tmp_path / "serve.log")
    try:
        await server.start()
        assert len(server.children()) == 2
        async with server.client() as http:
            r = await http.post("/v1/sessions", json={"id": "spread", "model": "gpt-4o"})
            assert r.status_code == 201, r.text
            await append_ok(
                http,
                "spread",
                [{"role": "user", "content": "the frobnicator config is at /etc/frob.toml"}],
            )
        # No kept-alive connection: each request is a new one.
        limits = httpx2.Limits(max_keepalive_connections=0)
        headers = {"X-Compactd-Session": "spread"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30, limits=limits) as client,
            streamable_http_client(f"{server.base_url}/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            texts = []
            for _ in range(CALLS):
                result = await session.call_tool("history_search", {"query": "frobnicator"})
                assert not result.is_error, result
                block = result.content[0]
                assert isinstance(block, types.TextContent)
                texts.append(block.text)
        assert len(set(texts)) == 1
        assert texts[0].startswith("[seq 1 · user] "), texts[0]
        assert "/etc/frob.toml" in texts[0]
        # Its session managers end with the processes (128 + SIGTERM: a clean stop).
        assert await server.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    finally:
        await server.close()
