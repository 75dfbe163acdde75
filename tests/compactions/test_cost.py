"""What compaction costs and saves (issue 30, "cost accounted"), through the real
worker, a real scripted upstream that reports usage in each API's own shape, and
Postgres: every summarizer request's usage is in the compaction's, the session's
and the tenant's totals; the hourly spend limit sends a compaction to the
extractive summarizer, and the next hour's bucket lets the model be asked again;
the metrics show it."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.core.database import driver_connection
from app.core.tenancy import DEFAULT_TENANT
from app.engine.accounting.summarizer_spend import Spend, add_usage, hour_of, over_limit
from tests.compactions import test_gate
from tests.compactions.helpers import compaction, drain, worker_config
from tests.compactions.remote_server import (  # noqa: F401 - the fixtures
    Remote,
    Summary,
    remote_fixture,
    remote_server_fixture,
)
from tests.compactions.worker_support import SHORT, SUMMARY, request_compaction, seeded
from tests.helpers import get_session
from tests.tree import test_branch_summary
from tests.upstream_server import Reply, Status, Upstream


def openai_usage(prompt: int, completion: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def metric(text: str, name: str, **labels: str) -> float:
    """A sample's value in a /metrics answer (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


async def metrics_text(client: httpx.AsyncClient) -> str:
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


