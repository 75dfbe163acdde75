"""Slow clients and crowds cannot exhaust the service: a bounded queue, a deadline per
request (408 for a body still arriving, 503 for a slow answer), each a clear error; and
tenants share the slots and the queue fairly (see also tests/e2e/test_fairness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.core.limits import KEYLESS_BODY_BYTES, KEYLESS_PLACES, NO_TENANT, FairSlots, Limits
from app.main import create_app
from tests.conftest import make_session
from tests.e2e.server import running
from tests.helpers import assert_problem, history, session_locked
from tests.ops.conftest import bearer, create_key, settings_with


@contextlib.asynccontextmanager
async def served(db_url: str, **changes: Any) -> AsyncIterator[tuple[Any, httpx.AsyncClient]]:
    application = create_app(settings_with(**changes), database_url=db_url)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
            yield application, c


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


async def test_a_chunked_body_over_the_limit_is_refused_without_running_the_handler(
    client: httpx.AsyncClient,
) -> None:
    sid = (await make_session(client))["id"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: sent chunked
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(3):
            yield b"x" * (1024 * 1024)
        yield b'"}]}'

    r = await client.post(f"/v1/sessions/{sid}/messages", content=chunks())
    assert_problem(r, 413, "2097152-byte limit")
    assert await history(client, sid) == []


async def test_one_tenant_holding_its_share_of_slots_leaves_the_rest_to_others(
    db_url: str,
) -> None:
    """Two slots, one each: tenant A's appends wait on a row lock inside their handler,
    yet tenant B's requests run at once."""
    key_a = await create_key(db_url, "tenant-a")
    key_b = await create_key(db_url, "tenant-b")
    async with served(db_url, max_concurrent_requests=2) as (_, client):
        r = await client.post("/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(key_a))
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        async with session_locked(db_url, sid):
            held = [
                asyncio.create_task(
                    client.post(
                        f"/v1/sessions/{sid}/messages",
                        json={"messages": USER},
                        headers=bearer(key_a),
                    )
                )
                for _ in range(3)
            ]
            await asyncio.sleep(0.3)
            for _ in range(3):
                r = await client.post(
                    "/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(key_b)
                )
                assert r.status_code == 201, r.text
            assert not any(task.done() for task in held)
        assert [(await task).status_code for task in held] == [201, 201, 201]


async def test_a_tenant_over_its_share_of_the_queue_gets_503_and_others_do_not(
    db_url: str,
) -> None:
    key_a = await create_key(db_url, "tenant-a")
    key_b = await create_key(db_url, "tenant-b")
    async with served(
        db_url,
        max_concurrent_requests=2,
        max_queued_requests=8,
        max_tenant_concurrent_requests=1,
        max_tenant_queued_requests=1,
    ) as (_, client):
        r = await client.post("/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(key_a))
        sid = r.json()["id"]
        async with session_locked(db_url, sid):
            append = {"messages": USER}
            running_one = asyncio.create_task(
                client.post(f"/v1/sessions/{sid}/messages", json=append, headers=bearer(key_a))
            )
            await asyncio.sleep(0.2)
            queued = asyncio.create_task(client.get(f"/v1/sessions/{sid}", headers=bearer(key_a)))
            await asyncio.sleep(0.2)
            refused = await client.get(f"/v1/sessions/{sid}", headers=bearer(key_a))
            assert_problem(refused, 503, "this tenant is at its share")
            assert refused.headers["retry-after"] == "1"
            other = await client.get("/v1/sessions", headers=bearer(key_b))
            assert other.status_code == 200, other.text
            assert not queued.done()
        assert (await running_one).status_code == 201
        assert (await queued).status_code == 200


async def test_bodies_held_in_memory_are_bounded_in_all(db_url: str) -> None:
    """Bodies are read before a slot: past max_buffered_body_bytes held at once, another
    body gets 503 (bodies_full) instead of more memory; once they are gone, it is served."""
    async with served(
        db_url,
        max_concurrent_requests=1,
        max_buffered_body_bytes=6000,
        max_tenant_buffered_body_bytes=6000,  # one tenant here: its share is the whole
        max_body_bytes=5000,
    ) as (_, client):
        sid = (await make_session(client))["id"]
        big = [{"role": "user", "content": "x" * 4000}]
        async with session_locked(db_url, sid):
            held = asyncio.create_task(
                client.post(f"/v1/sessions/{sid}/messages", json={"messages": big})
            )
            await asyncio.sleep(0.3)
            refused = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": big})
            assert_problem(refused, 503, "bytes of request bodies")
            assert refused.headers["retry-after"] == "1"
            # A small body still fits beside the held one.
            small = asyncio.create_task(client.get(f"/v1/sessions/{sid}"))
            await asyncio.sleep(0.2)
        assert (await held).status_code == 201
        assert (await small).status_code == 200
        again = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": big})
        assert again.status_code == 201, again.text
        assert len(await history(client, sid)) == 2


def stalled(first: bytes, gate: asyncio.Event, rest: bytes = b"") -> AsyncIterator[bytes]:
    """A body sent chunked: ``first``, then nothing until ``gate`` opens, then ``rest``."""

    async def chunks() -> AsyncIterator[bytes]:
        yield first
        await gate.wait()
        if rest:
            yield rest

    return chunks()


async def test_one_tenants_held_bodies_leave_room_for_another_tenants(db_url: str) -> None:
    """Each tenant holds at most its share of max_buffered_body_bytes (half by default):
    tenant A's stalled uploads are refused past 4,000 bytes of the 8,000, and tenant B's
    small request still finds room (it got 503 bodies_full when A could fill it all)."""
    key_a = await create_key(db_url, "tenant-a")
    key_b = await create_key(db_url, "tenant-b")
    gate = asyncio.Event()
    async with served(db_url, max_buffered_body_bytes=8000, max_body_bytes=5000) as (_, client):
        head = b'{"model": "gpt-4o", "metadata": {"x": "' + b"a" * 1460
        uploads = []
        for _ in range(6):
            uploads.append(
                asyncio.create_task(
                    client.post(
                        "/v1/sessions",
                        content=stalled(head, gate, b'"}}'),
                        headers={**bearer(key_a), "Content-Type": "application/json"},
                    )
                )
            )
            await asyncio.sleep(0.1)
        refused = [task for task in uploads if task.done()]
        assert len(refused) == 4  # 2 x 1,500 bytes held; a third would go past 4,000
        for task in refused:
            r = task.result()
            assert_problem(r, 503, "this tenant holds", "4000-byte share")
            assert r.headers["retry-after"] == "1"
        b_message = {"messages": [{"role": "user", "content": "b" * 1000}]}
        created = await client.post("/v1/sessions", json={"model": "gpt-4o"}, headers=bearer(key_b))
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        r = await client.post(f"/v1/sessions/{sid}/messages", json=b_message, headers=bearer(key_b))
        assert r.status_code == 201, r.text
        gate.set()
        held = [await task for task in uploads if task not in refused]
        assert [r.status_code for r in held] == [201, 201], [r.text for r in held]
        listed = await client.get("/v1/sessions", headers=bearer(key_a))
        assert len(listed.json()["sessions"]) == 2


async def test_requests_that_need_no_key_get_a_small_body_cap_and_few_places(
    db_url: str,
) -> None:
    """Outside /v1 no key is needed and no route takes a body: such a request may send at
    most 64 KiB (else 413) and at most 16 are in the process at once (else 503), so no
    one without a key can hold the memory or the queue places that tenants need."""
    gate = asyncio.Event()
    async with served(db_url) as (_, client):
        r = await client.post("/anything", content=b"x" * (100 * 1024))
        assert_problem(r, 413, "65536-byte limit", "no API key")
        assert r.headers["connection"] == "close"

        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(3):
                yield b"x" * (30 * 1024)

        r = await client.post("/anything", content=chunks())
        assert_problem(r, 413, "65536-byte limit")
        assert r.headers["connection"] == "close"

        held = []
        for _ in range(16):
            held.append(
                asyncio.create_task(client.post("/anything", content=stalled(b"x" * 1024, gate)))
            )
        await asyncio.sleep(0.3)
        assert not any(task.done() for task in held)
        refused = await client.post("/docs", content=b"{}")
        assert_problem(refused, 503, "need no API key", "16")
        assert refused.headers["retry-after"] == "1"
        # A tenant's requests (here the open mode's `default`) are served meanwhile.
        sid = (await make_session(client))["id"]
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": USER})
        assert r.status_code == 201, r.text
        gate.set()
        assert [(await task).status_code for task in held] == [404] * 16
        # Their places are free again.
        assert (await client.post("/docs", content=b"{}")).status_code == 405


def send_oversized_body(port: int, total: int) -> tuple[bytes, int]:
    """An append declaring a ``total``-byte body, sent while the answer is read; gives
    the answer (empty if the close reset the connection first) and the bytes that went
    out before the server closed."""
    head = (
        f"POST /v1/sessions/s/messages HTTP/1.1\r\nHost: compactd\r\n"
        f"Content-Type: application/json\r\nContent-Length: {total}\r\n\r\n"
    ).encode()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)

        def send() -> None:
            nonlocal sent
            piece = b"x" * 65536
            with contextlib.suppress(OSError):
                while sent < total:
                    sent += sock.send(piece[: total - sent])

        sender = threading.Thread(target=send)
        sender.start()
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    sender.join(timeout=30)
    return answer, sent


async def test_a_413_closes_the_connection_instead_of_reading_the_rest(db_url: str) -> None:
    """Without `Connection: close` uvicorn went on reading (and dropping) the whole body."""
    application = create_app(settings_with(), database_url=db_url)  # 2 MiB bodies at most
    total = 128 * 1024 * 1024
    with running(application) as base:
        port = int(base.rsplit(":", 1)[1])
        answer, sent = await asyncio.to_thread(send_oversized_body, port, total)
        print(f"\n[413] {sent:,} of {total:,} bytes went out before the server closed")
        assert answer == b"" or answer.startswith(b"HTTP/1.1 413"), answer[:300]
        if answer:
            assert b"\r\nconnection: close\r\n" in answer.lower(), answer[:300]
        assert sent < total


# ----------------------------------------------------------- the slots themselves


def limits(**changes: Any) -> Limits:
    base = Limits(
        max_concurrent=2,
        max_queued=4,
        tenant_concurrent=2,
        tenant_queued=4,
        max_body_bytes=1024,
        max_buffered_body_bytes=1 << 20,
        tenant_buffered_body_bytes=1 << 20,
        timeout=1.0,
    )
    return Limits(**{**base.__dict__, **changes})


async def settled() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_tenant_shares_default_to_half_the_servers_rounded_up() -> None:
    derived = Limits.from_settings(
        settings_with(max_concurrent_requests=5, max_queued_requests=1, max_buffered_body_bytes=9)
    )
    assert (derived.tenant_concurrent, derived.tenant_queued) == (3, 1)
    assert derived.tenant_buffered_body_bytes == 5
    explicit = Limits.from_settings(
        settings_with(
            max_tenant_concurrent_requests=7,
            max_tenant_queued_requests=0,
            max_tenant_buffered_body_bytes=1000,
        )
    )
    assert (explicit.tenant_concurrent, explicit.tenant_queued) == (7, 0)
    assert explicit.tenant_buffered_body_bytes == 1000


def test_body_memory_is_bounded_for_the_server_and_for_each_tenant() -> None:
    slots = FairSlots(limits(max_buffered_body_bytes=100, tenant_buffered_body_bytes=60))
    for tenant in ("a", "a", "b", "c"):
        assert slots.admit(tenant) is None
    assert slots.hold("a", 40) is None
    assert slots.hold("a", 21) == "tenant_bodies_full"  # 61 of a's 60
    assert slots.hold("b", 60) is None
    assert slots.hold("c", 1) == "bodies_full"  # 101 of the server's 100
    assert (slots.buffered, slots.buffered_by("a"), slots.buffered_by("b")) == (100, 40, 60)
    slots.drop("b", 60)
    assert slots.hold("c", 50) is None
    assert slots.fits("a", 10) is None
    assert slots.fits("a", 11) == "bodies_full"
    slots.drop("c", 50)
    assert slots.fits("a", 20) is None
    assert slots.fits("a", 21) == "tenant_bodies_full"


def test_requests_that_need_no_key_have_a_few_places_and_small_bodies() -> None:
    slots = FairSlots(limits(max_queued=100, tenant_queued=100))
    assert [slots.admit(NO_TENANT) for _ in range(KEYLESS_PLACES + 1)][-2:] == [
        None,
        "keyless_queue_full",
    ]
    assert slots.admit("a") is None  # a tenant still gets in
    assert slots.limits.body_limit(NO_TENANT) == min(1024, KEYLESS_BODY_BYTES)
    assert limits(max_body_bytes=1 << 30).body_limit(NO_TENANT) == KEYLESS_BODY_BYTES
    assert limits(max_body_bytes=1 << 30).body_limit("a") == 1 << 30


def test_admission_is_bounded_for_the_server_and_for_each_tenant() -> None:
    slots = FairSlots(limits(max_concurrent=2, max_queued=2, tenant_concurrent=1, tenant_queued=1))
    assert [slots.admit("a") for _ in range(3)] == [None, None, "tenant_queue_full"]
    assert [slots.admit("b") for _ in range(3)] == [None, None, "queue_full"]
    assert slots.in_process() == 4
    slots.leave("a")
    assert slots.admit("c") is None
    for tenant in ("a", "b", "b", "c"):
        slots.leave(tenant)
    assert slots.in_process() == 0


async def test_a_freed_slot_goes_to_the_tenant_with_fewest_running() -> None:
    slots = FairSlots(limits(max_concurrent=2, max_queued=8, tenant_queued=8))
    order: list[str] = []

    async def request(tenant: str) -> None:
        assert slots.admit(tenant) is None
        await slots.acquire(tenant)
        order.append(tenant)

    first = [asyncio.create_task(request("a")) for _ in range(2)]
    await settled()
    assert order == ["a", "a"]  # nobody else wanted them
    waiting = []
    for tenant in ("a", "a", "a", "b", "c"):
        waiting.append(asyncio.create_task(request(tenant)))
        await settled()
    slots.release("a")  # b and c have none running, a one: b, the first of them to come
    await settled()
    slots.release("a")  # a and c have none running: a's request came before c's
    await settled()
    assert order == ["a", "a", "b", "a"]
    slots.release("b")  # c has none running, a one
    await settled()
    assert order == ["a", "a", "b", "a", "c"]
    for tenant in ("c", "a"):
        slots.release(tenant)
    await settled()
    assert order == ["a", "a", "b", "a", "c", "a", "a"]
    await asyncio.gather(*first, *waiting)


async def test_a_tenant_at_its_share_waits_while_slots_stay_free_for_others() -> None:
    slots = FairSlots(limits(max_concurrent=4, tenant_concurrent=1))
    for tenant in ("a", "a", "b"):
        assert slots.admit(tenant) is None
    await slots.acquire("a")
    second = asyncio.create_task(slots.acquire("a"))
    await settled()
    assert not second.done()
    await asyncio.wait_for(slots.acquire("b"), timeout=1)  # a free slot, b's share
    slots.release("a")
    await asyncio.wait_for(second, timeout=1)


async def test_a_waiter_that_gives_up_loses_no_slot() -> None:
    slots = FairSlots(limits(max_concurrent=1))
    for tenant in ("a", "a", "a"):
        assert slots.admit(tenant) is None
    await slots.acquire("a")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await slots.acquire("a")
    # One granted the slot in the very turn it is cancelled hands it on.
    granted = asyncio.create_task(slots.acquire("a"))
    await settled()
    slots.release("a")
    granted.cancel()
    with pytest.raises(asyncio.CancelledError):
        await granted
    await asyncio.wait_for(slots.acquire("a"), timeout=1)
