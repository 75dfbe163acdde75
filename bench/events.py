"""Events and webhooks: what they cost and how fast they go out (docs/events.md).

Over real HTTP against the bench's ``compactd serve`` (embedded PostgreSQL), with a
``compactd worker`` of its own (it runs the webhook dispatcher):

- **the cost of events on an append** (target <= 10 % added). An append writes an
  event only when it changes the verdict's action (ok, prune, compact); every append
  also works out the verdict before it, to know. Measured two ways, each alternating
  its two sides so the machine's noise falls on both: one-message appends to a
  session none of whose appends changes the verdict, with no webhook and with 10
  webhooks of the tenant subscribed to everything (what every append pays), and the
  statement that writes one event with its 10 deliveries against an append's own
  latency (what an append that does change the verdict pays on top).
- **SSE fan-out**: 100 streams of one session open at once; 200 events written one
  after the other (each its own transaction, as a compaction's are); the latency from
  each event's commit to its arrival at each stream, p50 and p99, and whether every
  stream got every event once, in order.
- **webhook delivery throughput**: 2,000 events to one webhook whose receiver (in this
  process) answers 200 at once; deliveries per second from the first event written to
  the last delivery recorded as succeeded.

Figures only: nothing here fails on time.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import asyncpg
import httpx
import orjson

from app.store import events
from bench.http import Connection
from tests.e2e.server import free_port

APPENDS = 400
WEBHOOKS = 10
STREAMS = 100
FANOUT_EVENTS = 200
DELIVERIES = 2_000


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _receiver(port: int, received: list[float]) -> asyncio.Server:
    """A bare HTTP/1.1 server that answers every request 200 and notes when."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                received.append(time.perf_counter())
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def _appends(conn: Connection, sid: str, n: int) -> list[float]:
    out = []
    for k in range(n):
        body = {"messages": [{"role": "user", "content": f"step {k}: ok"}]}
        t = time.perf_counter()
        status, _ = await conn.request("POST", f"/v1/sessions/{sid}/messages", body)
        out.append(time.perf_counter() - t)
        assert status == 201, status
    return out


