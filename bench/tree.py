"""The history is a tree: what a tree costs over a line (docs/how-it-works.md, "The tree").

Over real HTTP against the bench's ``compactd serve`` (embedded PostgreSQL), with a
``compactd worker`` of its own for the two compactions below:

- **context read and one-message append at the leaf** of a 10,000-entry tree with 100
  branches, against a 10,000-entry line (target: p50 and p99 each <= 1.2x the line's).
  The tree is built in batches of 100: the first branch holds a system prompt, a
  question and 49 tool steps (an assistant call and its result); then 99 times a
  navigation back to a random tool result among the last 100 entries of the active
  path, and 100 entries (50 steps) after it. So every branch stays on the leaf's path:
  the leaf's path runs through all 100 branches (the most segments the key condition
  can get from 100 branches) and is about 5,000 entries deep. The line is the same
  system prompt, question and 4,999 steps, in one branch.

  The window: both sessions have automatic compaction and pruning off, and one
  compaction (extractive, ``keep_recent_tokens`` 20,000) at the leaf once built. So
  both contexts are a realistic size (the system prompt, the summary and the newest
  steps within 20,000 tokens), and the same: every step is the same size, so both keep
  the same number of entries (checked before measuring). Without it the window would be
  the whole path, and the read would measure the path's depth (about 5,000 entries in
  the tree against 10,000 in the line), not the tree. Reads of the two alternate, as do
  appends, so the machine's noise falls on both alike. The appends alternate an
  assistant call and its result (each one message), the result being the case that
  looks up its call along the path.

- **fork** at the leaf of lines of 100, 1,000 and 10,000 entries with no compaction
  (the window is the whole history), and of the 10,000-entry line once compacted
  (target <= 20 ms, independent of the length). A fork recounts its context from the
  window it inherits, so the first three show how that scales, the last what a
  compacted session pays.

- **navigate** without summary (target <= 10 ms), by entry id (as the appends returned
  them), each from wherever the previous one landed: first to random entries appended
  after the compaction at the tree's leaf (the window they land in is the entries it
  kept and those: 80 to 280 entries), then to random entries of the whole tree, split
  by how deep the target is, since a navigation recounts the window it lands in (the
  whole path up to the target when no compaction precedes it on its path: an entry
  before a compaction undoes it). With each, the service's and the database's CPU per
  navigation. The first line is taken before the tables were ever analyzed: PostgreSQL
  has no statistics of the 10,000 entries the bench wrote a minute ago and plans the
  family as a row or two (a scan of the whole family where the key finds one entry).
  Autovacuum analyzes them within its first minute on a running server (a table is due
  after 50 changes); the bench then runs ``ANALYZE`` itself, so that the lines after it
  measure that steady state, not how soon autovacuum came.

- ``GET /tree``: its first page of 1, 200 (the default) and 1,000 entries of that tree.

Figures only: nothing here fails on time.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from typing import Any

import asyncpg
import orjson

from bench.cpu import Meter
from bench.http import Connection

SEED = 15
ENTRIES = 10_000
BRANCHES = 100
BATCH = 100
READS = 200
APPENDS = 200
FORKS = 30
NAVIGATIONS = 200
KEEP_RECENT_TOKENS = 20_000
# Automatic compaction and pruning off: the one compaction is requested once built.
CONFIG = {
    "compaction": {"auto": False, "keep_recent_tokens": KEEP_RECENT_TOKENS},
    "prune": {"auto": False},
}
SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to fix the bug."}
QUESTION = {"role": "user", "content": "The test suite fails on test_parse; find out why."}
OUTPUT = "\n".join(f"tests/test_mod.py::test_case_{i} PASSED" for i in range(40))


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def line(name: str, samples: list[float], extra: str = "") -> None:
    print(
        f"  {name:<44} p50 {pct(samples, 0.5):7.2f} ms   p99 {pct(samples, 0.99):7.2f} ms  {extra}"
    )


def ratio(name: str, tree: list[float], flat: list[float], target: float) -> None:
    p50 = pct(tree, 0.5) / pct(flat, 0.5)
    p99 = pct(tree, 0.99) / pct(flat, 0.99)
    print(f"  {name:<44} p50 {p50:5.2f}x   p99 {p99:5.2f}x   (target <= {target}x each)")


def call(call_id: str, step: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": f"Step {step}: run the tests again.",
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": "bash", "arguments": '{"command": "pytest -x -q"}'},
            }
        ],
    }


def result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": OUTPUT}


def steps(tag: str, count: int) -> list[dict[str, Any]]:
    """``count`` messages of tool steps: an assistant call, then its result."""
    out: list[dict[str, Any]] = []
    for k in range(count // 2):
        out += [call(f"{tag}-{k}", k), result(f"{tag}-{k}")]
    return out


async def ok(
    conn: Connection, method: str, path: str, body: Any = None, expect: int = 200
) -> dict[str, Any]:
    status, raw = await conn.request(method, path, body)
    assert status == expect, (method, path, status, raw[:500])
    document: dict[str, Any] = orjson.loads(raw)
    return document


async def new_session(conn: Connection) -> str:
    created = await ok(
        conn, "POST", "/v1/sessions", {"model": "gpt-4o", "config": CONFIG}, expect=201
    )
    sid: str = created["id"]
    return sid


async def append(
    conn: Connection, sid: str, messages: list[dict[str, Any]]
) -> list[tuple[str, int]]:
    """Append in batches; the stored entries' ids and seqs."""
    stored: list[tuple[str, int]] = []
    for k in range(0, len(messages), BATCH):
        body = {"messages": messages[k : k + BATCH]}
        answer = await ok(conn, "POST", f"/v1/sessions/{sid}/messages", body, 201)
        stored.extend((e["id"], e["seq"]) for e in answer["entries"])
    return stored


