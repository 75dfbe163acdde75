"""CPU per request, side by side with what the same database work costs bare.

- **Append**: ``CLIENTS`` clients, each appending single messages to its own session
  back to back. Printed: appends/s, the service's CPU per append and the database's.
  Beside it, a **raw asyncpg INSERT** of the same message into a scratch table from this
  process, on as many connections: inserts/s and this process's CPU per insert. The
  ratios are the append's to the INSERT's (target: service CPU per append <= 1.0 ms).
- **Context read** of a 100-message session from the traces (``GET /context``,
  openai), from ``CLIENTS`` clients: the service's CPU per read, beside
  :mod:`bench.bare`, one FastAPI route with no middleware that runs the same statements
  on the same rows and answers their stored views, started as its own process on the
  same uvicorn options (target: ratio <= 2).

CPU is read off the processes (``psutil``: user + system), the database's as the sum
over the postmaster and its children. The bench prints; it never fails on timing.
``COMPACTD_BENCH_CPU_REQUESTS`` (default 3,000) makes the runs longer, for a profiler
attached to the service (``py-spy record -p <service pid>``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psutil

from bench.http import Connection
from tests import traces
from tests.e2e.server import free_port

CLIENTS = 8
# COMPACTD_BENCH_CPU_REQUESTS: more requests, for a profiler attached to the service.
APPENDS = READS = int(os.environ.get("COMPACTD_BENCH_CPU_REQUESTS", "3000"))
MESSAGE = {
    "role": "user",
    "content": "Please run the failing test again and show me the traceback. " * 4,
}


def cpu_of(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


class Meter:
    """CPU seconds of the service, the database and this process over a stretch."""

    def __init__(self, service: list[psutil.Process], pgdata: Path) -> None:
        self.service = service
        self.pgdata = pgdata

    def database(self) -> list[psutil.Process]:
        pid = int((self.pgdata / "postmaster.pid").read_text().split()[0])
        postmaster = psutil.Process(pid)
        return [postmaster, *postmaster.children()]

    def read(self) -> tuple[float, float, float]:
        database = self.database()
        # With what the backends that have exited spent (the postmaster reaps them): a
        # connection closed, or an autovacuum worker done, between two readings would
        # otherwise take its CPU out of the sum.
        reaped = database[0].cpu_times()
        return (
            cpu_of(self.service),
            cpu_of(database) + reaped.children_user + reaped.children_system,
            cpu_of([psutil.Process()]),
        )


async def measured(
    meter: Meter, count: int, run: Callable[[], Awaitable[None]]
) -> tuple[float, float, float, float]:
    """``run()`` once: per-item CPU in ms (service, database, this process) and the rate."""
    before = meter.read()
    started = time.perf_counter()
    await run()
    elapsed = time.perf_counter() - started
    after = meter.read()
    service, db, own = ((a - b) / count * 1000 for a, b in zip(after, before, strict=True))
    return service, db, own, count / elapsed


async def _new_session(conn: Connection, model: str = "gpt-4o") -> str:
    status, body = await conn.request("POST", "/v1/sessions", {"model": model})
    assert status == 201, body
    sid: str = orjson.loads(body)["id"]
    return sid


async def _appends(host: str, port: int, count: int) -> Callable[[], Awaitable[None]]:
    sids = []
    async with Connection(host, port) as conn:
        for _ in range(CLIENTS):
            sids.append(await _new_session(conn, "gpt-4.1"))

    async def client(sid: str) -> None:
        async with Connection(host, port) as conn:
            for _ in range(count // CLIENTS):
                status, body = await conn.request(
                    "POST", f"/v1/sessions/{sid}/messages", {"messages": [MESSAGE]}
                )
                assert status == 201, body

    async def run() -> None:
        await asyncio.gather(*(client(sid) for sid in sids))

    return run


async def _inserts(dsn: str, count: int) -> tuple[Callable[[], Awaitable[None]], asyncpg.Pool]:
    pool = await asyncpg.create_pool(dsn, min_size=CLIENTS, max_size=CLIENTS)
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS bench_raw_insert"
        " (session_id bigint, seq bigint, message jsonb, PRIMARY KEY (session_id, seq))"
    )
    await pool.execute("TRUNCATE bench_raw_insert")
    message = orjson.dumps(MESSAGE).decode()
    seqs = itertools.count()

    async def client(k: int) -> None:
        async with pool.acquire() as conn:
            for _ in range(count // CLIENTS):
                seq = next(seqs)
                await conn.execute(
                    "INSERT INTO bench_raw_insert (session_id, seq, message) VALUES ($1, $2, $3)",
                    k,
                    seq,
                    message,
                )

    async def run() -> None:
        await asyncio.gather(*(client(k) for k in range(CLIENTS)))

    return run, pool


def _reads(
    host: str, port: int, path: str, count: int, expect: int = 200
) -> Callable[[], Awaitable[None]]:
    async def client() -> None:
        async with Connection(host, port) as conn:
            for _ in range(count // CLIENTS):
                status, body = await conn.request("GET", path)
                assert status == expect, body

    async def run() -> None:
        await asyncio.gather(*(client() for _ in range(CLIENTS)))

    return run


def _trace_messages(n: int) -> list[dict[str, Any]]:
    """The first ``n`` messages of the first trace that has that many, whole turns."""
    for path in traces.trace_files():
        messages = traces.load(path)
        if len(messages) < n:
            continue
        picked = messages[:n]
        while picked[-1]["role"] == "assistant" and picked[-1].get("tool_calls"):
            picked.pop()
        return picked
    raise RuntimeError(f"no trace has {n} messages")


def _row(name: str, figures: tuple[float, float, float, float], unit: str, extra: str = "") -> None:
    service, db, own, rate = figures
    print(
        f"  {name:<34} {rate:7.0f} {unit}/s   CPU/{unit}: service {service:5.2f} ms,"
        f" database {db:5.2f} ms, this process {own:5.2f} ms  {extra}"
    )


async def bench_cpu(host: str, port: int, service_pid: int, dsn: str, pgdata: Path) -> None:
    print(f"\nCPU per request ({CLIENTS} clients, back to back)")
    root = psutil.Process(service_pid)
    meter = Meter([root, *root.children(recursive=True)], pgdata)

    # Warm up every path once (the first requests compile and fill caches).
    await (await _appends(host, port, CLIENTS * 50))()
    append = await measured(meter, APPENDS, await _appends(host, port, APPENDS))
    inserts, pool = await _inserts(dsn, APPENDS)
    try:
        await inserts()
        insert = await measured(meter, APPENDS, inserts)
    finally:
        await pool.execute("DROP TABLE bench_raw_insert")
        await pool.close()
    _row("append, one message", append, "append", "(target <= 1.0 ms service)")
    _row("raw asyncpg INSERT (this process)", insert, "insert")
    print(
        f"  {'append vs INSERT':<34} rate {append[3] / insert[3]:5.2f}x,"
        f" CPU {append[0] / insert[2]:5.1f}x (service per append / this process per INSERT)"
    )

    async with Connection(host, port) as conn:
        sid = await _new_session(conn, "gpt-4.1")
        messages = _trace_messages(100)
        status, body = await conn.request(
            "POST", f"/v1/sessions/{sid}/messages", {"messages": messages}
        )
        assert status == 201, body
    bare_port = free_port()
    bare = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
        [sys.executable, "-m", "bench.bare", "--port", str(bare_port), "--dsn", dsn]
    )
    try:
        deadline = time.monotonic() + 30
        async with httpx.AsyncClient() as http:
            while True:
                try:
                    answer = await http.get(f"http://{host}:{bare_port}/bare/{sid}")
                    if answer.status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline or bare.poll() is not None:
                    raise RuntimeError("the bare endpoint did not start")
                await asyncio.sleep(0.2)
        shown = len(orjson.loads(answer.content))
        context_path = f"/v1/sessions/{sid}/context"
        await _reads(host, port, context_path, 400)()
        context = await measured(meter, READS, _reads(host, port, context_path, READS))
        bare_meter = Meter([psutil.Process(bare.pid)], pgdata)
        bare_path = f"/bare/{sid}"
        await _reads(host, bare_port, bare_path, 400)()
        plain = await measured(bare_meter, READS, _reads(host, bare_port, bare_path, READS))
    finally:
        bare.terminate()
        bare.wait(timeout=30)
    _row(f"context read, {shown} messages", context, "read")
    _row("bare endpoint, same statements", plain, "read")
    print(
        f"  {'context read vs bare endpoint':<34} CPU {context[0] / plain[0]:5.2f}x"
        f" (target <= 2), rate {context[3] / plain[3]:5.2f}x"
    )
