"""What one large request costs everyone else.

While one client sends the largest append the limits accept (``max_batch_messages``
messages in just under ``max_body_bytes``) or a hostile body of the same size,
other clients poll ``/healthz`` and another session's context back to back, each
on its own connection. Printed: how long the large request took, what it got, and
the worst and median latency the others saw meanwhile (target: the worst under
100 ms). The service runs in its own process; this one only sends and times.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import orjson

from app.core.settings import Settings
from bench.http import Connection
from tests.e2e.large_bodies import arguments_with_array, max_size_append, million_integers

OTHERS = ("/healthz", "/v1/sessions/{other}/context")


async def _session(conn: Connection, messages: int = 0) -> str:
    status, body = await conn.request("POST", "/v1/sessions", {"model": "gpt-4o"})
    assert status == 201, body
    sid: str = orjson.loads(body)["id"]
    if messages:
        batch = [
            {"role": "user" if k % 2 == 0 else "assistant", "content": f"Step {k}: done."}
            for k in range(messages)
        ]
        status, body = await conn.request(
            "POST", f"/v1/sessions/{sid}/messages", {"messages": batch}
        )
        assert status == 201, body
    return sid


async def during(
    host: str, port: int, paths: list[str], send: Callable[[], Awaitable[tuple[int, bytes]]]
) -> tuple[float, tuple[int, bytes], dict[str, list[float]]]:
    """Run ``send()`` while polling ``paths``; its time and result, and each path's latencies."""
    latencies: dict[str, list[float]] = {p: [] for p in paths}
    done = asyncio.Event()

    async def poll(path: str) -> None:
        async with Connection(host, port) as conn:
            while not done.is_set() or not latencies[path]:
                t = time.perf_counter()
                status, body = await conn.request("GET", path)
                latencies[path].append(time.perf_counter() - t)
                assert status == 200, body
                await asyncio.sleep(0.002)

    pollers = [asyncio.create_task(poll(p)) for p in paths]
    await asyncio.sleep(0.1)
    t = time.perf_counter()
    result = await send()
    took = time.perf_counter() - t
    done.set()
    await asyncio.gather(*pollers)
    return took, result, latencies


def _ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def bench_bounds(host: str, port: int, settings: Settings | None = None) -> None:
    """The worst /healthz and context latency of other clients during a max-size append,
    and during hostile bodies of the same size."""
    settings = settings or Settings()
    print("\nOne large request, everyone else (worst latency of the others: target < 100 ms)")
    async with Connection(host, port) as conn:
        other = await _session(conn, messages=20)
    paths = [p.format(other=other) for p in OTHERS]
    cases: list[tuple[str, bytes, int]] = [
        (
            f"max-size append ({settings.max_batch_messages} messages)",
            max_size_append(settings.max_body_bytes, settings.max_batch_messages),
            201,
        ),
        ("1,000,000 integers as messages", million_integers(), 422),
        ("tool arguments: 1,000,000-element array", arguments_with_array(1_000_000), 422),
    ]
    for name, body, expected in cases:
        if len(body) > settings.max_body_bytes:
            print(f"  {name:<44} skipped: {len(body):,} bytes is over the body limit")
            continue
        async with Connection(host, port) as conn:
            sid = await _session(conn)

            async def send(
                conn: Connection = conn, sid: str = sid, body: bytes = body
            ) -> tuple[int, bytes]:
                return await conn.request(
                    "POST", f"/v1/sessions/{sid}/messages", orjson.Fragment(body)
                )

            took, result, latencies = await during(host, port, paths, send)
        status, answer = result
        assert status == expected, answer[:500]
        print(
            f"  {name:<44} {status} in {took * 1000:6.0f} ms ({len(body) / 2**20:.1f} MB in,"
            f" {len(answer):,} bytes out)"
        )
        for path, samples in latencies.items():
            label = "/healthz" if path == "/healthz" else "another session's /context"
            print(
                f"      {label:<40} worst {_ms(samples, 1.0):6.1f} ms"
                f"   p50 {_ms(samples, 0.5):5.1f} ms   ({len(samples)} polls)"
            )
