"""The remote summarization endpoint (seed 001, ``compaction.remote_endpoint``): a real
worker POSTs every summarizer request of a compaction to a real HTTP endpoint that the
test starts (tests/compactions/remote_server.py), with or without an upstream LLM,
and its faults end as the upstream's do: retried, or the extractive summary."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import httpx
import pytest

from app.compactions.worker import WorkerConfig
from app.prompts import load_prompt
from app.upstream.remote import MAX_RESPONSE_BYTES
from tests.compactions.helpers import compaction, drain, worker_config
from tests.compactions.remote_server import (  # noqa: F401 - the fixtures
    DEFAULT,
    Hang,
    Raw,
    Remote,
    Status,
    Summary,
    remote_fixture,
    remote_server_fixture,
)
from tests.compactions.test_gate import ERROR_LINE, MUST_NAME, session
from tests.compactions.worker_support import (
    SHORT,
    SUMMARY,
    assert_api_answers,
    compaction_count,
    request_compaction,
    seeded,
)
from tests.conftest import make_session
from tests.upstream_server import Reply, Upstream

HOST = "remote:127.0.0.1"
FALLBACK_SHORT = "Fix the failing date parser in src/dates.py. Never edit tests/."


def _config(
    upstream: Upstream | None = None, *, timeout: float = 5.0, max_attempts: int = 3
) -> WorkerConfig:
    config = worker_config(upstream, max_attempts=max_attempts)
    return dataclasses.replace(config, remote_timeout_seconds=timeout)


async def _seeded(
    client: httpx.AsyncClient, remote: Remote, url: str | None = None, **kw: Any
) -> str:
    return await seeded(
        client, 12, config={"compaction": {"remote_endpoint": url or remote.url}}, **kw
    )


async def test_the_remote_endpoint_writes_the_summary_without_an_upstream(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    sid = await _seeded(client, remote)
    remote.script([Summary(SUMMARY, extra={"model": "ignored", "usage": 12}), Summary(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 1
    assert done["error"] is None
    assert done["summary"].startswith(SUMMARY + "\n\n<read-files>\nsrc/mod0.py")
    assert done["short_summary"] == SHORT
    port = remote.url.split(":")[2].split("/")[0]
    assert done["upstream_model"] == f"{HOST}:{port}"
    assert done["upstream_usage"] is None
    # Not the note of a server without an upstream: the endpoint did the work.
    assert done["details"]["notes"] == []
    history, short = remote.requests
    assert history.headers["content-type"] == "application/json"
    assert set(history.json) == {"systemPrompt", "prompt"}
    assert history.json["systemPrompt"] == load_prompt("system")
    prompt = history.json["prompt"]
    assert prompt.startswith(
        "<conversation>\n[User]: Fix the failing date parser in src/dates.py. Never edit tests/."
    )
    assert '[Assistant tool calls]: bash(command="cat src/mod4.py")' in prompt
    assert "Keep going with part 2." not in prompt  # kept, not summarized
    assert load_prompt("structured") in prompt
    # The short summary is asked of the endpoint too.
    assert short.json["systemPrompt"] == load_prompt("system")
    assert f"<summary>\n{SUMMARY}" in short.json["prompt"]
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


async def test_the_remote_endpoint_wins_over_the_upstream(
    app: Any, client: httpx.AsyncClient, remote: Remote, upstream: Upstream
) -> None:
    sid = await _seeded(client, remote, cut="split")
    history_summary = "## Goal\nFix the date parser.\n\n## Progress\n- Read modules 0 to 4."
    prefix_summary = "## Original Request\nKeep going with part 1.\n\n## Early Progress\n- mod5-7"
    remote.script([Summary(history_summary), Summary(prefix_summary), Summary(SHORT)])
    upstream.script([Reply("## Goal\nthe upstream's summary, never asked for")])
    job = await request_compaction(client, sid, model="summarizer-mini")

    assert await drain(app, _config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["upstream_model"].startswith(HOST)
    assert done["details"]["split_turn"] is True
    assert upstream.requests == []
    history, prefix, short = remote.requests
    assert load_prompt("turn_prefix") in prefix.json["prompt"]
    assert prefix.json["prompt"].startswith("<conversation>\n[User]: Keep going with part 1.")
    assert "cat src/mod4.py" in history.json["prompt"]
    assert history_summary in short.json["prompt"]
    assert done["summary"].startswith(history_summary)


async def test_the_gates_retry_goes_to_the_remote_endpoint(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    # A failing test run: a summary that does not quote its error is asked for
    # again, with the error named, of the same endpoint.
    sid = await session(
        client, "remote-gate", failing=True, compaction={"remote_endpoint": remote.url}
    )
    remote.script([Summary(SUMMARY), Summary(f"{SUMMARY}\n- `{ERROR_LINE}`"), Summary(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    gate = done["details"]["gate"]
    assert gate["retried"] is True
    assert gate["missing_before"]["error"] == ERROR_LINE
    first, again, title = (r.json["prompt"] for r in remote.requests)
    assert again.startswith(first + "\n\n" + MUST_NAME)
    assert ERROR_LINE in again[len(first) :]
    assert load_prompt("short") in title
    assert done["summary"].startswith(f"{SUMMARY}\n- `{ERROR_LINE}`")


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (Status(500, {"error": "boom"}), "server"),
        (Status(503, "overloaded"), "server"),
        (Status(429, {"error": "slow down"}), "rate_limited"),
        (Status(408), "timeout"),
    ],
    ids=["500", "503", "429", "408"],
)
async def test_a_retryable_fault_is_retried_then_the_endpoint_answers(
    app: Any, client: httpx.AsyncClient, remote: Remote, fault: Status, kind: str
) -> None:
    sid = await _seeded(client, remote)
    remote.script([fault, Summary(SUMMARY), Summary(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None)) == 2  # the retry ran at once (no backoff here)

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 2
    assert done["error"] is None
    [note] = done["details"]["notes"]
    assert note.startswith(f"attempt 1: remote {kind}: {HOST}"), note
    assert f"HTTP {fault.code}" in note
    assert len(remote.requests) == 3
    # The retry sent the same request.
    assert remote.requests[0].json == remote.requests[1].json
    assert done["summary"].startswith(SUMMARY)


async def test_repeated_server_errors_fall_back_to_extractive(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    sid = await _seeded(client, remote)
    remote.script([Status(500, {"error": "boom"})] * 3 + [Summary(SUMMARY)])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None, max_attempts=3)) == 3

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer"] == "llm"
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 3
    assert len(remote.requests) == 3
    assert remote.pending == 1
    notes = done["details"]["notes"]
    assert [n.split(":")[0] for n in notes] == [
        "attempt 1",
        "attempt 2",
        "remote server (attempt 3)",
    ]
    assert notes[2].endswith("used extractive")
    # A fallback is on record as the job's error, with or without an upstream.
    assert done["error"] == "; ".join(notes)
    assert done["short_summary"] == FALLBACK_SHORT
    assert "Fix the failing date parser in src/dates.py" in done["summary"]
    assert SUMMARY not in done["summary"]
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


@pytest.mark.parametrize(
    ("fault", "says"),
    [
        (Raw(b"<html><body>502 Bad Gateway</body></html>"), "is not JSON"),
        (Raw(b'{"text": "a summary under another name"}'), 'has no string "summary"'),
        (Raw(b'{"summary": 42}'), 'has no string "summary"'),
        (Raw(b'["summary"]'), 'has no string "summary"'),
        (Status(400, {"error": "bad request"}), "HTTP 400"),
        (Status(401, "who are you"), "HTTP 401"),
        (Status(404), "HTTP 404"),
        (Status(302, headers={"location": "http://127.0.0.1:1/elsewhere"}), "redirects"),
    ],
    ids=["html", "no-summary", "summary-not-text", "not-an-object", "400", "401", "404", "302"],
)
async def test_a_non_retryable_fault_falls_back_at_once(
    app: Any, client: httpx.AsyncClient, remote: Remote, fault: Any, says: str
) -> None:
    sid = await _seeded(client, remote)
    remote.script([fault, Summary(SUMMARY), Summary(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None, max_attempts=3)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 1
    assert len(remote.requests) == 1
    [note] = done["details"]["notes"]
    assert note.startswith("remote "), note
    assert says in note, note
    assert note.endswith("used extractive")
    assert done["error"] == note
    assert done["upstream_model"] is None  # nothing came from it


async def test_an_answer_over_the_size_limit_is_refused_not_read_whole(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    sid = await _seeded(client, remote)
    remote.script([Summary("x" * (MAX_RESPONSE_BYTES + 10))])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 1
    assert f"larger than {MAX_RESPONSE_BYTES} bytes" in done["error"]
    assert "xxxxxxxx" not in done["summary"]


@pytest.mark.alone  # the answers must come within a 0.5 s deadline
async def test_a_hanging_endpoint_times_out_and_is_retried_then_falls_back(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    sid = await _seeded(client, remote)
    remote.script([Hang(3), Hang(3)])
    job = await request_compaction(client, sid)

    started = time.monotonic()
    assert await drain(app, _config(None, timeout=0.5, max_attempts=2)) == 2
    assert time.monotonic() - started < 2.5  # cut off at the deadline, not waited out

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 2
    first, last = done["details"]["notes"]
    assert first.startswith(f"attempt 1: remote timeout: {HOST}"), first
    assert "0.5 s" in first
    assert last.startswith("remote timeout (attempt 2): "), last
    assert len(remote.requests) == 2


async def test_an_endpoint_nobody_listens_on_is_a_connection_failure(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    from tests.upstream_server import _listening_socket

    sock = _listening_socket()  # bound, never listening: connections are refused
    port = sock.getsockname()[1]
    try:
        sid = await _seeded(client, remote, url=f"http://127.0.0.1:{port}/summarize")
        job = await request_compaction(client, sid)
        assert await drain(app, _config(None, max_attempts=2)) == 2
    finally:
        sock.close()

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 2
    first, last = done["details"]["notes"]
    assert first.startswith(f"attempt 1: remote connection: {HOST}:{port}"), first
    assert last.startswith("remote connection (attempt 2): "), last


async def test_a_key_in_the_endpoints_url_is_never_recorded(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    secret = "sk-remote-9f8e7d6c5b4a"
    url = f"{remote.url}?key={secret}"
    sid = await _seeded(client, remote, url=url)
    remote.script([Status(403, f"forbidden for {url} and key={secret}")])
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None)) == 1

    done = await compaction(client, sid, job["id"])
    assert remote.requests[0].query == f"key={secret}"  # sent as configured
    assert done["summarizer_used"] == "extractive"
    assert "HTTP 403" in done["error"]
    r = await client.get(f"/v1/sessions/{sid}/compactions/{job['id']}")
    assert secret not in r.text


async def test_extractive_on_request_never_calls_the_endpoint(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    sid = await _seeded(client, remote)
    job = await request_compaction(client, sid, summarizer="extractive")

    assert await drain(app, _config(None)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["details"]["notes"] == []
    assert remote.requests == []


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/summarize",
        "not a url",
        "/summarize",
        "example.com/summarize",
        "http://",
        "https://example.com/" + "a" * 2_100,
        "",
    ],
    ids=["ftp", "words", "relative", "no-scheme", "no-host", "too-long", "empty"],
)
async def test_the_endpoint_must_be_an_absolute_http_url(
    client: httpx.AsyncClient, url: str
) -> None:
    config = {"compaction": {"remote_endpoint": url}}
    r = await client.post("/v1/sessions", json={"model": "gpt-4o", "config": config})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "remote_endpoint" in r.text
    s = await make_session(client)
    r = await client.patch(f"/v1/sessions/{s['id']}", json={"config": config})
    assert r.status_code == 422, r.text


async def test_the_endpoint_is_set_and_unset_by_config(client: httpx.AsyncClient) -> None:
    s = await make_session(client)
    assert s["config"]["compaction"]["remote_endpoint"] is None
    url = "https://summaries.example.com:8443/v1/summarize?team=7"
    r = await client.patch(
        f"/v1/sessions/{s['id']}", json={"config": {"compaction": {"remote_endpoint": url}}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["config"]["compaction"]["remote_endpoint"] == url
    r = await client.patch(
        f"/v1/sessions/{s['id']}", json={"config": {"compaction": {"remote_endpoint": None}}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["config"]["compaction"]["remote_endpoint"] is None


async def test_the_default_answer_is_used_when_the_script_is_spent(
    app: Any, client: httpx.AsyncClient, remote: Remote
) -> None:
    # The endpoint's default summary never quotes the error: the gate asks once
    # more, then completes the summary itself; every request reached the endpoint.
    sid = await session(
        client, "remote-default", failing=True, compaction={"remote_endpoint": remote.url}
    )
    job = await request_compaction(client, sid)

    assert await drain(app, _config(None)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["summary"].startswith(DEFAULT)
    assert ERROR_LINE in done["summary"].split("<continuity-anchors>")[1]
    assert len(remote.requests) == 3  # the summary, the gate's retry, the title
