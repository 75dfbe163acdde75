"""The real coding agents, unmodified, through a real compactd to a scripted model.

Claude Code, Codex and OpenCode, installed from npm at pinned versions
(tests/agents/install.py), each run as a user runs it: its base URL is compactd's
proxy, one header names the session. The model is the scripted upstream on loopback
(tests/agents/script.py: it calls the agent's shell tool step by step, then answers),
and nothing else is reachable (tests/agents/agents.py). Each test checks what the user
sees (exit status, output, the file the agent wrote), what compactd stored (the
conversation exactly, side conversations such as title requests in child sessions),
and what the upstream got (every tool call paired with its result, every request
within the session's budget).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from tests.agents import agents, checks, script
from tests.agents.conftest import require
from tests.agents.install import Agent
from tests.proxy.support import api, proxy, stored_history
from tests.upstream_server import RecordedRequest, Upstream, prompt_tokens

pytestmark = [pytest.mark.slow, pytest.mark.agents]

NAMES = ["claude", "codex", "opencode"]
SETTLE_SECONDS = 5.0
#: Where each agent's calls reach the upstream, and with what query string.
WIRE_PATH = {
    "claude": ("/v1/messages", "beta=true"),
    "codex": ("/v1/responses", ""),
    "opencode": ("/v1/chat/completions", ""),
}


def proxy_url(name: str, base: str) -> str:
    """The base URL a user gives the agent: compactd's proxy for the agent's API."""
    return f"{base}/proxy/anthropic" if name == "claude" else f"{base}/proxy/openai/v1"


async def run_agent(
    agent: Agent,
    base: str,
    session: str,
    task: script.Task,
    folder: Path,
    dead_port: int,
    *,
    resume: bool = False,
) -> agents.Run:
    home, work = folder / "home", folder / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    return await asyncio.to_thread(
        agents.run,
        agent,
        base_url=proxy_url(agent.name, base),
        session=session,
        task=task.prompt(),
        home=home,
        workdir=work,
        dead_port=dead_port,
        resume=resume,
    )


def main_requests(requests: list[RecordedRequest]) -> list[RecordedRequest]:
    """The requests of the agent's own conversation: those that offer its tools."""
    return [r for r in requests if isinstance(r.json, dict) and r.json.get("tools")]


def side_requests(requests: list[RecordedRequest]) -> list[RecordedRequest]:
    """Its side calls (a title request): no tools offered."""
    return [r for r in requests if isinstance(r.json, dict) and not r.json.get("tools")]


async def stored(http: httpx.AsyncClient, sid: str, name: str) -> list[checks.Turn]:
    history = await stored_history(http, sid, checks.STORED_FORMAT[name])
    return checks.transcript(checks.STORED_FORMAT[name], history)


async def settled_transcript(
    http: httpx.AsyncClient, sid: str, name: str, last: checks.Turn
) -> list[checks.Turn]:
    """The session's stored conversation once its last turn is ``last`` (a reply is
    stored as it reaches the agent, which may have exited by then), or as it is after
    the wait."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        turns = await stored(http, sid, name)
        if (turns and turns[-1] == last) or time.monotonic() > deadline:
            return turns
        await asyncio.sleep(0.05)


async def children(http: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await http.get("/v1/sessions", params={"parent_id": sid})
    assert r.status_code == 200, r.text
    found: list[dict[str, Any]] = r.json()["sessions"]
    return found


async def where_stored(http: httpx.AsyncClient, sid: str, name: str) -> str:
    """What the session and its children hold, first and last turn each: for a failure."""
    lines = []
    for session in [sid, *[kid["id"] for kid in await children(http, sid)]]:
        turns = await stored(http, session, name)
        ends = (turns[0][:2], turns[-1][:2]) if turns else ()
        lines.append(f"{session}: {len(turns)} turns {ends}")
    return "; ".join(lines)


def assert_agent_done(run: agents.Run, task: script.Task, work: Path) -> None:
    assert run.returncode == 0, run.describe()
    assert task.final() in run.stdout, run.describe()
    assert (work / f"{task.name}.txt").read_text() == task.file_text(), run.describe()


async def assert_side_conversations(
    http: httpx.AsyncClient, sid: str, name: str, side: list[RecordedRequest]
) -> None:
    """Each side call the agent made (a title request) went to a child session of the
    named one, stored with the model's answer; the session itself holds none of it."""
    if not side:
        return
    kids = await children(http, sid)
    assert kids, f"{len(side)} side requests, no child session of {sid}"
    for kid in kids:
        assert kid["parent_id"] == sid
        turns = await settled_transcript(http, kid["id"], name, ("assistant", script.TITLE))
        assert turns[-1] == ("assistant", script.TITLE), turns


