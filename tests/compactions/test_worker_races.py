"""Exactly one commit per compaction, whatever happens to the workers: a cancel
while the upstream call is in flight, two workers draining the same queue, a
lease that ends under a live worker (time travel), and a worker process killed
with SIGKILL mid-call. Real workers, a real upstream server, real Postgres."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.compactions.pivot import Prepared
from app.compactions.repository import CompactionRepository
from app.compactions.summarizer import extractive
from app.compactions.worker import LeaseLost, Worker
from app.core.database import driver_connection
from app.core.outbound import Outbound
from app.core.settings import Settings
from app.engine.compaction.summary import SPLIT_TURN_SEPARATOR, strip_file_tags, strip_user_requests
from tests.compactions.helpers import compaction, conversation, drain, worker_config
from tests.compactions.worker_support import (
    SHORT,
    SUMMARY,
    assert_api_answers,
    compaction_count,
    compaction_entries,
    expire_lease,
    job_row,
    keep_from,
    prompt_of,
    request_compaction,
    seeded,
)
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import append_ok, get_session
from tests.upstream_server import Hang, Reply, Status, Upstream

# Each race is timed by an upstream call that hangs for a set while: a neighbour test
# in a parallel run could stretch the steps that must fit inside it.
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]


async def _until(check: Any, within: float = 10.0, pause: float = 0.02) -> None:
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(pause)


# --- cancel while running ------------------------------------------------------------


async def test_cancel_while_the_upstream_call_runs_never_commits(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    upstream.script([Hang(30, then=Reply(SUMMARY))])
    job = await request_compaction(client, sid)
    before = await get_session(client, sid)
    config = worker_config(upstream, lease_seconds=0.6, timeout_seconds=30)

    async with Outbound(TEST_SETTINGS) as http:
        worker = Worker(app.state.engine, config, http, name="cancel-test")
        run = asyncio.create_task(worker.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)  # the call is in flight
        running = await compaction(client, sid, job["id"])
        assert running["status"] == "running"
        assert running["attempts"] == 1

        started = time.monotonic()
        r = await client.post(f"/v1/sessions/{sid}/compactions/{job['id']}/cancel")
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "running"
        assert r.json()["cancel_requested"] is True
        assert await asyncio.wait_for(run, timeout=5) is True
        # The next heartbeat (every lease/3) saw the cancel and stopped the call.
        assert time.monotonic() - started < 2

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "cancelled", done
    assert done["cancel_requested"] is True
    assert "cancel" in done["error"]
    assert done["summary"] is None
    assert done["entry_seq"] is None
    assert done["finished_at"] is not None
    after = await get_session(client, sid)
    assert after["compaction_count"] == before["compaction_count"] == 0
    assert after["active_compaction_id"] is None
    assert after["entry_count"] == before["entry_count"]
    assert await compaction_entries(client, sid) == []
    assert len(upstream.requests) == 1  # no retry, no short-summary call
    await assert_api_answers(client, sid)
    # Cancelling again is a conflict, not an error.
    again = await client.post(f"/v1/sessions/{sid}/compactions/{job['id']}/cancel")
    assert again.status_code == 409, again.text
    # Nothing is left queued; a new request starts a new job.
    assert await drain(app, config) == 0
    fresh = await request_compaction(client, sid)
    assert fresh["id"] != job["id"]


async def test_cancel_of_a_queued_job_is_immediate(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    r = await client.post(f"/v1/sessions/{sid}/compactions/{job['id']}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert await drain(app, worker_config(upstream)) == 0
    assert upstream.requests == []
    assert await compaction_count(client, sid) == 0
    assert (await get_session(client, sid))["active_compaction_id"] is None


# --- two workers ---------------------------------------------------------------------


async def test_two_workers_commit_every_job_exactly_once(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sessions = 30
    flat = [m for batch in conversation(6, words=160) for m in batch]
    sids: list[str] = []
    jobs: dict[str, str] = {}
    for _ in range(sessions):
        s = await make_session(client, config={"compaction": {"keep_recent_tokens": 400}})
        await append_ok(client, s["id"], flat)
        sids.append(s["id"])
        jobs[s["id"]] = (await request_compaction(client, s["id"]))["id"]
    upstream.script([Reply(SUMMARY)] * (sessions * 3))
    config = worker_config(upstream)

    async def drain_with(worker: Worker) -> int:
        done = 0
        while await worker.run_once():
            done += 1
        return done

    async with Outbound(TEST_SETTINGS) as http:
        one = Worker(app.state.engine, config, http, name="racer-1")
        two = Worker(app.state.engine, config, http, name="racer-2")
        counts = await asyncio.gather(drain_with(one), drain_with(two))
    assert sum(counts) == sessions, counts
    assert all(count > 0 for count in counts), counts  # they really raced

    for sid in sids:
        job = await compaction(client, sid, jobs[sid])
        assert job["status"] == "succeeded", job
        assert job["summarizer_used"] == "llm"
        assert job["attempts"] == 1
        assert SUMMARY in job["summary"]
        session = await get_session(client, sid)
        assert session["compaction_count"] == 1
        assert session["active_compaction_id"] is None
        entries = await compaction_entries(client, sid)
        assert [e["seq"] for e in entries] == [job["entry_seq"]]
    async with driver_connection(app.state.engine) as driver:
        per_session = await driver.fetch(
            "SELECT session_id, count(*) FROM entry WHERE kind = 'compaction' GROUP BY session_id"
        )
        statuses = await driver.fetch("SELECT status, count(*) FROM compaction GROUP BY status")
    assert sorted(r[0] for r in per_session) == sorted(sids)
    assert {r[1] for r in per_session} == {1}
    assert [tuple(r) for r in statuses] == [("succeeded", sessions)]
    # The whole history was one split turn: the title was asked of that turn's summary.
    titles = [
        r for r in upstream.requests if r.json["messages"][-1]["content"].startswith("<summary>")
    ]
    assert len(titles) == sessions
    assert not any("No earlier history" in prompt_of(r) for r in titles)


# --- lease expiry by time travel ---------------------------------------------------------


async def test_an_expired_lease_is_claimed_again_and_the_stale_claim_cannot_commit(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    engine = app.state.engine
    config = worker_config(upstream)
    async with driver_connection(engine) as driver:
        stale = await CompactionRepository("").claim(driver, "dead-worker", 30.0)
    assert stale is not None
    assert str(stale.id) == job["id"]
    assert stale.attempts == 1
    assert stale.lease_owner == "dead-worker"

    async with Outbound(TEST_SETTINGS) as http:
        dead = Worker(engine, config, http, name="dead-worker")
        # The dead worker had planned and summarized before it stalled.
        loaded = await dead._prepare(stale)
        assert loaded is not None
        assert loaded[0] is not None
        prepared: Prepared = loaded[0]
        summarized = extractive(prepared.plan, prepared.previous_summary)

        # Its lease is live: nobody else may take the job.
        assert await drain(app, config) == 0
        await expire_lease(engine, stale.id)
        upstream.script([Reply(SUMMARY), Reply(SHORT)])
        assert await drain(app, config) == 1

        done = await compaction(client, sid, job["id"])
        assert done["status"] == "succeeded", done
        assert done["summarizer_used"] == "llm", done
        assert done["attempts"] == 2
        assert await compaction_count(client, sid) == 1

        # The stale claim wakes up: its heartbeat, commit, retry and finish are refused.
        repo = CompactionRepository(stale.tenant_id)
        async with driver_connection(engine) as driver:
            assert await repo.heartbeat(driver, stale, 30.0) is None
        try:
            await dead._commit(stale, prepared, summarized, repo)
        except LeaseLost:
            pass
        else:
            raise AssertionError("a stale claim committed")
        await dead._finish(stale, "failed", "the dead worker's verdict")
        # A full run of the stale row (plan, summarize, commit) changes nothing either.
        await dead.process(stale)

    after = await compaction(client, sid, job["id"])
    assert after == done
    assert await compaction_count(client, sid) == 1
    assert [e["seq"] for e in await compaction_entries(client, sid)] == [done["entry_seq"]]


async def test_a_live_worker_that_lost_its_lease_stops_without_committing(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    engine = app.state.engine
    upstream.script([Hang(30, then=Reply(SUMMARY))])
    slow_config = worker_config(upstream, lease_seconds=0.9, timeout_seconds=30)

    async with Outbound(TEST_SETTINGS) as http:
        slow = Worker(engine, slow_config, http, name="slow-worker")
        run = asyncio.create_task(slow.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)
        claimed = await job_row(engine, sid, job["id"])
        assert claimed.lease_owner == "slow-worker"
        assert claimed.attempts == 1
        # Time travel, then another worker takes the job and finishes it.
        await expire_lease(engine, claimed.id)
        upstream.script([Reply(SUMMARY), Reply(SHORT)])
        assert await drain(app, worker_config(upstream)) == 1
        # The slow worker's next heartbeat finds the lease gone and gives up.
        assert await asyncio.wait_for(run, timeout=5) is True

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2, done
    assert await compaction_count(client, sid) == 1
    assert len(await compaction_entries(client, sid)) == 1


# --- SIGKILL -------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker_mid_call(
    client: httpx.AsyncClient,
    upstream: Upstream,
    db_url: str,
    settings: Settings,
    tmp_path: Path,
    **env: str,
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str, dict[str, Any], Path]]:
    """A real `compactd worker --count 1` process on the test database, caught in
    the middle of an upstream call for a manual compaction: yields the process,
    the session, the job and the process's log. Killed on the way out if still up."""
    sid = await seeded(client, 12)
    upstream.script([Hang(60)])
    job = await request_compaction(client, sid)
    environment = {
        **os.environ,
        "DATABASE_URL": db_url,
        "COMPACTD_UPSTREAM_BASE_URL": upstream.url,
        "COMPACTD_UPSTREAM_TIMEOUT_SECONDS": "60",
        "COMPACTD_COMPACTION_POLL_SECONDS": "0.1",
        "COMPACTD_TIKTOKEN_CACHE_DIR": str(settings.tiktoken_cache_dir),
        "COMPACTD_LOG_LEVEL": "warning",
        **env,
    }
    environment.pop("COMPACTD_DATABASE_URL", None)
    log = tmp_path / "worker.log"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "compactd"),
            "worker",
            "--count",
            "1",
            cwd=ROOT,
            env=environment,
            stdout=output,
            stderr=output,
        )
    try:

        async def claimed() -> bool:
            assert process.returncode is None, log.read_text()
            state = await compaction(client, sid, job["id"])
            return bool(state["status"] == "running")

        await _until(claimed, within=30)
        await asyncio.to_thread(upstream.wait_for, 1, 10.0)  # mid-call
        yield process, sid, job, log
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_a_worker_killed_mid_call_is_replaced_after_its_lease(
    app: Any,
    client: httpx.AsyncClient,
    upstream: Upstream,
    db_url: str,
    settings: Settings,
    tmp_path: Path,
) -> None:
    async with worker_mid_call(
        client,
        upstream,
        db_url,
        settings,
        tmp_path,
        COMPACTD_UPSTREAM_API_KEY="sk-test",
        COMPACTD_COMPACTION_LEASE_SECONDS="2",
    ) as (process, sid, job, _):
        process.send_signal(signal.SIGKILL)
        assert await asyncio.wait_for(process.wait(), 10) == -signal.SIGKILL

    killed = await job_row(app.state.engine, sid, job["id"])
    assert killed.status == "running"
    assert killed.attempts == 1
    assert killed.lease_owner is not None
    assert f":{process.pid}:0:" in killed.lease_owner  # the killed process's worker
    assert killed.lease_expires_at is not None
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    config = worker_config(upstream)
    # Nobody may take it while the dead worker's lease runs.
    assert await drain(app, config) == 0
    await _until(lambda: _drained(app, config), within=10, pause=0.1)

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 2
    assert done["summary"].startswith(SUMMARY)
    assert await compaction_count(client, sid) == 1
    assert len(await compaction_entries(client, sid)) == 1
    assert len(upstream.requests) == 3


