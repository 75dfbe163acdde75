"""Blocking hooks (seed 001's session_before_compact, session.compacting and
session_before_tree) through a real worker, a real receiver and the scripted
upstream: a hook cancels a compaction, supplies its whole summary, or shapes the
summary prompt (its prompt, context lines and data to preserve), cancels a
navigation or supplies its branch summary; a hook that hangs, fails or answers
garbage changes nothing and blocks nothing. Every call is a signed request, a
``hook.called`` event and a line of the job's ``details.hooks``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from app.compactions.worker import Worker
from app.core.outbound import Outbound
from app.engine.compaction.branch_summary import PREAMBLE
from app.prompts import load_prompt
from tests.compactions.helpers import compaction, drain, worker_config
from tests.compactions.worker_support import (
    SHORT,
    SUMMARY,
    compaction_count,
    job_row,
    prompt_of,
    request_compaction,
    seeded,
)
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import append_ok, assert_problem, get_session
from tests.upstream_server import Reply, Upstream
from tests.webhooks.receiver import Answer, Hang, Inbox
from tests.webhooks.support import create_webhook, documented_verify, event_log

HOOK_SUMMARY = (
    "## Goal\nFix the date parser in src/dates.py (never edit tests/).\n\n"
    "## Progress\n- Written by the review bot, not by a model."
)
HOOK_PROMPT = "Summarize as five bullets, each naming a file."
DEFAULT = "default: the work goes on as without this hook"


async def _hook(client: httpx.AsyncClient, inbox: Inbox, name: str, **body: Any) -> dict[str, Any]:
    body.setdefault("types", ["compaction.before"])
    return await create_webhook(client, url=inbox.url(name), hook=True, **body)


async def _context(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": "openai"})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def _hook_events(app: Any) -> list[dict[str, Any]]:
    return [e["data"] for e in await event_log(app) if e["type"] == "hook.called"]


def _outcomes(calls: list[dict[str, Any]]) -> list[str]:
    return [c["outcome"] for c in calls]


# --- compaction.before -------------------------------------------------------------


async def test_a_hook_cancels_the_compaction(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    verify = documented_verify()
    hook = await _hook(client, inbox, "hook")
    inbox.script("hook", [Answer(200, {"cancel": True, "reason": "the user is reviewing"})])
    sid = await seeded(client, 12)
    before = await _context(client, sid)
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "cancelled", done
    assert done["error"] == "cancelled by a hook: the user is reviewing"
    assert done["summary"] is None
    assert upstream.requests == []  # no model was called
    assert await compaction_count(client, sid) == 0
    assert await _context(client, sid) == before
    # The call: signed, and what docs/events.md says it holds.
    [call] = inbox.received("hook")
    assert verify(hook["secret"], call.headers, call.body)
    assert call.json["type"] == "compaction.before"
    assert call.json["session_id"] == sid
    data = call.json["data"]
    assert set(data) >= {
        "compaction_id",
        "reason",
        "auto",
        "attempt",
        "source_start_seq",
        "first_kept_seq",
        "entries",
        "previous_summary",
        "conversation",
    }
    assert (data["compaction_id"], data["reason"], data["auto"], data["attempt"]) == (
        job["id"],
        "manual",
        False,
        1,
    )
    assert data["previous_summary"] is None
    assert data["entries"] > 0
    assert data["first_kept_seq"] > data["source_start_seq"]
    assert "Fix the failing date parser in src/dates.py" in data["conversation"]
    # Recorded: a hook.called event, and the job's cancellation event says why.
    [event] = await _hook_events(app)
    assert (event["webhook_id"], event["point"], event["outcome"], event["status"]) == (
        hook["id"],
        "compaction.before",
        "cancelled",
        200,
    )
    assert event["elapsed_ms"] >= 0
    cancelled = [e for e in await event_log(app) if e["type"] == "compaction.cancelled"]
    assert [e["data"]["error"] for e in cancelled] == [done["error"]]
    # Nothing holds the session: the next compaction runs (the hook said its piece).
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    again = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1
    assert (await compaction(client, sid, again["id"]))["status"] == "succeeded"


async def test_a_cancelled_job_records_the_hook_call(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "hook")
    inbox.script("hook", [Answer(200, {"cancel": True})])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1
    row = await job_row(app.state.engine, sid, job["id"])
    assert row.status == "cancelled"
    assert _outcomes((row.details or {}).get("hooks", [])) == ["cancelled"]


@pytest.mark.parametrize(
    "answer",
    [
        {"summary": HOOK_SUMMARY, "details": {"source": "review-bot"}},
        # Seed 001's shape: {summary: {summary, details}}.
        {"summary": {"summary": HOOK_SUMMARY, "details": {"source": "review-bot"}}},
    ],
    ids=["flat", "seed-001"],
)
async def test_a_hook_supplies_the_whole_summary(
    app: Any,
    client: httpx.AsyncClient,
    upstream: Upstream,
    inbox: Inbox,
    answer: dict[str, Any],
) -> None:
    hook = await _hook(client, inbox, "hook")
    later = await _hook(client, inbox, "later")  # not called: the summary stops there
    inbox.script("hook", [Answer(200, answer)])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "hook"
    assert done["summary"].startswith(HOOK_SUMMARY)
    assert upstream.requests == []
    assert inbox.received("later") == []
    assert await compaction_count(client, sid) == 1
    messages = (await _context(client, sid))["messages"]
    assert any(HOOK_SUMMARY in str(m["content"]) for m in messages)
    # Recorded as made outside (seed 001's fromExtension), on the job as the worker
    # stored it.
    row = await job_row(app.state.engine, sid, job["id"])
    details = row.details or {}
    assert details["from_hook"] is True
    assert details["hook_details"] == {"source": "review-bot"}
    assert _outcomes(details["hooks"]) == ["summary"]
    assert details["hooks"][0]["webhook_id"] == hook["id"]
    succeeded = [e["data"] for e in await event_log(app) if e["type"] == "compaction.succeeded"]
    assert [(e["summarizer"], e.get("from_hook")) for e in succeeded] == [("hook", True)]
    assert later["id"] not in {e["webhook_id"] for e in await _hook_events(app)}


async def test_the_api_shows_what_hooks_did(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "hook")
    inbox.script("hook", [Answer(200, {"summary": HOOK_SUMMARY, "details": {"k": 1}})])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1
    details = (await compaction(client, sid, job["id"]))["details"]
    assert details["from_hook"] is True
    assert _outcomes(details["hooks"]) == ["summary"]


async def test_hooks_prompts_context_and_preserved_data_add_up(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "first")
    await _hook(client, inbox, "second")
    inbox.script(
        "first",
        [
            Answer(
                200,
                {
                    "prompt": "A prompt the second hook replaces.",
                    "context": ["The user is on the release branch.", "  "],
                    "preserve": {"ticket": "DATES-41", "owner": "ana"},
                },
            )
        ],
    )
    inbox.script(
        "second",
        [
            Answer(
                200,
                {
                    "prompt": HOOK_PROMPT,
                    "context": ["Ticket DATES-42 tracks this work."],
                    "preserve": {"ticket": "DATES-42"},
                },
            )
        ],
    )
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["summary"].startswith(SUMMARY)
    prompt = prompt_of(upstream.requests[0])
    assert prompt.endswith(
        "<additional-context>\n"
        "- The user is on the release branch.\n"
        "- Ticket DATES-42 tracks this work.\n"
        "</additional-context>\n\n" + HOOK_PROMPT
    ), prompt[-600:]
    assert "A prompt the second hook replaces." not in prompt
    assert load_prompt("structured") not in prompt
    row = await job_row(app.state.engine, sid, job["id"])
    details = row.details or {}
    assert details["preserve"] == {"ticket": "DATES-42", "owner": "ana"}
    assert _outcomes(details["hooks"]) == ["customized", "customized"]
    assert "from_hook" not in details
    assert _outcomes(await _hook_events(app)) == ["customized", "customized"]


async def test_an_empty_answer_goes_on_as_usual(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "hook")
    inbox.script("hook", [Answer(200, {}), Answer(204, None, raw=b"")])
    await _hook(client, inbox, "blank")
    inbox.script("blank", [Answer(204, None, raw=b"")])
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1
    done = await compaction(client, sid, job["id"])
    assert (done["status"], done["summarizer_used"]) == ("succeeded", "llm")
    assert "<additional-context>" not in prompt_of(upstream.requests[0])
    assert load_prompt("structured") in prompt_of(upstream.requests[0])
    row = await job_row(app.state.engine, sid, job["id"])
    assert _outcomes((row.details or {})["hooks"]) == ["proceeded", "proceeded"]
    assert "preserve" not in (row.details or {})


async def test_hooks_that_hang_fail_or_answer_garbage_block_nothing(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "hangs", timeout_seconds=0.5)
    inbox.always("hangs", Hang(10, Answer(200, {"cancel": True})))
    await _hook(client, inbox, "fails")
    inbox.always("fails", Answer(500, {"cancel": True}))
    await _hook(client, inbox, "garbage")
    inbox.always("garbage", Answer(200, raw=b"<html><body>502 Bad Gateway</body></html>"))
    await _hook(client, inbox, "not-an-object")
    inbox.always("not-an-object", Answer(200, ["cancel", True]))
    await _hook(client, inbox, "fine")
    inbox.always("fine", Answer(200, {"context": ["Still heard after the others failed."]}))
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)

    started = time.monotonic()
    assert await drain(app, worker_config(upstream)) == 1
    assert time.monotonic() - started < 5  # the hang cost its timeout, not its 10 s

    done = await compaction(client, sid, job["id"])
    assert (done["status"], done["summarizer_used"]) == ("succeeded", "llm")
    assert done["summary"].startswith(SUMMARY)
    assert "- Still heard after the others failed." in prompt_of(upstream.requests[0])
    row = await job_row(app.state.engine, sid, job["id"])
    calls = (row.details or {})["hooks"]
    assert _outcomes(calls) == ["timeout", "error", "invalid", "invalid", "customized"]
    hung, failed, garbage, listed, fine = calls
    assert 400 <= hung["elapsed_ms"] < 3000
    assert hung["status"] is None
    assert hung["error"] == "no answer within 0.5 s"
    assert (failed["status"], failed["error"]) == (500, "answered 500")
    assert garbage["status"] == 200
    assert garbage["error"]
    assert listed["error"] == "the answer is not a JSON object"
    assert all(c["applied"] == DEFAULT for c in calls[:4])
    assert "applied" not in fine
    assert _outcomes(await _hook_events(app)) == _outcomes(calls)


async def test_an_answer_invalid_in_part_is_not_applied_in_part(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "hook")
    inbox.script(
        "hook",
        [
            Answer(
                200,
                {
                    "prompt": "A prompt from an answer that is not valid.",
                    "preserve": {"half": "applied"},
                    "context": "not a list",
                },
            )
        ],
    )
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid)
    assert await drain(app, worker_config(upstream)) == 1
    row = await job_row(app.state.engine, sid, job["id"])
    details = row.details or {}
    assert _outcomes(details["hooks"]) == ["invalid"]
    assert details["hooks"][0]["applied"] == DEFAULT
    # "The work goes on as without the hook": none of the answer is used.
    prompt = prompt_of(upstream.requests[0])
    assert "A prompt from an answer that is not valid." not in prompt
    assert load_prompt("structured") in prompt
    assert "preserve" not in details


async def test_only_the_hooks_for_this_session_and_point_are_called(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    sid = await seeded(client, 12, id="mine")
    await _hook(client, inbox, "other-session", session_id="other")
    await _hook(client, inbox, "navigation", types=["navigation.before"])
    paused = await _hook(client, inbox, "paused")
    r = await client.patch(f"/v1/webhooks/{paused['id']}", json={"enabled": False})
    assert r.status_code == 200, r.text
    await create_webhook(client, url=inbox.url("not-a-hook"), types=[])
    mine = await _hook(client, inbox, "mine", session_id="mine", types=[])
    job = await request_compaction(client, sid, summarizer="extractive")
    assert await drain(app) == 1
    assert (await compaction(client, sid, job["id"]))["status"] == "succeeded"
    assert [r.name for r in inbox.received()] == ["mine"]
    assert [e["webhook_id"] for e in await _hook_events(app)] == [mine["id"]]


async def test_at_most_five_hooks_are_called_oldest_first(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    made = [await _hook(client, inbox, f"h{i}") for i in range(6)]
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid, summarizer="extractive")
    assert await drain(app) == 1
    assert (await compaction(client, sid, job["id"]))["status"] == "succeeded"
    assert [r.name for r in inbox.received()] == [f"h{i}" for i in range(5)]
    assert [e["webhook_id"] for e in await _hook_events(app)] == [h["id"] for h in made[:5]]


# --- navigation.before -------------------------------------------------------------


async def _branchy(client: httpx.AsyncClient, sid: str) -> None:
    """A task, then a branch that tried something and failed."""
    await make_session(
        client, id=sid, config={"compaction": {"auto": False}, "prune": {"auto": False}}
    )
    await append_ok(
        client,
        sid,
        [
            {"role": "user", "content": "Fix the date parser in src/dates.py."},
            {"role": "assistant", "content": "I will look first."},
            {"role": "user", "content": "Try the regex approach."},
            {"role": "assistant", "content": "The regex approach fails on week 53."},
            {"role": "user", "content": "Then try the calendar module."},
            {"role": "assistant", "content": "The calendar module handles week 53."},
        ],
    )


async def test_a_hook_cancels_a_navigation(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    verify = documented_verify()
    hook = await _hook(client, inbox, "nav", types=["navigation.before"])
    inbox.script("nav", [Answer(200, {"cancel": True, "reason": "the agent is mid-task"})])
    await _branchy(client, "n")
    before = await get_session(client, "n")
    tree = (await client.get("/v1/sessions/n/tree")).json()

    r = await client.post(
        "/v1/sessions/n/navigate", json={"seq": 2, "summarize": True, "instructions": "Why?"}
    )

    assert_problem(r, 409, "the agent is mid-task")
    after = await get_session(client, "n")
    assert (after["entry_count"], after["version"], after["active_compaction_id"]) == (
        before["entry_count"],
        before["version"],
        None,
    )
    assert (await client.get("/v1/sessions/n/tree")).json() == tree
    [call] = inbox.received("nav")
    assert verify(hook["secret"], call.headers, call.body)
    assert (call.json["type"], call.json["session_id"]) == ("navigation.before", "n")
    assert call.json["data"] == {
        "entry_id": None,
        "seq": 2,
        "summarize": True,
        "instructions": "Why?",
    }
    log = await event_log(app)
    assert "session.navigated" not in {e["type"] for e in log}
    assert _outcomes(await _hook_events(app)) == ["cancelled"]
    # The hook changes its mind: the navigation goes through.
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 2})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "moved"


async def test_a_hook_supplies_the_branch_summary(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    branch_summary = "Tried a regex in src/dates.py: week 53 broke it; the calendar module works."
    await _hook(client, inbox, "nav", types=["navigation.before"])
    inbox.script("nav", [Answer(200, {"summary": branch_summary})])
    await _branchy(client, "n")

    r = await client.post("/v1/sessions/n/navigate", json={"seq": 2, "summarize": True})
    assert r.status_code == 202, r.text
    pending = r.json()["branch_summary"]
    assert await drain(app, worker_config(upstream)) == 1

    assert upstream.requests == []  # the hook's summary, not a model's
    job = await compaction(client, "n", pending["id"])
    assert (job["status"], job["summarizer_used"], job["reason"]) == (
        "succeeded",
        "hook",
        "branch_summary",
    )
    messages = (await _context(client, "n"))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[-1]["content"].startswith(PREAMBLE)
    assert branch_summary in messages[-1]["content"]
    assert [e["type"] for e in await event_log(app)].count("session.navigated") == 1


async def test_a_branch_summary_job_records_the_hook_call(
    app: Any, client: httpx.AsyncClient, upstream: Upstream, inbox: Inbox
) -> None:
    await _hook(client, inbox, "nav", types=["navigation.before"])
    inbox.script("nav", [Answer(200, {"summary": "What the branch tried, from the hook."})])
    await _branchy(client, "n")
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 2, "summarize": True})
    assert r.status_code == 202, r.text
    assert await drain(app, worker_config(upstream)) == 1
    row = await job_row(app.state.engine, "n", r.json()["branch_summary"]["id"])
    assert row.status == "succeeded"
    assert _outcomes((row.details or {}).get("hooks", [])) == ["summary"]


async def test_a_navigation_without_a_summary_ignores_a_supplied_one(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    await _hook(client, inbox, "nav", types=["navigation.before"])
    inbox.script("nav", [Answer(200, {"summary": "Not asked for."})])
    await _branchy(client, "n")
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 2, "summarize": False})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "moved"
    assert (await get_session(client, "n"))["entry_count"] == 2
    assert "Not asked for." not in str(await _context(client, "n"))


@pytest.mark.parametrize(
    ("action", "outcome"),
    [
        (Hang(10), "timeout"),
        (Answer(500, {"cancel": True}), "error"),
        (Answer(200, raw=b"cancel"), "invalid"),
        (Answer(200, {"summary": 42}), "invalid"),
    ],
    ids=["hang", "500", "garbage", "bad-summary"],
)
async def test_a_failing_navigation_hook_does_not_block_it(
    app: Any, client: httpx.AsyncClient, inbox: Inbox, action: Any, outcome: str
) -> None:
    await _hook(client, inbox, "nav", types=["navigation.before"], timeout_seconds=0.5)
    inbox.always("nav", action)
    await _branchy(client, "n")
    started = time.monotonic()
    r = await client.post("/v1/sessions/n/navigate", json={"seq": 2})
    assert time.monotonic() - started < 3
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "moved"
    assert (await get_session(client, "n"))["entry_count"] == 2
    [called] = await _hook_events(app)
    assert (called["point"], called["outcome"], called["applied"]) == (
        "navigation.before",
        outcome,
        DEFAULT,
    )


# --- known faults outside the hooks' own code (reported, not fixed here) -----------


async def test_a_slow_hook_keeps_the_job_s_lease(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    await _hook(client, inbox, "slow", timeout_seconds=5)
    inbox.always("slow", Hang(1.2, Answer(200, {})))
    sid = await seeded(client, 12)
    job = await request_compaction(client, sid, summarizer="extractive")
    async with Outbound(TEST_SETTINGS) as http:
        first = Worker(app.state.engine, worker_config(lease_seconds=0.6), http)
        second = Worker(app.state.engine, worker_config(lease_seconds=0.6), http)
        running = asyncio.ensure_future(first.run_once())
        await inbox.wait_for(1, "slow")
        await asyncio.sleep(0.8)  # past the first worker's lease, within the hook's wait
        claimed = await second.run_once()
        await running
    assert (await compaction(client, sid, job["id"]))["status"] == "succeeded"
    assert len(inbox.received("slow")) == 1
    assert not claimed


async def test_a_navigation_of_a_missing_session_calls_no_hook(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    await _hook(client, inbox, "nav", types=["navigation.before"])
    r = await client.post("/v1/sessions/ghost/navigate", json={"seq": 1})
    assert_problem(r, 404, "ghost")
    assert await event_log(app) == []
    assert inbox.received("nav") == []


async def test_a_replayed_navigation_calls_no_hook(
    app: Any, client: httpx.AsyncClient, inbox: Inbox
) -> None:
    await _hook(client, inbox, "nav", types=["navigation.before"])
    await _branchy(client, "n")
    key = {"Idempotency-Key": "nav-1"}
    first = await client.post("/v1/sessions/n/navigate", json={"seq": 2}, headers=key)
    assert first.status_code == 200, first.text
    inbox.always("nav", Answer(200, {"cancel": True}))
    again = await client.post("/v1/sessions/n/navigate", json={"seq": 2}, headers=key)
    assert again.status_code == 200, again.text
    assert again.json() == first.json()
    assert len(inbox.received("nav")) == 1