async def build_line(conn: Connection, entries: int, tag: str) -> str:
    """A line of ``entries`` messages: the system prompt, the question, tool steps."""
    sid = await new_session(conn)
    await append(conn, sid, [SYSTEM, QUESTION, *steps(tag, entries - 2)])
    return sid


async def build_tree(
    conn: Connection, rng: random.Random
) -> tuple[str, list[tuple[str, int]], int, int]:
    """The 10,000-entry tree of 100 branches: its id, its entries (id and seq), the
    leaf's depth and the number of segments of the leaf's path."""
    sid = await new_session(conn)
    entries = await append(conn, sid, [SYSTEM, QUESTION, *steps("t0", BATCH - 2)])
    leaf = BATCH
    for b in range(1, BRANCHES):
        # A random tool result (the even seqs from 4 on) among the last 100 entries of
        # the path, short of the leaf: a new branch after it.
        lo = max(4, leaf - BATCH + 1)
        back = rng.randrange(lo + lo % 2, leaf - 1, 2)
        moved = await ok(conn, "POST", f"/v1/sessions/{sid}/navigate", {"seq": back})
        assert moved["status"] == "moved", moved
        entries += await append(conn, sid, steps(f"t{b}", BATCH))
        leaf = back + BATCH
    assert len(entries) == ENTRIES
    page = await ok(conn, "GET", f"/v1/sessions/{sid}/tree?limit=1")
    assert page["leaf_seq"] == leaf, page
    return sid, entries, leaf, len(page["path"])


async def compact(conn: Connection, sid: str) -> None:
    job = await ok(
        conn,
        "POST",
        f"/v1/sessions/{sid}/compactions",
        {"wait": 120, "summarizer": "extractive"},
        expect=202,
    )
    assert job["status"] == "succeeded", job


async def bench_leaf(conn: Connection, flat: str, tree: str) -> list[tuple[str, int]]:
    """Context reads and appends at both leaves; the entries appended to the tree."""
    contexts = {sid: await ok(conn, "GET", f"/v1/sessions/{sid}/context") for sid in (flat, tree)}
    sizes = {sid: len(c["messages"]) for sid, c in contexts.items()}
    tokens = {sid: c["tokens"]["estimated"] for sid, c in contexts.items()}
    assert sizes[flat] == sizes[tree], f"the windows differ: {sizes}"
    reads: dict[str, list[float]] = {flat: [], tree: []}
    for _ in range(READS):
        for sid in (flat, tree):
            t = time.perf_counter()
            status, body = await conn.request("GET", f"/v1/sessions/{sid}/context")
            reads[sid].append(time.perf_counter() - t)
            assert status == 200, body
    print(
        f"  (both contexts: {sizes[flat]} messages; {tokens[flat]:,} tokens in the line's,"
        f" {tokens[tree]:,} in the tree's)"
    )
    line("context read, 10,000-entry line", reads[flat])
    line("context read, leaf of the 10,000-entry tree", reads[tree])
    ratio("context read, tree / line", reads[tree], reads[flat], 1.2)

    appends: dict[str, list[float]] = {flat: [], tree: []}
    appended: list[tuple[str, int]] = []
    for k in range(APPENDS):
        call_id = f"leaf-{k // 2}"
        message = call(call_id, k) if k % 2 == 0 else result(call_id)
        for sid in (flat, tree):
            t = time.perf_counter()
            status, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/messages", {"messages": [message]}
            )
            appends[sid].append(time.perf_counter() - t)
            assert status == 201, body
            if sid == tree:
                appended.extend((e["id"], e["seq"]) for e in orjson.loads(body)["entries"])
    line("append one message, 10,000-entry line", appends[flat])
    line("append one message, leaf of the tree", appends[tree])
    ratio("append, tree / line", appends[tree], appends[flat], 1.2)
    return appended


async def bench_forks(conn: Connection, sources: dict[str, str]) -> None:
    for label, sid in sources.items():
        samples: list[float] = []
        for _ in range(FORKS):
            t = time.perf_counter()
            status, body = await conn.request("POST", f"/v1/sessions/{sid}/fork", {})
            samples.append(time.perf_counter() - t)
            assert status == 201, body
        line(f"fork at the leaf, {label}", samples, "(target <= 20 ms)")