async def _drained(app: Any, config: Any) -> bool:
    return await drain(app, config) == 1


# --- while the upstream call runs ------------------------------------------------------


async def test_heartbeats_keep_a_slow_call_its_job(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    upstream.script([Hang(2.0, then=Reply(SUMMARY)), Reply(SHORT)])
    config = worker_config(upstream, lease_seconds=0.9, timeout_seconds=10)

    async with Outbound(TEST_SETTINGS) as http:
        slow = Worker(app.state.engine, config, http, name="slow-but-alive")
        run = asyncio.create_task(slow.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)
        for _ in range(5):  # well past the first lease: the heartbeats renew it
            await asyncio.sleep(0.3)
            assert await drain(app, config) == 0
            row = await job_row(app.state.engine, sid, job["id"])
            assert row.status == "running"
            assert row.lease_owner == "slow-but-alive"
        assert await asyncio.wait_for(run, timeout=5) is True

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 1
    assert len(upstream.requests) == 2


async def test_messages_appended_during_the_call_stay_after_the_cut(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    upstream.script([Hang(0.5, then=Reply(SUMMARY)), Reply(SHORT)])

    async with Outbound(TEST_SETTINGS) as http:
        worker = Worker(app.state.engine, worker_config(upstream), http, name="busy")
        run = asyncio.create_task(worker.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)
        late = await append_ok(client, sid, [{"role": "user", "content": "Also check leap years."}])
        assert await asyncio.wait_for(run, timeout=5) is True

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 1
    late_seq = late["entries"][0]["seq"]
    assert done["first_kept_seq"] < late_seq < done["entry_seq"]
    assert "leap years" not in upstream.requests[0].body.decode()
    r = await client.get(f"/v1/sessions/{sid}/context")
    assert r.status_code == 200, r.text
    contents = [m.get("content") for m in r.json()["messages"]]
    assert contents[-1] == "Also check leap years."
    assert any(isinstance(c, str) and SUMMARY in c for c in contents)
    assert "Keep going with part 2." in contents
    session = await get_session(client, sid)
    assert session["compaction_count"] == 1
    assert session["entry_count"] == late_seq + 1  # the compaction entry came after it


async def test_an_emergency_compaction_during_the_call_makes_the_job_plan_again(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    # A small window: 18,000 usable tokens, an emergency above 95 % of them.
    s = await make_session(
        client,
        context_window=20_000,
        max_output_tokens=2_000,
        config={"compaction": {"auto": True, "threshold": 0.9}, "prune": {"enabled": False}},
    )
    sid = s["id"]
    for batch in conversation(12):
        await append_ok(client, sid, batch)
    await keep_from(client, sid, "user")
    job = await request_compaction(client, sid)
    upstream.script([Hang(0.6, then=Reply(SUMMARY)), Reply(SHORT)])

    async with Outbound(TEST_SETTINGS) as http:
        worker = Worker(app.state.engine, worker_config(upstream), http, name="overtaken")
        run = asyncio.create_task(worker.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)
        # The agent appends a huge batch meanwhile: the append compacts on the spot.
        big = [
            {"role": "user", "content": "Here is the full log. " + "error at line 12; " * 1500},
            {"role": "assistant", "content": "Reading the log."},
        ]
        answer = await append_ok(client, sid, big)
        assert answer["compaction"] is not None, answer
        assert answer["compaction"]["reason"] == "emergency"
        assert answer["compaction"]["status"] == "succeeded"
        upstream.script([Reply(SUMMARY), Reply(SHORT)])
        assert await asyncio.wait_for(run, timeout=10) is True

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm", done
    assert done["attempts"] == 1
    # Planned again on top of the emergency pivot: what that summarized is not sent
    # again, its summary is carried forward, and only the big new turn is summarized.
    assert len(upstream.requests) == 4
    emergency = await compaction(client, sid, answer["compaction"]["id"])
    assert emergency["summarizer_used"] == "extractive"
    replanned = prompt_of(upstream.requests[2])
    assert replanned.startswith("<conversation>\n[User]: Here is the full log.")
    assert "Keep going with part" not in replanned
    assert done["first_kept_seq"] > emergency["first_kept_seq"]
    assert done["details"]["split_turn"] is True
    # The emergency's summary, carried without its file tags and quoted requests
    # (the new summary lists and quotes them afresh).
    carried = strip_file_tags(strip_user_requests(emergency["summary"]))
    assert done["summary"].startswith(carried + SPLIT_TURN_SEPARATOR + SUMMARY)
    session = await get_session(client, sid)
    assert session["compaction_count"] == 2
    assert len(await compaction_entries(client, sid)) == 2
    assert done["entry_seq"] > emergency["entry_seq"]


async def test_a_session_deleted_during_the_call_ends_its_job_quietly(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    await request_compaction(client, sid)
    upstream.script([Hang(0.5, then=Reply(SUMMARY)), Reply(SHORT)])
    async with Outbound(TEST_SETTINGS) as http:
        worker = Worker(app.state.engine, worker_config(upstream), http, name="orphaned")
        run = asyncio.create_task(worker.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)
        r = await client.delete(f"/v1/sessions/{sid}")
        assert r.status_code == 204, r.text
        assert await asyncio.wait_for(run, timeout=5) is True
        assert await worker.run_once() is False
    async with driver_connection(app.state.engine) as driver:
        assert await driver.fetchval("SELECT count(*) FROM compaction") == 0
        assert await driver.fetchval("SELECT count(*) FROM entry") == 0


async def test_a_cancel_that_meets_a_retryable_failure_still_cancels(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    # The cancel lands between two heartbeats; then the upstream asks to retry in 30 s.
    upstream.script([Hang(0.6, then=Status(429, headers={"Retry-After": "30"}))])
    config = worker_config(upstream, lease_seconds=30)
    async with Outbound(TEST_SETTINGS) as http:
        worker = Worker(app.state.engine, config, http, name="cancelled-then-429")
        run = asyncio.create_task(worker.run_once())
        await asyncio.to_thread(upstream.wait_for, 1)
        r = await client.post(f"/v1/sessions/{sid}/compactions/{job['id']}/cancel")
        assert r.status_code == 200, r.text
        assert r.json()["cancel_requested"] is True
        assert await asyncio.wait_for(run, timeout=5) is True

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "cancelled", done
    assert done["finished_at"] is not None
    session = await get_session(client, sid)
    assert session["active_compaction_id"] is None
    assert session["compaction_count"] == 0
    fresh = await request_compaction(client, sid)
    assert fresh["id"] != job["id"]


async def test_sigterm_stops_a_worker_and_gives_its_job_back(
    app: Any,
    client: httpx.AsyncClient,
    upstream: Upstream,
    db_url: str,
    settings: Settings,
    tmp_path: Path,
) -> None:
    async with worker_mid_call(
        client,
        upstream,
        db_url,
        settings,
        tmp_path,
        COMPACTD_COMPACTION_LEASE_SECONDS="30",
        COMPACTD_COMPACTION_SHUTDOWN_GRACE_SECONDS="0.5",
    ) as (process, sid, job, log):
        process.send_signal(signal.SIGTERM)
        # Stops within the grace period, cleanly.
        assert await asyncio.wait_for(process.wait(), 15) == 0, log.read_text()

    # The job went back to the queue at once (not to a 30 s lease), its claim uncounted.
    released = await job_row(app.state.engine, sid, job["id"])
    assert released.status == "queued"
    assert released.attempts == 0
    assert released.lease_owner is None
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    assert await drain(app, worker_config(upstream)) == 1
    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    assert await compaction_count(client, sid) == 1
