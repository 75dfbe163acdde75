"""The continuity gate through the real worker, a real scripted upstream and a real
Postgres (issue 14): a model's summary that misses the task, a modified file or the
latest unresolved error is asked for again once, with what it misses named in the
prompt, then completed from the anchors; a summary longer than what it replaces is
not committed; the job's details say what the gate found."""

from __future__ import annotations

import json
from typing import Any

import httpx

from app.engine.compaction.continuity import BLOCK_CLOSE, BLOCK_OPEN, ERROR_LABEL, TERMS_LABEL
from app.prompts import load_prompt
from tests.compactions.helpers import compaction, drain, worker_config
from tests.compactions.worker_support import SHORT, SUMMARY, keep_from, prompt_of
from tests.conftest import make_session
from tests.helpers import append_ok, get_session
from tests.upstream_server import Reply, Status, Upstream

FIRST = "Fix the failing date parser in src/dates.py. Never edit tests/."
ERROR_LINE = "FAILED tests/test_dates.py::test_iso_week - ValueError: week 53 is out of range"
PYTEST = "python -m pytest tests/test_dates.py"
MANUAL = {"compaction": {"auto": False}, "prune": {"auto": False}}
# The first words of must_name.md: what a retry prompt adds.
MUST_NAME = load_prompt("must_name").split("{items}")[0].strip()


def call(call_id: str, command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": arguments}}


def step(call_id: str, command: str, output: str, text: str = "Next step.") -> list[dict[str, Any]]:
    return [
        {"role": "assistant", "content": text, "tool_calls": [call(call_id, command)]},
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]


async def session(
    client: httpx.AsyncClient,
    sid: str,
    *,
    first: str = FIRST,
    edited: list[str] | None = None,
    failing: bool = False,
    reads: int = 6,
    compaction: dict[str, Any] | None = None,
) -> str:
    """A session: the request, ``reads`` files read, ``edited`` files changed with sed,
    the test run failing when ``failing``, then a user turn the compaction keeps."""
    config = {**MANUAL, "compaction": {**MANUAL["compaction"], **(compaction or {})}}
    await make_session(client, id=sid, config=config)
    await append_ok(
        client,
        sid,
        [
            {"role": "system", "content": "You are a careful coding agent."},
            {"role": "user", "content": first},
        ],
    )
    for k in range(reads):
        body = "\n".join(f"line {n}: value = {n * k}" for n in range(60))
        await append_ok(client, sid, step(f"r{k}", f"cat src/mod{k}.py", body))
    for k, path in enumerate(edited or []):
        await append_ok(
            client, sid, step(f"e{k}", f"sed -i 's/old/new/' {path}", "<returncode>0</returncode>")
        )
    if failing:
        output = f"<returncode>1</returncode>\n==== 1 failed ====\n{ERROR_LINE}"
        await append_ok(client, sid, step("t1", PYTEST, output, "Running the tests."))
    await append_ok(client, sid, [{"role": "user", "content": "Keep going."}])
    await append_ok(client, sid, [{"role": "assistant", "content": "On it."}])
    await keep_from(client, sid, "user")
    return sid


async def compact(
    app: Any, client: httpx.AsyncClient, sid: str, upstream: Upstream
) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app, worker_config(upstream)) == 1
    return await compaction(client, sid, r.json()["id"])


def block(summary: str) -> str:
    assert BLOCK_OPEN in summary, summary[-800:]
    return summary.split(BLOCK_OPEN, 1)[1].split(BLOCK_CLOSE, 1)[0]


async def summary_in_context(client: httpx.AsyncClient, sid: str) -> str:
    r = await client.get(f"/v1/sessions/{sid}/context")
    assert r.status_code == 200, r.text
    texts = [m["content"] for m in r.json()["messages"] if isinstance(m["content"], str)]
    found = [t for t in texts if BLOCK_OPEN in t]
    assert len(found) == 1, texts
    return found[0]


def assert_retried_once_naming(upstream: Upstream, items: list[str]) -> None:
    """Three calls: the summary, the summary asked for again with ``items`` named
    (the same prompt, the must-name section after it), the title."""
    assert len(upstream.requests) == 3
    first, retry, title = (prompt_of(r) for r in upstream.requests)
    assert MUST_NAME not in first
    assert retry.startswith(first + "\n\n" + MUST_NAME)
    asked = retry[len(first) :]
    for item in items:
        assert f"\n- {item}" in asked, (item, asked)
    assert load_prompt("short") in title


