"""The real traces in a 16k window with automatic compaction, replayed by an
agent that reports usage late: it appends the model's reply first and then
reports the usage of the call that produced it, without ``context_version``
(as many agents do). Through a real uvicorn server with its compaction
workers, as in test_trace_compaction_replay.

What must hold: no model call gets two compactions because of its own late
report (the report is about the context GET /context served for that call; a
compaction the reply's append started since makes it stale, or already the
call's), every context stays valid and under budget, and the stored history is
what was sent. Compactions per model call are counted and printed
(``pytest -s``). Before the fix, two runs had 44 and 53 of about 195
compactions started by such reports (23-27%), 6 and 2 of them in the same model
call as another compaction (and in the second run 28 more in the call right
after one); after it, 9-11 of about 178, none in or right after another's call.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from app.main import create_app
from tests import traces
from tests.e2e.server import running
from tests.e2e.test_trace_budget_replay import reported_prompt
from tests.e2e.test_trace_compaction_replay import CONFIG, WINDOW, check
from tests.helpers import history


def _started(body: dict[str, Any]) -> bool:
    started = body.get("compaction")
    return started is not None and bool(started["created"])


async def _replay(client: httpx.AsyncClient, path: Path) -> dict[str, Any]:
    messages = traces.load(path)
    session = await traces.create_session(client, path, "l-", **WINDOW, config=CONFIG)
    sid = session["id"]
    served: dict[str, Any] | None = None  # the last context read: what a model call sends
    per_call: list[tuple[int, int]] = []  # (by appends, by reports) in each model call
    by_appends = by_reports = stale = 0
    for n, batch in enumerate(traces.turns(messages)):
        reply = batch[0]["role"] == "assistant"
        if reply and n:
            per_call.append((by_appends, by_reports))
            by_appends = by_reports = 0
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": batch})
        assert r.status_code == 201, f"{path.name} turn {n}: {r.text}"
        by_appends += _started(r.json())
        prompt = reported_prompt(batch[0]) if reply else None
        if prompt is not None and served is not None:
            # What the provider reported for the context that call sent, reported
            # only now, after the reply's append.
            b = served["tokens"]["breakdown"]
            shown = b["summary"] + b["messages"] + b["tool_outputs"] + REPLY_PRIMING_TOKENS
            whole = session["stored_tokens"] + REPLY_PRIMING_TOKENS
            r = await client.post(
                f"/v1/sessions/{sid}/usage",
                json={"input_tokens": round(prompt * shown / whole), "finish_reason": "tool_calls"},
            )
            assert r.status_code == 200, r.text
            body = r.json()
            stale += body["stale"]
            by_reports += _started(body)
        pending = batch[-1]["role"] == "assistant"
        for fmt in ("openai", "anthropic"):
            r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
            assert r.status_code == 200, r.text
            served = r.json()
            check(served, fmt, pending, f"{path.name} turn {n} ({fmt})")
        session = (await client.get(f"/v1/sessions/{sid}")).json()
    per_call.append((by_appends, by_reports))

    # Let the last queued compaction finish.
    jobs = await traces.finished_compactions(client, sid)
    stored = await history(client, sid)
    assert [e["message"] for e in stored if e["kind"] == "message"] == messages, path.name
    added = collections.Counter(e["kind"] for e in stored if e["kind"] != "message")
    assert added["compaction"] == sum(j["status"] == "succeeded" for j in jobs), path.name
    return {"per_call": per_call, "stale": stale, "jobs": jobs}


@pytest.mark.slow
async def test_late_usage_reports_never_compact_a_model_call_twice(
    db_url: str, settings: Settings
) -> None:
    app = create_app(settings.model_copy(update={"compaction_workers": 2}), database_url=db_url)
    with running(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            results = await traces.replay_all(client, _replay)
    calls = [c for s in results for c in s["per_call"]]
    by_appends = sum(a for a, _ in calls)
    by_reports = sum(r for _, r in calls)
    counts = collections.Counter(a + r for a, r in calls)
    doubled = sum(1 for a, r in calls if r and a + r > 1)
    # A report's compaction in the call right after another compaction started.
    following = sum(
        1
        for s in results
        for (a0, r0), (_, r1) in zip(s["per_call"], s["per_call"][1:], strict=False)
        if r1 and a0 + r0
    )
    statuses = collections.Counter(j["status"] for s in results for j in s["jobs"])
    print(
        f"\n16k late-usage replay of {len(results)} traces: {len(calls)} model calls; "
        f"compactions started by appends {by_appends}, by usage reports {by_reports}; "
        f"model calls by compactions started {dict(sorted(counts.items()))}; "
        f"calls compacted twice with a report's help {doubled}; "
        f"report compactions in the call after another compaction {following}; "
        f"stale reports {sum(s['stale'] for s in results)}; jobs {dict(statuses)}"
    )
    assert by_appends > len(results)  # the replay did compact
    assert doubled == 0
