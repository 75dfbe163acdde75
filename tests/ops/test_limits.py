"""Slow clients and crowds cannot exhaust the service: a bounded queue, a deadline per
request (408 for a body still arriving, 503 for a slow answer), each a clear error."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx

from app.main import create_app
from tests import postgres
from tests.conftest import make_session
from tests.e2e.server import running
from tests.helpers import assert_problem, history
from tests.ops.conftest import settings_with


@contextlib.asynccontextmanager
async def served(db_url: str, **changes: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    application = create_app(settings_with(**changes), database_url=db_url)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
            yield application, c


@contextlib.asynccontextmanager
async def session_locked(db_url: str, session_id: str) -> AsyncIterator[None]:
    """Holds the session's row lock, so an append waits inside its transaction."""
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        async with conn.transaction():
            await conn.execute("SELECT 1 FROM session WHERE id = $1 FOR UPDATE", session_id)
            yield
    finally:
        await conn.close()


USER = [{"role": "user", "content": "hello"}]


async def test_a_full_queue_gets_503_at_once(db_url: str) -> None:
    async with served(db_url, max_concurrent_requests=1, max_queued_requests=1) as (_, client):
        sid = (await make_session(client))["id"]
        async with session_locked(db_url, sid):
            running_one = asyncio.create_task(
                client.post(f"/v1/sessions/{sid}/messages", json={"messages": USER})
            )
            await asyncio.sleep(0.2)
            queued = asyncio.create_task(client.get(f"/v1/sessions/{sid}"))
            await asyncio.sleep(0.2)
            refused = await client.get(f"/v1/sessions/{sid}")
            assert_problem(refused, 503, "capacity")
            assert refused.headers["retry-after"] == "1"
            # Probes still answer while the service is saturated.
            assert (await client.get("/healthz")).status_code == 200
            assert not queued.done()
        assert (await running_one).status_code == 201
        assert (await queued).status_code == 200


async def test_a_request_queued_past_the_deadline_gets_503(db_url: str) -> None:
    async with served(db_url, max_concurrent_requests=1, request_timeout_seconds=0.5) as (
        _,
        client,
    ):
        sid = (await make_session(client))["id"]
        async with session_locked(db_url, sid):
            held = asyncio.create_task(
                client.post(f"/v1/sessions/{sid}/messages", json={"messages": USER})
            )
            await asyncio.sleep(0.1)
            late = await client.get(f"/v1/sessions/{sid}")
            assert_problem(late, 503, "no free slot within 0.5 s")
            assert late.headers["retry-after"] == "1"
        # The request that held the slot is never cut halfway: it completes.
        assert (await held).status_code == 201
        assert len(await history(client, sid)) == 1


async def test_a_compaction_wait_is_not_cut_by_the_deadline(db_url: str) -> None:
    async with served(db_url, request_timeout_seconds=0.5) as (_, client):
        config = {"compaction": {"auto": False, "keep_recent_tokens": 200}}
        sid = (await make_session(client, config=config))["id"]
        long = [{"role": "user", "content": f"part {i}: " + "words " * 200} for i in range(6)]
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": long})
        assert r.status_code == 201, r.text
        # No worker runs here, so the job stays queued for the whole wait.
        waited = await client.post(f"/v1/sessions/{sid}/compactions", json={"wait": 1.2})
        assert waited.status_code == 202, waited.text
        assert waited.json()["status"] == "queued"


async def test_a_body_that_does_not_arrive_gets_408(db_url: str) -> None:
    application = create_app(settings_with(request_timeout_seconds=0.5), database_url=db_url)
    with running(application) as base:
        port = int(base.rsplit(":", 1)[1])

        def trickle() -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(
                    b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\n"
                    b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"'
                )
                sock.settimeout(10)
                answer = b""
                while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    answer += chunk
                return answer

        answer = await asyncio.to_thread(trickle)
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408"), answer
        assert b"application/problem+json" in head
        assert b"did not arrive within 0.5 s" in body
        async with httpx.AsyncClient(base_url=base) as client:
            listed = await client.get("/v1/sessions")
            assert listed.json()["sessions"] == []


async def test_a_huge_body_is_refused_before_it_is_read(client: httpx.AsyncClient) -> None:
    sid = (await make_session(client))["id"]
    huge = {"messages": [{"role": "user", "content": "x" * (3 * 1024 * 1024)}]}
    r = await client.post(f"/v1/sessions/{sid}/messages", json=huge)
    assert_problem(r, 413, "limit")
    assert await history(client, sid) == []


async def test_a_statement_held_past_the_timeout_gets_503_and_stores_nothing(db_url: str) -> None:
    async with served(db_url, db_statement_timeout_seconds=0.5) as (_, client):
        sid = (await make_session(client))["id"]
        async with session_locked(db_url, sid):
            slow = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": USER})
            assert_problem(slow, 503, "retry")
            assert slow.headers["retry-after"]
        assert await history(client, sid) == []
        # Its connection is fine afterwards, and so is the pool.
        ok = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": USER})
        assert ok.status_code == 201, ok.text
        assert len(await history(client, sid)) == 1
