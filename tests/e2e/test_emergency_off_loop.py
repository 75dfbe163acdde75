"""One huge message that sets off an emergency compaction holds up no one else (issue
27): the compaction's planning (and its summary) run off the event loop, as the
append's own counting does, so /healthz and other tenants keep being answered."""

from __future__ import annotations

import asyncio
import time

import httpx
import orjson
import pytest

from app.main import create_app
from tests.e2e.server import running
from tests.ops.conftest import settings_with

pytestmark = pytest.mark.slow

# 7.5 MB of plain prose: about 1.5 million tokens, twelve times a gpt-4o window.
PROSE = "The quick brown fox jumps over the lazy dog while we work on the current changes. "
HUGE = (PROSE * (7_500_000 // len(PROSE) + 1))[:7_500_000]


async def probe(client: httpx.AsyncClient, done: asyncio.Event) -> tuple[int, list[float]]:
    """/healthz, again and again until ``done``: how many answers came before it, and
    each answer's latency."""
    latencies: list[float] = []
    answered = 0
    while not done.is_set():
        started = time.perf_counter()
        r = await client.get("/healthz")
        latencies.append(time.perf_counter() - started)
        assert r.status_code == 200, r.text
        answered += not done.is_set()
        await asyncio.sleep(0.02)
    return answered, latencies


async def test_a_huge_message_that_sets_off_an_emergency_compaction_leaves_the_loop_free(
    db_url: str,
) -> None:
    """A 7.5 MB user message to a gpt-4o session, past its window many times over: the
    append compacts on the spot (the emergency path), and /healthz is answered
    throughout, none of its answers waiting more than a fraction of the append's time
    (the planning once held the loop for seconds: a regular expression over the whole
    message)."""
    settings = settings_with(max_body_bytes=16 * 1024 * 1024)
    application = create_app(settings, database_url=db_url)
    with running(application) as base:
        async with (
            httpx.AsyncClient(base_url=base, timeout=300) as client,
            httpx.AsyncClient(base_url=base, timeout=300) as prober,
        ):
            created = await client.post("/v1/sessions", json={"model": "gpt-4o"})
            assert created.status_code == 201, created.text
            sid = created.json()["id"]
            history = [{"role": "user", "content": "Please look at the repository in /srv/app."}]
            for k in range(10):  # some 20,000 tokens for the compaction to summarize
                history.append({"role": "assistant", "content": f"Step {k}: " + PROSE * 120})
                history.append({"role": "user", "content": f"Go on with step {k + 1}."})
            r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": history})
            assert r.status_code == 201, r.text
            body = orjson.dumps({"messages": [{"role": "user", "content": HUGE}]})

            done = asyncio.Event()
            probing = asyncio.create_task(probe(prober, done))
            await asyncio.sleep(0.2)  # the prober is going
            started = time.perf_counter()
            appended = await client.post(
                f"/v1/sessions/{sid}/messages",
                content=body,
                headers={"Content-Type": "application/json"},
            )
            took = time.perf_counter() - started
            done.set()
            answered, latencies = await probing

            assert appended.status_code == 201, appended.text
            document = appended.json()
            assert document["compaction"] == {
                "id": document["compaction"]["id"],
                "status": "succeeded",
                "reason": "emergency",
                "created": True,
            }
            worst = max(latencies)
            print(
                f"\n[off-loop] the append took {took:.2f} s; /healthz answered {answered} "
                f"times meanwhile, the slowest in {worst * 1000:.0f} ms"
            )
            # The loop was free: probes kept being answered while the append ran, none
            # held for anything like the append's own time.
            assert answered >= 3, (answered, took)
            assert worst < took / 4, (worst, took)

            # The append stored the message whole, and the context serves it after the
            # summary of the history (alone it is past the window: nothing makes it fit).
            assert [e["role"] for e in document["entries"]] == ["user"]
            assert document["entries"][0]["tokens"] > 1_000_000
            context = await client.get(f"/v1/sessions/{sid}/context")
            assert context.status_code == 200, context.text
            messages = context.json()["messages"]
            assert len(messages) == 2, [(m["role"], str(m["content"])[:100]) for m in messages]
            assert messages[0]["content"].startswith("The conversation history before this point")
            assert messages[1] == {"role": "user", "content": HUGE}
            assert context.json()["version"] == document["version"]
