"""Prune marks on a tree: a session's marks are per branch entry, so a path that
holds a marked output shows its placeholder, a path that does not shows the
output; the session's context_tokens always matches its context; a fork starts
with the source's marks of its window and keeps them its own."""

from __future__ import annotations

from typing import Any

import httpx

from tests.budget.test_prune_api import PLACEHOLDER, work
from tests.conftest import make_session
from tests.helpers import append_ok, get_session, history
from tests.tree.support import (
    MANUAL,
    assert_paired,
    breakdown_total,
    calling,
    context,
    fork_ok,
    navigate_ok,
    result,
)

# Prune everything but the newest ~6k tokens of output, whatever it saves.
LOW = {"protect_tokens": 6_000, "minimum_tokens": 0, "protect_turns": 0}


async def prune(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/prune", json=LOW)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def seeded(client: httpx.AsyncClient, sid: str, steps: int = 8, **config: Any) -> None:
    await make_session(client, id=sid, config={**MANUAL, "prune": {"auto": False, **config}})
    for batch in work(steps):
        await append_ok(client, sid, batch)


async def consistent(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """The session's context_tokens is what its context counts, in both formats,
    and the context is paired; the OpenAI context."""
    session = await get_session(client, sid)
    for fmt in ("openai", "anthropic"):
        ctx = await context(client, sid, fmt)
        assert breakdown_total(ctx) == session["context_tokens"], fmt
        assert ctx["version"] == session["version"]
    await assert_paired(client, sid)
    return await context(client, sid)


def more(prefix: str, steps: int) -> list[list[dict[str, Any]]]:
    """Batches of ``steps`` calls, each with ~3k tokens of output, ids ``prefix0``..."""
    batches: list[list[dict[str, Any]]] = []
    for k in range(steps):
        call = f"{prefix}{k}"
        body = "\n".join(f"line {i} of {call}: ok" for i in range(300))
        batches.append([calling(call, f"Step {call}."), result(call, body)])
    return batches


def outputs(ctx: dict[str, Any]) -> list[str]:
    return [m["content"] for m in ctx["messages"] if m["role"] == "tool"]


async def output_seqs(client: httpx.AsyncClient, sid: str) -> list[int]:
    return [e["seq"] for e in await history(client, sid) if e["role"] == "tool"]


async def test_marks_follow_the_path(client: httpx.AsyncClient) -> None:
    await seeded(client, "p")
    unpruned = await consistent(client, "p")
    pruned = await prune(client, "p")
    marked = {p["seq"] for p in pruned["pruned"]}
    assert len(marked) >= 3
    after = await consistent(client, "p")
    assert outputs(after).count(PLACEHOLDER) == len(marked)
    leaf_a = (await history(client, "p"))[-1]
    tools = await output_seqs(client, "p")

    # Back to just after the second marked output: its marks hold there.
    second = sorted(marked)[1]
    await navigate_ok(client, "p", seq=second + 1)
    ctx = await consistent(client, "p")
    assert outputs(ctx) == [PLACEHOLDER, PLACEHOLDER]
    # A new branch: its outputs are unmarked, and pruning there marks its own.
    for batch in more("b", 5):
        await append_ok(client, "p", batch)
    ctx = await consistent(client, "p")
    assert outputs(ctx)[:2] == [PLACEHOLDER, PLACEHOLDER]
    assert PLACEHOLDER not in outputs(ctx)[2:]
    branch_pruned = await prune(client, "p")
    assert branch_pruned["pruned"], branch_pruned
    assert all(p["seq"] > second for p in branch_pruned["pruned"])
    await consistent(client, "p")

    # Back on A: exactly A's marks, not the branch's.
    await navigate_ok(client, "p", entry_id=leaf_a["id"])
    back = await consistent(client, "p")
    assert back["messages"] == after["messages"]
    assert await output_seqs(client, "p") == tools
    # Before the first mark, the context is the unpruned one's start.
    first = min(marked)
    await navigate_ok(client, "p", seq=first - 1)
    early = await consistent(client, "p")
    assert early["messages"] == unpruned["messages"][: len(early["messages"])]
    assert PLACEHOLDER not in outputs(early)


async def test_a_fork_keeps_the_marks_of_its_window(client: httpx.AsyncClient) -> None:
    await seeded(client, "p")
    pruned = await prune(client, "p")
    marked = sorted(p["seq"] for p in pruned["pruned"])
    source = await consistent(client, "p")
    source_session = await get_session(client, "p")

    forked = await fork_ok(client, "p", id="f")
    assert forked["context_tokens"] == source_session["context_tokens"]
    ctx = await consistent(client, "f")
    assert ctx["messages"] == source["messages"]

    # A fork in the middle: the context the source has at that seq.
    at = marked[1] + 1
    mid = await fork_ok(client, "p", at_seq=at, id="g")
    await navigate_ok(client, "p", seq=at)
    there = await consistent(client, "p")
    assert (await consistent(client, "g"))["messages"] == there["messages"]
    assert mid["context_tokens"] == (await get_session(client, "p"))["context_tokens"]

    # The source grows and prunes again: the forks' marks are their own.
    await append_ok(client, "p", [{"role": "user", "content": "More."}])
    for batch in more("p", 4):
        await append_ok(client, "p", batch)
    again = await prune(client, "p")
    assert again["pruned"], again
    f_before = await context(client, "f")
    assert (await consistent(client, "f"))["messages"] == ctx["messages"]
    assert (await consistent(client, "g"))["messages"] == there["messages"]
    assert f_before["messages"] == ctx["messages"]
    # And a fork's own pruning leaves the source's context alone.
    p_before = await consistent(client, "p")
    for batch in more("f", 4):
        await append_ok(client, "f", batch)
    assert (await prune(client, "f"))["pruned"]
    await consistent(client, "f")
    assert (await consistent(client, "p"))["messages"] == p_before["messages"]


async def test_erase_leaves_what_another_session_of_the_family_reaches(
    client: httpx.AsyncClient,
) -> None:
    """``prune.erase`` clears a stored output only when no other session of the
    family reaches it: a fork that sits elsewhere in its tree for now still
    reaches its old path, and must find it as it was."""
    await seeded(client, "p", erase=True)
    await fork_ok(client, "p", id="f")
    stored = await history(client, "f")
    ctx = await context(client, "f")
    await navigate_ok(client, "f", seq=2)  # the fork looks elsewhere for a while
    pruned = await prune(client, "p")
    assert pruned["pruned"], pruned
    erased = [e for e in await history(client, "p") if e["erased_bytes"] is not None]
    assert erased == [], "erased what the fork reaches"
    await navigate_ok(client, "f", entry_id=stored[-1]["id"])
    assert await history(client, "f") == stored
    assert (await context(client, "f"))["messages"] == ctx["messages"]
    assert PLACEHOLDER not in outputs(await context(client, "f"))
