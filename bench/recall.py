"""Recall: what search costs, what its indexes add to an append, and their size (docs/how-it-works.md, "Recall").

- **search** over real HTTP (``GET /v1/sessions/{id}/search``), against one session of
  10,000 entries (target: p50 <= 20 ms) and against 1,000 sessions of 1,000 entries
  each (a random one per query), with queries of each kind an agent sends: an
  identifier, a path, an error name, a four-word phrase and a single word taken from
  the session's own entries, and an identifier no entry holds. Figures per kind and
  over the mix.

  The histories are **not written through the API** (a million appends would take the
  better part of an hour here): the traces' messages are parsed, rendered, counted and
  given their searchable text once by the engine functions an append uses, and the
  sessions' rows are made from them in the database (``bench.recall_data``); the two
  search indexes are dropped for the load and built again after it. The service then
  serves them as any others.

- **append cost** of the search indexes: the traces appended turn by turn over HTTP to
  two more ``compactd serve`` processes, on two scratch databases migrated to head, one
  of which then loses the two GIN indexes and the generated ``search_tsv``; the appends
  alternate between them. The searchable text itself (computed in Python, stored in
  both) is timed apart in this process and counted as added.

- **size**: the indexes and the search columns per MB stored, on the bench's database
  after the load.

Figures only: nothing here fails on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator

import asyncpg
import httpx
import orjson

from app.core import migrations
from app.core.tenancy import DEFAULT_TENANT
from app.engine.formats import openai_format
from app.engine.search_text import search_text
from bench import recall_data
from bench.http import Connection
from tests import traces
from tests.e2e.server import free_port

SEED = 16
BIG = 10_000
SESSIONS = 1_000
PER_SESSION = 1_000
BATCH = 50  # sessions per INSERT
QUERIES_PER_KIND = 60

KINDS = {
    "identifier": re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+){1,}\b"),
    "path": re.compile(r"\b[\w.-]+(?:/[\w.-]+)+\.(?:py|cfg|toml|txt|json|rst|md)\b"),
    "error name": re.compile(r"\b[A-Z][A-Za-z]+(?:Error|Exception)\b"),
    "phrase": re.compile(r"\b[a-z]{3,} [a-z]{3,} [a-z]{3,} [a-z]{3,}\b"),
    "word": re.compile(r"\b[a-z]{5,}\b"),
}
ABSENT = "absent_identifier_"  # + a number: held by no entry
MANUAL = {"compaction": {"auto": False}, "prune": {"auto": False}}

_INDEXES = {
    "entry_search_tsv_idx": "CREATE INDEX entry_search_tsv_idx ON entry"
    " USING gin (session_id, tenant_id, search_tsv)",
    "entry_search_text_idx": "CREATE INDEX entry_search_text_idx ON entry"
    " USING gin (session_id, tenant_id, search_text gin_trgm_ops)",
}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def line(name: str, samples: list[float], extra: str = "") -> None:
    print(
        f"  {name:<44} p50 {pct(samples, 0.5):7.2f} ms   p99 {pct(samples, 0.99):7.2f} ms  {extra}"
    )


# --- the data ----------------------------------------------------------------------


async def load(
    pg: asyncpg.Connection, rows: list[recall_data.CorpusRow], rng: random.Random
) -> tuple[str, list[tuple[str, int]]]:
    """The 10,000-entry session and the 1,000 sessions (with where each starts in the
    corpus), written straight into the tables, the indexes built after."""
    await recall_data.stage(pg, rows)
    for name in _INDEXES:
        await pg.execute(f"DROP INDEX {name}")
    t = time.perf_counter()
    big = recall_data.session_ids("recall-big", 1)
    await recall_data.insert_sessions(pg, DEFAULT_TENANT, big, BIG, len(rows), [0])
    ids = recall_data.session_ids("recall", SESSIONS)
    starts = [rng.randrange(len(rows)) for _ in ids]
    for k in range(0, SESSIONS, BATCH):
        await recall_data.insert_sessions(
            pg,
            DEFAULT_TENANT,
            ids[k : k + BATCH],
            PER_SESSION,
            len(rows),
            starts[k : k + BATCH],
        )
    loaded = time.perf_counter() - t
    t = time.perf_counter()
    await pg.execute("SET maintenance_work_mem = '512MB'")
    for sql in _INDEXES.values():
        await pg.execute(sql)
    await pg.execute("ANALYZE entry")
    print(
        f"  (built directly in the database, not through the API: {BIG + SESSIONS * PER_SESSION:,}"
        f" entries from {len(rows):,} trace messages in {loaded:.0f} s, both indexes in"
        f" {time.perf_counter() - t:.0f} s)"
    )
    return big[0], list(zip(ids, starts, strict=True))


def pick(
    rows: list[recall_data.CorpusRow], first: int, count: int, kind: str, rng: random.Random
) -> str:
    """A query of ``kind`` from the corpus rows ``first .. first + count`` (wrapping)."""
    if kind == "absent":
        return f"{ABSENT}{rng.randrange(10**9)}"
    pattern = KINDS[kind]
    for _ in range(500):
        text = rows[(first + rng.randrange(count)) % len(rows)].search_text
        found = pattern.findall(text)
        if found:
            term: str = rng.choice(found)
            return term
    raise RuntimeError(f"no {kind} in that part of the corpus")


async def timed_searches(
    conn: Connection, plan: list[tuple[str, str, str]]
) -> dict[str, list[float]]:
    """Each (kind, session, query) searched once, in a shuffled order: seconds by kind."""
    samples: dict[str, list[float]] = {}
    for kind, sid, query in plan:
        url = f"/v1/sessions/{sid}/search?" + urllib.parse.urlencode({"q": query})
        t = time.perf_counter()
        status, body = await conn.request("GET", url)
        samples.setdefault(kind, []).append(time.perf_counter() - t)
        assert status == 200, body
        if kind == "absent":
            assert not orjson.loads(body)["hits"], body
    return samples


def report(label: str, samples: dict[str, list[float]], target: str = "") -> None:
    every = [s for kind in samples.values() for s in kind]
    line(f"{label}, all kinds", every, target)
    for kind, kind_samples in samples.items():
        line(f"  {kind}", kind_samples)


async def bench_search(
    conn: Connection,
    rows: list[recall_data.CorpusRow],
    big: str,
    many: list[tuple[str, int]],
    rng: random.Random,
) -> None:
    kinds = [*KINDS, "absent"]
    plan = [(k, big, pick(rows, 1, BIG, k, rng)) for k in kinds for _ in range(QUERIES_PER_KIND)]
    rng.shuffle(plan)
    for kind, sid, query in plan[:20]:  # warm the caches a little, as a running service is
        await timed_searches(conn, [(kind, sid, query)])
    report(
        f"search, one session of {BIG:,} entries",
        await timed_searches(conn, plan),
        "(target p50 <= 20 ms)",
    )

    plan = []
    for kind in kinds:
        for _ in range(QUERIES_PER_KIND):
            sid, start = rng.choice(many)
            plan.append((kind, sid, pick(rows, start + 1, PER_SESSION, kind, rng)))
    rng.shuffle(plan)
    report(
        f"search, {SESSIONS:,} sessions of {PER_SESSION:,}, a random one",
        await timed_searches(conn, plan),
    )


# --- the append cost ---------------------------------------------------------------


async def scratch_database(admin: asyncpg.Connection, base_url: str, name: str) -> str:
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    parts = urllib.parse.urlsplit(base_url)
    url = urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
    await asyncio.to_thread(migrations.upgrade, url)
    return url


@contextlib.contextmanager
def serving(url: str) -> Iterator[int]:
    """``compactd serve`` on the database at ``url``; its port."""
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "COMPACTD_PORT": str(port),
        "COMPACTD_LOG_LEVEL": "warning",
        "COMPACTD_COMPACTION_WORKERS": "0",
    }
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the scratch service did not start")
            time.sleep(0.2)
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


async def bench_append_cost(base_url: str, dsn: str) -> None:
    admin = await asyncpg.connect(dsn)
    names = {"with": "recall_with_indexes", "without": "recall_without_indexes"}
    try:
        urls = {k: await scratch_database(admin, base_url, name) for k, name in names.items()}
        plain = await asyncpg.connect(urls["without"].replace("postgresql+asyncpg", "postgresql"))
        try:
            for name in _INDEXES:
                await plain.execute(f"DROP INDEX {name}")
            await plain.execute("ALTER TABLE entry DROP COLUMN search_tsv")
        finally:
            await plain.close()
        with serving(urls["with"]) as port_with, serving(urls["without"]) as port_without:
            ports = {"with": port_with, "without": port_without}
            samples, texts = await _appends(ports)
        with_, without = samples["with"], samples["without"]
        print(
            f"  ({len(with_):,} appends of the traces' turns over HTTP, alternating between"
            " two services on two scratch databases)"
        )
        line("append, with the search indexes", with_)
        line("append, without them (no GIN, no search_tsv)", without)
        line("  of which the searchable text (Python)", texts)
        mean_text = statistics.fmean(texts)
        mean_with, mean_without = statistics.fmean(with_), statistics.fmean(without)
        added = (mean_with - mean_without + mean_text) / (mean_without - mean_text)
        print(
            f"  {'added by search, on the mean append':<44} {added * 100:6.1f} %"
            f"   (p50 {pct(with_, 0.5) / pct(without, 0.5) * 100 - 100:+.1f} %;"
            f" mean {mean_with * 1000:.2f} vs {mean_without * 1000:.2f} ms; target <= 15 %)"
        )
    finally:
        for name in names.values():
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def _appends(ports: dict[str, int]) -> tuple[dict[str, list[float]], list[float]]:
    """Every trace appended turn by turn to both services (each session made by the API,
    nothing automatic); the seconds of each append, and of computing the searchable
    text of each turn in this process."""
    samples: dict[str, list[float]] = {"with": [], "without": []}
    texts: list[float] = []
    order = ["with", "without"]
    conns = {k: await Connection("127.0.0.1", port).__aenter__() for k, port in ports.items()}
    try:
        for path in traces.trace_files():
            sids = {}
            for which, conn in conns.items():
                status, body = await conn.request(
                    "POST", "/v1/sessions", {"model": "gpt-4o", "config": MANUAL}
                )
                assert status == 201, body
                sids[which] = orjson.loads(body)["id"]
            for batch in traces.turns(traces.load(path)):
                t = time.perf_counter()
                for i, m in enumerate(batch):
                    search_text(openai_format.parse_message(m, f"messages[{i}]").parts)
                texts.append(time.perf_counter() - t)
                order.reverse()  # each goes first half the time
                for which in order:
                    t = time.perf_counter()
                    status, body = await conns[which].request(
                        "POST", f"/v1/sessions/{sids[which]}/messages", {"messages": batch}
                    )
                    samples[which].append(time.perf_counter() - t)
                    assert status == 201, body
    finally:
        for conn in conns.values():
            await conn.__aexit__()
    return samples, texts


# --- the size ----------------------------------------------------------------------

_SIZE_SQL = """
SELECT pg_table_size('entry') AS table_bytes,
    pg_relation_size('entry_search_tsv_idx') AS tsv_index,
    pg_relation_size('entry_search_text_idx') AS text_index,
    (SELECT sum(pg_column_size(search_text)) FROM entry) AS text_bytes,
    (SELECT sum(pg_column_size(search_tsv)) FROM entry) AS tsv_bytes,
    (SELECT count(*) FROM entry) AS entries
