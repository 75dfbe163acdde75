"""compactd benchmarks on embedded PostgreSQL, with a naive baseline beside them.

Starts ``compactd serve`` as its own process (embedded PostgreSQL in a
temporary folder) and measures over real HTTP:

- CPU per request: the service's and the database's per one-message append beside a
  raw asyncpg INSERT, and per context read beside a bare endpoint running the same
  statements (:mod:`bench.cpu`);
- append latency and throughput: single messages (sequential, then concurrent
  clients) and 100-message batches;
- context reads at 100 and 1,000 stored messages, built from the real traces;
- the naive baseline for the same sessions: load every row, count tokens with
  tiktoken on each request, build the list (what a service without stored
  counts does), measured in this process against the same database;
- what one large request costs the others: the worst ``/healthz`` and context
  latency while a maximum-size append (or a hostile body as large) is processed;
- scale-out: the load mix against ``serve --workers`` 1, 2 and 4 on one PostgreSQL and
  behind PgBouncer (:mod:`bench.scale`);
- the proxy's added latency per call, and to a stream's first byte, over calling the
  scripted upstream directly, at 100 and 10,000 stored messages (:mod:`bench.proxy`);
- continuity after compaction: the real traces replayed at a 16k window in the engine
  alone (no service, no database), and what each compaction's context still holds of
  the task, the modified files and the last error (:mod:`bench.continuity`);
- the tree: context read and append at the leaf of a 10,000-entry tree of 100 branches
  against a 10,000-entry line, forks and navigations (:mod:`bench.tree`);
- events and webhooks: their cost on an append, SSE fan-out to 100 streams, webhook
  delivery throughput (:mod:`bench.events`);
- recall: search over a 10,000-entry session and over 1,000 sessions of 1,000 entries
  (written straight into the database), the append cost of the search indexes and their
  size (:mod:`bench.recall`). It runs last: it leaves a million entries behind.

``python -m bench eval [options]`` is apart: the scorecard of :mod:`bench.eval` (``make
eval``), continuity and recall after compaction per strategy beside a naive baseline,
with options of its own (``python -m bench eval --help``). It is not one of the sections
the plain ``python -m bench`` runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import orjson
import psutil

from app.context.service import ContextService
from app.core import embedded
from app.core.database import create_engine
from app.core.settings import Settings
from app.core.tenancy import DEFAULT_TENANT
from app.core.tokenizer import load_encodings
from app.engine.accounting import tokens
from app.engine.formats import openai_format
from app.history.service import entry_from_row
from bench import bounds, continuity, cpu, events, load, proxy, recall, scale, tree, upstream
from bench import eval as eval_scorecard
from bench.http import Connection
from tests import traces
from tests.e2e.server import free_port


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def line(name: str, samples: list[float], extra: str = "") -> None:
    print(
        f"  {name:<44} p50 {pct(samples, 0.5):7.2f} ms   p99 {pct(samples, 0.99):7.2f} ms  {extra}"
    )


def corpus() -> list[dict[str, Any]]:
    """Real messages from the traces, with call ids made unique per copy."""
    out: list[dict[str, Any]] = []
    for path in traces.trace_files():
        out.extend(traces.load(path))
    return out


def session_messages(all_msgs: list[dict[str, Any]], n: int, tag: str) -> list[dict[str, Any]]:
    """``n`` valid messages (whole turns) from the corpus, with ids unique to ``tag``."""
    picked: list[dict[str, Any]] = []
    i = 0
    while len(picked) < n:
        m = dict(all_msgs[i % len(all_msgs)])
        i += 1
        if m["role"] == "tool" and (not picked or picked[-1]["role"] not in ("assistant", "tool")):
            continue
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "id": f"{c['id']}-{tag}-{i}"} for c in m["tool_calls"]]
            last_ids = [c["id"] for c in m["tool_calls"]]
        if m["role"] == "tool":
            if not last_ids:
                continue
            m["tool_call_id"] = last_ids.pop(0)
        elif m["role"] != "assistant":
            last_ids = []
        picked.append(m)
        if m["role"] == "assistant":
            pending = [c["id"] for c in m.get("tool_calls") or []]
            last_ids = pending
    # Close dangling calls so every session is complete.
    while picked and picked[-1]["role"] == "assistant" and picked[-1].get("tool_calls"):
        picked.pop()
    return picked


async def new_session(
    conn: Connection, model: str = "gpt-4o", config: dict[str, Any] | None = None
) -> str:
    status, body = await conn.request(
        "POST", "/v1/sessions", {"model": model, "config": config or {}}
    )
    assert status == 201, body
    sid: str = orjson.loads(body)["id"]
    return sid


async def bench_appends(host: str, port: int, server: psutil.Process) -> None:
    print("\nAppend")
    msg = {
        "role": "user",
        "content": "Please run the failing test again and show me the traceback. " * 4,
    }
    async with Connection(host, port) as conn:
        sid = await new_session(conn)
        samples: list[float] = []
        for _ in range(400):
            t = time.perf_counter()
            status, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/messages", {"messages": [msg]}
            )
            samples.append(time.perf_counter() - t)
            assert status == 201, body
        line("single message, sequential", samples, "(target p50 <= 8 ms)")
        sids = [await new_session(conn) for _ in range(16)]

    for clients, same in ((16, False), (16, True)):
        per = 150
        lat: list[float] = []

        async def worker(target: str, lat: list[float], per: int = per) -> None:
            async with Connection(host, port) as conn:
                for _ in range(per):
                    t = time.perf_counter()
                    status, body = await conn.request(
                        "POST", f"/v1/sessions/{target}/messages", {"messages": [msg]}
                    )
                    lat.append(time.perf_counter() - t)
                    assert status == 201, body

        cpu0 = sum(server.cpu_times()[:2])
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(sids[0] if same else sids[k], lat) for k in range(clients)))
        elapsed = time.perf_counter() - t0
        cpu = (sum(server.cpu_times()[:2]) - cpu0) / (clients * per) * 1000
        where = "one shared session" if same else "a session each"
        line(
            f"single, {clients} concurrent clients, {where}",
            lat,
            f"{clients * per / elapsed:7.0f} appends/s (target >= 500),"
            f" service CPU {cpu:.2f} ms/append",
        )

    all_msgs = corpus()
    batch_samples: list[float] = []
    async with Connection(host, port) as conn:
        sid = await new_session(conn)
        for b in range(40):
            batch = session_messages(all_msgs[b * 37 :] + all_msgs, 100, f"b{b}")
            t = time.perf_counter()
            status, body = await conn.request(
                "POST", f"/v1/sessions/{sid}/messages", {"messages": batch}
            )
            batch_samples.append(time.perf_counter() - t)
            assert status == 201, body
    total = sum(batch_samples)
    line(
        "100-message batch (real trace messages)",
        batch_samples,
        f"{40 * 100 / total:7.0f} messages/s",
    )


async def naive_context(conn: asyncpg.Connection, sid: str) -> list[dict[str, Any]]:
    """The baseline: every row, re-tokenized on every request, then rendered."""
    rows = await conn.fetch(
        "SELECT seq, role, parts, tool_call_id, tool_name, is_error, name, content_form, tokens,"
        " extra FROM entry WHERE session_id = $1 ORDER BY seq",
        sid,
    )
    entries = [entry_from_row(row, row.extra) for row in map(_Row, rows)]
    total = sum(tokens.count_entry(e) for e in entries)
    messages = [openai_format.render_message(e) for e in entries]
    assert total > 0
    return messages


class _Row:
    def __init__(self, record: asyncpg.Record) -> None:
        import orjson

        self._r = record
        self.parts = orjson.loads(record["parts"])
        self.extra = orjson.loads(record["extra"]) if record["extra"] else None

    def __getattr__(self, name: str) -> Any:
        return self._r[name]


async def bench_context(host: str, port: int, dsn: str) -> None:
    print("\nContext read (GET /context, openai) vs naive baseline")
    all_msgs = corpus()
    client = await Connection(host, port).__aenter__()
    conn = await asyncpg.connect(dsn)
    engine = create_engine(dsn.replace("postgresql://", "postgresql+asyncpg://", 1), Settings())
    try:
        for size in (100, 1000):
            sid = await new_session(client, "gpt-4.1")
            msgs = session_messages(all_msgs, size, f"c{size}")
            for k in range(0, len(msgs), 100):
                status, body = await client.request(
                    "POST", f"/v1/sessions/{sid}/messages", {"messages": msgs[k : k + 100]}
                )
                assert status == 201, body
            ours: list[float] = []
            ours_direct: list[float] = []
            naive: list[float] = []
            reads = 200 if size == 100 else 60
            for _ in range(reads):
                t = time.perf_counter()
                status, body = await client.request("GET", f"/v1/sessions/{sid}/context")
                ours.append(time.perf_counter() - t)
                assert status == 200, body
                t = time.perf_counter()
                direct = await ContextService(engine, DEFAULT_TENANT).build(sid, "openai")
                ours_direct.append(time.perf_counter() - t)
                assert direct == body
                t = time.perf_counter()
                await naive_context(conn, sid)
                naive.append(time.perf_counter() - t)
            n = len(orjson.loads(body)["messages"])
            line(f"compactd, {n} messages (over HTTP)", ours)
            line(f"compactd, {n} messages (in-process, same path)", ours_direct)
            line(
                f"naive baseline, {n} messages (in-process)",
                naive,
                f"ratio {pct(naive, 0.5) / pct(ours_direct, 0.5):5.1f}x in-process,"
                f" {pct(naive, 0.5) / pct(ours, 0.5):5.1f}x vs HTTP (target >= 10x at 1,000)",
            )
    finally:
        await conn.close()
        await engine.dispose()
        await client.__aexit__()


def tool_session(entries: int, tag: str, output_tokens: int = 300) -> list[dict[str, Any]]:
    """``entries`` messages: a user turn every 100 steps, then per step an assistant
    call and a bash result of about ``output_tokens`` tokens."""
    msgs: list[dict[str, Any]] = []
    k = 0
    while len(msgs) < entries:
        if k % 100 == 0:
            msgs.append({"role": "user", "content": f"Continue with part {k // 100}."})
        call = {
            "id": f"{tag}-{k}",
            "type": "function",
            "function": {"name": "bash", "arguments": '{"command": "pytest -x"}'},
        }
        lines = "\n".join(f"test_{k}_{i} PASSED" for i in range(output_tokens // 6))
        msgs.append({"role": "assistant", "content": f"Step {k}.", "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": call["id"], "content": lines})
        k += 1
    return msgs[:entries]


async def fill(conn: Connection, sid: str, msgs: list[dict[str, Any]]) -> None:
    for k in range(0, len(msgs), 200):
        status, body = await conn.request(
            "POST", f"/v1/sessions/{sid}/messages", {"messages": msgs[k : k + 200]}
        )
        assert status == 201, body


async def bench_budget(host: str, port: int) -> None:
    print("\nBudget and pruning")
    # Pruning and verdicts alone: no automatic compaction changes the window.
    manual = {"prune": {"auto": False}, "compaction": {"auto": False}}
    async with Connection(host, port) as conn:
        verdicts: dict[int, list[float]] = {}
        for size in (100, 10_000):
            sid = await new_session(conn, config={"compaction": {"auto": False}})
            await fill(conn, sid, tool_session(size, f"v{size}"))
            samples = verdicts[size] = []
            for _ in range(300):
                t = time.perf_counter()
                status, body = await conn.request("GET", f"/v1/sessions/{sid}/overflow")
                samples.append(time.perf_counter() - t)
                assert status == 200, body
            line(f"overflow verdict, {size} entries", samples)
        ratio = pct(verdicts[10_000], 0.5) / pct(verdicts[100], 0.5)
        print(f"  {'verdict p50 ratio, 10,000 vs 100 entries':<44} {ratio:5.2f}   (target <= 1.5)")

        first: list[float] = []
        again: list[float] = []
        saved: list[int] = []
        for run in range(5):
            status, body = await conn.request(
                "POST", "/v1/sessions", {"model": "gpt-4o", "config": manual}
            )
            sid = orjson.loads(body)["id"]
            await fill(conn, sid, tool_session(10_000, f"p{run}"))
            t = time.perf_counter()
            status, body = await conn.request("POST", f"/v1/sessions/{sid}/prune", {})
            first.append(time.perf_counter() - t)
            assert status == 200, body
            result = orjson.loads(body)
            saved.append(result["tokens_saved"])
            for _ in range(20):
                t = time.perf_counter()
                status, body = await conn.request("POST", f"/v1/sessions/{sid}/prune", {})
                again.append(time.perf_counter() - t)
                assert status == 200, body
                assert not orjson.loads(body)["pruned"], body
        outputs = sum(m["role"] == "tool" for m in tool_session(10_000, "count"))
        line(
            f"prune, 10,000 entries ({outputs} tool outputs)",
            first,
            f"{len(result['pruned'])} pruned, {saved[0]} tokens saved (target p50 <= 100 ms)",
        )
        line("prune again, nothing left to do", again, "(target p50 <= 10 ms)")

    from app.engine.window.truncate import CATEGORIES, truncate

    output = "".join(
        f"[{i:06d}] tests/test_mod_{i % 97}.py::test_case_{i} PASSED\n" for i in range(20_000)
    )
    output = output[: 1 << 20]
    for category in CATEGORIES:
        samples = []
        for _ in range(30):
            t = time.perf_counter()
            cut = truncate(output, category, 4_000)
            samples.append(time.perf_counter() - t)
        assert cut.truncated
        mbps = len(output.encode()) / 2**20 / (pct(samples, 0.5) / 1000)
        line(
            f"ingest truncation, 1 MB output, {category}",
            samples,
            f"{mbps:8.0f} MB/s (target >= 20)",
        )


async def bench_compaction(host: str, port: int, dsn: str, worker_env: dict[str, str]) -> None:
    """Compaction: context reads after a pivot, claim-to-commit overhead with an
    upstream that answers at once, the extractive summarizer on 200k tokens, and
    1,000 queued compactions drained by a separate `compactd worker --count 2`."""
    print("\nCompaction")
    from app.compactions.summarizer import extractive
    from app.engine.compaction import prepare as engine

    # The extractive summarizer, in-process, on ~200k tokens of real history.
    entries = []
    total = 0
    for path in traces.trace_files():
        for m in traces.load(path):
            entry = openai_format.parse_message(m, "messages")
            entry.tokens = tokens.count_entry(entry)
            entries.append(entry)
            total += entry.tokens
        if total >= 200_000:
            break
    sources = [engine.Source(seq=i + 1, kind="message", entry=e) for i, e in enumerate(entries)]
    samples = []
    for _ in range(5):
        t = time.perf_counter()
        plan = engine.plan(
            sources, start_seq=1, end_seq=len(sources) + 1, keep=20_000, previous_details=None
        )
        assert plan is not None
        summary = extractive(plan, None).summary
        samples.append(time.perf_counter() - t)
    line(
        f"plan + extractive summary, {total:,} tokens",
        samples,
        f"{len(entries)} entries -> {len(summary):,} chars (target <= 1,000 ms)",
    )

    pg = await asyncpg.connect(dsn)
    worker: subprocess.Popen[bytes] | None = None
    try:
        async with Connection(host, port) as conn:
            # 1,000 queued compactions across sessions, then two workers drain them.
            config = {"compaction": {"auto": False, "keep_recent_tokens": 2_000}}
            phase = await pg.fetchval("SELECT now()")
            for k in range(1000):
                sid = await new_session(conn, config=config)
                await fill(conn, sid, tool_session(40, f"q{k}"))
                status, body = await conn.request(
                    "POST", f"/v1/sessions/{sid}/compactions", {"summarizer": "extractive"}
                )
                assert status == 202, body
            t = time.perf_counter()
            worker = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
                [sys.executable, "-m", "app.cli", "worker", "--count", "2"], env=worker_env
            )
            while await pg.fetchval("SELECT count(*) FROM compaction WHERE status <> 'succeeded'"):
                await asyncio.sleep(0.05)
                assert worker.poll() is None, "the worker died"
            wall = time.perf_counter() - t
            span = await pg.fetchval(
                "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM compaction"
                " WHERE created_at >= $1 AND reason = 'manual'",
                phase,
            )
            print(
                f"  {'1,000 queued compactions, 2 workers':<44} {1000 / float(span):7.0f} jobs/s"
                f" (first claim to last commit {float(span):.2f} s; {wall:.2f} s from worker start)"
            )
        # A new connection: the idle one may have been closed by the keep-alive timeout.
        async with Connection(host, port) as conn:
            # Claim to commit, with an upstream that answers at once (LLM path).
            overhead: list[float] = []
            request: list[float] = []
            for k in range(40):
                sid = await new_session(conn, config=config)
                # About 100k tokens: where gpt-4o's window calls for compaction.
                await fill(conn, sid, tool_session(600, f"o{k}"))
                t = time.perf_counter()
                status, body = await conn.request(
                    "POST", f"/v1/sessions/{sid}/compactions", {"wait": 30}
                )
                request.append(time.perf_counter() - t)
                job = orjson.loads(body)
                assert status == 202, body
                assert job["status"] == "succeeded", body
                assert job["summarizer_used"] == "llm", job
                started = datetime.fromisoformat(job["started_at"])
                finished = datetime.fromisoformat(job["finished_at"])
                overhead.append((finished - started).total_seconds())
            line(
                "compaction claim -> commit, instant upstream",
                overhead,
                "600 entries, ~100k tokens (target p50 <= 50 ms)",
            )
            line("POST /compactions?wait, request -> answer", request)

            # Context after a pivot: the cost follows the window, not the history.
            reads: dict[int, list[float]] = {}
            for size in (100, 10_000):
                sid = await new_session(conn, config=config)
                await fill(conn, sid, tool_session(size, f"x{size}"))
                status, body = await conn.request(
                    "POST",
                    f"/v1/sessions/{sid}/compactions",
                    {"wait": 30, "summarizer": "extractive"},
                )
                assert status == 202, body
                assert orjson.loads(body)["status"] == "succeeded", body
                samples = reads[size] = []
                for _ in range(300):
                    t = time.perf_counter()
                    status, body = await conn.request("GET", f"/v1/sessions/{sid}/context")
                    samples.append(time.perf_counter() - t)
                    assert status == 200, body
                n = len(orjson.loads(body)["messages"])
                line(f"context after a pivot, {size:,} entries", samples, f"{n} messages")
            ratio = pct(reads[10_000], 0.5) / pct(reads[100], 0.5)
            print(
                f"  {'context p50 ratio, 10,000 vs 100 entries':<44} {ratio:5.2f}   (target <= 1.5)"
            )
    finally:
        if worker is not None:
            worker.terminate()
            worker.wait(timeout=30)
        await pg.close()


SECTIONS = (
    "cpu",
    "append",
    "context",
    "budget",
    "compaction",
    "tree",
    "bounds",
    "load",
    "scale",
    "proxy",
    "events",
    "recall",
    "continuity",
)


def main() -> int:
    if sys.argv[1:2] == ["eval"]:  # the scorecard, with its own options
        return eval_scorecard.main(sys.argv[2:])
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("sections", nargs="*", help=f"any of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument(
        "--seconds",
        type=float,
        help="length of each open-loop load run (default COMPACTD_BENCH_LOAD_SECONDS or 60;"
        " scale: 20)",
    )
    parser.add_argument(
        "--json", action="store_true", help="continuity: its figures as one JSON document"
    )
    parser.add_argument("--verbose", action="store_true", help="continuity: a line per compaction")
    args = parser.parse_args()
    if unknown := set(args.sections) - set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(unknown))}")
    if "continuity" in (set(args.sections) or set(SECTIONS)):
        # The engine alone, in this process: no service, no database. It goes first.
        status = continuity.run(as_json=args.json, verbose=args.verbose)
        if set(args.sections) == {"continuity"}:
            return status
    # The naive baselines and the load section count tokens in this process.
    tokens.register_encodings(load_encodings())
    folder = Path(tempfile.mkdtemp(prefix="compactd-bench-"))
    port = free_port()
    url = embedded.start(folder / "pgdata", cleanup_mode="delete")
    upstream_port = free_port()
    scripted_port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "COMPACTD_PORT": str(port),
        "COMPACTD_LOG_LEVEL": "warning",
        # Workers run in their own process (the compaction section starts it).
        "COMPACTD_COMPACTION_WORKERS": "0",
        "COMPACTD_UPSTREAM_BASE_URL": f"http://127.0.0.1:{upstream_port}/v1",
        # The proxy section's scripted upstream (tests.upstream_server in demo mode).
        "COMPACTD_PROXY_OPENAI_URL": f"http://127.0.0.1:{scripted_port}/v1",
    }
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve"], env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the service did not start")
            time.sleep(0.2)
        print(
            f"compactd bench: service pid {server.pid} on {base}, embedded PostgreSQL, {os.cpu_count()} cores"
        )

        # `python -m bench budget` runs one section; no argument runs them all.
        sections = set(args.sections) or set(SECTIONS)

        async def run() -> None:
            instant = await upstream.start(upstream_port)
            if "cpu" in sections:
                await cpu.bench_cpu(
                    "127.0.0.1",
                    port,
                    server.pid,
                    url.replace("postgresql+asyncpg://", "postgresql://"),
                    folder / "pgdata",
                )
            if "append" in sections:
                await bench_appends("127.0.0.1", port, psutil.Process(server.pid))
            if "context" in sections:
                await bench_context(
                    "127.0.0.1", port, url.replace("postgresql+asyncpg://", "postgresql://")
                )
            if "budget" in sections:
                await bench_budget("127.0.0.1", port)
            if "compaction" in sections:
                await bench_compaction(
                    "127.0.0.1",
                    port,
                    url.replace("postgresql+asyncpg://", "postgresql://"),
                    {**env, "COMPACTD_COMPACTION_POLL_SECONDS": "0.2"},
                )
            if "tree" in sections:
                await tree.bench_tree(
                    "127.0.0.1",
                    port,
                    {**env, "COMPACTD_COMPACTION_POLL_SECONDS": "0.2"},
                    cpu.Meter([psutil.Process(server.pid)], folder / "pgdata"),
                    url.replace("postgresql+asyncpg://", "postgresql://"),
                )
            if "bounds" in sections:
                await bounds.bench_bounds("127.0.0.1", port)
            if "load" in sections:
                await load.bench_load(
                    "127.0.0.1", port, server.pid, args.seconds, folder / "pgdata"
                )
            if "scale" in sections:
                await scale.bench_scale(url, folder / "pgdata", env, args.seconds or 20.0)
            if "proxy" in sections:
                command = ["-m", "tests.upstream_server", "--port", str(scripted_port)]
                scripted = subprocess.Popen(  # noqa: ASYNC220 - started once, not awaited
                    [sys.executable, *command, "--log-level", "warning"],
                    stdout=subprocess.DEVNULL,
                )
                try:
                    await proxy.wait_for(scripted_port)
                    await proxy.bench_proxy(port, scripted_port)
                finally:
                    scripted.terminate()
                    scripted.wait(timeout=30)
            if "events" in sections:
                await events.bench_events(
                    "127.0.0.1", port, url, {**env, "COMPACTD_COMPACTION_POLL_SECONDS": "0.2"}
                )
            if "recall" in sections:
                await recall.bench_recall("127.0.0.1", port, url)
            instant.close()

        asyncio.run(run())
        rss = psutil.Process(server.pid).memory_info().rss / 2**20
        print(f"\nservice RSS after the run: {rss:.0f} MB")
    finally:
        server.terminate()
        server.wait(timeout=30)
        embedded.stop(folder / "pgdata")
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
