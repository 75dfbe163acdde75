"""Small helpers shared by the API tests: HTTP calls, and row and table locks held
in another connection."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx

from app.core.settings import Settings
from tests import postgres

PROBLEM_JSON = "application/problem+json"


def assert_problem(r: httpx.Response, status: int, *names: str) -> dict[str, Any]:
    """``r`` is a problem document with ``status`` whose detail or errors mention every name."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM_JSON), r.headers["content-type"]
    doc: dict[str, Any] = r.json()
    assert doc["status"] == status
    assert doc["title"]
    text = doc["detail"] + " " + " ".join(e["field"] for e in doc.get("errors") or [])
    for name in names:
        assert name in text, f"{name!r} not named in {doc}"
    return doc


async def get_session(client: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{session_id}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def append(
    client: httpx.AsyncClient,
    session_id: str,
    messages: list[dict[str, Any]],
    fmt: str = "openai",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/{session_id}/messages",
        json={"messages": messages, "format": fmt},
        headers=headers or {},
    )


async def append_ok(
    client: httpx.AsyncClient, session_id: str, messages: list[dict[str, Any]], fmt: str = "openai"
) -> dict[str, Any]:
    r = await append(client, session_id, messages, fmt)
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


async def history(
    client: httpx.AsyncClient, session_id: str, fmt: str = "openai", limit: int = 1000
) -> list[dict[str, Any]]:
    """Every stored entry, following next_after_seq to the end."""
    entries: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(
            f"/v1/sessions/{session_id}/messages",
            params={"after_seq": after, "limit": limit, "format": fmt},
        )
        assert r.status_code == 200, r.text
        page = r.json()
        entries.extend(page["entries"])
        if page["next_after_seq"] is None:
            return entries
        after = page["next_after_seq"]


def tool_call(
    call_id: str, name: str = "bash", arguments: str = '{"command": "ls"}'
) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


@contextlib.asynccontextmanager
async def session_locked(db_url: str, session_id: str) -> AsyncIterator[None]:
    """Holds the session's row lock in another connection, as an append, a usage
    report or a compaction's commit does for the length of its transaction (an
    append waits inside its transaction)."""
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM session WHERE id = $1 FOR UPDATE", session_id)
            yield
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def key_table_locked(db_url: str) -> AsyncIterator[None]:
    """No one reads the key table until the block ends (a read waits for the lock)."""
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE api_key IN ACCESS EXCLUSIVE MODE")
            yield
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def direct_and_fastapi(
    db_url: str, settings: Settings
) -> AsyncIterator[list[httpx.AsyncClient]]:
    """Two apps on one database, one with the direct routes (app.core.direct) and one
    without, started; a client of each, in that order."""
    from app.main import create_app  # the app, only for the tests that compare two

    direct = create_app(settings, database_url=db_url)
    plain = create_app(settings, database_url=db_url, direct=False)
    async with direct.router.lifespan_context(direct), plain.router.lifespan_context(plain):
        clients = [
            httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://compactd.test")
            for a in (direct, plain)
        ]
        try:
            yield clients
        finally:
            for c in clients:
                await c.aclose()
