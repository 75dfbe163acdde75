"""Every event a session's own work writes (docs/events.md's table), read out of the
session's stream on a real server, with the data the table documents: verdict changes
on an append, a usage report and a relief; prunes (automatic and manual); compactions
queued, started, retried, succeeded, failed and cancelled (queued or running),
threshold and emergency ones; navigations, and a branch summary's.

The work is done through an in-process app (its worker run by ``drain``, the
summarizer a real scripted upstream); the events are read from a separate uvicorn
server on the same database, as a client would read them. An event is written in the
transaction of the change it reports: events of one change share their transaction
(the first part of their id)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.engine.accounting.budget import Action
from app.main import create_app
from tests.budget.test_prune_api import work
from tests.compactions.helpers import compaction, conversation, drain, worker_config
from tests.compactions.test_compactions_api import AUTO, SMALL, append_until, window_filler
from tests.compactions.worker_support import SUMMARY, request_compaction
from tests.conftest import make_session
from tests.e2e.server import running
from tests.events.sse import (
    MARK,
    Frame,
    check_frames,
    eventually,
    logged,
    mark,
    open_stream,
)
from tests.helpers import append_ok, get_session, history
from tests.tree.test_branch_summary import seeded as branchy
from tests.upstream_server import Hang, Reply, Status, Upstream

ACTIONS = set(Action.__args__)  # type: ignore[attr-defined]
COMPACTION_KEYS = {"compaction_id", "reason", "auto"}
SUCCEEDED_KEYS = COMPACTION_KEYS | {
    "tokens_before",
    "tokens_after",
    "summarizer",
    "first_kept_seq",
    "entry_seq",
    "from_hook",
    "error",
}


@pytest.fixture
def reader(db_url: str, settings: Settings) -> Iterator[str]:
    """A real server on the test's database, no worker: where the streams are read."""
    with running(create_app(settings, database_url=db_url)) as base:
        yield base


async def session_events(base: str, db_url: str, sid: str) -> list[Frame]:
    """The session's whole stream (read up to a mark written last), checked against
    the log in the database: the same events, in the same order."""
    last = await mark(db_url, sid)
    async with open_stream(base, f"/v1/sessions/{sid}/events") as stream:
        frames = await stream.until(last)
    check_frames(frames)
    assert [(f.id, f.event, f.data["session_id"]) for f in frames] == await logged(
        db_url, session_id=sid
    )
    for f in frames:
        assert f.data["session_id"] == sid
        assert datetime.fromisoformat(f.data["created_at"]).tzinfo is not None
    return [f for f in frames if f.event != MARK]


async def verdict_now(client: httpx.AsyncClient, sid: str) -> str:
    r = await client.get(f"/v1/sessions/{sid}/overflow")
    assert r.status_code == 200, r.text
    action: str = r.json()["action"]
    return action


def txid(frame: Frame) -> str:
    return frame.id.split("-")[0]


def of(frames: list[Frame], *wanted: str) -> list[Frame]:
    return [f for f in frames if f.event in wanted]


def assert_verdict(frame: Frame, was: str, now: str, cause: str) -> None:
    assert frame.event == "session.verdict"
    data = frame.data["data"]
    assert set(data) == {
        "from",
        "to",
        "cause",
        "estimated_tokens",
        "usable_tokens",
        "threshold_tokens",
        "fraction",
    }, data
    assert (data["from"], data["to"], data["cause"]) == (was, now, cause), data
    assert {data["from"], data["to"]} <= ACTIONS
    assert 0 < data["threshold_tokens"] <= data["usable_tokens"]
    assert data["fraction"] == round(data["estimated_tokens"] / data["usable_tokens"], 4)


# --- verdicts and prunes ------------------------------------------------------------


