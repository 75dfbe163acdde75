"""The real traces replayed as trees, through a real uvicorn server (issue 15).

Each trace runs as in test_trace_compaction_replay (a 16k window, automatic
compaction by the server's own workers, the usage its model reported), with two
moves an agent makes in a tree, at random (seeded) points:

- every few turns, a **navigation** back to the end of an earlier turn (1 to 5 turns
  back, by seq on the active path), and the trace goes on from the turn after it: the
  turns in between are sent again, on the new branch, their tool calls answered again;
- every few turns, a **fork** at the end of a recent turn (the leaf, or a few turns
  back), continued by the next 1 to 3 turns of the trace, sent to the fork.

All 23 traces, each up to its 35th turn (TURNS): checked in full after every step,
the whole traces would take several minutes.

After every step (an append, a navigation, a fork) the session it touched is checked:
its context in both formats has no orphaned tool result or call and is within
budget (test_trace_compaction_replay.check), ``GET /messages`` of its path holds
exactly the messages sent along that path (with only compaction entries between
them), and ``GET /tree`` holds exactly as many messages as were sent to it (for a
fork, with the path it was forked from). At the end of a trace every fork is checked
again: what its source did afterwards changed nothing of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
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

SEED = 15
NAVIGATE_EVERY = (3, 8)  # turns between two navigations
BACK_TURNS = (1, 5)  # how far back a navigation goes
FORK_EVERY = (6, 12)  # turns between two forks
FORK_BACK_TURNS = (0, 3)  # how far back a fork is made
FORK_TURNS = (1, 3)  # turns of the trace sent to a fork
# The first turns of each trace: with the turns sent again after each navigation and
# those sent to forks, about twice as many steps, each checked in full, which keeps
# the test near a minute and a half (a GET /tree costs O(tree²) per step, see the
# xfail below). The 16k window is compacted within them (some 75 compactions in all,
# checked below).
TURNS = 35


@dataclass
class Sent:
    """A session's active path as the test sent it: the messages along it, and for
    each turn on it the turn's index in the trace, the seq of its last entry and how
    many messages the path held after it."""

    sid: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    turn_ends: list[tuple[int, int, int]] = field(default_factory=list)
    sent: int = 0  # messages sent to this session, on every branch it wrote
    inherited: int = 0  # for a fork: the messages of the path it was forked from

    def pending(self, turns: list[list[dict[str, Any]]]) -> bool:
        """Whether the path ends on an assistant message whose calls wait."""
        return bool(self.turn_ends) and turns[self.turn_ends[-1][0]][-1]["role"] == "assistant"


async def _report_usage(client: httpx.AsyncClient, sid: str, batch: list[dict[str, Any]]) -> None:
    """The usage the trace's model reported before this assistant message, scaled to
    the context the session holds (as in test_trace_compaction_replay)."""
    prompt = reported_prompt(batch[0]) if batch[0]["role"] == "assistant" else None
    if prompt is None:
        return
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    whole = session["stored_tokens"] + REPLY_PRIMING_TOKENS
    shown = session["context_tokens"] + REPLY_PRIMING_TOKENS
    r = await client.post(
        f"/v1/sessions/{sid}/usage",
        json={"input_tokens": round(prompt * shown / whole), "finish_reason": "tool_calls"},
    )
    assert r.status_code == 200, r.text


async def _send(
    client: httpx.AsyncClient, path: Sent, turns: list[list[dict[str, Any]]], n: int
) -> None:
    batch = turns[n]
    await _report_usage(client, path.sid, batch)
    r = await client.post(f"/v1/sessions/{path.sid}/messages", json={"messages": batch})
    assert r.status_code == 201, f"{path.sid} turn {n}: {r.text}"
    entries = r.json()["entries"]
    assert len(entries) == len(batch)
    path.messages.extend(batch)
    path.sent += len(batch)
    path.turn_ends.append((n, entries[-1]["seq"], len(path.messages)))


async def _tree_messages(client: httpx.AsyncClient, sid: str) -> int:
    """The messages of the session's tree (compaction entries aside), every page."""
    count = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000} | ({"cursor": cursor} if cursor else {})
        r = await client.get(f"/v1/sessions/{sid}/tree", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        count += sum(1 for e in page["entries"] if e["kind"] == "message")
        cursor = page["next_cursor"]
        if cursor is None:
            return count


async def _check(
    client: httpx.AsyncClient, path: Sent, turns: list[list[dict[str, Any]]], where: str
) -> None:
    pending = path.pending(turns)
    for fmt in ("openai", "anthropic"):
        r = await client.get(f"/v1/sessions/{path.sid}/context", params={"format": fmt})
        assert r.status_code == 200, r.text
        check(r.json(), fmt, pending, f"{where} ({fmt})")
    stored = await history(client, path.sid)
    assert [e["message"] for e in stored if e["kind"] == "message"] == path.messages, where
    assert {e["kind"] for e in stored} <= {"message", "compaction", "continue"}, where
    assert await _tree_messages(client, path.sid) == path.inherited + path.sent, where


async def _replay(client: httpx.AsyncClient, trace: Path) -> dict[str, int]:
    rng = random.Random(f"{SEED}-{trace.name}")
    turns = traces.turns(traces.load(trace))[:TURNS]
    session = await traces.create_session(client, trace, "t-", **WINDOW, config=CONFIG)
    root = Sent(session["id"])
    forks: list[Sent] = []
    stats = {
        "turns": 0,
        "navigations": 0,
        "undone": 0,  # navigations that left a compaction behind
        "forks": 0,
        "fork_turns": 0,
        "compactions": 0,
    }
    next_navigation = rng.randint(*NAVIGATE_EVERY)
    next_fork = rng.randint(*FORK_EVERY)
    n = 0
    step = 0
    while n < len(turns):
        await _send(client, root, turns, n)
        await _check(client, root, turns, f"{trace.name} turn {n}")
        stats["turns"] += 1
        step += 1
        n += 1

        if step >= next_fork and n < len(turns):
            next_fork = step + rng.randint(*FORK_EVERY)
            back = min(rng.randint(*FORK_BACK_TURNS), len(root.turn_ends) - 1)
            turn, seq, held = root.turn_ends[-1 - back]
            fork = Sent(f"{root.sid}-f{len(forks)}", inherited=held)
            r = await client.post(
                f"/v1/sessions/{root.sid}/fork", json={"at_seq": seq, "id": fork.sid}
            )
            assert r.status_code == 201, r.text
            fork.messages = root.messages[:held]
            fork.turn_ends = [(turn, seq, held)]
            where = f"{trace.name} fork {fork.sid} at turn {turn}"
            await _check(client, fork, turns, where)
            for k in range(turn + 1, min(turn + 1 + rng.randint(*FORK_TURNS), len(turns))):
                await _send(client, fork, turns, k)
                await _check(client, fork, turns, f"{where}, its turn {k}")
                stats["fork_turns"] += 1
            forks.append(fork)
            stats["forks"] += 1

        if step >= next_navigation and n < len(turns) and len(root.turn_ends) > 1:
            next_navigation = step + rng.randint(*NAVIGATE_EVERY)
            back = min(rng.randint(*BACK_TURNS), len(root.turn_ends) - 1)
            del root.turn_ends[len(root.turn_ends) - back :]
            turn, seq, held = root.turn_ends[-1]
            r = await client.post(f"/v1/sessions/{root.sid}/navigate", json={"seq": seq})
            assert r.status_code == 200, r.text
            moved = r.json()
            assert moved["status"] == "moved", moved
            assert moved["leaf_seq"] == seq, moved
            # Only compaction entries were left besides the messages sent.
            assert moved["abandoned_seqs"] >= len(root.messages) - held, moved
            stats["undone"] += moved["abandoned_seqs"] > len(root.messages) - held
            del root.messages[held:]
            await _check(client, root, turns, f"{trace.name} back to turn {turn}")
            stats["navigations"] += 1
            n = turn + 1

    # Let the last compactions end; then every session of the family once more.
    for path in (root, *forks):
        jobs = await traces.finished_compactions(client, path.sid)
        stats["compactions"] += sum(j["status"] == "succeeded" for j in jobs)
        await _check(client, path, turns, f"{trace.name} end of {path.sid}")
    return stats


@pytest.mark.slow
async def test_replay_every_trace_as_a_tree(db_url: str, settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"compaction_workers": 2}), database_url=db_url)
    with running(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            results = await traces.replay_all(client, _replay)
    totals = {k: sum(r[k] for r in results) for k in results[0]}
    print(f"\ntree replay of {len(results)} traces: {totals}")
    assert len(results) == 23
    assert totals["navigations"] > 23 * 5
    assert totals["forks"] > 23 * 2
    # The tree was compacted, and navigations went back before compactions (undoing them).
    assert totals["compactions"] > 23
    assert totals["undone"] > 0


@pytest.mark.slow
async def test_a_page_of_a_long_sessions_tree_is_read_within_the_statement_timeout(
    db_url: str, settings: Settings
) -> None:
    # 2 s: the query with both lookups by index (children by entry_parent_idx, the
    # parent by its key) reads this page in about 20 ms.
    configured = settings.model_copy(update={"db_statement_timeout_seconds": 2.0})
    with running(create_app(configured, database_url=db_url)) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            r = await client.post("/v1/sessions", json={"model": "gpt-4o"})
            assert r.status_code == 201, r.text
            sid = r.json()["id"]
            for k in range(100):
                batch = [
                    {"role": "user" if i % 2 == 0 else "assistant", "content": f"Step {k}.{i}."}
                    for i in range(100)
                ]
                r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": batch})
                assert r.status_code == 201, r.text
            r = await client.get(f"/v1/sessions/{sid}/tree", params={"limit": 1000})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [e["seq"] for e in page["entries"]] == list(range(1, 1001))
    assert all(e["children"] == 1 for e in page["entries"])
    assert page["next_cursor"] is not None