@pytest.mark.parametrize("name", NAMES)
async def test_short_task(
    name: str,
    db_url: str,
    settings: Settings,
    upstream: Upstream,
    dead_port: int,
    tmp_path: Path,
) -> None:
    """The agent runs two shell commands and answers; compactd stores the conversation
    exactly as the agent sent and received it."""
    agent = require(name)
    upstream.respond = script.respond
    wire = checks.API[name]
    task = script.Task("short", 2)
    sid = f"agent-{name}-short"
    with proxy(settings, db_url, upstream) as base:
        run = await run_agent(agent, base, sid, task, tmp_path, dead_port)
        assert_agent_done(run, task, tmp_path / "work")
        requests = upstream.requests
        for request in requests:
            checks.assert_valid(request, wire)
        # The agent's endpoint and query string reach the upstream as it sent them.
        assert {(r.path, r.query) for r in requests} == {WIRE_PATH[name]}
        main = main_requests(requests)
        assert len(main) == task.steps + 1, [r.path for r in requests]
        expected = checks.transcript(wire, checks.request_messages(wire, main[-1]))
        expected.append(("assistant", task.final()))
        async with api(base) as http:
            turns = await settled_transcript(http, sid, name, expected[-1])
            assert turns == expected, await where_stored(http, sid, name)
            await assert_side_conversations(http, sid, name, side_requests(requests))


# The long task: 14 steps of some 1,000 tokens of tool output each, in a window of
# 24,000 (22,000 usable) where the agent's own prompt and tools take 7,000 to 11,000.
LONG = script.Task("long", 14, filler=400)
WINDOW = {"context_window": 24_000, "max_output_tokens": 2_000}
LONG_CONFIG = {
    "compaction": {"reserve_tokens": 4_000, "keep_recent_tokens": 3_000},
    # Pruning alone would keep this task in the window: off, so that it takes a compaction.
    "prune": {"enabled": False},
}
MODEL = {"claude": "claude-sonnet-4-5", "codex": agents.CODEX_MODEL, "opencode": "gpt-4o"}


@pytest.mark.parametrize("name", NAMES)
async def test_long_task_is_compacted_and_finishes(
    name: str,
    db_url: str,
    settings: Settings,
    upstream: Upstream,
    dead_port: int,
    tmp_path: Path,
) -> None:
    """In a session whose window the task outgrows, compactd compacts the history at
    least once; every request the upstream gets fits the budget with its tool calls
    paired, the agent still finishes, and the stored history keeps every step."""
    agent = require(name)
    upstream.respond = script.respond
    wire = checks.API[name]
    sid = f"agent-{name}-long"
    with proxy(settings, db_url, upstream, compaction_workers=1) as base:
        async with api(base) as http:
            r = await http.post(
                "/v1/sessions",
                json={"id": sid, "model": MODEL[name], **WINDOW, "config": LONG_CONFIG},
            )
            assert r.status_code == 201, r.text
            budget = r.json()["usable_tokens"]
        # The model refuses a prompt over the budget, as a provider does past its window.
        upstream.context_limit = budget
        run = await run_agent(agent, base, sid, LONG, tmp_path, dead_port)
        assert_agent_done(run, LONG, tmp_path / "work")
        requests = upstream.requests
        sizes = [prompt_tokens(r.json) for r in main_requests(requests)]
        async with api(base) as http:
            turns = await settled_transcript(http, sid, name, ("assistant", LONG.final()))
            session = (await http.get(f"/v1/sessions/{sid}")).json()
            print(
                f"{name}: {len(sizes)} calls, {session['compaction_count']} compactions, "
                f"largest request {max(sizes)} of {budget} tokens, {run.seconds:.1f} s; "
                f"requests (the model's count): {sizes}"
            )
            await assert_side_conversations(http, sid, name, side_requests(requests))
        for request in requests:
            checks.assert_valid(request, wire, budget)
        assert session["compaction_count"] >= 1, session
        # Every step's result is stored, in order, and the answer last: nothing the agent
        # did was lost to the compactions.
        markers = [LONG.marker(k) for k in range(1, LONG.steps + 1)]
        results = [t[2] for t in turns if t[0] == "result"]
        found = [m for m in markers if any(m in text for text in results)]
        assert found == markers, results
        assert turns[-1] == ("assistant", LONG.final())


RESUMED = script.Task("again", 1)


@pytest.mark.parametrize("name", NAMES)
async def test_resume_continues_the_session(
    name: str,
    db_url: str,
    settings: Settings,
    upstream: Upstream,
    dead_port: int,
    tmp_path: Path,
) -> None:
    """A second run that resumes the agent's last conversation (Claude Code ``-c``,
    Codex ``exec resume --last``, OpenCode ``--continue``) continues the same compactd
    session: its history is the first run's followed by the second's."""
    agent = require(name)
    upstream.respond = script.respond
    wire = checks.API[name]
    first = script.Task("short", 1)
    sid = f"agent-{name}-resume"
    with proxy(settings, db_url, upstream) as base:
        run = await run_agent(agent, base, sid, first, tmp_path, dead_port)
        assert_agent_done(run, first, tmp_path / "work")
        run = await run_agent(agent, base, sid, RESUMED, tmp_path, dead_port, resume=True)
        assert_agent_done(run, RESUMED, tmp_path / "work")
        requests = upstream.requests
        for request in requests:
            checks.assert_valid(request, wire)
        main = main_requests(requests)
        assert len(main) == first.steps + 1 + RESUMED.steps + 1
        expected = checks.transcript(wire, checks.request_messages(wire, main[-1]))
        expected.append(("assistant", RESUMED.final()))
        # The resumed run sent the first run's conversation again, then its own.
        assert ("assistant", first.final()) in expected
        async with api(base) as http:
            turns = await settled_transcript(http, sid, name, expected[-1])
            assert turns == expected, await where_stored(http, sid, name)
