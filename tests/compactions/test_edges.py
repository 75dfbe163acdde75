"""Edges a review found: stale usage after a compaction, the synthetic continue,
NOTIFY, a reply with NUL, bounded file lists, and a shutdown mid-job."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import httpx

from app.compactions.repository import CHANNEL
from app.compactions.worker import WorkerPool
from app.core.outbound import Outbound
from app.engine.compaction.fileops import FileOps
from app.engine.compaction.prepare import capped_files
from tests import postgres
from tests.compactions.helpers import (
    compaction,
    conversation,
    drain,
    overflow_error,
    worker_config,
)
from tests.compactions.worker_support import SUMMARY
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import append_ok, get_session, history
from tests.upstream_server import Hang, Reply, Upstream

MANUAL = {"compaction": {"auto": False, "keep_recent_tokens": 3_000}, "prune": {"auto": False}}


async def compacted(app: Any, client: httpx.AsyncClient, sid: str, **config: Any) -> dict[str, Any]:
    await make_session(client, id=sid, config={**MANUAL, **config})
    for batch in conversation(24):
        await append_ok(client, sid, batch)
    r = await client.post(f"/v1/sessions/{sid}/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    return await compaction(client, sid, r.json()["id"])


async def test_a_usage_report_about_the_context_before_a_compaction_is_stale(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="u", config=MANUAL)
    for batch in conversation(24):
        await append_ok(client, "u", batch)
    ctx = (await client.get("/v1/sessions/u/context")).json()
    old_version = ctx["version"]
    old_prompt = ctx["tokens"]["estimated"]
    r = await client.post("/v1/sessions/u/compactions", json={})
    await drain(app)
    before = await get_session(client, "u")
    # The model call went out with the old context; the compaction committed meanwhile.
    r = await client.post(
        "/v1/sessions/u/usage",
        json={"input_tokens": old_prompt, "context_version": old_version},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["stale"] is True
    assert body["compaction"] is None
    after = await get_session(client, "u")
    assert after["calibration_factor"] == before["calibration_factor"]
    assert after["usage_count"] == before["usage_count"] + 1
    assert body["overflow"]["estimated_tokens"] < old_prompt / 2
    # Without context_version: the first report after the pivot, far above it, is stale too.
    r = await client.post("/v1/sessions/u/usage", json={"input_tokens": old_prompt})
    assert r.json()["stale"] is True
    # A report of the current context calibrates as usual.
    current = (await client.get("/v1/sessions/u/context")).json()
    r = await client.post(
        "/v1/sessions/u/usage",
        json={
            "input_tokens": current["tokens"]["estimated"],
            "context_version": current["version"],
        },
    )
    assert r.json()["stale"] is False
    # And a provider error about the old context starts no recovery.
    recovery = await overflow_error(client, "u", old_version)
    assert recovery["stale"] is True
    assert recovery["action"] == "none"
    assert (await get_session(client, "u"))["active_compaction_id"] is None


async def test_no_continue_after_a_user_message_or_while_calls_run(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="k", config={"prune": {"auto": False}})
    batches = conversation(12)
    for batch in batches:
        await append_ok(client, "k", batch)
    # Two calls in parallel; one result is in, the other still running.
    await append_ok(
        client,
        "k",
        [
            {
                "role": "assistant",
                "content": "Running both.",
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "make"}'},
                    }
                    for i in ("p1", "p2")
                ],
            },
            {"role": "tool", "tool_call_id": "p1", "content": "built"},
        ],
    )
    recovery = await overflow_error(client, "k")
    job = recovery["compaction"]
    assert await drain(app) == 1
    done = await compaction(client, "k", job["id"])
    assert done["details"]["continued"] is False
    ctx = (await client.get("/v1/sessions/k/context")).json()
    # The running call stays in view, answered or not yet.
    assert ctx["messages"][-2]["tool_calls"][1]["id"] == "p2"
    await append_ok(client, "k", [{"role": "tool", "tool_call_id": "p2", "content": "ok"}])
    await append_ok(client, "k", [{"role": "user", "content": "Please look at this log."}])
    version = (await client.get("/v1/sessions/k/context")).json()["version"]
    recovery = await overflow_error(client, "k", version)
    job = recovery["compaction"]
    assert await drain(app) == 1
    assert (await compaction(client, "k", job["id"]))["details"]["continued"] is False
    ctx = (await client.get("/v1/sessions/k/context")).json()
    assert ctx["messages"][-1] == {"role": "user", "content": "Please look at this log."}


async def test_enqueueing_notifies_the_workers(client: httpx.AsyncClient, db_url: str) -> None:
    await make_session(client, id="n", config=MANUAL)
    for batch in conversation(12):
        await append_ok(client, "n", batch)
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        await listener.add_listener(CHANNEL, lambda *args: heard.put_nowait(args[2]))
        r = await client.post("/v1/sessions/n/compactions", json={})
        assert r.status_code == 202, r.text
        assert await asyncio.wait_for(heard.get(), 5) == CHANNEL
        # The same session asked again: no new job, no new notice.
        await client.post("/v1/sessions/n/compactions", json={})
        await asyncio.sleep(0.2)
        assert heard.empty()
    finally:
        await listener.close()


async def test_a_reply_with_nul_is_stored_without_it(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    await make_session(client, id="z", config=MANUAL)
    for batch in conversation(24):
        await append_ok(client, "z", batch)
    # The cut splits a turn: the history, the turn's start, then a title.
    upstream.script(
        [Reply(SUMMARY.replace("Goal", "Go\x00al")), Reply(SUMMARY), Reply("A short title")]
    )
    r = await client.post("/v1/sessions/z/compactions", json={})
    assert await drain(app, worker_config(upstream)) == 1
    done = await compaction(client, "z", r.json()["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert "## Goal" in done["summary"]
    assert "\x00" not in done["summary"]
    stored = await history(client, "z")
    assert stored[-1]["kind"] == "compaction"


def test_file_lists_in_the_summary_are_bounded() -> None:
    ops = FileOps.of(
        read=[f"src/pkg/module_{i}.py" for i in range(500)],
        modified=[f"src/pkg/changed_{i}.py" for i in range(40)],
    )
    read, modified = capped_files(ops, 600)
    shown = [p for p in [*read, *modified] if not p.startswith("(and")]
    assert sum(len(p) + 1 for p in shown) <= 600
    # Modified files come first; the rest is counted.
    assert modified[: len(shown)] == [p for p in ops.modified if p in shown]
    assert read[-1] == f"(and {500 - (len(read) - 1)} more)"
    small = FileOps.of(read=["a.py"], modified=["b.py"])
    assert capped_files(small, 600) == (["a.py"], ["b.py"])


async def test_shutdown_gives_the_job_in_hand_back_to_the_queue(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    await make_session(client, id="g", config=MANUAL)
    for batch in conversation(24):
        await append_ok(client, "g", batch)
    upstream.script([Hang(30)])
    r = await client.post("/v1/sessions/g/compactions", json={})
    job_id = r.json()["id"]
    async with Outbound(TEST_SETTINGS) as http:
        pool = WorkerPool(
            app.state.engine, worker_config(upstream), http, count=1, grace_seconds=0.2
        )
        pool.start()
        pool.wake.set()
        for _ in range(200):
            job = await compaction(client, "g", job_id)
            if job["status"] == "running":
                break
            await asyncio.sleep(0.05)
        assert job["status"] == "running"
        await pool.close()
    job = await compaction(client, "g", job_id)
    assert job["status"] == "queued"
    assert job["attempts"] == 0  # the interrupted claim is not counted
    upstream.script([Reply(SUMMARY), Reply(SUMMARY), Reply("A short title")])
    assert await drain(app, worker_config(upstream)) == 1
    assert (await compaction(client, "g", job_id))["status"] == "succeeded"


async def test_an_overflow_error_makes_a_waiting_threshold_job_an_overflow_one(
    app: Any, client: httpx.AsyncClient
) -> None:
    config = {"compaction": {"reserve_tokens": 4_000}, "prune": {"auto": False}}
    await make_session(
        client, id="w", context_window=16_000, max_output_tokens=2_000, config=config
    )
    queued = None
    for batch in conversation(40, words=300):
        body = await append_ok(client, "w", batch)
        if body["compaction"]:
            queued = body["compaction"]
            break
    assert queued is not None
    assert queued["reason"] == "threshold"
    version = (await client.get("/v1/sessions/w/context")).json()["version"]
    recovery = await overflow_error(client, "w", version)
    started = recovery["compaction"]
    assert started["id"] == queued["id"]
    assert started["created"] is False
    assert started["reason"] == "overflow"
    assert await drain(app) == 1
    done = await compaction(client, "w", queued["id"])
    assert done["status"] == "succeeded"
    assert done["reason"] == "overflow"
