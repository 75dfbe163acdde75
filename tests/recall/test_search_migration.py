"""Migration 0010 on a database with history: it leaves every existing entry's text to
the indexer (search says how many are pending), which writes exactly the text an
append computes, and a session written before it is searchable after it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import httpx
import pytest

from app.core import migrations
from app.core.settings import Settings
from app.main import create_app
from app.store import search_index as indexer
from tests import postgres
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import append_ok


@pytest.fixture
async def migrated_url(admin_url: str) -> AsyncIterator[str]:
    name = f"r_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(postgres.asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = postgres.with_database(admin_url, name)
    await asyncio.to_thread(migrations.upgrade, url)
    yield url
    await postgres.drop(admin_url, url)


async def _texts(url: str) -> dict[tuple[int, int], tuple[str, str]]:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(url))
    try:
        rows = await conn.fetch(
            "SELECT branch, seq, role, search_text FROM entry WHERE session_id = 'old'"
        )
    finally:
        await conn.close()
    return {(r["branch"], r["seq"]): (r["role"], r["search_text"]) for r in rows}


async def test_the_back_fill_matches_what_appends_compute(
    migrated_url: str, settings: Settings
) -> None:
    long_output = "\n".join(f"row {i} ok" for i in range(3_000)) + "\nE   KeyError: 'week_53'"
    app = create_app(settings, database_url=migrated_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            config = {"compaction": {"auto": False, "keep_recent_tokens": 200}}
            await make_session(client, id="old", config=config)
            await append_ok(
                client,
                "old",
                [
                    {"role": "system", "content": "You fix bugs."},
                    {"role": "user", "content": "The ISO week parser fails on 2020-W53."},
                ],
            )
            for k in range(6):
                call = {
                    "id": f"c{k}",
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": f'{{"command": "pytest tests/test_dates.py -k w{k}"}}',
                    },
                }
                await append_ok(
                    client,
                    "old",
                    [
                        {"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": f"c{k}", "content": long_output},
                    ],
                )
            r = await client.post("/v1/sessions/old/compactions", json={"summarizer": "extractive"})
            assert r.status_code == 202, r.text
            assert await drain(app) == 1
    before = await _texts(migrated_url)
    assert any(role == "tool" for role, _ in before.values())

    await asyncio.to_thread(migrations.downgrade, migrated_url, "0009")
    await asyncio.to_thread(migrations.upgrade, migrated_url)
    after = await _texts(migrated_url)
    assert after.keys() == before.keys()
    assert all(text == "" for _, text in after.values())

    app = create_app(settings, database_url=migrated_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.get("/v1/sessions/old/search", params={"q": "2020-W53"})
            assert r.status_code == 200, r.text
            assert r.json()["hits"] == []
            assert r.json()["pending"] == len(before)
            assert await indexer.index_all(app.state.engine) == len(before)
            assert await _texts(migrated_url) == before
            r = await client.get("/v1/sessions/old/search", params={"q": "2020-W53"})
            assert r.status_code == 200, r.text
            assert r.json()["pending"] == 0
            hits = r.json()["hits"]
            # The question, and the summary that quotes it: both hold it as written (a
            # summary scores 3 for it, below the entry that holds it).
            assert hits[0]["seq"] == 2
            assert all(h["score"] >= (3 if h["kind"] == "compaction" else 4) for h in hits)
            r = await client.get("/v1/sessions/old/search", params={"q": "KeyError: 'week_53'"})
            hits = r.json()["hits"]
            assert sum(h["role"] == "tool" for h in hits) == 6
