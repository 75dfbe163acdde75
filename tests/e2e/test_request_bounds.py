"""One request must not stall the service for everyone, over a real uvicorn server.

While a large request is processed, other clients poll ``/healthz`` and another
session's context. The tests print the worst latency they saw (timing is the
benchmark's business: ``python -m bench bounds``) and assert that they were
answered, and that the large request got the answer it should, bounded in size.

Decisions stated here:
- a body of a million integers as ``messages`` is a 422 naming ``messages`` (the
  array is over ``max_json_items``) before anything validates its items;
- a batch over ``max_batch_messages`` is a 422 before its messages are validated;
  within it, a 422 lists the first 20 errors and counts the rest;
- a million-element array inside a tool call's arguments is a 422 naming the
  arguments, in both formats (an OpenAI ``arguments`` string is parsed JSON too);
- the largest append the limits accept (``max_batch_messages`` messages in just
  under ``max_body_bytes``) is stored, counted in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import orjson

from app.core.http import MAX_REPORTED_ERRORS
from app.core.settings import Settings
from app.main import create_app
from tests.e2e.large_bodies import arguments_with_array, max_size_append, million_integers
from tests.e2e.server import running
from tests.helpers import assert_problem

JSON = {"content-type": "application/json"}


@dataclass
class Polls:
    """What other clients saw while the large request was processed."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    statuses: dict[str, list[int]] = field(default_factory=dict)

    def report(self, what: str, took: float) -> None:
        worst = ", ".join(
            f"{path} worst {max(lat) * 1000:.0f} ms over {len(lat)} polls"
            for path, lat in self.latencies.items()
        )
        print(f"\n  {what}: answered in {took * 1000:.0f} ms; meanwhile {worst}")

    def assert_answered(self) -> None:
        for path, statuses in self.statuses.items():
            assert statuses, f"{path} was never polled"
            assert set(statuses) == {200}, (path, statuses)


@contextlib.asynccontextmanager
async def polling(base_url: str, paths: list[str]) -> AsyncIterator[Polls]:
    """Poll each path back to back, each on its own connection, until the block ends
    (and at least once after it starts)."""
    polls = Polls()
    done = asyncio.Event()

    async def poll(path: str) -> None:
        lat = polls.latencies.setdefault(path, [])
        statuses = polls.statuses.setdefault(path, [])
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            while not done.is_set() or not statuses:
                t = time.perf_counter()
                r = await client.get(path)
                lat.append(time.perf_counter() - t)
                statuses.append(r.status_code)
                await asyncio.sleep(0.005)

    tasks = [asyncio.create_task(poll(path)) for path in paths]
    await asyncio.sleep(0.05)  # the pollers are connected and polling
    try:
        yield polls
    finally:
        done.set()
        await asyncio.gather(*tasks)


@contextlib.asynccontextmanager
async def _serving(db_url: str, settings: Settings) -> AsyncIterator[tuple[str, httpx.AsyncClient]]:
    """A real server and a client of it, with the sessions ``big`` (empty) for the
    large request and ``other`` (with a turn) to poll."""
    with running(create_app(settings, database_url=db_url)) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=300) as client:
            for sid in ("big", "other"):
                r = await client.post("/v1/sessions", json={"model": "gpt-4o", "id": sid})
                assert r.status_code == 201, r.text
            r = await client.post(
                "/v1/sessions/other/messages",
                json={
                    "messages": [
                        {"role": "user", "content": "What changed?"},
                        {"role": "assistant", "content": "Two files."},
                    ]
                },
            )
            assert r.status_code == 201, r.text
            yield base_url, client


OTHERS = ["/healthz", "/v1/sessions/other/context"]


async def _send_while_polling(
    base_url: str, client: httpx.AsyncClient, what: str, path: str, body: bytes
) -> httpx.Response:
    async with polling(base_url, OTHERS) as polls:
        t = time.perf_counter()
        r = await client.post(path, content=body, headers=JSON)
        took = time.perf_counter() - t
    polls.report(what, took)
    polls.assert_answered()
    return r


async def _entry_count(client: httpx.AsyncClient, sid: str) -> int:
    r = await client.get(f"/v1/sessions/{sid}")
    assert r.status_code == 200, r.text
    count: int = r.json()["entry_count"]
    return count


def _default_limits(settings: Settings) -> Settings:
    """The test settings with the production body and batch limits (8 MiB, 1,000)."""
    defaults = Settings.model_fields
    return settings.model_copy(
        update={
            "max_body_bytes": defaults["max_body_bytes"].default,
            "max_batch_messages": defaults["max_batch_messages"].default,
        }
    )


