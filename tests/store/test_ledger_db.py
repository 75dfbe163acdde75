"""The session row's running totals, through the public API, always equal a
brute-force recount of the stored rows.

Random programs of appends, prunes, usage reports and extractive compactions
(drained by a real worker) run against a fresh session each, with automatic
pruning and compaction on or off and windows small enough for them to fire.
After every step the ``session`` row is read by column name and checked
against the ``entry``, ``prune_mark`` and ``compaction`` rows, and against
what the program itself did (how many appends and reports). It pins what the
service does today, so that moving every write of the totals into one writer
is checked against it.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests import postgres
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import tool_call

PINNED_ROLES = ("system", "developer")

# --- programs -----------------------------------------------------------------

# About this many tokens: tiny, or enough for the windows below to fill up.
SIZES = st.sampled_from([0, 5, 40]) | st.integers(0, 2_500) | st.integers(800, 2_500)
# An assistant's calls and their results, in the same batch: always valid.
TOOLS = st.tuples(
    st.just("tools"),
    st.lists(SIZES, min_size=1, max_size=3),
    st.sampled_from(["bash", "read", "skill"]),
)
GROUPS = st.one_of(TOOLS, st.tuples(st.sampled_from(["user", "assistant", "system"]), SIZES), TOOLS)
APPEND = st.tuples(st.just("append"), st.lists(GROUPS, min_size=1, max_size=3))
PRUNE = st.tuples(
    st.just("prune"),
    st.fixed_dictionaries(
        {},
        optional={
            "dry_run": st.booleans(),
            "protect_tokens": st.sampled_from([0, 300, 2_000]),
            "minimum_tokens": st.sampled_from([0, 100, 1_000]),
            "protect_turns": st.integers(0, 2),
        },
    ),
)
# How the agent reports: the prompt as a multiple of what the session counts
# (past 1.5 after a compaction is taken as stale), the tools' overhead, and
# whether it read the context first (the served context a report measures).
USAGE = st.tuples(
    st.just("usage"),
    st.floats(0.7, 3.0),
    st.none() | st.integers(0, 800),
    st.booleans(),
)
COMPACT = st.tuples(st.just("compact"))
# A history to work on first (a task, then tool calls), then anything.
OPENING = st.tuples(
    st.just("append"),
    st.lists(GROUPS, min_size=2, max_size=6).map(lambda g: [("system", 60), ("user", 30), *g]),
)
STEPS = st.tuples(
    OPENING, st.lists(st.one_of(APPEND, APPEND, PRUNE, USAGE, COMPACT), min_size=2, max_size=7)
).map(lambda program: [program[0], *program[1]])

SESSIONS = st.fixed_dictionaries(
    {
        "config": st.fixed_dictionaries(
            {
                "prune": st.fixed_dictionaries(
                    {
                        "auto": st.booleans(),
                        "protect_tokens": st.sampled_from([0, 500, 3_000]),
                        "minimum_tokens": st.sampled_from([0, 200, 2_000]),
                        "protect_turns": st.integers(0, 2),
                        "erase": st.booleans(),
                    }
                ),
                "compaction": st.fixed_dictionaries(
                    {
                        "auto": st.booleans(),
                        "keep_recent_tokens": st.sampled_from([200, 1_000, 4_000]),
                        "auto_continue": st.booleans(),
                    }
                ),
            }
        ),
    },
    # Small windows: the automatic prune, the threshold and the emergency fire.
    optional={
        "context_window": st.sampled_from([8_000, 20_000]),
        "max_output_tokens": st.just(1_000),
    },
)


def text(tokens: int, tag: str) -> str:
    """Text of about ``tokens`` tokens, distinct per ``tag``."""
    return f"{tag}:" + "".join(f" w{tag}{k}" for k in range(tokens // 3))


def batch(groups: list[Any], ids: itertools.count[int]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for group in groups:
        if group[0] == "tools":
            _, sizes, name = group
            calls = [f"call{next(ids)}" for _ in sizes]
            messages.append(
                {
                    "role": "assistant",
                    "content": text(20, calls[0]),
                    "tool_calls": [tool_call(c, name) for c in calls],
                }
            )
            messages.extend(
                {"role": "tool", "tool_call_id": c, "content": text(size, c)}
                for c, size in zip(calls, sizes, strict=True)
            )
        else:
            role, size = group
            messages.append({"role": role, "content": text(size, f"{role}{next(ids)}")})
    return messages


# --- the recount --------------------------------------------------------------


@dataclass
class Done:
    """What the program did so far, and what it was answered."""

    appends: int = 0
    reports: int = 0
    calibration_factor: float = 1.0
    overhead_tokens: int = 0
    reported_prompt_tokens: int | None = None


async def recount(conn: asyncpg.Connection, sid: str) -> dict[str, Any]:
    """The session's log-derived totals from its rows alone: the pivot from its
    latest succeeded compaction, the context from the entries and the marks."""
    entries = await conn.fetch(
        "SELECT seq, role, kind, tokens FROM entry WHERE session_id = $1 ORDER BY seq", sid
    )
    marks = {
        r["seq"]: r
        for r in await conn.fetch(
            "SELECT seq, tokens, pruned_at FROM prune_mark WHERE session_id = $1", sid
        )
    }
    done = await conn.fetch(
        "SELECT entry_seq, first_kept_seq FROM compaction"
        " WHERE session_id = $1 AND status = 'succeeded' ORDER BY entry_seq",
        sid,
    )
    summary = done[-1]["entry_seq"] if done else None
    start = done[-1]["first_kept_seq"] if done else 1
    # Every compaction pins the system entries before its cut.
    pinned = [e["seq"] for e in entries if e["role"] in PINNED_ROLES and e["seq"] < start]
    context = [
        e
        for e in entries
        if e["seq"] in pinned
        or (e["seq"] >= start and (e["kind"] != "compaction" or e["seq"] == summary))
    ]

    def cost(e: asyncpg.Record) -> int:
        mark = marks.get(e["seq"])
        return int(e["tokens"] if mark is None or e["seq"] < start else mark["tokens"])

    by_seq = {e["seq"]: e for e in entries}
    return {
        "next_seq": entries[-1]["seq"] + 1 if entries else 1,
        "entry_count": len(entries),
        "stored_tokens": sum(e["tokens"] for e in entries),
        "context_tokens": sum(cost(e) for e in context),
        "context_tool_tokens": sum(cost(e) for e in context if e["role"] == "tool"),
        "context_start_seq": start,
        "summary_seq": summary,
        "pinned_seqs": pinned,
        "pruned_tokens": sum(by_seq[s]["tokens"] - m["tokens"] for s, m in marks.items()),
        "prune_count": len({m["pruned_at"] for m in marks.values()}),
        "compaction_count": sum(e["kind"] == "compaction" for e in entries),
        "succeeded_compactions": len(done),
    }


async def check(
    conn: asyncpg.Connection, sid: str, done: Done, before: asyncpg.Record, kind: str
) -> asyncpg.Record:
    """The row against the recount and the program; returns the row."""
    row = await conn.fetchrow("SELECT * FROM session WHERE id = $1", sid)
    assert row is not None
    expected = await recount(conn, sid)
    assert expected.pop("succeeded_compactions") == expected["compaction_count"]
    assert {name: row[name] for name in expected} == expected, kind
    # Every write a client sees is one version: appends, prunes that hid
    # something, usage reports and pivot moves.
    assert row["version"] == (
        1 + done.appends + row["prune_count"] + row["usage_count"] + row["compaction_count"]
    )
    assert row["version"] >= before["version"]
    assert row["usage_count"] == done.reports
    assert row["calibration_factor"] == done.calibration_factor
    assert row["overhead_tokens"] == done.overhead_tokens
    assert (row["pivot_version"] is None) == (row["compaction_count"] == 0)
    if row["compaction_count"] > before["compaction_count"]:
        # The pivot moved, last thing in the step: what was measured or checked
        # against the context it replaced is forgotten.
        done.reported_prompt_tokens = None
        assert row["pivot_version"] == row["version"]
        assert row["prune_checked_tool_tokens"] is None
        assert row["prune_checked_urgent"] is None
    assert row["reported_prompt_tokens"] == done.reported_prompt_tokens
    assert (row["context_tokens_at_report"] is None) == (row["reported_prompt_tokens"] is None)
    return row


# --- the test -----------------------------------------------------------------

sids = itertools.count()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(session=SESSIONS, steps=STEPS)
async def test_the_session_totals_equal_a_recount_of_its_rows(
    app: Any, client: httpx.AsyncClient, db_url: str, session: dict[str, Any], steps: list[Any]
) -> None:
    started = time.perf_counter()
    sid = f"ledger{next(sids)}"
    await make_session(client, id=sid, **session)
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        done = Done()
        ids = itertools.count()
        created = await conn.fetchrow("SELECT * FROM session WHERE id = $1", sid)
        assert created is not None
        row = await check(conn, sid, done, created, "create")
        for step in steps:
            kind = step[0]
            answered: int | None = None  # the version the answer carries
            if kind == "append":
                r = await client.post(
                    f"/v1/sessions/{sid}/messages", json={"messages": batch(step[1], ids)}
                )
                assert r.status_code == 201, r.text
                done.appends += 1
                answered = r.json()["version"]
                context_tokens = r.json()["context_tokens"]
            elif kind == "prune":
                r = await client.post(f"/v1/sessions/{sid}/prune", json=step[1])
                assert r.status_code == 200, r.text
                answered = r.json()["version"]
            elif kind == "usage":
                _, ratio, tools_tokens, read_first = step
                if read_first:
                    r = await client.get(f"/v1/sessions/{sid}/context")
                    assert r.status_code == 200, r.text
                body: dict[str, Any] = {
                    "input_tokens": round(ratio * row["context_tokens"]),
                    "output_tokens": 10,
                }
                if tools_tokens is not None:
                    body["tools_tokens"] = tools_tokens
                r = await client.post(f"/v1/sessions/{sid}/usage", json=body)
                assert r.status_code == 200, r.text
                report = r.json()
                done.reports += 1
                done.calibration_factor = report["calibration_factor"]
                done.overhead_tokens = report["overhead_tokens"]
                done.reported_prompt_tokens = report["reported_prompt_tokens"]
                answered = report["version"]
            else:
                r = await client.post(
                    f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive"}
                )
                if r.status_code == 409:
                    # Nothing since the pivot to cut: refused, and nothing changes.
                    assert "nothing to compact" in r.json()["detail"], r.text
                else:
                    assert r.status_code == 202, r.text
                    await drain(app)
            before, row = row, await check(conn, sid, done, row, kind)
            for name in ("prune_count", "compaction_count", "usage_count"):
                if row[name] > before[name]:
                    event(f"{kind} moved {name}")
            if kind == "usage" and r.json()["stale"]:
                event("stale report")
            if answered is not None:
                assert answered == row["version"], kind
            if kind == "append":
                assert context_tokens == row["context_tokens"]
            if kind == "prune" and not step[1].get("dry_run"):
                # Pruned or not, the automatic prune looks again only past this.
                assert row["prune_checked_tool_tokens"] == row["context_tool_tokens"]
                assert row["prune_checked_urgent"] is False
            if (kind == "prune" and step[1].get("dry_run")) or r.status_code == 409:
                assert row == before, kind
    finally:
        await conn.close()
    print(f"\n  {len(steps)} steps in {time.perf_counter() - started:.2f}s")
