"""Postgres stopped and started again under load (a restart, a failover).

Requests in the gap get 503 problem+json with a Retry-After, never a 500; the
service recovers by itself within 5 s of Postgres accepting connections; the
compaction worker and its LISTEN connection come back; nothing acknowledged is
lost, and nothing retried is stored twice.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import httpx
import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.compactions.worker_support import seeded
from tests.e2e.server import running
from tests.resilience.support import (
    DedicatedPostgres,
    assert_unavailable,
    copies,
    turn,
)

# A slow tier: `make test` and CI run it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

CLIENTS = 6
RECOVERY_BOUND_SECONDS = 5.0


@dataclass
class Load:
    """What the clients saw. ``bad`` lists every answer outside the contract."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    statuses: Counter[int] = field(default_factory=Counter)
    unavailable: int = 0
    last_unavailable_at: float = 0.0
    bad: list[str] = field(default_factory=list)
    acked: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # key -> session, body

    async def call(
        self, http: httpx.AsyncClient, method: str, path: str, ok: int, **kwargs: Any
    ) -> httpx.Response | None:
        try:
            r = await http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            self.bad.append(f"{method} {path}: {exc!r}")
            return None
        self.statuses[r.status_code] += 1
        if r.status_code == ok:
            return r
        try:
            assert_unavailable(r)
        except (AssertionError, KeyError, ValueError):
            self.bad.append(f"{method} {path}: {r.status_code} {r.headers} {r.text[:500]}")
            return None
        self.unavailable += 1
        self.last_unavailable_at = time.monotonic()
        return r


async def agent(base_url: str, sid: str, name: str, load: Load) -> None:
    """An agent's loop: append a turn (retried with its Idempotency-Key until it
    is acknowledged, as a client should), read the context, report usage, read
    the session (an ORM route). No timing: it runs until told to stop."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        n = 0
        while not load.stop.is_set() and not load.bad:
            key = f"{name}-{n}"
            n += 1
            while not load.bad:
                r = await load.call(
                    http,
                    "POST",
                    f"/v1/sessions/{sid}/messages",
                    201,
                    json={"messages": turn(key)},
                    headers={"Idempotency-Key": key},
                )
                if r is not None and r.status_code == 201:
                    load.acked[key] = (sid, r.content)
                    break
                await asyncio.sleep(0.02)
            await load.call(http, "GET", f"/v1/sessions/{sid}/context", 200)
            await load.call(
                http,
                "POST",
                f"/v1/sessions/{sid}/usage",
                200,
                json={"input_tokens": 50 + n, "output_tokens": 10},
            )
            await load.call(http, "GET", f"/v1/sessions/{sid}", 200)


async def until(load: Load, predicate: Any, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert not load.bad, "\n".join(load.bad[:20])
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def listening(dsn: str, within: float = 10) -> None:
    """Wait for the workers' listener: a backend whose last statement was its LISTEN."""
    deadline = time.monotonic() + within
    conn = await asyncpg.connect(dsn)
    try:
        while True:
            n = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN %'"
            )
            if n:
                return
            assert time.monotonic() < deadline, "the compaction listener is not connected"
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_postgres_restart_under_load(pg: DedicatedPostgres, settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"compaction_workers": 1}), database_url=pg.url)
    with running(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            sids = []
            for i in range(CLIENTS):
                r = await http.post("/v1/sessions", json={"id": f"agent-{i}", "model": "gpt-4o"})
                assert r.status_code == 201, r.text
                sids.append(r.json()["id"])
            compact_sid = await seeded(http, 12)
            await listening(pg.dsn)

            load = Load()
            tasks = [
                asyncio.create_task(agent(base_url, sid, f"a{i}", load))
                for i, sid in enumerate(sids)
            ]
            try:
                await until(
                    load, lambda: len(load.acked) >= CLIENTS * 5, 60, "appends before the outage"
                )
                acked_before = dict(load.acked)

                await asyncio.to_thread(pg.stop)
                await until(load, lambda: load.unavailable >= CLIENTS * 2, 60, "503s in the outage")
                await asyncio.sleep(2.0)  # a couple of seconds of outage, under load

                # Start it again; note when it first accepts a connection, then
                # when the service first answers a read of each kind.
                starting = asyncio.create_task(asyncio.to_thread(pg.start))
                while True:
                    if await pg.accepts():
                        break
                    await asyncio.sleep(0.05)
                accepted_at = time.monotonic()
                recovered: dict[str, float] = {}
                probes = {
                    "context (asyncpg path)": f"/v1/sessions/{sids[0]}/context",
                    "session (ORM path)": f"/v1/sessions/{sids[0]}",
                }
                while len(recovered) < len(probes):
                    for name, path in probes.items():
                        if name not in recovered:
                            probe = await load.call(http, "GET", path, 200)
                            if probe is not None and probe.status_code == 200:
                                recovered[name] = time.monotonic() - accepted_at
                    if time.monotonic() - accepted_at > 30:
                        break
                    await asyncio.sleep(0.05)
                await starting
                recovery = max(recovered.values(), default=float("inf"))
                # Load requests sent before the restart may still answer 503 after it.
                last_503 = (load.last_unavailable_at - accepted_at) * 1000
                print(
                    f"\n[resilience] recovery after Postgres accepted connections: "
                    f"{recovery * 1000:.0f} ms ({', '.join(f'{k} {v * 1000:.0f} ms' for k, v in recovered.items())}); "
                    f"statuses {dict(load.statuses)}; last 503 at {last_503:+.0f} ms"
                )

                # The load goes on after recovery: every agent gets more turns through.
                after = len(load.acked)
                await until(
                    load, lambda: len(load.acked) >= after + CLIENTS * 5, 60, "appends after"
                )
            finally:
                load.stop.set()
                await asyncio.gather(*tasks)

            assert not load.bad, "\n".join(load.bad[:20])
            assert load.unavailable >= CLIENTS * 2
            assert len(recovered) == len(probes), recovered
            assert recovery <= RECOVERY_BOUND_SECONDS, recovered

            # Nothing acknowledged is lost, nothing retried is stored twice.
            assert acked_before.keys() <= load.acked.keys()
            for sid in sids:
                mine = {k for k, (s, _) in load.acked.items() if s == sid}
                assert await copies(http, sid) == dict.fromkeys(mine, 1), sid
            # A retry now replays the first answer, byte for byte.
            for key, (sid, body) in load.acked.items():
                r = await http.post(
                    f"/v1/sessions/{sid}/messages",
                    json={"messages": turn(key)},
                    headers={"Idempotency-Key": key},
                )
                assert r.status_code == 201, r.text
                assert r.headers["idempotent-replayed"] == "true"
                assert r.content == body, key

            # The compaction worker came back, and so did its LISTEN connection.
            r = await http.post(f"/v1/sessions/{compact_sid}/compactions", json={"wait": 20})
            assert r.status_code == 202, r.text
            assert r.json()["status"] == "succeeded", r.json()
            await listening(pg.dsn)  # every backend is new since the restart
