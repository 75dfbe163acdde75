"""Model candidates (seed 001: "Auto compaction can try multiple model candidates"):
``compaction.models`` are asked, in order, after the compaction's own model when it
fails in a way that would end in the extractive summary. A real worker, a real
scripted upstream (which answers as the model it was asked for) and Postgres."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.compactions.helpers import compaction, drain, worker_config
from tests.compactions.worker_support import (
    SHORT,
    SUMMARY,
    assert_api_answers,
    compaction_count,
    prompt_of,
    request_compaction,
    seeded,
)
from tests.conftest import make_session
from tests.upstream_server import Close, Reply, Status, Upstream

NOT_FOUND = {"error": {"message": "The model `model-a` does not exist", "code": "model_not_found"}}


def _models(upstream: Upstream) -> list[str]:
    """The model each request asked for, in order."""
    return [r.json["model"] for r in upstream.requests]


async def _seeded(client: httpx.AsyncClient, **compaction_config: Any) -> str:
    return await seeded(client, 12, config={"compaction": compaction_config})


async def test_the_next_candidate_writes_the_summary_when_the_first_is_refused(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await _seeded(client, model="model-a", models=["model-b", "model-c"])
    upstream.script([Status(404, body=NOT_FOUND), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, max_attempts=3)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 1  # no retry: the next model, in the same attempt
    assert done["upstream_model"] == "model-b"
    assert done["summary"].startswith(SUMMARY)
    assert done["short_summary"] == SHORT
    assert done["error"] is None
    # The title is asked of the model that wrote the summary; model-c never.
    assert _models(upstream) == ["model-a", "model-b", "model-b"]
    # Both models were sent the same prompt.
    assert prompt_of(upstream.requests[0]) == prompt_of(upstream.requests[1])
    refused, by = done["details"]["notes"]
    assert refused.startswith("model model-a: upstream client: "), refused
    assert "HTTP 404" in refused
    assert "does not exist" in refused
    assert refused.endswith("; trying model model-b")
    assert by == "summary by model model-b (candidate 2 of 3)"
    assert await compaction_count(client, sid) == 1
    await assert_api_answers(client, sid)


async def test_every_candidate_failing_ends_in_the_extractive_summary(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await _seeded(client, model="model-a", models=["model-b", "model-c"])
    upstream.script(
        [
            Status(404, body=NOT_FOUND),
            Status(400, body={"error": {"message": "unsupported parameter: max_tokens"}}),
            Status(401),
            Reply(SUMMARY),
        ]
    )
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, max_attempts=3)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 1
    assert _models(upstream) == ["model-a", "model-b", "model-c"]
    assert upstream.pending == 1
    a, b, c = done["details"]["notes"]
    assert a.startswith("model model-a: upstream client: "), a
    assert "HTTP 404" in a
    assert a.endswith("trying model model-b")
    assert b.startswith("model model-b: upstream client: "), b
    assert "max_tokens" in b
    assert b.endswith("trying model model-c")
    assert c.startswith("model model-c: upstream client (attempt 1): "), c
    assert "HTTP 401" in c
    assert c.endswith("used extractive")
    assert done["error"] == "; ".join([a, b, c])
    assert SUMMARY not in done["summary"]
    assert "Fix the failing date parser in src/dates.py" in done["summary"]


async def test_a_retryable_failure_retries_the_job_and_the_last_attempt_moves_on(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await _seeded(client, model="model-a", models=["model-b"])
    # Attempt 1: model-a is overloaded, and attempts remain: the job is retried
    # (model-b is not asked). Attempt 2, the last: model-a overloaded again, so
    # model-b is asked at once.
    upstream.script([Status(503), Status(503), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, max_attempts=2)) == 2

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    assert done["attempts"] == 2
    assert done["upstream_model"] == "model-b"
    assert _models(upstream) == ["model-a", "model-a", "model-b", "model-b"]
    retried, overloaded, by = done["details"]["notes"]
    assert retried.startswith("attempt 1: model model-a: upstream server: "), retried
    assert overloaded.startswith("model model-a: upstream server: "), overloaded
    assert overloaded.endswith("; trying model model-b")
    assert by == "summary by model model-b (candidate 2 of 2)"


async def test_a_retry_after_a_refused_model_names_both(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await _seeded(client, model="model-a", models=["model-b"])
    # model-a is refused, model-b drops the connection with attempts left: the job
    # is retried, from model-a again, and the retry's reason names both.
    upstream.script(
        [Status(404, body=NOT_FOUND), Close(), Status(404, body=NOT_FOUND), Reply(SUMMARY)]
    )
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream, max_attempts=2)) == 2

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    assert done["upstream_model"] == "model-b"
    assert _models(upstream)[:4] == ["model-a", "model-b", "model-a", "model-b"]
    retried = done["details"]["notes"][0]
    assert retried.startswith("attempt 1: model model-a: upstream client: "), retried
    assert "; model model-b: upstream connection: " in retried


async def test_the_requests_model_comes_first_and_names_are_tried_once(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await _seeded(client, model="model-a", models=["model-b", "model-a", "model-c"])
    upstream.script([Status(404), Status(404), Status(404), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, sid, model="model-b")

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    assert done["status"] == "succeeded", done
    # The request's model replaces compaction.model as the first choice; each
    # candidate is asked once, in order.
    assert _models(upstream)[:3] == ["model-b", "model-a", "model-c"]
    assert done["summarizer_used"] == "extractive"
    assert len(upstream.requests) == 3


async def test_without_a_configured_model_the_servers_then_the_sessions_come_first(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    by_server = await _seeded(client, models=["model-b"])
    upstream.script([Status(404), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, by_server)
    assert await drain(app, worker_config(upstream, model="server-model")) == 1
    assert (await compaction(client, by_server, job["id"]))["upstream_model"] == "model-b"
    assert _models(upstream) == ["server-model", "model-b", "model-b"]

    by_session = await _seeded(client, models=["model-b"])
    upstream.script([Status(404), Reply(SUMMARY), Reply(SHORT)])
    job = await request_compaction(client, by_session)
    assert await drain(app, worker_config(upstream)) == 1
    assert _models(upstream)[3:] == ["gpt-4o", "model-b", "model-b"]


async def test_a_single_model_reads_as_before(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await _seeded(client, model="model-a")
    upstream.script([Status(404, body=NOT_FOUND)])
    job = await request_compaction(client, sid)

    assert await drain(app, worker_config(upstream)) == 1

    done = await compaction(client, sid, job["id"])
    [note] = done["details"]["notes"]
    assert note.startswith("upstream client (attempt 1): "), note
    assert "model model-a" not in note


@pytest.mark.parametrize(
    "models",
    [["m1", "m2", "m3", "m4", "m5", "m6"], [""], ["x" * 201], "model-b", [3]],
    ids=["six", "empty-name", "long-name", "not-a-list", "not-a-string"],
)
async def test_models_is_a_short_list_of_names(client: httpx.AsyncClient, models: Any) -> None:
    config = {"compaction": {"models": models}}
    r = await client.post("/v1/sessions", json={"model": "gpt-4o", "config": config})
    assert r.status_code == 422, r.text
    assert "models" in r.text


async def test_models_are_set_by_config(client: httpx.AsyncClient) -> None:
    s = await make_session(client)
    assert s["config"]["compaction"]["models"] == []
    five = ["m1", "m2", "m3", "m4", "m5"]
    r = await client.patch(
        f"/v1/sessions/{s['id']}", json={"config": {"compaction": {"models": five}}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["config"]["compaction"]["models"] == five
