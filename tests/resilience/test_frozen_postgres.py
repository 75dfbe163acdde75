"""A hung database is an unavailable one: every Postgres process frozen (SIGSTOP on
the postmaster and its children, as a stalled disk or network leaves it), under a
real uvicorn server.

``statement_timeout`` cannot fire on a frozen server, so the service bounds each
database call itself (connect, pool checkout, each command): requests get 503 with
a Retry-After within those bounds instead of hanging for the whole freeze, /readyz
answers within its 2 s, and after SIGCONT the service recovers by itself with
nothing acknowledged lost and nothing retried stored twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil
import pytest

from app.core.settings import Settings
from app.health.router import READY_TIMEOUT_SECONDS
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

BOUND_SECONDS = 2.0  # this test's connect, pool and command bounds
FREEZE_SECONDS = 8.0
SESSIONS = 4


@contextlib.contextmanager
def frozen(data: Path) -> Iterator[list[int]]:
    """SIGSTOP every process of the server of ``data`` (the postmaster first, so that it
    forks no new backend meanwhile); SIGCONT them all when the block ends, whatever
    happened in it."""
    postmaster = int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    stopped: list[int] = []
    try:
        os.kill(postmaster, signal.SIGSTOP)
        stopped.append(postmaster)
        for child in psutil.Process(postmaster).children(recursive=True):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGSTOP)
                stopped.append(child.pid)
        yield stopped
    finally:
        for pid in reversed(stopped):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def timed(
    http: httpx.AsyncClient, method: str, path: str, **kwargs: Any
) -> tuple[str, httpx.Response, float]:
    started = time.monotonic()
    r = await http.request(method, path, **kwargs)
    return f"{method} {path.split('/')[-1] or path}", r, time.monotonic() - started


def wave(http: httpx.AsyncClient, sids: list[str], name: str) -> list[Any]:
    """One request of each kind per session: the append (asyncpg, a transaction when it
    must lock), the context and the usage report (asyncpg), the session (the ORM)."""
    calls = []
    for i, sid in enumerate(sids):
        key = f"{name}-{i}"
        calls += [
            timed(
                http,
                "POST",
                f"/v1/sessions/{sid}/messages",
                json={"messages": turn(key)},
                headers={"Idempotency-Key": key},
            ),
            timed(http, "GET", f"/v1/sessions/{sid}/context"),
            timed(http, "POST", f"/v1/sessions/{sid}/usage", json={"input_tokens": 90 + i}),
            timed(http, "GET", f"/v1/sessions/{sid}"),
        ]
    return calls


async def test_a_frozen_postgres_gets_503_within_the_bounds_and_recovers(
    pg: DedicatedPostgres, settings: Settings
) -> None:
    bounded = settings.model_copy(
        update={
            "compaction_workers": 1,
            "db_statement_timeout_seconds": BOUND_SECONDS / 2,
            "db_command_timeout_seconds": BOUND_SECONDS,
            "db_connect_timeout_seconds": BOUND_SECONDS,
            "db_pool_timeout_seconds": BOUND_SECONDS,
        }
    )
    app = create_app(bounded, database_url=pg.url)
    acked: dict[str, str] = {}  # Idempotency-Key -> session
    with running(app) as base_url:
        # A client that would wait out the whole freeze, and then some.
        async with httpx.AsyncClient(base_url=base_url, timeout=FREEZE_SECONDS * 4) as http:
            sids = []
            for i in range(SESSIONS):
                r = await http.post("/v1/sessions", json={"id": f"agent-{i}", "model": "gpt-4o"})
                assert r.status_code == 201, r.text
                sids.append(r.json()["id"])
                for n in range(2):
                    key = f"before-{i}-{n}"
                    r = await http.post(
                        f"/v1/sessions/{sids[-1]}/messages",
                        json={"messages": turn(key)},
                        headers={"Idempotency-Key": key},
                    )
                    assert r.status_code == 201, r.text
                    acked[key] = sids[-1]
            compact_sid = await seeded(http, 12)
            assert (await http.get("/readyz")).status_code == 200

            waves: list[list[tuple[str, httpx.Response, float]]] = []
            readyz: list[tuple[httpx.Response, float]] = []
            with frozen(pg.data) as stopped:
                froze_at = time.monotonic()
                # Requests in flight while it is frozen: first on pooled connections,
                # then (those dropped) on new ones; /healthz never needs the database.
                for name in ("frozen-a", "frozen-b"):
                    calls = wave(http, sids, name)
                    ready = timed(http, "GET", "/readyz")
                    health = timed(http, "GET", "/healthz")
                    *answers, (_, ready_r, ready_s), (_, health_r, _) = await asyncio.gather(
                        *calls, ready, health
                    )
                    waves.append(answers)
                    readyz.append((ready_r, ready_s))
                    assert health_r.status_code == 200, health_r.text
                await asyncio.sleep(max(0.0, FREEZE_SECONDS - (time.monotonic() - froze_at)))
                frozen_for = time.monotonic() - froze_at
            resumed_at = time.monotonic()

            for i, answers in enumerate(waves):
                slowest = max(seconds for _, _, seconds in answers)
                print(
                    f"\n[frozen] wave {i + 1}: {len(answers)} requests, all 503 in "
                    f"{min(s for _, _, s in answers):.2f}-{slowest:.2f} s "
                    f"(bounds {BOUND_SECONDS:g} s; {len(stopped)} processes frozen "
                    f"{frozen_for:.1f} s); /readyz {readyz[i][0].status_code} in "
                    f"{readyz[i][1]:.2f} s"
                )
                for what, r, _ in answers:
                    assert r.status_code == 503, (what, r.status_code, r.text)
                    assert_unavailable(r)
            for r, _ in readyz:
                assert_unavailable(r)
                assert "did not answer" in r.json()["detail"] or "not ready" in r.json()["detail"]

            # Thawed: the service recovers by itself; each write answered 503 is
            # retried with its key until acknowledged, as a client should.
            retried = [f"{name}-{i}" for name in ("frozen-a", "frozen-b") for i in range(SESSIONS)]
            recovered_at = None
            deadline = time.monotonic() + 60
            while retried:
                key = retried[0]
                sid = sids[int(key.rsplit("-", 1)[1])]
                r = await http.post(
                    f"/v1/sessions/{sid}/messages",
                    json={"messages": turn(key)},
                    headers={"Idempotency-Key": key},
                )
                if r.status_code == 201:
                    recovered_at = recovered_at or time.monotonic()
                    acked[key] = sid
                    retried.pop(0)
                    continue
                assert_unavailable(r)
                assert time.monotonic() < deadline, "no recovery after SIGCONT"
                await asyncio.sleep(0.05)
            assert recovered_at is not None
            print(
                f"[frozen] first append acknowledged {recovered_at - resumed_at:.2f} s "
                "after SIGCONT"
            )
            ready_r = await http.get("/readyz")
            assert ready_r.status_code == 200, ready_r.text

            # Nothing acknowledged is lost, nothing retried is stored twice.
            for sid in sids:
                mine = {k for k, s in acked.items() if s == sid}
                assert await copies(http, sid) == dict.fromkeys(mine, 1), sid

            # The compaction worker (its LISTEN connection too) lived through it.
            r = await http.post(f"/v1/sessions/{compact_sid}/compactions", json={"wait": 20})
            assert r.status_code == 202, r.text
            assert r.json()["status"] == "succeeded", r.json()
    assert READY_TIMEOUT_SECONDS == 2.0  # the bound the README documents


SLOW_COMMIT = """
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep({seconds});
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT OR UPDATE ON session
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON entry
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""


