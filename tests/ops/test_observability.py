"""Request ids, one JSON log line per request, and /metrics in Prometheus format."""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.core import metrics
from app.core.migrations import head_revision
from app.core.observability import JsonFormatter
from app.upstream import UpstreamConfig, UpstreamError, complete
from tests import postgres
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import append_ok
from tests.upstream_server import Reply, Status, Upstream


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def _metrics(client: httpx.AsyncClient) -> dict[Any, float]:
    r = await client.get("/metrics")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    return _samples(r.text)


async def test_every_answer_carries_a_request_id(client: httpx.AsyncClient) -> None:
    generated = (await client.get("/healthz")).headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert (await client.get("/healthz")).headers["x-request-id"] != generated
    mine = await client.get("/v1/sessions", headers={"X-Request-ID": "agent-7.turn-12"})
    assert mine.headers["x-request-id"] == "agent-7.turn-12"
    # An id that would corrupt a log line is replaced, not echoed.
    for bad in ("has spaces in it", "x" * 200, 'quote"d'):
        r = await client.get("/v1/sessions", headers={"X-Request-ID": bad})
        assert re.fullmatch(r"[0-9a-f]{32}", r.headers["x-request-id"]), bad
    problem = await client.get("/v1/sessions/nope")
    assert problem.status_code == 404
    assert problem.headers["x-request-id"]


async def test_one_json_log_line_per_request(
    client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="compactd.http")
    session = await make_session(client)
    r = await client.get(f"/v1/sessions/{session['id']}", headers={"X-Request-ID": "trace-1"})
    assert r.status_code == 200
    lines = [
        json.loads(JsonFormatter().format(rec))
        for rec in caplog.records
        if rec.name == "compactd.http" and rec.getMessage() == "request"
    ]
    assert [line["status"] for line in lines] == [201, 200]
    last = lines[-1]
    assert last["request_id"] == "trace-1"
    assert last["route"] == "/v1/sessions/{session_id}"
    assert last["path"] == f"/v1/sessions/{session['id']}"
    assert last["method"] == "GET"
    assert last["tenant"] == "default"
    assert last["level"] == "info"
    assert last["duration_ms"] >= 0
    assert last["ts"].endswith("Z")


def test_the_json_formatter_keeps_extras_and_exceptions() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("compactd.test").makeRecord(
            "compactd.test",
            logging.ERROR,
            __file__,
            1,
            "job %s failed",
            ("j1",),
            __import__("sys").exc_info(),
            extra={"job_id": "j1", "attempts": 2},
        )
    line = json.loads(JsonFormatter().format(record))
    assert line["msg"] == "job j1 failed"
    assert line["job_id"] == "j1"
    assert line["attempts"] == 2
    assert "ValueError: boom" in line["exc"]
    assert "\n" not in JsonFormatter().format(record)


async def test_metrics_count_requests_by_route_and_status(client: httpx.AsyncClient) -> None:
    before = await _metrics(client)
    session = await make_session(client)
    await client.get(f"/v1/sessions/{session['id']}")
    await client.get("/v1/sessions/missing")
    after = await _metrics(client)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    created = {"method": "POST", "route": "/v1/sessions", "status": "201"}
    assert delta("compactd_http_requests_total", **created) == 1
    read = {"method": "GET", "route": "/v1/sessions/{session_id}"}
    assert delta("compactd_http_requests_total", **read, status="200") == 1
    assert delta("compactd_http_requests_total", **read, status="404") == 1
    assert delta("compactd_http_request_duration_seconds_count", **read) == 2
    assert _value(after, "compactd_http_request_duration_seconds_bucket", **read, le="+Inf") >= 2
    assert _value(after, "compactd_db_pool_size") == 5  # TEST_SETTINGS.db_pool_size
    assert ("compactd_db_pool_checked_out", ()) in after


