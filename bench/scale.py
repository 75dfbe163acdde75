"""Scale-out: the load bench's mixed agent traffic (:mod:`bench.load`) against
``compactd serve --workers N`` for N = 1, 2 and 4 on one PostgreSQL, and against 4
processes behind a real PgBouncer in transaction pooling (``COMPACTD_DATABASE_POOLER=
pgbouncer``, the LISTEN connections on the direct URL), each started for its run.

For each: the closed-loop rate, the open-loop maximum (the same bisection as the load
bench), then an open-loop run at 50 % of that maximum with its p99, and the CPU shares of
the service (all its processes), PostgreSQL and the load generator. The runs on one
PostgreSQL have one connection budget, one process's default pool shared by the N
processes; behind PgBouncer each process has its default pool and PgBouncer
``PGBOUNCER_POOL_SIZE`` server connections. This machine has two
cores shared by all three, so more processes can only add what the cores have left: the
figures say how much, as measured. The bench prints; it never fails on timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import psutil

from app.core.database import statement_timeout_ms
from app.core.settings import Settings
from bench import load
from tests.e2e.server import free_port

PROCESSES = (1, 2, 4)
BEHIND_PGBOUNCER = 4  # processes in the PgBouncer run
PGBOUNCER_POOL_SIZE = 20  # server connections PgBouncer keeps for the database
# One process's pool and overflow (the defaults), shared by the processes of a run.
DB_POOL_SIZE = Settings().db_pool_size
DB_MAX_OVERFLOW = Settings().db_max_overflow


@dataclass
class Outcome:
    label: str
    closed: float
    maximum: float
    p99: float
    errors: int
    shares: dict[str, float]


@contextlib.contextmanager
def serving(
    env: dict[str, str], workers: int, *, share_pool: bool = True
) -> Iterator[tuple[int, psutil.Process]]:
    """``compactd serve --workers N`` on a free port, until the block ends. With
    ``share_pool``, the N processes share one process's database connections (the pool
    and its overflow divided by N): every run then has the same connection budget, and
    four default pools with the bench's own service would pass the embedded server's
    ``max_connections`` of 100 (each refused connection a 503)."""
    if share_pool:
        env = {
            **env,
            "COMPACTD_DB_POOL_SIZE": str(max(4, DB_POOL_SIZE // workers)),
            "COMPACTD_DB_MAX_OVERFLOW": str(max(2, DB_MAX_OVERFLOW // workers)),
        }
    port = free_port()
    log = Path(env["COMPACTD_BENCH_SCALE_LOG"])
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "serve", "--workers", str(workers)],
            env={**env, "COMPACTD_PORT": str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"serve --workers {workers} did not start (log: {log})")
            time.sleep(0.2)
        server = psutil.Process(process.pid)
        # Every server process up (one process serves by itself; N have a supervisor).
        while workers > 1 and len(server.children()) < workers and time.monotonic() < deadline:
            time.sleep(0.2)
        yield port, server
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


async def run_one(
    label: str, port: int, server: psutil.Process, pgdata: Path, seconds: float
) -> Outcome:
    print(f"\n  --- {label}")
    cpu = load.Cpu(server, pgdata)
    pool = load.Pool("127.0.0.1", port, load.MAX_CONNECTIONS)
    try:
        agents = await load.create_agents(pool, random.Random(load.SEED))
        closed = await load.saturation(pool, agents, cpu)
        maximum = await load.open_loop_capacity(pool, agents, closed)
        agents = await load.create_agents(pool, random.Random(load.SEED))
        await asyncio.sleep(2)
        rng = random.Random(load.SEED + 50)
        half = await load.open_loop(
            pool, agents, server, cpu, maximum * 0.5, seconds, f"{label}, 50% load", rng
        )
    finally:
        pool.close()
    every = [x for kind in load.KINDS for x in half.stats.latency[kind]]
    return Outcome(
        label, closed, maximum, load.ms(every, 0.99), half.stats.errors(), dict(cpu.shares)
    )


@contextlib.asynccontextmanager
async def role_timeout(dsn: str, statement_timeout_ms: int) -> AsyncIterator[None]:
    """The statement_timeout behind a transaction pooler comes from the role (see
    docs/deployment.md, Behind PgBouncer): set for the block, reset after it (the later
    sections' own connections must not inherit it)."""
    conn = await asyncpg.connect(dsn)
    try:
        database = await conn.fetchval("SELECT current_database()")
        scope = f'ALTER ROLE CURRENT_USER IN DATABASE "{database}"'
        await conn.execute(f"{scope} SET statement_timeout = {statement_timeout_ms}")
        try:
            yield
        finally:
            await conn.execute(f"{scope} RESET statement_timeout")
    finally:
        await conn.close()


async def _behind_pgbouncer(
    bouncers: Any,
    url: str,
    libpq: str,
    env: dict[str, str],
    pgdata: Path,
    seconds: float,
    outcomes: list[Outcome],
) -> None:
    """The run behind PgBouncer (``bouncers``: the tests' module that starts one)."""
    with bouncers.running_pgbouncer(libpq, PGBOUNCER_POOL_SIZE) as bouncer:
        behind = {
            **env,
            "DATABASE_URL": bouncer.url(url),
            "COMPACTD_DATABASE_POOLER": "pgbouncer",
            "COMPACTD_DATABASE_DIRECT_URL": url,
        }
        # Behind PgBouncer each process keeps its default pool: the pooler's own
        # PGBOUNCER_POOL_SIZE server connections are what reach the database.
        with serving(behind, BEHIND_PGBOUNCER, share_pool=False) as (port, server):
            label = f"{BEHIND_PGBOUNCER} processes behind PgBouncer"
            outcomes.append(await run_one(label, port, server, pgdata, seconds))


async def bench_scale(url: str, pgdata: Path, env: dict[str, str], seconds: float) -> None:
    print(
        "\nScale-out: the load mix against serve --workers N on one PostgreSQL, and behind"
        f" PgBouncer ({os.cpu_count()} cores for service, PostgreSQL and the generator)"
    )
    env = {
        **env,
        "DATABASE_URL": url,
        "COMPACTD_LOG_LEVEL": "warning",
        "COMPACTD_COMPACTION_WORKERS": "1",
        "COMPACTD_BENCH_SCALE_LOG": str(pgdata.parent / "scale.log"),
    }
    outcomes: list[Outcome] = []
    for workers in PROCESSES:
        with serving(env, workers) as (port, server):
            outcomes.append(
                await run_one(
                    f"{workers} process{'es' if workers > 1 else ''}", port, server, pgdata, seconds
                )
            )

    from tests.pgbouncer import conftest as bouncers  # the tests' PgBouncer, bigger pools

    try:
        bouncers.pgbouncer_binary()
    except BaseException:  # pytest's skip: not installed
        print("\n  PgBouncer: not installed (apt-get install pgbouncer), run skipped")
    else:
        libpq = url.replace("postgresql+asyncpg://", "postgresql://", 1)
        async with role_timeout(libpq, statement_timeout_ms(Settings())):
            await _behind_pgbouncer(bouncers, url, libpq, env, pgdata, seconds, outcomes)

    print("\n  scale-out summary (CPU as shares of one core)")
    base = outcomes[0].maximum
    for o in outcomes:
        shares = o.shares
        print(
            f"  {o.label:<48} closed loop {o.closed:5.0f} req/s, open-loop max {o.maximum:5.0f}"
            f" req/s ({o.maximum / base:4.2f}x), p99 at 50% {o.p99:7.1f} ms, errors {o.errors};"
            f" CPU at 50%: service {shares.get('service', 0):.0%},"
            f" PostgreSQL {shares.get('postgres', 0):.0%},"
            f" generator {shares.get('generator', 0):.0%},"
            f" other processes {shares.get('other', 0):.0%}"
        )
    print(
        "  (other processes: PgBouncer in its run; this machine's cores are shared by all of"
        " them, so more server processes can only use what PostgreSQL and the generator leave)"
    )