async def bench_tree_page(conn: Connection, sid: str) -> None:
    """``GET /tree``'s first page, at a few sizes (a few reads each: a large page of a
    large tree is slow, and may end on the statement timeout, a 503)."""
    for limit in (1, 200, 1000):
        samples: list[float] = []
        statuses: set[int] = set()
        for _ in range(3 if limit < 1000 else 1):
            t = time.perf_counter()
            status, _body = await conn.request("GET", f"/v1/sessions/{sid}/tree?limit={limit}")
            samples.append(time.perf_counter() - t)
            statuses.add(status)
        line(f"GET /tree, first page of {limit:,}", samples, f"status {sorted(statuses)}")


async def navigations(
    conn: Connection, sid: str, targets: list[tuple[str, int]], meter: Meter
) -> tuple[list[tuple[int, float]], str]:
    """Navigate to each target (by id) in turn: its seq and how long it took, and the
    service's and the database's CPU per navigation."""
    samples: list[tuple[int, float]] = []
    before = meter.read()
    for entry_id, seq in targets:
        t = time.perf_counter()
        status, body = await conn.request(
            "POST", f"/v1/sessions/{sid}/navigate", {"entry_id": entry_id}
        )
        samples.append((seq, time.perf_counter() - t))
        assert status == 200, body
        assert orjson.loads(body)["leaf_seq"] == seq, body
    service, db, _ = (
        (a - b) / len(targets) * 1000 for a, b in zip(meter.read(), before, strict=True)
    )
    return samples, f"CPU {service:.2f} ms service, {db:.2f} ms database"


async def bench_navigate(
    conn: Connection,
    sid: str,
    entries: list[tuple[str, int]],
    after_compaction: list[tuple[str, int]],
    rng: random.Random,
    meter: Meter,
    dsn: str,
) -> None:
    # Within the compacted window: the entries appended after the compaction (an
    # entry before it would undo it, and land in the whole path). First on tables
    # never analyzed yet (the module's docstring), then analyzed.
    near, cpu = await navigations(
        conn, sid, [rng.choice(after_compaction) for _ in range(NAVIGATIONS // 2)], meter
    )
    line("navigate, after the compaction, not analyzed", [s for _, s in near], cpu)
    db = await asyncpg.connect(dsn)
    try:
        await db.execute("ANALYZE")
    finally:
        await db.close()
    near, cpu = await navigations(
        conn, sid, [rng.choice(after_compaction) for _ in range(NAVIGATIONS // 2)], meter
    )
    line("navigate, no summary, after the compaction", [s for _, s in near], "(target <= 10 ms)")
    print(f"  {'':<44} {cpu} per navigation")
    # Anywhere in the tree: most targets are before the compaction on their path,
    # so the window they land in is their whole path.
    anywhere, cpu = await navigations(conn, sid, rng.sample(entries, NAVIGATIONS), meter)
    line("navigate, no summary, to random entries", [s for _, s in anywhere], "(target <= 10 ms)")
    print(f"  {'':<44} {cpu} per navigation")
    for lo, hi in ((1, 1_000), (1_000, 3_000), (3_000, ENTRIES)):
        part = [s for seq, s in anywhere if lo <= seq < hi]
        if part:
            line(f"  targets at depth {lo:,}..{hi - 1:,} ({len(part)})", part)


async def bench_tree(
    host: str, port: int, worker_env: dict[str, str], meter: Meter, dsn: str
) -> None:
    """``meter``: the service's and the database's CPU; ``dsn``: the database (asyncpg),
    for its ``ANALYZE``."""
    print("\nTree")
    rng = random.Random(SEED)
    async with Connection(host, port) as conn:
        t = time.perf_counter()
        flat = await build_line(conn, ENTRIES, "l")
        tree, entries, depth, segments = await build_tree(conn, rng)
        small = {n: await build_line(conn, n, f"f{n}") for n in (100, 1_000)}
        print(
            f"  (built in {time.perf_counter() - t:.1f} s: the tree's leaf is {depth:,} deep,"
            f" its path {segments} segments)"
        )
        await bench_forks(
            conn,
            {
                "100 entries": small[100],
                "1,000 entries": small[1_000],
                "10,000 entries": flat,
            },
        )
    worker = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
        [sys.executable, "-m", "app.cli", "worker", "--count", "1"], env=worker_env
    )
    try:
        # A new connection: the idle one may have been closed by the keep-alive timeout.
        async with Connection(host, port) as conn:
            t = time.perf_counter()
            await compact(conn, flat)
            await compact(conn, tree)
            print(f"  (compacted both at the leaf in {time.perf_counter() - t:.1f} s)")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    async with Connection(host, port) as conn:
        await bench_forks(conn, {"10,000 entries, compacted": flat})
        appended = await bench_leaf(conn, flat, tree)
        await bench_navigate(conn, tree, entries, appended, rng, meter, dsn)
        await bench_tree_page(conn, tree)
