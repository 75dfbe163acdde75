"""Shared by the tree's API tests: calls to the tree's routes, the context and
the whole tree read back, and small message builders."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx

from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from tests import postgres
from tests.helpers import tool_call

# Nothing automatic: the tests drive compaction and pruning by hand.
MANUAL: dict[str, Any] = {"compaction": {"auto": False}, "prune": {"auto": False}}


def users(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


def calling(call_id: str, text: str = "Looking.") -> dict[str, Any]:
    return {"role": "assistant", "content": text, "tool_calls": [tool_call(call_id)]}


def result(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


async def navigate(
    client: httpx.AsyncClient,
    sid: str,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/navigate", json=body, headers=headers or {})


async def navigate_ok(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await navigate(client, sid, **body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def fork(
    client: httpx.AsyncClient,
    sid: str,
    headers: dict[str, str] | None = None,
    **body: Any,
) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/fork", json=body, headers=headers or {})


async def fork_ok(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await fork(client, sid, **body)
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def texts(ctx: dict[str, Any]) -> list[Any]:
    """The contents of an OpenAI-format context's messages."""
    return [m["content"] for m in ctx["messages"]]


def breakdown_total(ctx: dict[str, Any]) -> int:
    """What the context's breakdown counts as the session's ``context_tokens``."""
    b = ctx["tokens"]["breakdown"]
    total: int = b["summary"] + b["messages"] + b["tool_outputs"]
    return total


async def assert_paired(client: httpx.AsyncClient, sid: str) -> None:
    """The context in both formats: every tool result follows its call, every
    call is answered (or still pending at the end)."""
    openai = await context(client, sid, "openai")
    assert check_openai_pairing(openai["messages"]) == []
    anthropic = await context(client, sid, "anthropic")
    assert check_anthropic_pairing(anthropic["messages"]) == []


async def tree_page(client: httpx.AsyncClient, sid: str, **params: Any) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/tree", params=params)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def whole_tree(client: httpx.AsyncClient, sid: str, limit: int = 1000) -> dict[str, Any]:
    """Every page of the tree: the last page, with every entry of all of them."""
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        page = await tree_page(client, sid, **params)
        entries.extend(page["entries"])
        cursor = page["next_cursor"]
        if cursor is None:
            return {**page, "entries": entries}


async def db_rows(db_url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        rows: list[asyncpg.Record] = await conn.fetch(sql, *args)
        return rows
    finally:
        await conn.close()
