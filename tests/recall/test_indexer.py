"""The indexer: an append past search_text.APPEND_CHARS leaves its later entries'
text to it. Until it runs, search says how many entries are pending and does not
find them; after, it finds them, and their text is what the append would have
written. Indexers share the work and never write an entry twice, and a worker
process's indexer is woken by the append."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import httpx
import pytest

from app.compactions.worker import WorkerConfig, WorkerPool
from app.core.outbound import Outbound
from app.engine.search_text import APPEND_CHARS
from app.store import search_index as indexer
from tests import postgres
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import append_ok
from tests.recall.support import MANUAL, search, searchable

# Each output holds its own marker in the middle of 9,000 characters.
SIZE = 9_000
COUNT = APPEND_CHARS // SIZE + 20


def _outputs(tag: str) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Run the suite per module."}]
    for k in range(COUNT):
        call = {
            "id": f"{tag}{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": f'{{"command": "pytest mod_{k}"}}'},
        }
        pad = "ok " * (SIZE // 6)
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"{tag}{k}", "content": f"{pad}marker_{k}_{tag} {pad}"}
        )
    return messages


async def _stored_texts(db_url: str, sid: str) -> dict[int, tuple[str, bool]]:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch(
            "SELECT seq, search_text, search_pending FROM entry WHERE session_id = $1", sid
        )
    finally:
        await conn.close()
    return {r["seq"]: (r["search_text"], r["search_pending"]) for r in rows}


async def test_a_large_append_is_searchable_once_the_indexer_ran(
    app: Any, client: httpx.AsyncClient, db_url: str
) -> None:
    await make_session(client, id="s", config=MANUAL)
    await append_ok(client, "s", _outputs("a"))
    stored = await _stored_texts(db_url, "s")
    pending = sorted(seq for seq, (_, left) in stored.items() if left)
    assert pending, "the append should have left text to the indexer"
    # Written: a prefix of the append within its budget; pending: all the rest, empty.
    assert pending == list(range(pending[0], len(stored) + 1))
    assert sum(len(text) for text, _ in stored.values()) <= APPEND_CHARS
    assert all(stored[seq][0] == "" for seq in pending)
    last = COUNT - 1
    page = await search(client, "s", f"marker_{last}_a")
    assert page["hits"] == []
    assert page["pending"] == len(pending)
    assert page["complete"] is False
    page = await search(client, "s", "marker_0_a")
    assert [h["seq"] for h in page["hits"]] == [3]

    assert await indexer.index_all(app.state.engine) == len(pending)
    assert await indexer.index_all(app.state.engine) == 0
    page = await search(client, "s", f"marker_{last}_a")
    assert [h["seq"] for h in page["hits"]] == [1 + 2 * COUNT]
    assert page["pending"] == 0
    assert page["complete"] is True
    # Each text is the one an append computes from the message.
    stored = await _stored_texts(db_url, "s")
    expected = await searchable(client, "s")
    assert {seq: text for seq, (text, _) in stored.items()} == {
        seq: text for seq, (_, text) in expected.items()
    }
    assert not any(left for _, left in stored.values())


async def test_indexers_share_the_work_and_write_each_entry_once(
    app: Any, client: httpx.AsyncClient, db_url: str
) -> None:
    for sid in ("a", "b", "c"):
        await make_session(client, id=sid, config=MANUAL)
        await append_ok(client, sid, _outputs(sid))
    before = 0
    for sid in ("a", "b", "c"):
        before += sum(left for _, left in (await _stored_texts(db_url, sid)).values())
    done = await asyncio.gather(*(indexer.index_all(app.state.engine) for _ in range(3)))
    assert sum(done) == before
    for sid in ("a", "b", "c"):
        assert not any(left for _, left in (await _stored_texts(db_url, sid)).values())
        page = await search(client, sid, f"marker_{COUNT - 1}_{sid}")
        assert len(page["hits"]) == 1


@pytest.mark.slow
async def test_a_worker_process_indexes_what_an_append_left_without_a_poll(
    app: Any, client: httpx.AsyncClient, db_url: str
) -> None:
    # A poll far longer than the test waits: only the append's wake-up can start it.
    config = WorkerConfig(poll_seconds=600.0)
    async with Outbound(TEST_SETTINGS) as http:
        pool = WorkerPool(app.state.engine, config, http, count=1, grace_seconds=5)
        pool.start()
        try:
            await asyncio.sleep(0.5)  # the listener connects (and indexes nothing)
            await make_session(client, id="s", config=MANUAL)
            await append_ok(client, "s", _outputs("w"))
            deadline = time.monotonic() + 30
            while True:
                page = await search(client, "s", f"marker_{COUNT - 1}_w")
                if page["hits"] or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        finally:
            await pool.close()
    assert [h["seq"] for h in page["hits"]] == [1 + 2 * COUNT]
    assert page["pending"] == 0