"""


async def bench_size(pg: asyncpg.Connection) -> None:
    row = await pg.fetchrow(_SIZE_SQL)
    assert row is not None
    mb = 2**20
    stored = (row["table_bytes"] - row["text_bytes"] - row["tsv_bytes"]) / mb
    indexes = (row["tsv_index"] + row["text_index"]) / mb
    columns = (row["text_bytes"] + row["tsv_bytes"]) / mb
    print(
        f"  {row['entries']:,} entries: the table {row['table_bytes'] / mb:,.0f} MB, of which"
        f" search_text {row['text_bytes'] / mb:,.0f} MB and search_tsv {row['tsv_bytes'] / mb:,.0f}"
        f" MB; the words index {row['tsv_index'] / mb:,.0f} MB, the trigram index"
        f" {row['text_index'] / mb:,.0f} MB"
    )
    print(
        f"  {'index size per MB stored (without search)':<44} {indexes / stored:6.2f} MB"
        f"   (the search columns add {columns / stored:.2f} MB more;"
        f" indexes per MB of searchable text {indexes * mb / row['text_bytes']:.2f} MB)"
    )


async def bench_recall(host: str, port: int, base_url: str) -> None:
    print("\nRecall")
    dsn = base_url.replace("postgresql+asyncpg://", "postgresql://", 1)
    rng = random.Random(SEED)
    rows = recall_data.corpus_rows(recall_data.corpus_messages())
    pg = await asyncpg.connect(dsn)
    try:
        big, many = await load(pg, rows, rng)
        async with Connection(host, port) as conn:
            await bench_search(conn, rows, big, many, rng)
        await bench_size(pg)
    finally:
        await pg.close()
    await bench_append_cost(base_url, dsn)