async def usage(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/v1/usage")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def cost_of(done: dict[str, Any]) -> dict[str, int]:
    return {
        k: done["usage"][k] for k in ("calls", "input_tokens", "output_tokens", "cached_tokens")
    }


async def test_every_call_of_a_gated_compaction_is_in_its_the_sessions_and_the_tenants_totals(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """The summary, the continuity gate's second ask (the summary misses the failing
    test) and the short title: three requests, each with its own usage (OpenAI's
    shape, cached tokens in prompt_tokens_details)."""
    sid = await test_gate.session(client, "gated", failing=True)
    before = await metrics_text(client)
    upstream.script(
        [
            Reply(SUMMARY, usage=openai_usage(1200, 150, 1024)),
            Reply(SUMMARY, usage=openai_usage(1300, 160, 0)),
            Reply(SHORT, usage=openai_usage(200, 12, 128)),
        ]
    )
    done = await test_gate.compact(app, client, sid, upstream)

    assert done["status"] == "succeeded", done
    assert done["details"]["gate"]["retried"] is True  # the second ask happened
    assert len(upstream.requests) == 3
    expected = {"calls": 3, "input_tokens": 2700, "output_tokens": 322, "cached_tokens": 1152}
    assert cost_of(done) == expected
    assert done["usage"]["model"] == done["upstream_model"] == "gpt-4o"
    # The usage as the upstream reported it, summed; the requests are counted apart.
    assert done["upstream_usage"] == {
        "input_tokens": 2700,
        "output_tokens": 322,
        "cache_read_tokens": 1152,
    }

    session = await get_session(client, sid)
    assert session["compaction_cost"] == expected
    saved = done["tokens_before"] - done["tokens_after"]
    assert saved > 0
    assert session["compaction_saved_tokens"] == saved

    tenant = await usage(client)
    assert tenant["summarizer"] == expected
    assert tenant["compactions"] == 1
    assert tenant["saved_tokens"] == saved
    assert tenant["limited_compactions"] == 0
    hour = tenant["current_hour"]
    assert {k: hour[k] for k in expected} == expected
    assert datetime.fromisoformat(hour["hour_start"]) == hour_of(datetime.now(UTC))
    assert tenant["tokens_per_hour_limit"] is None

    after = await metrics_text(client)
    for kind, value in (("input", 2700), ("output", 322), ("cached", 1152)):
        name = "compactd_summarizer_tokens_total"
        grew = metric(after, name, kind=kind) - metric(before, name, kind=kind)
        assert grew == value, (kind, grew)
    name = "compactd_summarizer_calls_total"
    assert metric(after, name, reason="manual") - metric(before, name, reason="manual") == 3


async def test_a_split_turn_then_a_failure_keeps_the_usage_of_the_call_that_answered(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """Anthropic's shape: the history's summary answers (cache reads and writes are
    part of its prompt), the split turn's request is refused for good, the extractive
    summary is the fallback: the answered call's usage and both requests are counted."""
    sid = await seeded(client, 12, cut="split")
    answered = {
        "input_tokens": 300,
        "output_tokens": 90,
        "cache_read_input_tokens": 1000,
        "cache_creation_input_tokens": 50,
    }
    upstream.script([Reply(SUMMARY, usage=answered), Status(400)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, api="anthropic")) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["details"]["split_turn"] is True
    assert len(upstream.requests) == 2
    expected = {"calls": 2, "input_tokens": 1350, "output_tokens": 90, "cached_tokens": 1000}
    assert cost_of(done) == expected
    session = await get_session(client, sid)
    assert session["compaction_cost"] == expected
    assert session["compaction_saved_tokens"] == done["tokens_before"] - done["tokens_after"]
    assert (await usage(client))["summarizer"] == expected


async def test_an_attempt_retried_after_an_answered_call_is_counted_when_a_later_one_commits(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """The history's summary answers, then the split turn's request is rate limited
    (retryable): the job goes back to the queue, and the answered request's usage and
    both requests go with it; the next attempt asks again (history, split turn, title)
    and commits. The compaction, the session and the tenant count all five requests."""
    sid = await seeded(client, 12, cut="split")
    first = openai_usage(700, 80, 512)
    upstream.script(
        [
            Reply(SUMMARY, usage=first),
            Status(429, headers={"retry-after": "0"}),
            Reply(SUMMARY, usage=openai_usage(710, 81, 0)),
            Reply(SUMMARY, usage=openai_usage(300, 40, 0)),
            Reply(SHORT, usage=openai_usage(100, 9, 64)),
        ]
    )
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) >= 1
    retried = await compaction(client, sid, job["id"])
    if retried["status"] == "queued":  # its retry was not due yet
        await asyncio.sleep(1.5)
        assert await drain(app, worker_config(upstream)) == 1
    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert len(upstream.requests) == 5
    expected = {"calls": 5, "input_tokens": 1810, "output_tokens": 210, "cached_tokens": 576}
    assert cost_of(done) == expected
    assert (await get_session(client, sid))["compaction_cost"] == expected
    assert (await usage(client))["summarizer"] == expected


async def test_the_tenant_sums_its_sessions_and_an_extractive_compaction_saves_without_cost(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    first = await seeded(client, 12)
    second = await seeded(client, 12)
    upstream.script(
        [Reply(SUMMARY, usage=openai_usage(900, 80, 0)), Reply(SHORT, usage=openai_usage(50, 9, 0))]
    )
    a = await request_compaction(client, first)
    assert await drain(app, worker_config(upstream)) == 1
    b = await request_compaction(client, second, summarizer="extractive")
    assert await drain(app, worker_config(upstream)) == 1
    llm = await compaction(client, first, a["id"])
    plain = await compaction(client, second, b["id"])
    assert llm["summarizer_used"] == "llm"
    assert plain["summarizer_used"] == "extractive"
    assert cost_of(llm) == {
        "calls": 2,
        "input_tokens": 950,
        "output_tokens": 89,
        "cached_tokens": 0,
    }
    assert cost_of(plain) == {"calls": 0, "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
    assert plain["usage"]["model"] is None

    saved = [d["tokens_before"] - d["tokens_after"] for d in (llm, plain)]
    assert (await get_session(client, second))["compaction_saved_tokens"] == saved[1] > 0
    assert (await get_session(client, second))["compaction_cost"]["calls"] == 0
    tenant = await usage(client)
    assert tenant["summarizer"] == cost_of(llm)
    assert tenant["compactions"] == 2
    assert tenant["saved_tokens"] == sum(saved)


async def test_past_the_hourly_limit_a_compaction_is_extractive_until_the_next_hour(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    limit = 1_000
    config = dataclasses.replace(worker_config(upstream), summarizer_tokens_per_tenant_hour=limit)
    sessions = [await seeded(client, 12) for _ in range(3)]
    before = await metrics_text(client)
    # Under the limit (nothing spent yet): the model is asked, and spends past it.
    upstream.script(
        [Reply(SUMMARY, usage=openai_usage(900, 80, 0)), Reply(SHORT, usage=openai_usage(50, 9, 0))]
    )
    first = await request_compaction(client, sessions[0])
    assert await drain(app, config) == 1
    assert (await compaction(client, sessions[0], first["id"]))["summarizer_used"] == "llm"
    assert (await usage(client))["current_hour"]["input_tokens"] == 950

    # At 1,039 of 1,000 tokens this hour: extractive, no request sent, and the notes say why.
    asked = len(upstream.requests)
    second = await request_compaction(client, sessions[1])
    assert await drain(app, config) == 1
    done = await compaction(client, sessions[1], second["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert len(upstream.requests) == asked
    note = next(n for n in done["details"]["notes"] if n.startswith("summarizer spend limit"))
    assert "1039 of its 1000" in note
    assert note in (done["error"] or "")
    assert cost_of(done)["calls"] == 0
    tenant = await usage(client)
    assert tenant["limited_compactions"] == 1
    assert tenant["current_hour"]["limited_compactions"] == 1
    after = await metrics_text(client)
    name = "compactd_summarizer_limited_total"
    assert metric(after, name, reason="manual") - metric(before, name, reason="manual") == 1

    # The spend moves to the hour before (time travel): this hour starts from zero.
    async with driver_connection(app.state.engine) as driver:
        moved = await driver.execute(
            "UPDATE tenant_summarizer_hour SET hour_start = hour_start - interval '1 hour'"
        )
    assert moved == "UPDATE 1", moved
    upstream.script([Reply(SUMMARY), Reply(SHORT)])
    third = await request_compaction(client, sessions[2])
    assert await drain(app, config) == 1
    assert (await compaction(client, sessions[2], third["id"]))["summarizer_used"] == "llm"
    assert len(upstream.requests) == asked + 2


def test_the_hour_bucket_is_the_utc_hour_and_a_new_one_starts_from_zero() -> None:
    last = datetime(2027, 1, 12, 10, 59, 59, 999_999, tzinfo=UTC)
    assert hour_of(last) == datetime(2027, 1, 12, 10, tzinfo=UTC)
    assert hour_of(last + timedelta(microseconds=1)) == datetime(2027, 1, 12, 11, tzinfo=UTC)
    east = datetime(2027, 1, 12, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    assert hour_of(east) == datetime(2027, 1, 12, 10, tzinfo=UTC)
    with pytest.raises(ValueError, match="aware"):
        hour_of(datetime(2027, 1, 12, 10, 30))
    # The limit reads the current bucket's spend only: the next hour's is 0.
    assert over_limit(1_000, 1_000)
    assert not over_limit(999, 1_000)
    assert not over_limit(0, 1_000)
    assert not over_limit(10**9, 0)  # 0: no limit


def test_usage_adds_up_key_by_key() -> None:
    total = add_usage({}, {"input_tokens": 10, "output_tokens": 2})
    total = add_usage(total, {"input_tokens": 5, "cache_read_tokens": 4})
    assert total == {"input_tokens": 15, "output_tokens": 2, "cache_read_tokens": 4}
    spend = Spend.of(total, 3)
    assert spend == Spend(calls=3, input_tokens=15, output_tokens=2, cached_tokens=4)
    assert spend.tokens == 17
    assert Spend.of({"input_tokens": True, "output_tokens": "2"}) == Spend()
    assert Spend.of(None).empty
    assert Spend.of(None, 2) == Spend(calls=2)  # a remote endpoint: calls, no tokens


async def test_a_branch_summarys_requests_are_the_sessions_cost_and_save_nothing(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    await test_branch_summary.seeded(client, "nav")
    r = await test_branch_summary.navigate(client, "nav", seq=2, summarize=True)
    assert r.status_code == 202, r.text
    job_id = r.json()["branch_summary"]["id"]
    upstream.script(
        [
            Reply("Tried a regex in src/dates.py; week 53 failed.", usage=openai_usage(400, 30, 0)),
            Reply("Regex try", usage=openai_usage(60, 4, 0)),
        ]
    )
    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, "nav", job_id)
    assert done["status"] == "succeeded", done
    assert done["reason"] == "branch_summary"
    calls = len(upstream.requests)
    expected = {"calls": calls, "input_tokens": 460, "output_tokens": 34, "cached_tokens": 0}
    assert calls == 2
    assert cost_of(done) == expected
    session = await get_session(client, "nav")
    assert session["compaction_cost"] == expected
    assert session["compaction_saved_tokens"] == 0
    tenant = await usage(client)
    assert tenant["summarizer"] == expected
    assert tenant["compactions"] == 0  # a navigation, not a compaction


async def test_a_remote_endpoint_counts_its_calls_and_is_not_held_by_the_limit(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    """A tenant's own endpoint reports no tokens: its requests are counted, and the
    operator's hourly limit (on its upstream) does not stop it."""
    sid = await seeded(client, 12, config={"compaction": {"remote_endpoint": remote.url}})
    # The tenant has spent this hour's tokens on the operator's upstream already.
    async with driver_connection(app.state.engine) as driver:
        await driver.execute(
            "INSERT INTO tenant_summarizer_hour (tenant_id, hour_start, input_tokens) "
            "VALUES ($1, $2, 5000)",
            DEFAULT_TENANT,
            hour_of(datetime.now(UTC)),
        )
    remote.script([Summary(SUMMARY), Summary(SHORT)])
    job = await request_compaction(client, sid)
    config = dataclasses.replace(worker_config(None), summarizer_tokens_per_tenant_hour=1_000)

    assert await drain(app, config) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["upstream_usage"] is None
    assert cost_of(done) == {"calls": 2, "input_tokens": 0, "output_tokens": 0, "cached_tokens": 0}
    assert done["usage"]["model"].startswith("remote:127.0.0.1")
    assert (await get_session(client, sid))["compaction_cost"]["calls"] == 2
    hour = (await usage(client))["current_hour"]
    assert hour["calls"] == 2
    assert hour["input_tokens"] == 5000
    assert hour["limited_compactions"] == 0