async def test_a_commit_left_unanswered_is_a_503_never_a_success(
    db_url: str, settings: Settings
) -> None:
    """The COMMIT itself goes unanswered (deferred triggers that sleep, so that it is
    the commit and nothing before it): whether it lands is unknown, so the answer is a
    503 within the command bound on each path (the ORM's commit, an asyncpg
    statement's implicit one, an asyncpg transaction's COMMIT), never a success."""
    bounded = settings.model_copy(
        update={
            "db_statement_timeout_seconds": 0,  # only the client's bound is left
            "db_command_timeout_seconds": 1.0,
            "db_connect_timeout_seconds": BOUND_SECONDS,
        }
    )
    app = create_app(bounded, database_url=db_url)
    dsn = db_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    with running(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
            r = await http.post("/v1/sessions", json={"id": "s", "model": "gpt-4o"})
            assert r.status_code == 201, r.text
            admin = await asyncpg.connect(dsn)
            try:
                await admin.execute(SLOW_COMMIT.format(seconds=4))
                answers = await asyncio.gather(
                    timed(http, "POST", "/v1/sessions", json={"id": "t", "model": "gpt-4o"}),
                    timed(
                        http,
                        "POST",
                        "/v1/sessions/s/messages",
                        json={"messages": turn("unanswered")},
                        headers={"Idempotency-Key": "unanswered"},
                    ),
                    timed(http, "POST", "/v1/sessions/s/usage", json={"input_tokens": 120}),
                )
                for what, r, seconds in answers:
                    print(f"\n[commit] {what}: {r.status_code} in {seconds:.2f} s (bound 1 s)")
                    assert r.status_code == 503, (what, r.status_code, r.text)
                    assert_unavailable(r)
                await admin.execute(
                    "DROP TRIGGER slow_commit ON session; DROP TRIGGER slow_commit ON entry"
                )
            finally:
                await admin.close()
            # The service carries on, and a retry with the key stores the turn once,
            # whether or not the unanswered commit landed.
            r = await http.post(
                "/v1/sessions/s/messages",
                json={"messages": turn("unanswered")},
                headers={"Idempotency-Key": "unanswered"},
            )
            assert r.status_code == 201, r.text
            assert await copies(http, "s") == {"unanswered": 1}
