"""Migration 0009 on a database with history: a session written as a line (with a
compaction, tool calls and prune marks) goes down to 0008 and up again, and its
context, its totals and its history come back the same; it then navigates and
forks like a session made at head."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from app.core import migrations
from app.core.settings import Settings
from app.main import create_app
from tests import postgres
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import append_ok

TOTALS = ("entry_count", "stored_tokens", "context_tokens", "compaction_count", "pruned_tokens")


@pytest.fixture
async def migrated_url(admin_url: str) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(postgres.asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = postgres.with_database(admin_url, name)
    await asyncio.to_thread(migrations.upgrade, url)
    yield url
    await postgres.drop(admin_url, url)


async def snapshot(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    context = (await client.get(f"/v1/sessions/{sid}/context")).json()
    history = (await client.get(f"/v1/sessions/{sid}/messages", params={"limit": 1000})).json()
    return {
        "totals": {k: session[k] for k in TOTALS},
        "context": context["messages"],
        "tokens": context["tokens"],
        "history": [(e["seq"], e["kind"], e["message"]) for e in history["entries"]],
    }


def run_app(settings: Settings, url: str) -> Any:
    return create_app(settings, database_url=url)


async def test_a_line_written_before_the_tree_reads_the_same_after_it(
    migrated_url: str, settings: Settings
) -> None:
    app = run_app(settings, migrated_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await make_session(
                client,
                id="old",
                config={
                    "compaction": {"auto": False, "keep_recent_tokens": 200},
                    "prune": {"auto": False, "protect_tokens": 100, "minimum_tokens": 1},
                },
            )
            for k in range(8):
                call = {
                    "id": f"c{k}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "ls"}'},
                }
                await append_ok(
                    client,
                    "old",
                    [
                        {"role": "user", "content": f"Step {k}: list the files again."},
                        {"role": "assistant", "content": "Listing.", "tool_calls": [call]},
                        {"role": "tool", "tool_call_id": f"c{k}", "content": "file\n" * 200},
                    ],
                )
            r = await client.post("/v1/sessions/old/prune", json={})
            assert r.status_code == 200, r.text
            assert r.json()["pruned"], r.json()
            r = await client.post("/v1/sessions/old/compactions", json={"summarizer": "extractive"})
            assert r.status_code == 202, r.text
            assert await drain(app) == 1
            await append_ok(client, "old", [{"role": "user", "content": "And now?"}])
            before = await snapshot(client, "old")
    assert before["totals"]["compaction_count"] == 1
    assert before["totals"]["pruned_tokens"] > 0

    await asyncio.to_thread(migrations.downgrade, migrated_url, "0008")
    await asyncio.to_thread(migrations.upgrade, migrated_url)

    app = run_app(settings, migrated_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert await snapshot(client, "old") == before
            # The tree's moves work on it: back before the compaction, and forward again.
            compacted = [e for e in before["history"] if e[1] == "compaction"]
            assert len(compacted) == 1
            r = await client.post("/v1/sessions/old/navigate", json={"seq": compacted[0][0] - 1})
            assert r.status_code == 200, r.text
            assert r.json()["session"]["compaction_count"] == 0
            r = await client.post("/v1/sessions/old/fork", json={"id": "young"})
            assert r.status_code == 201, r.text
            assert r.json()["compaction_count"] == 0
            last = before["history"][-1][0]
            tree = (await client.get("/v1/sessions/old/tree")).json()
            leaf = next(e for e in tree["entries"] if e["seq"] == last and e["branch"] == 0)
            r = await client.post("/v1/sessions/old/navigate", json={"entry_id": leaf["id"]})
            assert r.status_code == 200, r.text
            # Back at the old leaf, on the branch it was written on: as it was.
            assert await snapshot(client, "old") == before
