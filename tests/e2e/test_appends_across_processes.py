"""Appends to ONE session through `compactd serve --workers 2`: the database, not the
per-process turn appends of one process take (app.messages.service._turns), keeps them
correct when they come from different processes.

Many agents, each on connections of its own that are not kept alive (so that the
kernel hands its requests to either process), append turns with tool calls and their
results (in the call's batch or a later one, OpenAI and Anthropic formats), every
append with an Idempotency-Key, some sent twice at once or again after their answer.
Then the stored history: every acknowledged append present exactly once, at the seqs
it was answered with and in its order, seqs contiguous, each entry's parent the one
before, every tool result after its call and every call answered once, the context
without an orphan, and the session's totals equal to a recount from its rows. Both
processes served appends (their metric files say how many each did), and /metrics,
whichever process answers it, counts them all.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests.e2e.serve_workers import ServeWorkers
from tests.helpers import history
from tests.postgres import asyncpg_dsn
from tests.store.test_ledger_db import recount

pytestmark = pytest.mark.slow

AGENTS = 12
TURNS = 6
SESSION = "shared"
APPEND_ROUTE = "/v1/sessions/{session_id}/messages"


def openai_turn(marker: str, shape: str) -> list[list[dict[str, Any]]]:
    """One turn of an OpenAI-format agent as the batches it appends."""
    question = {"role": "user", "content": f"question {marker}"}
    answer = {"role": "assistant", "content": f"answer {marker}"}
    if shape == "plain":
        return [[question, answer]]
    calls = [f"{marker}-{k}" for k in range(2)]
    asking = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call,
                "type": "function",
                "function": {"name": "bash", "arguments": json.dumps({"command": f"ls {call}"})},
            }
            for call in calls
        ],
    }
    results = [
        {"role": "tool", "tool_call_id": call, "content": f"output of {call} " * 20}
        for call in calls
    ]
    if shape == "one batch":
        return [[question, asking, *results, answer]]
    return [[question, asking], results, [answer]]  # results in later appends


def anthropic_turn(marker: str, shape: str) -> list[list[dict[str, Any]]]:
    question = {"role": "user", "content": [{"type": "text", "text": f"question {marker}"}]}
    answer = {"role": "assistant", "content": [{"type": "text", "text": f"answer {marker}"}]}
    if shape == "plain":
        return [[question, answer]]
    calls = [f"{marker}-{k}" for k in range(2)]
    asking = {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": call, "name": "bash", "input": {"command": f"ls {call}"}}
            for call in calls
        ],
    }
    results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": call, "content": f"output of {call} " * 20}
            for call in calls
        ],
    }
    if shape == "one batch":
        return [[question, asking, results, answer]]
    return [[question, asking], [results], [answer]]


class Agent:
    """One agent: its turns, sent in order, each append with a key of its own."""

    def __init__(self, number: int, base_url: str, rng: random.Random) -> None:
        self.number = number
        self.base_url = base_url
        self.rng = rng
        self.fmt = "anthropic" if number % 3 == 2 else "openai"
        self.sent: dict[str, list[dict[str, Any]]] = {}  # key -> the batch
        self.answers: dict[str, list[httpx.Response]] = {}  # key -> every answer to it
        self.posts = 0

    async def run(self) -> None:
        # No kept-alive connection: each request is a new one, taken by either process.
        limits = httpx.Limits(max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=self.base_url, timeout=60, limits=limits) as http:
            for turn in range(TURNS):
                marker = f"a{self.number}t{turn}"
                shape = self.rng.choice(["plain", "one batch", "later results"])
                make = anthropic_turn if self.fmt == "anthropic" else openai_turn
                for i, batch in enumerate(make(marker, shape)):
                    await self.append(http, f"{marker}-{i}", batch)

    async def append(self, http: httpx.AsyncClient, key: str, batch: list[dict[str, Any]]) -> None:
        self.sent[key] = batch

        async def post() -> httpx.Response:
            self.posts += 1
            return await http.post(
                f"/v1/sessions/{SESSION}/messages",
                json={"messages": batch, "format": self.fmt},
                headers={"Idempotency-Key": key},
            )

        how = self.rng.choice(["once", "twice at once", "again after"])
        if how == "twice at once":  # a client that timed out and retried meanwhile
            answers = list(await asyncio.gather(post(), post()))
        else:
            answers = [await post()]
            if how == "again after":  # the first answer was lost on the way
                answers.append(await post())
        self.answers[key] = answers
        for r in answers:
            assert r.status_code == 201, (key, r.status_code, r.text)


def per_process_appends(folder: Path) -> dict[int, int]:
    """Appends answered 201 by each server process (pid), from its metric file."""
    counts: dict[int, int] = {}
    for path in folder.glob("counter_*.db"):
        pid = int(path.stem.split("_")[-1])
        values = MmapedDict.read_all_values_from_file(str(path))  # type: ignore[no-untyped-call]
        for key, value, _timestamp, _position in values:
            _metric, name, labels, _help = json.loads(key)
            if (
                name == "compactd_http_requests_total"
                and labels.get("route") == APPEND_ROUTE
                and labels.get("method") == "POST"
                and labels.get("status") == "201"
            ):
                counts[pid] = counts.get(pid, 0) + int(value)
    return counts


def scraped_appends(text: str) -> int:
    total = 0.0
    wanted = ("compactd_http_requests_total{", f'route="{APPEND_ROUTE}"', 'method="POST"')
    for line in text.splitlines():
        if all(w in line for w in wanted) and 'status="201"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


async def test_concurrent_appends_to_one_session_through_two_processes(
    db_url: str, tmp_path: Path
) -> None:
    folder = tmp_path / "metrics"
    server = ServeWorkers(db_url, 2, tmp_path / "serve.log", PROMETHEUS_MULTIPROC_DIR=str(folder))
    try:
        await server.start()
        assert len(server.children()) == 2
        async with server.client() as http:
            r = await http.post("/v1/sessions", json={"id": SESSION, "model": "gpt-4o"})
            assert r.status_code == 201, r.text

        rng = random.Random(18)
        agents = [Agent(n, server.base_url, random.Random(rng.random())) for n in range(AGENTS)]
        await asyncio.gather(*(a.run() for a in agents))
        posts = sum(a.posts for a in agents)

        # --- the answers: one stored append per key, every other answer its replay
        acked: dict[str, dict[str, Any]] = {}
        batches: dict[str, list[dict[str, Any]]] = {}
        fmt_of: dict[str, str] = {}
        for agent in agents:
            for key, answers in agent.answers.items():
                docs = [r.json() for r in answers]
                assert all(d == docs[0] for d in docs), (key, docs)
                firsts = [r for r in answers if r.headers.get("idempotent-replayed") != "true"]
                assert len(firsts) == 1, (key, [dict(r.headers) for r in answers])
                acked[key] = docs[0]
                batches[key] = agent.sent[key]
                fmt_of[key] = agent.fmt
        stored = sum(len(doc["entries"]) for doc in acked.values())

        # Both processes answered appends, and /metrics counts all of them whichever
        # process answers the scrape.
        per_process = per_process_appends(folder)
        print(f"{posts} appends sent, {len(acked)} keys, answered per process: {per_process}")
        assert len(per_process) == 2, per_process
        assert all(count > 0 for count in per_process.values()), per_process
        assert sum(per_process.values()) == posts
        limits = httpx.Limits(max_keepalive_connections=0)
        async with server.client(limits=limits) as http:
            for _ in range(4):
                r = await http.get("/metrics")
                assert r.status_code == 200
                assert scraped_appends(r.text) == posts

            # --- the stored history, through the API
            entries = await history(http, SESSION, limit=500)
            context = await http.get(f"/v1/sessions/{SESSION}/context")
            assert context.status_code == 200, context.text
            session = (await http.get(f"/v1/sessions/{SESSION}")).json()

        assert [e["seq"] for e in entries] == list(range(1, stored + 1))
        by_seq = {e["seq"]: e for e in entries}
        for key, doc in acked.items():
            # A batch's entries are contiguous (an Anthropic user message with two tool
            # results is stored as two entries).
            seqs = [e["seq"] for e in doc["entries"]]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), key
            for answered in doc["entries"]:
                kept = by_seq[answered["seq"]]
                assert kept["id"] == answered["id"], key
                assert kept["tokens"] == answered["tokens"], key
            if fmt_of[key] == "openai":
                kept_messages = [by_seq[seq]["message"] for seq in seqs]
                assert kept_messages == batches[key], key
        # Each turn's question is stored once.
        questions = Counter(
            json.dumps(e["message"]["content"])
            for e in entries
            if e["role"] == "user" and "question" in json.dumps(e["message"]["content"])
        )
        assert len(questions) == AGENTS * TURNS
        assert set(questions.values()) == {1}
        assert session["entry_count"] == stored
        versions = sorted(doc["version"] for doc in acked.values())
        assert len(set(versions)) == len(acked)
        assert session["version"] == versions[-1]

        # The context: every tool result right after its call's message or others of its
        # turn, never one without its call, never a call without its result.
        called: set[str] = set()
        answered_calls: list[str] = []
        for message in context.json()["messages"]:
            for call in message.get("tool_calls") or []:
                called.add(call["id"])
            if message["role"] == "tool":
                assert message["tool_call_id"] in called, message
                answered_calls.append(message["tool_call_id"])
        assert sorted(answered_calls) == sorted(called)
        assert len(set(answered_calls)) == len(answered_calls)

        # --- the rows: the path, the calls, the totals
        conn = await asyncpg.connect(asyncpg_dsn(db_url))
        try:
            rows = await conn.fetch(
                "SELECT seq, branch, parent_seq FROM entry WHERE session_id = $1 ORDER BY seq",
                SESSION,
            )
            assert [r["seq"] for r in rows] == list(range(1, stored + 1))
            assert {r["branch"] for r in rows} == {0}
            assert [r["parent_seq"] for r in rows] == [None, *range(1, stored)]
            calls = await conn.fetch(
                "SELECT call_id, call_seq, result_seq FROM tool_call WHERE session_id = $1",
                SESSION,
            )
            assert calls, "the agents made tool calls"
            assert len(calls) == len(called)
            for call in calls:
                assert call["result_seq"] is not None, call
                assert call["result_seq"] > call["call_seq"], call
            row = await conn.fetchrow("SELECT * FROM session WHERE id = $1", SESSION)
            assert row is not None
            counted = await recount(conn, SESSION)
        finally:
            await conn.close()
        for name in (
            "next_seq",
            "entry_count",
            "stored_tokens",
            "context_tokens",
            "context_tool_tokens",
            "context_start_seq",
            "pruned_tokens",
            "prune_count",
            "compaction_count",
        ):
            assert row[name] == counted[name], (name, row[name], counted[name])
        assert row["stored_tokens"] == sum(
            e["tokens"] for doc in acked.values() for e in doc["entries"]
        )
        assert session["context_tokens"] == row["context_tokens"]

        assert await server.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    finally:
        await server.close()
