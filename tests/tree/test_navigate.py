"""POST /v1/sessions/{id}/navigate: by seq and by entry id, what is refused (422
problem documents naming the field, 404), a move to the current leaf, retries
with an Idempotency-Key, If-Match, tool calls answered on two branches, and
appends racing after a move."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from tests.conftest import make_session
from tests.helpers import append, append_ok, assert_problem, get_session, history
from tests.tree.support import (
    assert_paired,
    calling,
    context,
    fork_ok,
    navigate,
    navigate_ok,
    result,
    texts,
    users,
    whole_tree,
)


async def five(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """A session of five user messages m1..m5; their stored entries."""
    await make_session(client, id=sid)
    appended = await append_ok(client, sid, users("m1", "m2", "m3", "m4", "m5"))
    entries: list[dict[str, Any]] = appended["entries"]
    return entries


# --- moving ---------------------------------------------------------------------


async def test_navigate_by_seq_moves_the_leaf_and_answers_the_session(
    client: httpx.AsyncClient,
) -> None:
    entries = await five(client, "s")
    before = await get_session(client, "s")
    r = await navigate(client, "s", seq=2)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "moved"
    assert body["leaf_seq"] == 2
    assert body["leaf_id"] == entries[1]["id"]
    assert body["abandoned_seqs"] == 3
    assert body["branch_summary"] is None
    session = body["session"]
    assert session["version"] == before["version"] + 1
    assert r.headers["etag"] == f'"{session["version"]}"'
    assert session == await get_session(client, "s")
    assert session["entry_count"] == 2
    assert session["stored_tokens"] == sum(e["tokens"] for e in entries[:2])
    ctx = await context(client, "s")
    assert texts(ctx) == ["m1", "m2"]
    assert ctx["version"] == session["version"]
    assert [e["message"]["content"] for e in await history(client, "s")] == ["m1", "m2"]
    # The next append goes after the leaf, as seq 3 of the new path.
    appended = await append_ok(client, "s", users("b3"))
    assert [e["seq"] for e in appended["entries"]] == [3]
    assert texts(await context(client, "s")) == ["m1", "m2", "b3"]


async def test_navigate_by_entry_id_to_an_abandoned_branch(client: httpx.AsyncClient) -> None:
    entries = await five(client, "s")
    await navigate_ok(client, "s", seq=3)
    await append_ok(client, "s", users("b4"))
    body = await navigate_ok(client, "s", entry_id=entries[4]["id"])
    assert body["status"] == "moved"
    assert (body["leaf_seq"], body["leaf_id"]) == (5, entries[4]["id"])
    # The old path leaves only b4: the common ancestor is m3.
    assert body["abandoned_seqs"] == 1
    assert texts(await context(client, "s")) == ["m1", "m2", "m3", "m4", "m5"]
    # An entry id in the middle of the active path is a move too.
    body = await navigate_ok(client, "s", entry_id=entries[0]["id"])
    assert (body["status"], body["leaf_seq"], body["abandoned_seqs"]) == ("moved", 1, 4)
    assert texts(await context(client, "s")) == ["m1"]


async def test_navigating_to_the_current_leaf_changes_nothing(client: httpx.AsyncClient) -> None:
    entries = await five(client, "s")
    before = await get_session(client, "s")
    for body in ({"seq": 5}, {"entry_id": entries[4]["id"]}):
        r = await navigate(client, "s", **body)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["status"] == "unchanged"
        assert doc["abandoned_seqs"] == 0
        assert (doc["leaf_seq"], doc["leaf_id"]) == (5, entries[4]["id"])
        assert doc["session"]["version"] == before["version"]
    assert await get_session(client, "s") == before
    # Also on a branch of its own, after a move.
    await navigate_ok(client, "s", seq=2)
    moved = await get_session(client, "s")
    doc = await navigate_ok(client, "s", seq=2)
    assert doc["status"] == "unchanged"
    assert await get_session(client, "s") == moved


# --- refused --------------------------------------------------------------------


async def assert_unmoved(client: httpx.AsyncClient, sid: str, before: dict[str, Any]) -> None:
    assert await get_session(client, sid) == before
    tree = await whole_tree(client, sid)
    assert tree["leaf_seq"] == before["entry_count"]


async def test_a_navigation_names_exactly_one_target(client: httpx.AsyncClient) -> None:
    entries = await five(client, "s")
    before = await get_session(client, "s")
    for body in ({}, {"seq": 2, "entry_id": entries[1]["id"]}, {"summarize": False}):
        r = await navigate(client, "s", **body)
        doc = assert_problem(r, 422)
        assert "exactly one of entry_id and seq" in r.text, doc
    for bad in ({"seq": 0}, {"seq": -1}, {"seq": "two"}, {"entry_id": "not-a-uuid"}):
        r = await navigate(client, "s", **bad)
        assert_problem(r, 422, next(iter(bad)))
    r = await navigate(client, "s", seq=2, surprise=True)
    assert_problem(r, 422, "surprise")
    await assert_unmoved(client, "s", before)


async def test_a_seq_beyond_the_leaf_is_422(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    before = await get_session(client, "s")
    for seq in (6, 2**62):
        r = await navigate(client, "s", seq=seq)
        doc = assert_problem(r, 422, "seq")
        assert "5" in doc["errors"][0]["detail"], doc
    await assert_unmoved(client, "s", before)
    # After a move back, the abandoned seqs are beyond the new leaf.
    await navigate_ok(client, "s", seq=2)
    moved = await get_session(client, "s")
    assert_problem(await navigate(client, "s", seq=3), 422, "seq")
    await assert_unmoved(client, "s", moved)


async def test_an_empty_session_has_nowhere_to_go(client: httpx.AsyncClient) -> None:
    await make_session(client, id="e")
    before = await get_session(client, "e")
    assert_problem(await navigate(client, "e", seq=1), 422, "seq")
    await assert_unmoved(client, "e", before)


async def test_an_entry_of_another_family_is_422(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    other = await five(client, "o")
    before = await get_session(client, "s")
    r = await navigate(client, "s", entry_id=other[1]["id"])
    assert_problem(r, 422, "entry_id")
    r = await navigate(client, "s", entry_id="00000000-0000-4000-8000-000000000000")
    assert_problem(r, 422, "entry_id")
    await assert_unmoved(client, "s", before)


async def test_a_forks_own_entries_are_not_in_its_sources_tree(
    client: httpx.AsyncClient,
) -> None:
    src = await five(client, "s")
    await fork_ok(client, "s", at_seq=3, id="f")
    mine = await append_ok(client, "f", users("f4", "f5"))
    before = await get_session(client, "s")
    for entry in mine["entries"]:
        r = await navigate(client, "s", entry_id=entry["id"])
        assert_problem(r, 422, "entry_id")
    await assert_unmoved(client, "s", before)
    assert texts(await context(client, "s")) == ["m1", "m2", "m3", "m4", "m5"]
    # The fork reaches the source's entries up to its fork point, not after it.
    fork_before = await get_session(client, "f")
    for entry in src[3:]:
        r = await navigate(client, "f", entry_id=entry["id"])
        assert_problem(r, 422, "entry_id")
    await assert_unmoved(client, "f", fork_before)
    body = await navigate_ok(client, "f", entry_id=src[1]["id"])
    assert (body["status"], body["leaf_seq"]) == ("moved", 2)
    assert texts(await context(client, "f")) == ["m1", "m2"]
    # The source did not move with it.
    assert await get_session(client, "s") == before


async def test_an_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    entries = await five(client, "s")
    for body in ({"seq": 1}, {"entry_id": entries[0]["id"]}):
        r = await navigate(client, "nope", **body)
        assert_problem(r, 404, "nope")
    r = await client.get("/v1/sessions/nope/tree")
    assert_problem(r, 404, "nope")


# --- retries and preconditions -------------------------------------------------------


async def test_an_idempotent_navigation_moves_once(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    key = {"Idempotency-Key": "nav-1"}
    first = await navigate(client, "s", headers=key, seq=3)
    assert first.status_code == 200, first.text
    assert "idempotent-replayed" not in first.headers
    moved = await get_session(client, "s")
    # The session moves on; the retry answers the first response and moves nothing.
    await append_ok(client, "s", users("b4"))
    after_append = await get_session(client, "s")
    again = await navigate(client, "s", headers=key, seq=3)
    assert again.status_code == 200, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert again.json()["session"] == moved
    assert await get_session(client, "s") == after_append
    assert texts(await context(client, "s")) == ["m1", "m2", "m3", "b4"]
    # The same key with another body is refused, and moves nothing either.
    for other in ({"seq": 2}, {"seq": 3, "summarize": False}):
        r = await navigate(client, "s", headers=key, **other)
        assert_problem(r, 422, "Idempotency-Key")
    assert await get_session(client, "s") == after_append
    # Another key is another navigation.
    r = await navigate(client, "s", headers={"Idempotency-Key": "nav-2"}, seq=3)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "moved"
    assert texts(await context(client, "s")) == ["m1", "m2", "m3"]


async def test_concurrent_retries_of_one_navigation_move_once(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    before = await get_session(client, "s")
    results = await asyncio.gather(
        *(navigate(client, "s", headers={"Idempotency-Key": "k"}, seq=2) for _ in range(5))
    )
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    assert all(r.json() == results[0].json() for r in results)
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in results) == 4
    assert (await get_session(client, "s"))["version"] == before["version"] + 1


async def test_if_match_guards_a_navigation(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    before = await get_session(client, "s")
    stale = f'"{before["version"] - 1}"'
    r = await navigate(client, "s", headers={"If-Match": stale}, seq=2)
    assert_problem(r, 412)
    await assert_unmoved(client, "s", before)
    assert texts(await context(client, "s")) == ["m1", "m2", "m3", "m4", "m5"]
    r = await navigate(client, "s", headers={"If-Match": f'"{before["version"]}"'}, seq=2)
    assert r.status_code == 200, r.text
    assert r.json()["session"]["version"] == before["version"] + 1
    # The version it had is stale now.
    r = await navigate(client, "s", headers={"If-Match": f'"{before["version"]}"'}, seq=1)
    assert_problem(r, 412)
    assert texts(await context(client, "s")) == ["m1", "m2"]


# --- tool calls across branches ---------------------------------------------------------


async def tool_results(client: httpx.AsyncClient, sid: str) -> list[tuple[str, str]]:
    ctx = await context(client, sid)
    return [(m["tool_call_id"], m["content"]) for m in ctx["messages"] if m["role"] == "tool"]


async def test_a_call_is_answered_once_per_branch(client: httpx.AsyncClient) -> None:
    await make_session(client, id="t")
    await append_ok(
        client,
        "t",
        [
            {"role": "user", "content": "List the files."},
            calling("c1"),  # seq 2
            result("c1", "on branch A"),  # seq 3
            {"role": "assistant", "content": "Two files."},  # seq 4
        ],
    )
    leaf_a = (await history(client, "t"))[-1]
    await assert_paired(client, "t")

    await navigate_ok(client, "t", seq=2)
    ctx = await context(client, "t")
    assert ctx["messages"][-1]["tool_calls"][0]["id"] == "c1"  # waits on its result
    r = await append(client, "t", [result("c1", "on branch B")])
    assert r.status_code == 201, r.text
    assert [e["seq"] for e in r.json()["entries"]] == [3]
    assert await tool_results(client, "t") == [("c1", "on branch B")]
    await assert_paired(client, "t")
    # A second result for the same call, on the same branch, is refused.
    before = await get_session(client, "t")
    r = await append(client, "t", [result("c1", "again")])
    assert_problem(r, 422, "messages[0].tool_call_id")
    assert await get_session(client, "t") == before
    await append_ok(client, "t", [{"role": "assistant", "content": "Three files."}])
    await assert_paired(client, "t")

    # Back on A: its own result, once.
    await navigate_ok(client, "t", entry_id=leaf_a["id"])
    assert await tool_results(client, "t") == [("c1", "on branch A")]
    await assert_paired(client, "t")
    assert [e["message"].get("content") for e in await history(client, "t")] == [
        "List the files.",
        "Looking.",
        "on branch A",
        "Two files.",
    ]
    # And A's call stays answered there.
    r = await append(client, "t", [result("c1", "a third")])
    assert_problem(r, 422, "messages[0].tool_call_id")


async def test_a_call_made_before_a_fork_is_answered_in_each(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", [{"role": "user", "content": "Go."}, calling("c1")])
    await fork_ok(client, "s", id="f")
    await append_ok(client, "f", [result("c1", "fork's")])
    await append_ok(client, "s", [result("c1", "source's")])
    assert await tool_results(client, "f") == [("c1", "fork's")]
    assert await tool_results(client, "s") == [("c1", "source's")]
    for sid in ("s", "f"):
        await assert_paired(client, sid)
        assert_problem(await append(client, sid, [result("c1", "x")]), 422, "tool_call_id")


async def test_a_navigation_back_past_a_result_reopens_its_call(
    client: httpx.AsyncClient,
) -> None:
    """Back at the call, its result on the other branch is not on the path: the
    branch holds what a line of the same messages holds, context and all."""
    await make_session(client, id="t")
    await append_ok(
        client,
        "t",
        [{"role": "user", "content": "Go."}, calling("c1"), result("c1", "first")],
    )
    await navigate_ok(client, "t", seq=2)
    await make_session(client, id="line")
    await append_ok(client, "line", [{"role": "user", "content": "Go."}, calling("c1")])
    for sid in ("t", "line"):
        await append_ok(client, sid, [{"role": "user", "content": "skip it"}])
        await append_ok(client, sid, [{"role": "assistant", "content": "Skipped."}])
    for fmt in ("openai", "anthropic"):
        branch, line = await context(client, "t", fmt), await context(client, "line", fmt)
        assert branch["messages"] == line["messages"]
        assert branch["tokens"] == line["tokens"]
        assert "first" not in str(branch["messages"])
    await assert_paired(client, "t")
    assert (await get_session(client, "t"))["context_tokens"] == (
        await get_session(client, "line")
    )["context_tokens"]


# --- racing ------------------------------------------------------------------------------


async def test_appends_racing_after_a_navigation_share_one_path(
    client: httpx.AsyncClient,
) -> None:
    await five(client, "s")
    await navigate_ok(client, "s", seq=2)
    a, b = await asyncio.gather(
        append(client, "s", users("a1", "a2")), append(client, "s", users("b1", "b2"))
    )
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    seqs = sorted(e["seq"] for r in (a, b) for e in r.json()["entries"])
    assert seqs == [3, 4, 5, 6]
    got = texts(await context(client, "s"))
    assert got[:2] == ["m1", "m2"]
    assert got[2:] in (["a1", "a2", "b1", "b2"], ["b1", "b2", "a1", "a2"])
    stored = await history(client, "s")
    assert [e["seq"] for e in stored] == [1, 2, 3, 4, 5, 6]
    assert [e["message"]["content"] for e in stored] == got
    session = await get_session(client, "s")
    assert session["entry_count"] == 6
    assert session["stored_tokens"] == sum(e["tokens"] for e in stored)
    # One new branch, holding both batches: the tree is the old five and the four new.
    tree = await whole_tree(client, "s")
    assert len(tree["entries"]) == 9
    new = [e for e in tree["entries"] if e["seq"] > 2 and e["on_path"]]
    assert len({e["branch"] for e in new}) == 1
    assert [(s["from_seq"], s["to_seq"]) for s in tree["path"]] == [(1, 2), (3, 6)]


async def test_a_navigation_racing_an_append_leaves_one_consistent_path(
    client: httpx.AsyncClient,
) -> None:
    await five(client, "s")
    nav, app = await asyncio.gather(navigate(client, "s", seq=2), append(client, "s", users("x")))
    assert nav.status_code == 200, nav.text
    assert app.status_code == 201, app.text
    got = texts(await context(client, "s"))
    # Either the append went first (on the old path, then left) or after (on the new one).
    assert got in (["m1", "m2"], ["m1", "m2", "x"])
    session = await get_session(client, "s")
    assert session["entry_count"] == len(got)
    stored = await history(client, "s")
    assert [e["message"]["content"] for e in stored] == got
    assert session["stored_tokens"] == sum(e["tokens"] for e in stored)
