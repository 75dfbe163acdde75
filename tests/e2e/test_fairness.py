"""One tenant, or no tenant at all, cannot starve the others (issue 11), through a real
uvicorn server set up as ``compactd serve`` sets it up: slow bodies hold no slot, a
flood of forged keys takes no place in the queue, and each tenant has its share."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections import Counter
from collections.abc import AsyncIterator

import httpx
from prometheus_client import REGISTRY

from app.main import create_app
from tests.e2e.server import running
from tests.helpers import key_table_locked
from tests.ops.conftest import bearer, create_key, settings_with

SLOTS = 4


def gauge(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def settle(name: str, at_least: float, within: float = 10.0) -> None:
    """Until the server's gauge reaches a value (the server runs in this process), or
    for ``within`` seconds at most: a readiness hint, not a check."""
    for _ in range(int(within / 0.05)):
        if gauge(name) >= at_least:
            return
        await asyncio.sleep(0.05)


async def new_session(client: httpx.AsyncClient, key: str) -> str:
    """A session of the key's tenant; its id."""
    created = await client.post("/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(key))
    assert created.status_code == 201, created.text
    sid: str = created.json()["id"]
    return sid


@contextlib.asynccontextmanager
async def trickling_bodies(port: int, key: str, count: int) -> AsyncIterator[None]:
    """``count`` appends whose bodies arrive a byte every half second, for as long as
    the block lasts."""
    body_length = 10_000
    head = (
        f"POST /v1/sessions HTTP/1.1\r\nHost: compactd\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {body_length}\r\n\r\n"
    ).encode()

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(head + b'{"model": "gpt-4o", "metadata": {"x": "')
        while True:
            await writer.drain()
            await asyncio.sleep(0.5)
            writer.write(b"a")

    writers = [(await asyncio.open_connection("127.0.0.1", port))[1] for _ in range(count)]
    tasks = [asyncio.create_task(trickle(w)) for w in writers]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for w in writers:
            w.close()


async def test_one_tenants_slow_bodies_do_not_hold_up_another_tenant(db_url: str) -> None:
    settings = settings_with(
        max_concurrent_requests=SLOTS, max_queued_requests=64, request_timeout_seconds=30
    )
    key_a = await create_key(db_url, "tenant-a")
    key_b = await create_key(db_url, "tenant-b")
    application = create_app(settings, database_url=db_url)
    with running(application) as base:
        port = int(base.rsplit(":", 1)[1])
        slow = 3 * SLOTS  # more uploads than there are slots
        async with (
            trickling_bodies(port, key_a, slow),
            httpx.AsyncClient(base_url=base, timeout=60) as client,
        ):
            # Every upload has its head in and its body arriving.
            await settle("compactd_http_requests_receiving", slow)
            started = time.perf_counter()
            created = await client.post(
                "/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(key_b)
            )
            b_latency = time.perf_counter() - started
            print(
                f"\n[fairness] tenant B answered in {b_latency * 1000:.1f} ms "
                f"while tenant A had {slow} bodies trickling"
            )
            assert created.status_code == 201, created.text
            # Nor do they hold up tenant A's own quick requests (within its share).
            started = time.perf_counter()
            listed = await client.get("/v1/sessions", headers=bearer(key_a))
            print(
                f"[fairness] tenant A's own read: {(time.perf_counter() - started) * 1000:.1f} ms"
            )
            assert listed.status_code == 200, listed.text
            assert listed.json()["sessions"] == []  # none of the trickles got through
            # They are still there, waiting for their bodies, and hold no slot.
            assert gauge("compactd_http_requests_receiving") >= slow
            assert gauge("compactd_http_requests_in_flight") == 0
        # The server stays sound once the trickling clients are gone.
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            listed = await client.get("/v1/sessions", headers=bearer(key_b))
            assert [s["id"] for s in listed.json()["sessions"]] == [created.json()["id"]]


def forged_key() -> str:
    return f"cpd_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)[:43]}"


async def forged_flood(port: int, path: str, size: int) -> list[asyncio.Task[bytes]]:
    """``size`` appends, each with a key of its own that no one created, sent all at once
    once every connection is open; each task gives the status line it got."""
    body = b'{"messages": [{"role": "user", "content": "let me in"}]}'
    connections = [await asyncio.open_connection("127.0.0.1", port) for _ in range(size)]
    for _, writer in connections:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: compactd\r\nAuthorization: Bearer {forged_key()}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + body
        )

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bytes:
        try:
            return (await reader.read()).split(b"\r\n", 1)[0]
        finally:
            writer.close()

    return [asyncio.create_task(answer(r, w)) for r, w in connections]