async def test_a_summary_missing_the_goal_is_asked_again_then_completed(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """A first request far over keep_requests_tokens is quoted clipped: the terms of
    its last lines are only in what the model writes, and this one drops them."""
    steps = [f"Step {i}: update `handler_{i}` in src/handlers/h{i}.py." for i in range(24)]
    first = "Refactor the request handlers, one by one:\n" + "\n".join(steps)
    sid = await session(client, "goal", first=first, compaction={"keep_requests_tokens": 200})
    # The second answer names one term more, not all: the rest is completed.
    upstream.script([Reply(SUMMARY), Reply(SUMMARY + "\n- Then `handler_23`."), Reply(SHORT)])
    done = await compact(app, client, sid, upstream)
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "llm"
    gate = done["details"]["gate"]
    assert done["details"]["user_requests"]["first"]["clipped"] is True
    lost = gate["missing_before"]["terms"]
    assert "handler_23" in lost
    assert "src/handlers/h23.py" in lost
    assert "handler_0" not in lost  # the clipped quote keeps the first lines
    assert gate["missing_before"]["files"] == []
    assert gate["missing_before"]["error"] is None
    assert_retried_once_naming(upstream, [f"`{t}`" for t in lost])
    assert gate["retried"] is True
    assert gate["retry_missing"]["terms"] == [t for t in lost if t != "handler_23"]
    # The retried summary, completed with what it still missed.
    assert done["summary"].startswith(SUMMARY + "\n- Then `handler_23`.")
    assert gate["completed"]["terms"] == gate["retry_missing"]["terms"]
    assert gate["missing_after"] == {"terms": [], "files": [], "error": None}
    assert block(done["summary"]).count(TERMS_LABEL) == 1
    context = await summary_in_context(client, sid)
    for term in lost:
        assert term in context
    assert done["details"]["task_terms"][:3] == ["handler_0", "src/handlers/h0.py", "handler_1"]


async def test_a_summary_missing_a_modified_file_is_asked_again_then_completed(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    """More modified files than the summary's file list holds: the ones past its
    hard cap are named in the retry, then in the block."""
    edited = [
        f"src/package/feature/module_{i:02d}_of_the_implementation_layer.py" for i in range(30)
    ]
    sid = await session(client, "files", edited=edited, reads=0)
    upstream.script([Reply(SUMMARY), Reply(SUMMARY), Reply(SHORT)])
    done = await compact(app, client, sid, upstream)
    assert done["status"] == "succeeded", done
    assert done["details"]["modified_files"] == edited
    gate = done["details"]["gate"]
    listed = done["summary"].split("<modified-files>\n", 1)[1].split("\n</modified-files>")[0]
    shown = listed.splitlines()
    assert shown[-1].startswith("(and ")
    past_the_cap = edited[len(shown) - 1 :]
    assert past_the_cap
    assert gate["missing_before"] == {"terms": [], "files": past_the_cap, "error": None}
    assert_retried_once_naming(upstream, past_the_cap)
    assert gate["retry_missing"]["files"] == past_the_cap
    assert gate["completed"]["files"] == past_the_cap
    assert gate["missing_after"]["files"] == []
    named = block(done["summary"])
    for path in past_the_cap:
        assert f"\n{path}\n" in named
    context = await summary_in_context(client, sid)
    assert all(path in context for path in edited)


async def test_a_summary_missing_the_error_is_asked_again_then_completed(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await session(client, "error", failing=True)
    upstream.script([Reply(SUMMARY), Reply(SUMMARY + "\n- The tests fail."), Reply(SHORT)])
    done = await compact(app, client, sid, upstream)
    assert done["status"] == "succeeded", done
    gate = done["details"]["gate"]
    assert gate["missing_before"] == {"terms": [], "files": [], "error": ERROR_LINE}
    shown = f"{ERROR_LINE} — after `{PYTEST}`"
    assert_retried_once_naming(upstream, [shown])
    assert gate["retry_missing"]["error"] == ERROR_LINE
    assert gate["completed"]["error"] == ERROR_LINE
    assert gate["missing_after"]["error"] is None
    assert f"\n{ERROR_LABEL} {shown}\n" in block(done["summary"])
    assert done["summary"].startswith(SUMMARY + "\n- The tests fail.")
    assert done["details"]["unresolved_error"] == {"line": ERROR_LINE, "command": PYTEST}
    assert ERROR_LINE in await summary_in_context(client, sid)


async def test_a_summary_that_names_everything_is_not_asked_again(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await session(client, "named", failing=True)
    whole = f"{SUMMARY}\n- Blocked: `{ERROR_LINE}`"
    upstream.script([Reply(whole), Reply(SHORT)])
    done = await compact(app, client, sid, upstream)
    assert done["status"] == "succeeded", done
    assert len(upstream.requests) == 2
    gate = done["details"]["gate"]
    assert gate["retried"] is False
    assert gate["missing_before"] == gate["completed"] == gate["missing_after"]
    assert gate["missing_after"] == {"terms": [], "files": [], "error": None}
    assert gate["checked"] == {"terms": 1, "files": 0, "error": ERROR_LINE}
    assert BLOCK_OPEN not in done["summary"]


async def test_a_failed_retry_is_recorded_and_the_summary_completed(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await session(client, "retry-fails", failing=True)
    upstream.script([Reply(SUMMARY), Status(400, {"error": {"message": "bad"}}), Reply(SHORT)])
    done = await compact(app, client, sid, upstream)
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 1
    assert done["error"] is None
    gate = done["details"]["gate"]
    assert gate["retried"] is True
    assert "400" in gate["retry_error"]
    assert gate["retry_missing"] is None
    assert gate["completed"]["error"] == ERROR_LINE
    assert done["summary"].startswith(SUMMARY)
    assert ERROR_LINE in block(done["summary"])


async def test_a_summary_longer_than_what_it_replaces_is_not_committed(
    app: Any, client: httpx.AsyncClient, upstream: Upstream
) -> None:
    sid = await session(client, "long", failing=True)
    before = await get_session(client, sid)
    padding = "\n".join(f"- Detail {i}: the module was read with care." for i in range(3_000))
    huge = f"{SUMMARY}\n{padding}"
    upstream.script([Reply(huge), Reply(huge), Reply(SHORT)])
    done = await compact(app, client, sid, upstream)
    assert done["status"] == "cancelled", done
    assert "not committed" in done["error"]
    assert done["summary"] is None
    # What the gate found is recorded all the same.
    gate = done["details"]["gate"]
    assert gate["missing_before"]["error"] == ERROR_LINE
    assert gate["retried"] is True
    assert gate["completed"]["error"] == ERROR_LINE
    assert gate["trimmed"] == {"terms": [], "files": [], "error": None}
    assert done["details"]["summarized_tokens"] > 0
    after = await get_session(client, sid)
    for key in ("entry_count", "context_tokens", "compaction_count", "version"):
        assert after[key] == before[key], key