async def bench_append_cost(
    host: str, port: int, pg: asyncpg.Connection[Any], receiver: str
) -> None:
    async with Connection(host, port) as conn:
        for sid in ("ev-plain", "ev-hooked"):
            body = {"id": sid, "model": "gpt-4o"}
            status, _ = await conn.request("POST", "/v1/sessions", body)
            assert status in (201, 409), status
        await _appends(conn, "ev-plain", 50)  # warm up
        await _appends(conn, "ev-hooked", 50)
        plain: list[float] = []
        hooked: list[float] = []
        ids = []
        for k in range(WEBHOOKS):
            hook = {"url": f"{receiver}/{k}", "types": []}
            status, doc = await conn.request("POST", "/v1/webhooks", hook)
            assert status == 201, doc
            ids.append(orjson.loads(doc)["id"])
        # Alternating rounds: with the webhooks subscribed (they see no event, since no
        # append changes the verdict) against the plain session, the same moment.
        for _ in range(APPENDS // 20):
            plain += await _appends(conn, "ev-plain", 10)
            hooked += await _appends(conn, "ev-hooked", 10)
        # One event with its 10 deliveries, as an append that changes the verdict writes it.
        emits = []
        for k in range(APPENDS):
            t = time.perf_counter()
            async with pg.transaction():
                await events.emit(pg, "default", "ev-hooked", "session.verdict", {"k": k})
            emits.append(time.perf_counter() - t)
        delivered = await pg.fetchval(
            "SELECT count(*) FROM webhook_delivery WHERE session_id = 'ev-hooked'"
        )
        for webhook_id in ids:
            status, _ = await conn.request("DELETE", f"/v1/webhooks/{webhook_id}")
    added = statistics.median(hooked) / statistics.median(plain) - 1
    print(
        f"  one-message append, no event written: p50 {pct(plain, 0.5):.2f} ms, "
        f"with {WEBHOOKS} webhooks {pct(hooked, 0.5):.2f} ms ({added * 100:+.1f} %); "
        f"p99 {pct(plain, 0.99):.2f} / {pct(hooked, 0.99):.2f} ms"
    )
    share = statistics.median(emits) / statistics.median(plain)
    print(
        f"  writing one event and its {WEBHOOKS} deliveries (a verdict change): "
        f"p50 {pct(emits, 0.5):.2f} ms, p99 {pct(emits, 0.99):.2f} ms "
        f"= {share * 100:.1f} % of an append's p50 ({delivered} deliveries written)"
    )


async def bench_fanout(host: str, port: int, pg: asyncpg.Connection[Any]) -> None:
    sid = "ev-fanout"
    async with httpx.AsyncClient(base_url=f"http://{host}:{port}", timeout=None) as client:
        r = await client.post("/v1/sessions", json={"id": sid, "model": "gpt-4o"})
        assert r.status_code in (201, 409), r.text
        committed: dict[str, float] = {}
        arrivals: list[list[tuple[str, float]]] = [[] for _ in range(STREAMS)]
        ready = asyncio.Semaphore(0)

        async def stream(k: int) -> None:
            path = f"/v1/sessions/{sid}/events"
            async with client.stream("GET", path, params={"after": "now"}) as r:
                ready.release()
                last_id = ""
                async for line in r.aiter_lines():
                    if line.startswith("id: "):
                        last_id = line[4:]
                    elif line.startswith("data: "):  # an event (the opening id has none)
                        arrivals[k].append((last_id, time.perf_counter()))
                        if len(arrivals[k]) >= FANOUT_EVENTS:
                            return

        tasks = [asyncio.create_task(stream(k)) for k in range(STREAMS)]
        for _ in range(STREAMS):
            await ready.acquire()
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        for k in range(FANOUT_EVENTS):
            async with pg.transaction():
                place = await events.emit(pg, "default", sid, "session.pruned", {"k": k})
            committed[str(place)] = time.perf_counter()
            await asyncio.sleep(0.005)
        try:
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        except TimeoutError:
            for task in tasks:
                task.cancel()
        elapsed = time.perf_counter() - t0
    order = list(committed)
    complete = sum(1 for got in arrivals if [i for i, _ in got] == order)
    latencies = [at - committed[i] for got in arrivals for i, at in got if i in committed]
    print(
        f"  SSE fan-out: {STREAMS} streams x {FANOUT_EVENTS} events in {elapsed:.1f} s; "
        f"commit to arrival p50 {pct(latencies, 0.5):.1f} ms, p99 {pct(latencies, 0.99):.1f} ms; "
        f"{complete} of {STREAMS} streams got every event once, in order"
    )


async def bench_delivery(host: str, port: int, pg: asyncpg.Connection[Any]) -> None:
    received: list[float] = []
    receiver_port = free_port()
    server = await _receiver(receiver_port, received)
    await asyncio.sleep(1.0)  # the append section's deliveries have gone out
    sid = f"ev-deliver-{uuid.uuid4().hex[:8]}"
    try:
        async with Connection(host, port) as conn:
            body = {"url": f"http://127.0.0.1:{receiver_port}/hook", "session_id": sid}
            status, doc = await conn.request("POST", "/v1/webhooks", body)
            assert status == 201, doc
            webhook_id = orjson.loads(doc)["id"]
            t0 = time.perf_counter()
            for start in range(0, DELIVERIES, 100):
                async with pg.transaction():
                    for k in range(start, start + 100):
                        await events.emit(pg, "default", sid, "session.pruned", {"k": k})
            written = time.perf_counter() - t0
            deadline = time.monotonic() + 120
            done = 0
            while time.monotonic() < deadline:
                done = await pg.fetchval(
                    "SELECT count(*) FROM webhook_delivery WHERE webhook_id = $1 "
                    "AND status = 'succeeded'",
                    uuid.UUID(webhook_id),
                )
                if done >= DELIVERIES:
                    break
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - t0
        async with Connection(host, port) as conn:  # the other one idled out meanwhile
            await conn.request("DELETE", f"/v1/webhooks/{webhook_id}")
    finally:
        server.close()
    print(
        f"  webhook deliveries: {done} of {DELIVERIES} succeeded in {elapsed:.1f} s "
        f"({done / elapsed:.0f}/s; events written in {written:.1f} s; "
        f"{len(received)} requests received, one dispatcher process)"
    )


async def bench_events(host: str, port: int, base_url: str, env: dict[str, str]) -> None:
    print("\nEvents and webhooks")
    dsn = base_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    pg = await asyncpg.connect(dsn)
    worker = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
        [sys.executable, "-m", "app.cli", "worker", "--count", "1"], env=env
    )
    sink: list[float] = []
    sink_port = free_port()
    sink_server = await _receiver(sink_port, sink)
    try:
        await bench_append_cost(host, port, pg, f"http://127.0.0.1:{sink_port}")
        await bench_fanout(host, port, pg)
        await bench_delivery(host, port, pg)
    finally:
        sink_server.close()
        worker.terminate()
        worker.wait(timeout=30)
        await pg.close()