async def test_a_flood_of_forged_keys_turns_no_tenant_request_away(db_url: str) -> None:
    # Small limits: were the key checked after a request takes its place, the flood
    # alone would fill them (forged ids are looked up four at a time).
    settings = settings_with(
        max_concurrent_requests=SLOTS, max_queued_requests=16, auth_cache_seconds=0.0
    )
    key = await create_key(db_url, "tenant-a")
    application = create_app(settings, database_url=db_url)
    flood_size, workers, per_worker = 600, 4, 10
    with running(application) as base:
        port = int(base.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            sid = await new_session(client, key)

            async def legitimate() -> list[tuple[int, float]]:
                answers = []
                for _ in range(per_worker):
                    started = time.perf_counter()
                    r = await client.get(f"/v1/sessions/{sid}/context", headers=bearer(key))
                    answers.append((r.status_code, time.perf_counter() - started))
                return answers

            started = time.perf_counter()
            flood = await forged_flood(port, f"/v1/sessions/{sid}/messages", flood_size)
            legit = await asyncio.gather(*(legitimate() for _ in range(workers)))
            flood_statuses = Counter(await asyncio.gather(*flood))
            elapsed = time.perf_counter() - started

        answers = [a for worker in legit for a in worker]
        latencies = sorted(t for _, t in answers)
        print(
            f"\n[forged flood] {flood_size} forged requests answered {dict(flood_statuses)} "
            f"in {elapsed:.2f} s; {len(answers)} tenant requests meanwhile, latency median "
            f"{latencies[len(latencies) // 2] * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms "
            "(the clients run in the server's process)"
        )
        assert Counter(status for status, _ in answers) == Counter({200: workers * per_worker})
        # Every forged request got its 401: none was counted against the queue (503).
        assert flood_statuses == Counter({b"HTTP/1.1 401 Unauthorized": flood_size})
        # Nothing the flood sent was stored.
        async with httpx.AsyncClient(base_url=base) as client:
            history = await client.get(f"/v1/sessions/{sid}/messages", headers=bearer(key))
            assert history.status_code == 200
            assert history.json()["entries"] == []


async def test_a_keys_first_use_does_not_wait_behind_a_flood_of_forged_keys(
    db_url: str,
) -> None:
    """A key never used since the server started, presented while hundreds of forged
    keys arrive and reading the key table is blocked: the server knows it from the one
    read it made at its first request, and answers at once. Before, a key not yet in
    the cache was looked up like the forged ids, four at a time in arrival order with
    no deadline, and waited behind every one of them (here: for good)."""
    settings = settings_with(
        auth_cache_seconds=60,
        # Reads that wait for the lock wait until it ends, rather than fail.
        db_statement_timeout_seconds=0,
        db_command_timeout_seconds=120,
    )
    first = await create_key(db_url, "tenant-a")
    unused = await create_key(db_url, "tenant-b")
    application = create_app(settings, database_url=db_url)
    flood_size = 400
    with running(application) as base:
        port = int(base.rsplit(":", 1)[1])
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            sid = await new_session(client, first)
            async with key_table_locked(db_url):
                flood = await forged_flood(port, f"/v1/sessions/{sid}/messages", flood_size)
                started = time.perf_counter()
                answer = await asyncio.wait_for(
                    client.post("/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(unused)),
                    timeout=30,
                )
                latency = time.perf_counter() - started
                print(
                    f"\n[first use] a key's first request answered {answer.status_code} in "
                    f"{latency * 1000:.1f} ms during a flood of {flood_size} forged keys "
                    "(reading the key table blocked)"
                )
                assert answer.status_code == 201, answer.text
            flood_statuses = Counter(await asyncio.gather(*flood))
            print(f"[first use] the forged requests: {dict(flood_statuses)}")
            assert flood_statuses == Counter({b"HTTP/1.1 401 Unauthorized": flood_size})
            # The session is tenant B's, and A's is A's.
            listed = await client.get("/v1/sessions", headers=bearer(unused))
            assert [s["id"] for s in listed.json()["sessions"]] == [answer.json()["id"]]