async def test_appends_that_reach_the_prune_line_write_the_verdict_the_prune_and_the_relief(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await make_session(client, id="a", context_window=100_000, max_output_tokens=4_000)
    responses = [await append_ok(client, "a", batch) for batch in work(36)]
    pruning = [r for r in responses if r["pruned"] and r["pruned"]["pruned"]]
    assert len(pruning) >= 2
    frames = await session_events(reader, db_url, "a")
    session = await get_session(client, "a")
    # Nothing else happened to the session: verdicts and prunes only.
    assert {f.event for f in frames} == {"session.verdict", "session.pruned"}
    pruned = of(frames, "session.pruned")
    assert len(pruned) == len(pruning) == session["prune_count"]
    # Each prune: the append's verdict moved to prune, the prune, and the relief it
    # brought, all in the append's transaction.
    first = frames.index(pruned[0])
    verdict, prune, relief = frames[first - 1 : first + 2]
    assert_verdict(verdict, "none", "prune", "append")
    assert_verdict(relief, "prune", "none", "relief")
    assert txid(verdict) == txid(prune) == txid(relief)
    assert verdict.data["data"]["usable_tokens"] == session["usable_tokens"]
    assert relief.data["data"]["estimated_tokens"] < verdict.data["data"]["estimated_tokens"]
    for frame, response in zip(pruned, pruning, strict=True):
        data = frame.data["data"]
        assert set(data) == {
            "trigger",
            "tokens_saved",
            "entries",
            "erased",
            "context_tokens",
            "version",
        }
        assert data["trigger"] == "auto"
        assert data["erased"] is False
        assert data["tokens_saved"] == response["pruned"]["tokens_saved"] > 0
        assert data["entries"] == len(response["pruned"]["pruned"])
        # The context after the prune: what the relief's verdict estimates from.
        assert 0 < data["context_tokens"] < verdict.data["data"]["estimated_tokens"]
    # The verdict alternates: every change is written once, from what it was.
    verdicts = [f.data["data"] for f in of(frames, "session.verdict")]
    for before, after in itertools.pairwise(verdicts):
        assert after["from"] == before["to"]
    assert verdicts[0]["from"] == "none"
    assert verdicts[-1]["to"] == await verdict_now(client, "a")


async def test_a_manual_prune_is_an_event_and_one_that_prunes_nothing_is_not(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    manual = {"prune": {"auto": False, "erase": True}, "compaction": {"auto": False}}
    await make_session(
        client, id="p", context_window=100_000, max_output_tokens=4_000, config=manual
    )
    for batch in work(30):
        await append_ok(client, "p", batch)
    r = await client.post("/v1/sessions/p/prune", json={})
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["pruned"], done
    r = await client.post("/v1/sessions/p/prune", json={})
    assert r.status_code == 200, r.text
    assert r.json()["pruned"] == []  # nothing left to prune: no event
    r = await client.post("/v1/sessions/p/prune", json={"dry_run": True})
    assert r.status_code == 200, r.text
    frames = await session_events(reader, db_url, "p")
    (prune,) = of(frames, "session.pruned")
    session = await get_session(client, "p")
    assert prune.data["data"] == {
        "trigger": "manual",
        "tokens_saved": done["tokens_saved"],
        "entries": len(done["pruned"]),
        "erased": True,
        "context_tokens": session["context_tokens"],
        "version": done["version"],
    }
    # Whatever verdicts moved, each came from an append or from the prune's own
    # effect on the window: no event for what did not change.
    for verdict in of(frames, "session.verdict"):
        assert verdict.data["data"]["from"] != verdict.data["data"]["to"]


async def test_a_usage_report_that_moves_the_verdict_says_so(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    manual = {"prune": {"auto": False}, "compaction": {"auto": False}}
    s = await make_session(
        client, id="u", context_window=100_000, max_output_tokens=4_000, config=manual
    )
    await append_ok(client, "u", [{"role": "user", "content": "Summarize the repository."}])
    assert await session_events(reader, db_url, "u") == []  # the verdict stayed "none"
    # The provider counted far more than compactd did: the verdict moves on the report.
    r = await client.post(
        "/v1/sessions/u/usage",
        json={"input_tokens": int(s["usable_tokens"] * 0.9), "output_tokens": 10},
    )
    assert r.status_code == 200, r.text
    frames = await session_events(reader, db_url, "u")
    (verdict,) = frames
    assert verdict.data["data"]["from"] == "none"
    assert verdict.data["data"]["to"] in {"compact", "emergency"}
    assert_verdict(verdict, "none", verdict.data["data"]["to"], "usage")
    assert verdict.data["data"]["to"] == await verdict_now(client, "u")


# --- compactions ----------------------------------------------------------------------


def assert_compaction(frame: Frame, job: dict[str, Any], *more: str) -> dict[str, Any]:
    data: dict[str, Any] = frame.data["data"]
    assert set(data) == COMPACTION_KEYS | set(more), (frame.event, data)
    assert data["compaction_id"] == job["id"]
    assert data["reason"] == job["reason"]
    assert data["auto"] == job["auto"]
    return data


def assert_queued(frame: Frame, job: dict[str, Any], context_tokens: int) -> None:
    """``compaction.queued``, with the session's context tokens when it was queued."""
    assert frame.event == "compaction.queued"
    assert assert_compaction(frame, job, "tokens_before") == {
        "compaction_id": job["id"],
        "reason": job["reason"],
        "auto": job["auto"],
        "tokens_before": context_tokens,
    }


def assert_succeeded(frame: Frame, job: dict[str, Any]) -> None:
    data = assert_compaction(frame, job, *(SUCCEEDED_KEYS - COMPACTION_KEYS))
    assert job["status"] == "succeeded"
    assert data["tokens_before"] == job["tokens_before"] > 0
    assert data["tokens_after"] == job["tokens_after"] > 0
    assert data["summarizer"] == job["summarizer_used"]
    assert data["first_kept_seq"] == job["first_kept_seq"]
    assert data["entry_seq"] == job["entry_seq"]
    assert data["from_hook"] is False
    assert data["error"] == job["error"]


async def test_a_compaction_retried_after_an_upstream_error_then_committed(
    app: Any, client: httpx.AsyncClient, reader: str, db_url: str, upstream: Upstream
) -> None:
    await make_session(
        client, id="m", config={"compaction": {"auto": False, "keep_recent_tokens": 500}}
    )
    for batch in conversation(12):
        await append_ok(client, "m", batch)
    context_tokens = (await get_session(client, "m"))["context_tokens"]
    queued = await request_compaction(client, "m")
    upstream.script([Status(500), Reply(SUMMARY)])
    assert await drain(app, worker_config(upstream)) == 2
    job = await compaction(client, "m", queued["id"])
    frames = await session_events(reader, db_url, "m")
    assert [f.event for f in frames] == [
        "compaction.queued",
        "compaction.started",
        "compaction.retrying",
        "compaction.started",
        "compaction.succeeded",
    ]
    queued_ev, started, retrying, again, succeeded = frames
    assert_queued(queued_ev, job, context_tokens)
    assert job["reason"] == "manual"
    assert job["auto"] is False
    one = assert_compaction(started, job, "attempt", "worker")
    two = assert_compaction(again, job, "attempt", "worker")
    assert (one["attempt"], two["attempt"]) == (1, 2)
    assert job["attempts"] == 2
    assert one["worker"]
    assert two["worker"]
    retry = assert_compaction(retrying, job, "attempt", "retry_in_seconds", "error")
    assert retry["attempt"] == 1
    assert retry["retry_in_seconds"] == 0.0  # the test's worker waits for nothing
    assert "500" in retry["error"]
    assert_succeeded(succeeded, job)
    assert job["summarizer_used"] == "llm"
    # Each step is its own transaction: the queue, each claim, the retry, the commit.
    assert len({txid(f) for f in frames}) == 5


async def test_an_automatic_compaction_is_queued_with_the_verdict_that_asked_for_it(
    app: Any, client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await make_session(client, id="t", **SMALL, config=AUTO)
    _, body = await append_until(client, "t", conversation(40, words=300), "compaction")
    context_tokens = (await get_session(client, "t"))["context_tokens"]
    assert await drain(app) == 1
    job = await compaction(client, "t", body["compaction"]["id"])
    frames = await session_events(reader, db_url, "t")
    queued = of(frames, "compaction.queued")
    assert len(queued) == 1
    at = frames.index(queued[0])
    assert_verdict(frames[at - 1], "prune", "compact", "append")
    assert txid(frames[at - 1]) == txid(queued[0])  # the append's transaction
    assert_queued(queued[0], job, context_tokens)
    assert (job["reason"], job["auto"]) == ("threshold", True)
    started, succeeded = of(frames, "compaction.started", "compaction.succeeded")
    assert assert_compaction(started, job, "attempt", "worker")["attempt"] == 1
    assert_succeeded(succeeded, job)
    assert succeeded.data["data"]["tokens_after"] < succeeded.data["data"]["tokens_before"]


async def test_an_emergency_compaction_succeeds_in_the_append_that_needed_it(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    config = {**AUTO, "truncate": {"enabled": False}}
    await make_session(client, id="e", **SMALL, config=config)
    await append_until(client, "e", conversation(40, words=300), "compaction")
    body = await append_ok(client, "e", window_filler())
    assert body["compaction"]["reason"] == "emergency", body
    job = await compaction(client, "e", body["compaction"]["id"])
    frames = await session_events(reader, db_url, "e")
    mine = [f for f in frames if f.data["data"].get("compaction_id") == job["id"]]
    # No queue, no worker: it committed in the append, and said so there.
    (succeeded,) = mine
    assert succeeded.event == "compaction.succeeded"
    assert_succeeded(succeeded, job)
    assert (succeeded.data["data"]["reason"], succeeded.data["data"]["auto"]) == ("emergency", True)
    assert succeeded.data["data"]["summarizer"] == "extractive"
    verdicts = [f for f in of(frames, "session.verdict") if txid(f) == txid(succeeded)]
    assert [v.data["data"]["cause"] for v in verdicts] == ["append", "relief"]
    assert verdicts[0].data["data"]["to"] == "emergency"
    assert verdicts[1].data["data"]["to"] != "emergency"


async def test_a_compaction_that_finds_nothing_to_compact_fails(
    app: Any, client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    config = {"compaction": {"auto": False, "keep_recent_tokens": 500}}
    await make_session(client, id="f", config=config)
    for batch in conversation(6):
        await append_ok(client, "f", batch)
    queued = await request_compaction(client, "f", summarizer="extractive")
    # Before it runs, the session keeps everything recent: a manual job then fails.
    r = await client.patch(
        "/v1/sessions/f", json={"config": {"compaction": {"keep_recent_tokens": 1_000_000}}}
    )
    assert r.status_code == 200, r.text
    assert await drain(app) == 1
    job = await compaction(client, "f", queued["id"])
    assert job["status"] == "failed", job
    frames = await session_events(reader, db_url, "f")
    assert [f.event for f in frames] == [
        "compaction.queued",
        "compaction.started",
        "compaction.failed",
    ]
    assert_queued(frames[0], job, (await get_session(client, "f"))["context_tokens"])
    assert_compaction(frames[1], job, "attempt", "worker")
    failed = assert_compaction(frames[2], job, "error")
    assert failed["error"] == job["error"]
    assert "nothing to compact" in failed["error"]


async def test_a_compaction_cancelled_while_queued_and_one_cancelled_while_running(
    app: Any, client: httpx.AsyncClient, reader: str, db_url: str, upstream: Upstream
) -> None:
    config = {"compaction": {"auto": False, "keep_recent_tokens": 500}}
    await make_session(client, id="c", config=config)
    for batch in conversation(8):
        await append_ok(client, "c", batch)
    waiting = await request_compaction(client, "c")
    r = await client.post(f"/v1/sessions/c/compactions/{waiting['id']}/cancel")
    assert r.status_code == 200, r.text
    before_run = await compaction(client, "c", waiting["id"])
    # The second one hangs in the upstream until it is cancelled; the worker's
    # heartbeat (every lease / 3) finds the request.
    running_job = await request_compaction(client, "c")
    upstream.script([Hang(30)])
    worker = asyncio.create_task(drain(app, worker_config(upstream, lease_seconds=0.6)))

    async def runs() -> bool:
        status: str = (await compaction(client, "c", running_job["id"]))["status"]
        return status == "running"

    await eventually(runs, "the worker runs the job", within=20)
    r = await client.post(f"/v1/sessions/c/compactions/{running_job['id']}/cancel")
    assert r.status_code == 200, r.text
    assert await asyncio.wait_for(worker, 20) == 1
    during_run = await compaction(client, "c", running_job["id"])
    assert before_run["status"] == during_run["status"] == "cancelled"
    frames = await session_events(reader, db_url, "c")
    assert [f.event for f in frames] == [
        "compaction.queued",
        "compaction.cancelled",
        "compaction.queued",
        "compaction.started",
        "compaction.cancelled",
    ]
    context_tokens = (await get_session(client, "c"))["context_tokens"]
    assert_queued(frames[0], before_run, context_tokens)
    assert_queued(frames[2], during_run, context_tokens)
    one = assert_compaction(frames[1], before_run, "error")
    assert one["error"] == before_run["error"]
    two = assert_compaction(frames[4], during_run, "error")
    assert two["error"] == during_run["error"]
    assert one["error"] != two["error"]  # before it ran; while running


# --- navigation -----------------------------------------------------------------------


async def test_a_navigation_and_a_branch_summary_s_navigation(
    app: Any, client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await branchy(client, "n")  # a task (seqs 1-2), then a branch to seq 8
    entries = {e["seq"]: e for e in await history(client, "n")}
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 4})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "moved"
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 4})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "unchanged"
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 2, "summarize": True})
    assert r.status_code == 202, r.text
    job_id = r.json()["branch_summary"]["id"]
    assert await drain(app) == 1
    job = await compaction(client, "n", job_id)
    frames = await session_events(reader, db_url, "n")
    assert [f.event for f in frames] == [
        "session.navigated",  # the unchanged one writes nothing
        "compaction.queued",
        "compaction.started",
        "session.navigated",
        "compaction.succeeded",
    ]
    moved, queued, started, summarized, succeeded = frames
    assert moved.data["data"] == {
        "from_leaf_seq": 8,
        "to_leaf_seq": 4,
        "to_entry_id": entries[4]["id"],
        "abandoned_seqs": 4,
        "branch_summary_seq": None,
    }
    assert {k: queued.data["data"][k] for k in COMPACTION_KEYS} == {
        "compaction_id": job_id,
        "reason": "branch_summary",
        "auto": False,
    }
    assert_compaction(started, job, "attempt", "worker")
    after = await get_session(client, "n")
    nav = summarized.data["data"]
    assert nav == {
        "from_leaf_seq": 4,
        "to_leaf_seq": 2,
        "to_entry_id": entries[2]["id"],
        "abandoned_seqs": 2,
        "branch_summary_seq": job["entry_seq"],
        "compaction_id": job_id,
    }
    assert nav["branch_summary_seq"] == after["entry_count"]  # the new leaf: the summary
    assert_succeeded(succeeded, job)
    assert job["summarizer_used"] == "extractive"
    # The leaf moved with the summary's commit: one transaction.
    assert txid(summarized) == txid(succeeded)


async def test_a_queued_branch_summary_carries_the_tokens_before(
    client: httpx.AsyncClient, reader: str, db_url: str
) -> None:
    await branchy(client, "q")
    context_tokens = (await get_session(client, "q"))["context_tokens"]
    r = await client.post("/v1/sessions/q/navigate", json={"seq": 2, "summarize": True})
    assert r.status_code == 202, r.text
    job = await compaction(client, "q", r.json()["branch_summary"]["id"])
    (queued,) = await session_events(reader, db_url, "q")
    assert_queued(queued, job, context_tokens)
