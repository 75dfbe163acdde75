"""The API behind PgBouncer in transaction pooling (the app's database URL is the
pooler's, its LISTEN connections go to the direct URL): appends, one session's appends
racing from two processes (two apps, two engines, two in-process append locks: only the
database keeps them apart), Idempotency-Key retries, If-Match, the context read, a
compaction run by a real worker, the workers and the search indexer woken by NOTIFY on
the direct connection with no poll, an event stream, and the tenant's webhook limit
(held by a transaction-level advisory lock)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from sqlalchemy import make_url

from app.compactions.worker import WorkerConfig, WorkerPool, listen_dsn
from app.core.outbound import Outbound
from app.main import create_app
from tests.compactions.helpers import compaction, conversation, drain
from tests.compactions.worker_support import request_compaction
from tests.conftest import TEST_SETTINGS, make_session
from tests.e2e.server import running
from tests.events.sse import open_stream
from tests.helpers import append, append_ok, assert_problem, get_session, history, tool_call
from tests.pgbouncer.conftest import Bouncer, client_of, served
from tests.recall.support import MANUAL, search
from tests.recall.test_indexer import COUNT, _outputs

WEBHOOK = "https://hooks.example.com/compactd"
# Compacted only when asked, and then with something to compact.
MANUAL_COMPACTION = {
    "compaction": {"auto": False, "keep_recent_tokens": 500},
    "prune": {"auto": False},
}


async def test_appends_history_and_context(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s", config=MANUAL)
    sent: list[dict[str, Any]] = []
    for batch in conversation(6, words=40):
        stored = await append_ok(client, "s", batch)
        assert [e["seq"] for e in stored["entries"]] == list(
            range(len(sent) + 1, len(sent) + len(batch) + 1)
        )
        sent += batch
    assert [e["message"] for e in await history(client, "s", limit=7)] == sent

    r = await client.get("/v1/sessions/s/context")
    assert r.status_code == 200, r.text
    context = r.json()
    assert context["messages"] == sent
    assert context["state"] == "ok"
    r = await client.get("/v1/sessions/s/context", params={"format": "anthropic"})
    assert r.status_code == 200, r.text
    assert r.json()["system"]

    r = await client.post("/v1/sessions/s/usage", json={"input_tokens": 900, "output_tokens": 20})
    assert r.status_code == 200, r.text
    session = await get_session(client, "s")
    assert session["entry_count"] == len(sent)
    assert session["last_usage"]["input_tokens"] == 900


async def test_one_sessions_appends_from_two_processes_get_gapless_seqs(
    app: Any, client: httpx.AsyncClient, pooled_url: str, settings: Any
) -> None:
    await make_session(client, id="s")
    batches = [
        [{"role": "user", "content": f"writer {w} message {i}"} for i in range(2 + w % 3)]
        for w in range(30)
    ]
    async with served(pooled_url, settings) as other_app, client_of(other_app) as other:
        clients = (client, other)
        results = await asyncio.gather(
            *(append(clients[w % 2], "s", b) for w, b in enumerate(batches))
        )
    assert [r.status_code for r in results] == [201] * len(batches), [
        r.text for r in results if r.status_code != 201
    ]
    total = sum(len(b) for b in batches)
    for batch, r in zip(batches, results, strict=True):
        seqs = [e["seq"] for e in r.json()["entries"]]
        assert seqs == list(range(seqs[0], seqs[0] + len(batch)))
    assert sorted(e["seq"] for r in results for e in r.json()["entries"]) == list(
        range(1, total + 1)
    )
    assert len({r.json()["version"] for r in results}) == len(batches)
    by_seq = {e["seq"]: e["message"] for e in await history(client, "s", limit=13)}
    for batch, r in zip(batches, results, strict=True):
        assert [by_seq[e["seq"]] for e in r.json()["entries"]] == batch
    session = await get_session(client, "s")
    assert session["entry_count"] == total
    assert session["version"] == len(batches) + 1


async def test_idempotent_retries_from_two_processes_store_once(
    app: Any, client: httpx.AsyncClient, pooled_url: str, settings: Any
) -> None:
    await make_session(client, id="s")
    msgs: list[dict[str, Any]] = [
        {"role": "assistant", "content": None, "tool_calls": [tool_call("c1")]},
        {"role": "tool", "tool_call_id": "c1", "content": "only once"},
    ]
    key = {"Idempotency-Key": "race"}
    async with served(pooled_url, settings) as other_app, client_of(other_app) as other:
        clients = (client, other)
        results = await asyncio.gather(
            *(append(clients[i % 2], "s", msgs, headers=key) for i in range(10))
        )
        assert all(r.status_code == 201 for r in results), [r.text for r in results]
        assert len({r.text for r in results}) == 1
        assert sum(r.headers.get("idempotent-replayed") == "true" for r in results) == 9
        # A retry later, from the other process, replays; another body is refused.
        again = await append(other, "s", msgs, headers=key)
        assert again.headers["idempotent-replayed"] == "true"
        assert again.json() == results[0].json()
        assert_problem(await append(other, "s", msgs[:1], headers=key), 422, "Idempotency-Key")
    assert [e["message"] for e in await history(client, "s")] == msgs
    stale = await append(
        client, "s", [{"role": "user", "content": "x"}], headers={"If-Match": '"1"'}
    )
    assert_problem(stale, 412, "1")
    session = await get_session(client, "s")
    assert (session["entry_count"], session["version"]) == (2, 2)


async def test_a_compaction_run_by_a_real_worker(app: Any, client: httpx.AsyncClient) -> None:
    await make_session(client, id="s", config=MANUAL_COMPACTION)
    for batch in conversation(12):
        await append_ok(client, "s", batch)
    job = await request_compaction(client, "s")
    assert await drain(app) == 1
    done = await compaction(client, "s", job["id"])
    assert done["status"] == "succeeded", done
    assert done["tokens_after"] < done["tokens_before"]
    r = await client.get("/v1/sessions/s/context")
    assert r.status_code == 200, r.text
    context = r.json()
    assert context["compaction"]["entry_seq"] == done["entry_seq"]
    assert context["compaction"]["first_kept_seq"] == done["first_kept_seq"]
    assert sum(done["summary"] in str(m["content"]) for m in context["messages"]) == 1
    assert (await get_session(client, "s"))["compaction_count"] == 1


def _address(url: str) -> tuple[str | None, int | None, str | None]:
    parsed = make_url(url)
    return parsed.host, parsed.port, parsed.query.get("host")  # type: ignore[return-value]


@pytest.mark.slow
async def test_the_workers_and_the_indexer_wake_on_notify_over_the_direct_connection(
    app: Any, client: httpx.AsyncClient, db_url: str, pgbouncer: Bouncer
) -> None:
    # The LISTEN goes to Postgres itself, not to the pooler.
    assert _address(listen_dsn(app.state.engine)) == _address(db_url)
    assert make_url(listen_dsn(app.state.engine)).port != pgbouncer.port
    # A poll far longer than the test waits: only a NOTIFY can start the work.
    config = WorkerConfig(poll_seconds=600.0)
    async with Outbound(TEST_SETTINGS) as http:
        pool = WorkerPool(app.state.engine, config, http, count=1, grace_seconds=5)
        pool.start()
        try:
            await asyncio.sleep(0.5)  # the listener connects (and finds nothing to do)
            await make_session(client, id="s", config=MANUAL_COMPACTION)
            for batch in conversation(12):
                await append_ok(client, "s", batch)
            job = await request_compaction(client, "s")
            await append_ok(client, "s", _outputs("w"))  # text left to the indexer
            deadline = time.monotonic() + 20
            while True:
                done = await compaction(client, "s", job["id"])
                page = await search(client, "s", f"marker_{COUNT - 1}_w")
                finished = done["status"] == "succeeded" and page["hits"]
                if finished or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
        finally:
            await pool.close()
    assert done["status"] == "succeeded", done
    assert len(page["hits"]) == 1
    assert page["pending"] == 0


async def test_an_event_stream_behind_the_pooler(pooled_url: str, settings: Any) -> None:
    with running(create_app(settings, database_url=pooled_url)) as base:
        async with httpx.AsyncClient(base_url=base) as client:
            await make_session(client, id="s", config=MANUAL_COMPACTION)
            for batch in conversation(6):
                await append_ok(client, "s", batch)
            async with open_stream(base, "/v1/sessions/s/events") as stream:
                job = await request_compaction(client, "s")
                queued = await stream.next(within=10)
                r = await client.post(f"/v1/sessions/s/compactions/{job['id']}/cancel")
                assert r.status_code == 200, r.text
                cancelled = await stream.next(within=10)
    assert [queued.event, cancelled.event] == ["compaction.queued", "compaction.cancelled"]
    assert queued.data["data"]["compaction_id"] == cancelled.data["data"]["compaction_id"]
    assert queued.data["data"]["compaction_id"] == job["id"]


async def test_the_webhook_limit_holds_for_creates_at_once_from_two_processes(
    app: Any, client: httpx.AsyncClient, pooled_url: str, settings: Any
) -> None:
    for i in range(97):
        r = await client.post("/v1/webhooks", json={"url": f"{WEBHOOK}/{i}"})
        assert r.status_code == 201, r.text
    async with served(pooled_url, settings) as other_app, client_of(other_app) as other:
        clients = (client, other)
        results = await asyncio.gather(
            *(
                clients[i % 2].post("/v1/webhooks", json={"url": f"{WEBHOOK}/more/{i}"})
                for i in range(8)
            )
        )
    assert sorted(r.status_code for r in results) == [201] * 3 + [409] * 5, [
        r.text for r in results
    ]
    listed = (await client.get("/v1/webhooks")).json()["webhooks"]
    assert len(listed) == 100
