"""Idempotent retries, If-Match, and many appenders racing on one session."""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import httpx

from tests.conftest import make_session
from tests.helpers import append, append_ok, assert_problem, get_session, history


async def test_idempotent_retry_replays_the_first_response(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    msgs = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    first = await append(client, "s", msgs, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers

    again = await append(client, "s", msgs, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()

    s = await get_session(client, "s")
    assert s["entry_count"] == 2
    assert s["version"] == 2
    assert [e["message"] for e in await history(client, "s")] == msgs

    # Another key is another append.
    other = await append(client, "s", msgs, headers={"Idempotency-Key": "k-2"})
    assert other.status_code == 201
    assert [e["seq"] for e in other.json()["entries"]] == [3, 4]


async def test_same_key_with_a_different_body_is_422(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    await append(client, "s", [{"role": "user", "content": "a"}], headers={"Idempotency-Key": "k"})
    r = await append(
        client, "s", [{"role": "user", "content": "b"}], headers={"Idempotency-Key": "k"}
    )
    assert_problem(r, 422, "Idempotency-Key")
    r = await append(
        client,
        "s",
        [{"role": "user", "content": "a"}],
        fmt="anthropic",
        headers={"Idempotency-Key": "k"},
    )
    assert_problem(r, 422, "Idempotency-Key")
    s = await get_session(client, "s")
    assert s["entry_count"] == 1
    assert [e["message"]["content"] for e in await history(client, "s")] == ["a"]


async def test_idempotency_keys_are_per_session(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s1")
    await make_session(client, id="s2")
    msgs = [{"role": "user", "content": "same"}]
    a = await append(client, "s1", msgs, headers={"Idempotency-Key": "k"})
    b = await append(client, "s2", msgs, headers={"Idempotency-Key": "k"})
    assert a.status_code == b.status_code == 201
    assert "idempotent-replayed" not in b.headers
    assert (await get_session(client, "s2"))["entry_count"] == 1


async def test_concurrent_requests_with_one_key_store_once(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    msgs = [{"role": "user", "content": "only once"}, {"role": "assistant", "content": "ok"}]
    results = await asyncio.gather(
        *(append(client, "s", msgs, headers={"Idempotency-Key": "race"}) for _ in range(10))
    )
    assert all(r.status_code == 201 for r in results), [r.text for r in results]
    assert len({r.text for r in results}) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in results) == 9
    s = await get_session(client, "s")
    assert s["entry_count"] == 2
    assert s["version"] == 2
    assert [e["message"] for e in await history(client, "s")] == msgs


async def test_if_match(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    r = await append(client, "s", [{"role": "user", "content": "one"}], headers={"If-Match": '"1"'})
    assert r.status_code == 201, r.text
    assert r.json()["version"] == 2

    stale = await append(
        client, "s", [{"role": "user", "content": "two"}], headers={"If-Match": '"1"'}
    )
    doc = assert_problem(stale, 412, "1")
    assert doc["current_version"] == 2
    s = await get_session(client, "s")
    assert s["entry_count"] == 1
    assert s["version"] == 2
    assert [e["message"]["content"] for e in await history(client, "s")] == ["one"]

    r = await append(
        client, "s", [{"role": "user", "content": "two"}], headers={"If-Match": 'W/"2"'}
    )
    assert r.status_code == 201, r.text


async def test_many_concurrent_appenders_get_gapless_seqs(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    rng = random.Random(7)
    batches: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": f"writer {w} message {i}"} for i in range(rng.randint(2, 4))]
        for w in range(25)
    ]
    results = await asyncio.gather(*(append(client, "s", b) for b in batches))
    assert all(r.status_code == 201 for r in results), [
        r.text for r in results if r.status_code != 201
    ]
    total = sum(len(b) for b in batches)

    # Each batch got a contiguous run of seqs, in its own order.
    for batch, r in zip(batches, results, strict=True):
        seqs = [e["seq"] for e in r.json()["entries"]]
        assert len(seqs) == len(batch)
        assert seqs == list(range(seqs[0], seqs[0] + len(batch)))
    all_seqs = sorted(e["seq"] for r in results for e in r.json()["entries"])
    assert all_seqs == list(range(1, total + 1))
    assert len({r.json()["version"] for r in results}) == 25

    stored = await history(client, "s", limit=17)
    assert [e["seq"] for e in stored] == list(range(1, total + 1))
    contents = [e["message"]["content"] for e in stored]
    assert sorted(contents) == sorted(m["content"] for b in batches for m in b)
    # A batch is stored contiguously and in order.
    by_seq = {e["seq"]: e["message"] for e in stored}
    for batch, r in zip(batches, results, strict=True):
        assert [by_seq[e["seq"]] for e in r.json()["entries"]] == batch

    s = await get_session(client, "s")
    assert s["entry_count"] == total
    assert s["version"] == 26
    assert s["stored_tokens"] == sum(e["tokens"] for r in results for e in r.json()["entries"])

    # The next append continues after the last one.
    more = await append_ok(client, "s", [{"role": "user", "content": "after the race"}])
    assert more["entries"][0]["seq"] == total + 1


async def test_appends_to_one_session_take_turns_and_leave_no_locks_behind() -> None:
    import asyncio

    from app.core.keyed_locks import KeyedLocks

    turns = KeyedLocks()
    inside: list[int] = []
    order: list[int] = []

    async def one(k: int, key: tuple[str, str]) -> None:
        async with turns.held(key):
            inside.append(k)
            assert len([x for x in inside if x < 100]) <= 1  # one at a time per key
            await asyncio.sleep(0)
            order.append(k)
            inside.remove(k)

    await asyncio.gather(*(one(k, ("t", "a")) for k in range(20)), one(100, ("t", "b")))
    assert sorted(order) == [*range(20), 100]
    assert [k for k in order if k < 100] == list(range(20))  # first come, first served
    assert turns._locks == {}

    task = asyncio.create_task(one(7, ("t", "c")))
    async with turns.held(("t", "c")):
        await asyncio.sleep(0)
        task.cancel()  # cancelled while waiting for its turn
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert turns._locks == {}