async def test_metrics_show_compactions_and_pruning(app: Any, client: httpx.AsyncClient) -> None:
    before = await _metrics(client)
    session = await make_session(
        client,
        config={
            "compaction": {"auto": False, "keep_recent_tokens": 500},
            "prune": {"protect_tokens": 100, "minimum_tokens": 10, "protect_turns": 0},
        },
    )
    sid = session["id"]
    for i in range(3):
        await append_ok(
            client,
            sid,
            [
                # The user's words are short: a summary quotes them verbatim, so a
                # history of long requests and pruned outputs has nothing to gain.
                {"role": "user", "content": f"step {i}: read a.py and fix it."},
                {
                    "role": "assistant",
                    "content": "Reading the file to see what breaks. " * 40,
                    "tool_calls": [
                        {
                            "id": f"c{i}",
                            "type": "function",
                            "function": {"name": "bash", "arguments": '{"cmd": "cat a.py"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": f"c{i}", "content": "line of output\n" * 300},
            ],
        )
    pruned = await client.post(f"/v1/sessions/{sid}/prune", json={})
    assert pruned.status_code == 200, pruned.text
    saved = pruned.json()["tokens_saved"]
    assert saved > 0
    r = await client.post(f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = (await client.get(f"/v1/sessions/{sid}/compactions/{r.json()['id']}")).json()
    assert job["status"] == "succeeded"
    after = await _metrics(client)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("compactd_prunes_total", trigger="manual") == 1
    assert delta("compactd_pruned_tokens_total", trigger="manual") == saved
    assert delta("compactd_compaction_jobs_total", status="claimed", reason="manual") == 1
    assert delta("compactd_compaction_jobs_total", status="succeeded", reason="manual") == 1
    assert (
        delta("compactd_compaction_tokens_saved_total", reason="manual")
        == job["tokens_before"] - job["tokens_after"]
    )
    seconds = {"reason": "manual", "summarizer": "extractive"}
    assert delta("compactd_compaction_duration_seconds_count", **seconds) == 1


async def test_readyz_fails_while_migrations_are_behind(
    client: httpx.AsyncClient, db_url: str
) -> None:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        await conn.execute("UPDATE alembic_version SET version_num = '0003'")
        r = await client.get("/readyz")
        assert r.status_code == 503
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "migrations are behind: at 0003" in r.json()["detail"]
        assert r.headers["retry-after"]
        await conn.execute("UPDATE alembic_version SET version_num = $1", head_revision())
        assert (await client.get("/readyz")).status_code == 200
    finally:
        await conn.close()


async def test_metrics_count_upstream_calls_by_outcome(
    client: httpx.AsyncClient, upstream: Upstream
) -> None:
    before = await _metrics(client)
    config = UpstreamConfig(api="anthropic", base_url=upstream.url, timeout_seconds=5.0)
    upstream.script([Reply("A summary."), Status(529), Status(429, headers={"retry-after": "1"})])
    async with httpx.AsyncClient() as http:
        done = await complete(http, config, model="m", system="s", prompt="p")
        assert done.text == "A summary."
        for kind in ("server", "rate_limited"):
            with pytest.raises(UpstreamError) as failed:
                await complete(http, config, model="m", system="s", prompt="p")
            assert failed.value.kind == kind
    after = await _metrics(client)

    def delta(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    for outcome in ("ok", "server", "rate_limited"):
        assert delta("compactd_upstream_calls_total", api="anthropic", outcome=outcome) == 1
    assert delta("compactd_upstream_call_duration_seconds_count", api="anthropic") == 3


async def test_odd_methods_are_counted_as_other(client: httpx.AsyncClient) -> None:
    before = await _metrics(client)
    r = await client.request("PROPFIND", "/v1/sessions")
    assert r.status_code == 405
    after = await _metrics(client)
    labels = {"method": "other", "route": "/v1/sessions", "status": "405"}
    assert (
        _value(after, "compactd_http_requests_total", **labels)
        - _value(before, "compactd_http_requests_total", **labels)
        == 1
    )
    assert not any(dict(key[1]).get("method") == "PROPFIND" for key in after)


def test_observations_wait_for_the_transaction_and_vanish_with_it() -> None:
    seen: list[int] = []
    with metrics.after_commit():
        metrics.observe(lambda: seen.append(1))
        assert seen == []  # not while the transaction may still roll back
    assert seen == [1]

    def rolled_back() -> None:
        with metrics.after_commit():
            metrics.observe(lambda: seen.append(2))
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        rolled_back()
    assert seen == [1]
    with metrics.after_commit() as pending:
        metrics.observe(lambda: seen.append(3))
        pending.clear()  # an attempt that wrote nothing
        metrics.observe(lambda: seen.append(4))
    metrics.observe(lambda: seen.append(5))  # outside any transaction: at once
    assert seen == [1, 4, 5]


async def test_cancelling_a_queued_job_is_a_transition(client: httpx.AsyncClient) -> None:
    config = {"compaction": {"auto": False, "keep_recent_tokens": 200}}
    sid = (await make_session(client, config=config))["id"]
    long = [{"role": "user", "content": f"part {i}: " + "words " * 200} for i in range(6)]
    await append_ok(client, sid, long)
    before = await _metrics(client)
    job = (await client.post(f"/v1/sessions/{sid}/compactions", json={})).json()
    r = await client.post(f"/v1/sessions/{sid}/compactions/{job['id']}/cancel")
    assert r.json()["status"] == "cancelled"
    after = await _metrics(client)
    for status in ("queued", "cancelled"):
        labels = {"status": status, "reason": "manual"}
        name = "compactd_compaction_jobs_total"
        assert _value(after, name, **labels) - _value(before, name, **labels) == 1
