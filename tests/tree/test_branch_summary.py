"""Branch summaries (seed 001) through the real worker: a navigation that asks for
one waits (202) until the worker has summarized the abandoned branch, then the leaf
is the target with the summary after it; the model is a real scripted upstream,
and when it fails the summary falls back to the extractive one, as compaction does;
a navigation is called off when the session moves on, or when its job is cancelled."""

from __future__ import annotations

import itertools
import json
from typing import Any

import httpx
import pytest

from app.engine.compaction.branch_summary import PREAMBLE
from tests.compactions.helpers import drain, worker_config
from tests.conftest import make_session
from tests.helpers import append_ok
from tests.upstream_server import Reply, Status, Upstream

MANUAL = {"compaction": {"auto": False}, "prune": {"auto": False}}


def call(call_id: str, command: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "bash", "arguments": json.dumps({"command": command})},
    }


async def seeded(client: httpx.AsyncClient, sid: str, **config: Any) -> None:
    """A task, then a branch that edits a file and fails a test."""
    await make_session(client, id=sid, config={**MANUAL, **config})
    await append_ok(
        client,
        sid,
        [
            {"role": "user", "content": "Fix the date parser in src/dates.py."},
            {"role": "assistant", "content": "I will look first."},
            {"role": "user", "content": "Try the regex approach."},
            {
                "role": "assistant",
                "content": "Editing.",
                "tool_calls": [call("c1", "sed -i s/a/b/ src/dates.py")],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {
                "role": "assistant",
                "content": "Testing.",
                "tool_calls": [call("c2", "pytest tests/test_dates.py")],
            },
            {
                "role": "tool",
                "tool_call_id": "c2",
                "content": "FAILED tests/test_dates.py::test_week - ValueError: week 53",
            },
            {"role": "assistant", "content": "The regex approach fails on week 53."},
        ],
    )


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def navigate(client: httpx.AsyncClient, sid: str, **body: Any) -> httpx.Response:
    return await client.post(f"/v1/sessions/{sid}/navigate", json=body)


async def test_the_abandoned_branch_is_summarized_after_the_target(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    await seeded(client, "b")
    before = (await client.get("/v1/sessions/b")).json()
    r = await navigate(client, "b", seq=2, summarize=True)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "pending"
    assert body["branch_summary"]["abandoned_from_seq"] == 3
    assert body["branch_summary"]["abandoned_to_seq"] == 8
    # Nothing moved yet.
    assert body["session"]["entry_count"] == before["entry_count"] == 8
    upstream.script([Reply("Tried a regex in src/dates.py; week 53 failed."), Reply("Regex try")])
    assert await drain(app, worker_config(upstream)) == 1
    session = (await client.get("/v1/sessions/b")).json()
    assert session["entry_count"] == 3  # the target, then the summary
    messages = (await context(client, "b"))["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    summary = messages[-1]["content"]
    assert summary.startswith(PREAMBLE)
    assert "week 53" in summary
    # The summarizer read the abandoned branch, with the branch instructions.
    prompt = str(upstream.requests[0].body)
    assert "regex approach" in prompt
    assert "earlier point" in prompt
    job = (await client.get(f"/v1/sessions/b/compactions/{body['branch_summary']['id']}")).json()
    assert job["status"] == "succeeded"
    assert job["reason"] == "branch_summary"
    assert job["details"]["abandoned_entries"] == 6, job["details"]
    assert "src/dates.py" in job["details"]["modified_files"]
    # The abandoned branch stays in the tree, off the path.
    tree = (await client.get("/v1/sessions/b/tree")).json()
    assert len(tree["entries"]) == 9
    assert sum(e["on_path"] for e in tree["entries"]) == 3
    # Valid in both formats: an Anthropic context alternates.
    anthropic = (await context(client, "b", "anthropic"))["messages"]
    roles = [m["role"] for m in anthropic]
    assert all(a != b for a, b in itertools.pairwise(roles))


async def test_an_upstream_failure_falls_back_to_the_extractive_summary(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    await seeded(client, "f")
    r = await navigate(client, "f", seq=2, summarize=True, instructions="Focus on week 53.")
    assert r.status_code == 202, r.text
    upstream.script([Status(500)] * 10)
    config = worker_config(upstream, max_attempts=1)
    assert await drain(app, config) >= 1
    job = (
        await client.get(f"/v1/sessions/f/compactions/{r.json()['branch_summary']['id']}")
    ).json()
    assert job["status"] == "succeeded", job
    assert job["summarizer_used"] == "extractive"
    messages = (await context(client, "f"))["messages"]
    assert messages[-1]["content"].startswith(PREAMBLE)
    assert "src/dates.py" in messages[-1]["content"]


async def test_an_append_meanwhile_calls_the_navigation_off(
    app: Any, client: httpx.AsyncClient
) -> None:
    await seeded(client, "m")
    r = await navigate(client, "m", seq=2, summarize=True)
    assert r.status_code == 202
    await append_ok(client, "m", [{"role": "user", "content": "One more thing."}])
    assert await drain(app) == 1
    job = (
        await client.get(f"/v1/sessions/m/compactions/{r.json()['branch_summary']['id']}")
    ).json()
    assert job["status"] == "cancelled"
    assert "moved on" in job["error"]
    session = (await client.get("/v1/sessions/m")).json()
    assert session["entry_count"] == 9
    assert session["active_compaction_id"] is None


async def test_a_cancelled_navigation_leaves_the_session_where_it_was(
    app: Any, client: httpx.AsyncClient
) -> None:
    await seeded(client, "c")
    r = await navigate(client, "c", seq=2, summarize=True)
    job_id = r.json()["branch_summary"]["id"]
    cancelled = await client.post(f"/v1/sessions/c/compactions/{job_id}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert await drain(app) == 0
    session = (await client.get("/v1/sessions/c")).json()
    assert session["entry_count"] == 8
    assert session["active_compaction_id"] is None


async def test_branch_summary_enabled_is_the_default_and_summarize_false_wins(
    client: httpx.AsyncClient,
) -> None:
    await seeded(client, "d", branch_summary={"enabled": True})
    r = await navigate(client, "d", seq=6, summarize=False)
    assert r.status_code == 200
    assert r.json()["status"] == "moved"
    r = await navigate(client, "d", seq=2)
    assert r.status_code == 202
    assert r.json()["status"] == "pending"


@pytest.mark.parametrize("seq", [4, 6])
async def test_no_summary_after_an_entry_that_waits_on_tool_results(
    client: httpx.AsyncClient, seq: int
) -> None:
    await seeded(client, f"w{seq}")
    r = await navigate(client, f"w{seq}", seq=seq, summarize=True)
    assert r.status_code == 409, r.text
    assert "wait on their results" in r.json()["detail"]
    session = (await client.get(f"/v1/sessions/w{seq}")).json()
    assert session["entry_count"] == 8


async def test_file_operations_carry_on_from_an_earlier_branch_summary(
    app: Any, client: httpx.AsyncClient
) -> None:
    await seeded(client, "k")  # its branch edits src/dates.py
    r = await navigate(client, "k", seq=2, summarize=True)
    assert r.status_code == 202
    assert await drain(app) == 1  # extractive: no upstream configured
    # On the new path (the target, then the summary), a branch that edits another file.
    await append_ok(
        client,
        "k",
        [
            {"role": "user", "content": "Try a lookup table instead."},
            {
                "role": "assistant",
                "content": "Editing.",
                "tool_calls": [call("c9", "sed -i s/x/y/ src/weeks.py")],
            },
            {"role": "tool", "tool_call_id": "c9", "content": "ok"},
        ],
    )
    r = await navigate(client, "k", seq=2, summarize=True)
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = (
        await client.get(f"/v1/sessions/k/compactions/{r.json()['branch_summary']['id']}")
    ).json()
    assert job["status"] == "succeeded"
    modified = job["details"]["modified_files"]
    assert "src/weeks.py" in modified
    assert "src/dates.py" in modified  # from the first branch summary's details