async def test_a_maximum_size_append_leaves_others_answering(
    db_url: str, settings: Settings
) -> None:
    limits = _default_limits(settings)
    body = max_size_append(limits.max_body_bytes, limits.max_batch_messages)
    assert len(body) > limits.max_body_bytes * 0.99
    async with _serving(db_url, limits) as (base_url, client):
        r = await _send_while_polling(
            base_url,
            client,
            f"max-size append ({limits.max_batch_messages} messages, {len(body):,} bytes)",
            "/v1/sessions/big/messages",
            body,
        )
        assert r.status_code == 201, r.text[:2000]
        entries = r.json()["entries"]
        assert len(entries) == limits.max_batch_messages
        assert all(e["tokens"] > 0 for e in entries)
        assert await _entry_count(client, "big") >= limits.max_batch_messages


async def test_a_thousand_8_kb_messages_are_stored_while_others_are_answered(
    db_url: str, settings: Settings
) -> None:
    limits = _default_limits(settings)
    text = max_size_append(8_000 * 1000, 1000, tag="8k").decode()[:8_000]
    filler = "".join(c for c in text if c not in '"\\')
    messages = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": (filler * 2)[k : k + 8_000]}
        for k in range(1000)
    ]
    body = orjson.dumps({"messages": messages})
    assert len(body) <= limits.max_body_bytes
    async with _serving(db_url, limits) as (base_url, client):
        r = await _send_while_polling(
            base_url,
            client,
            f"1,000 x 8 kB append ({len(body):,} bytes)",
            "/v1/sessions/big/messages",
            body,
        )
        assert r.status_code == 201, r.text[:2000]
        assert len(r.json()["entries"]) == 1000
        r = await client.get("/v1/sessions/big/messages", params={"after_seq": 999, "limit": 1})
        assert r.json()["entries"][0]["message"] == messages[-1]


async def test_a_million_integers_is_a_quick_small_422(db_url: str, settings: Settings) -> None:
    body = million_integers()
    async with _serving(db_url, settings) as (base_url, client):
        r = await _send_while_polling(
            base_url,
            client,
            "1,000,000 integers as messages",
            "/v1/sessions/big/messages",
            body,
        )
        doc = assert_problem(r, 422, "messages", "1,000,000")
        assert len(r.content) < 2_000, len(r.content)
        assert len(doc["errors"]) == 1
        assert f"{settings.max_json_items:,}" in doc["detail"]

        # Just over the batch cap: refused before its messages are validated.
        over = settings.max_batch_messages + 1
        r = await client.post(
            "/v1/sessions/big/messages",
            content=b'{"messages": [' + b",".join([b"1"] * over) + b"]}",
            headers=JSON,
        )
        doc = assert_problem(r, 422, "messages", f"{over:,}")
        assert len(doc["errors"]) == 1

        # Within it, every message is wrong: the first errors and a count of the rest.
        count = settings.max_batch_messages
        r = await client.post(
            "/v1/sessions/big/messages",
            content=b'{"messages": [' + b",".join([b"1"] * count) + b"]}",
            headers=JSON,
        )
        doc = assert_problem(r, 422, "messages[0]", f"{count - MAX_REPORTED_ERRORS:,} more")
        assert len(doc["errors"]) == MAX_REPORTED_ERRORS
        assert doc["errors"][-1]["field"] == f"messages[{MAX_REPORTED_ERRORS - 1}]"
        assert doc["errors_omitted"] == count - MAX_REPORTED_ERRORS
        assert len(r.content) < 10_000, len(r.content)
        assert await _entry_count(client, "big") == 0


async def test_a_million_element_array_in_tool_arguments_is_a_422(
    db_url: str, settings: Settings
) -> None:
    limits = _default_limits(settings)  # the body is ~7 MB
    async with _serving(db_url, limits) as (base_url, client):
        for fmt, field_name in (
            ("openai", "messages[0].tool_calls[0].function.arguments"),
            ("anthropic", "messages[0].content[0].input.values"),
        ):
            body = arguments_with_array(1_000_000, fmt)
            assert len(body) <= limits.max_body_bytes
            r = await _send_while_polling(
                base_url,
                client,
                f"tool arguments with a 1,000,000-element array ({fmt}, {len(body):,} bytes)",
                "/v1/sessions/big/messages",
                body,
            )
            doc = assert_problem(r, 422, field_name, "1,000,000 items")
            assert [e["field"] for e in doc["errors"]] == [field_name]
            assert len(r.content) < 2_000
        assert await _entry_count(client, "big") == 0
        # At the cap it is stored, as sent.
        for fmt in ("openai", "anthropic"):
            body = arguments_with_array(limits.max_json_items, fmt)
            r = await client.post("/v1/sessions/big/messages", content=body, headers=JSON)
            assert r.status_code == 201, r.text
            r = await client.get(
                "/v1/sessions/big/messages", params={"format": fmt, "after_seq": 0}
            )
            sent = orjson.loads(body)["messages"]
            assert [e["message"] for e in r.json()["entries"][-2:]] == sent
        assert await _entry_count(client, "big") == 4
