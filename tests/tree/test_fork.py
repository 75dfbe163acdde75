"""POST /v1/sessions/{id}/fork: where it ends, what is refused, forks of forks,
retries, deleting either side of a fork (and a whole family, down to its rows),
and tenants."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from app.main import create_app
from tests import postgres
from tests.conftest import make_session
from tests.helpers import append, append_ok, assert_problem, get_session, history
from tests.ops.conftest import AUTH_SETTINGS, bearer, create_key
from tests.tree.support import (
    assert_paired,
    calling,
    context,
    db_rows,
    fork,
    fork_ok,
    navigate,
    navigate_ok,
    result,
    texts,
    users,
    whole_tree,
)


async def five(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    await make_session(client, id=sid, metadata={"who": sid})
    appended = await append_ok(client, sid, users("m1", "m2", "m3", "m4", "m5"))
    entries: list[dict[str, Any]] = appended["entries"]
    return entries


async def contents(client: httpx.AsyncClient, sid: str) -> list[Any]:
    return [e["message"]["content"] for e in await history(client, sid)]


# --- where a fork ends, and what is refused ------------------------------------------


async def test_a_fork_ends_at_the_sources_leaf_by_default(client: httpx.AsyncClient) -> None:
    entries = await five(client, "s")
    source = await get_session(client, "s")
    r = await fork(client, "s")
    assert r.status_code == 201, r.text
    forked = r.json()
    fid = forked["id"]
    assert fid.startswith("ses_")
    assert r.headers["location"] == f"/v1/sessions/{fid}"
    assert r.headers["etag"] == f'"{forked["version"]}"'
    assert forked == await get_session(client, fid)
    assert forked["entry_count"] == 5
    assert forked["metadata"] == {"who": "s"}  # the source's, by default
    for name in ("model", "config", "stored_tokens", "context_tokens", "context_window"):
        assert forked[name] == source[name], name
    assert texts(await context(client, fid)) == ["m1", "m2", "m3", "m4", "m5"]
    assert await contents(client, fid) == ["m1", "m2", "m3", "m4", "m5"]
    # The same stored entries, ids and all.
    assert [e["id"] for e in await history(client, fid)] == [e["id"] for e in entries]
    tree = await whole_tree(client, fid)
    assert (tree["leaf_seq"], tree["leaf_id"]) == (5, entries[4]["id"])
    # The source did not change.
    assert await get_session(client, "s") == source


async def test_a_fork_at_a_seq_with_its_own_id_and_metadata(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    forked = await fork_ok(client, "s", at_seq=2, id="f", metadata={"who": "fork"})
    assert (forked["id"], forked["entry_count"], forked["metadata"]) == ("f", 2, {"who": "fork"})
    assert texts(await context(client, "f")) == ["m1", "m2"]
    # It grows on its own, with seqs after its fork point.
    appended = await append_ok(client, "f", users("f3"))
    assert [e["seq"] for e in appended["entries"]] == [3]
    assert await contents(client, "f") == ["m1", "m2", "f3"]
    assert await contents(client, "s") == ["m1", "m2", "m3", "m4", "m5"]


async def test_what_a_fork_refuses(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    await make_session(client, id="taken")
    await make_session(client, id="empty")
    before = await get_session(client, "s")
    r = await fork(client, "s", id="taken")
    assert_problem(r, 409, "taken")
    r = await fork(client, "s", id="s")
    assert_problem(r, 409, "s")
    r = await fork(client, "s", at_seq=6)
    assert_problem(r, 422, "at_seq")
    for bad in ({"at_seq": 0}, {"at_seq": "x"}, {"id": ""}, {"metadata": 3}, {"nope": 1}):
        assert_problem(await fork(client, "s", **bad), 422, next(iter(bad)))
    r = await fork(client, "empty", id="f")
    assert_problem(r, 409, "empty")
    r = await fork(client, "nope", id="f")
    assert_problem(r, 404, "nope")
    # Nothing was made, and the source did not move.
    assert (await client.get("/v1/sessions/f")).status_code == 404
    listed = (await client.get("/v1/sessions")).json()["sessions"]
    assert sorted(s["id"] for s in listed) == ["empty", "s", "taken"]
    assert await get_session(client, "s") == before
    # After a navigation back, the abandoned seqs are beyond the leaf.
    await navigate_ok(client, "s", seq=2)
    assert_problem(await fork(client, "s", at_seq=3), 422, "at_seq")


async def test_a_fork_of_a_fork(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    await fork_ok(client, "s", at_seq=3, id="f")
    await append_ok(client, "f", users("f4", "f5"))
    await fork_ok(client, "f", at_seq=4, id="g")
    await append_ok(client, "g", users("g5"))
    await append_ok(client, "f", users("f6"))
    assert await contents(client, "g") == ["m1", "m2", "m3", "f4", "g5"]
    assert await contents(client, "f") == ["m1", "m2", "m3", "f4", "f5", "f6"]
    assert await contents(client, "s") == ["m1", "m2", "m3", "m4", "m5"]
    # g's tree: the path it came from, and its own branch.
    tree = await whole_tree(client, "g")
    assert sorted(e["label"] for e in tree["entries"]) == ["f4", "g5", "m1", "m2", "m3"]
    assert all(e["on_path"] for e in tree["entries"])
    # g reaches m2 (before both fork points) and writes a branch there.
    m2 = next(e for e in tree["entries"] if e["label"] == "m2")
    await navigate_ok(client, "g", entry_id=m2["id"])
    await append_ok(client, "g", users("g3"))
    assert await contents(client, "g") == ["m1", "m2", "g3"]
    assert await contents(client, "f") == ["m1", "m2", "m3", "f4", "f5", "f6"]
    assert await contents(client, "s") == ["m1", "m2", "m3", "m4", "m5"]


# --- retries -----------------------------------------------------------------------


async def test_an_idempotent_fork_makes_one_session(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    key = {"Idempotency-Key": "fork-1"}
    first = await fork(client, "s", headers=key, at_seq=3)
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    again = await fork(client, "s", headers=key, at_seq=3)
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json() == first.json()
    assert again.headers["location"] == first.headers["location"]
    listed = (await client.get("/v1/sessions")).json()["sessions"]
    assert sorted(s["id"] for s in listed) == sorted(["s", first.json()["id"]])
    # The same key with another body is refused.
    for other in ({"at_seq": 2}, {"at_seq": 3, "id": "x"}):
        assert_problem(await fork(client, "s", headers=key, **other), 422, "Idempotency-Key")
    assert (await client.get("/v1/sessions/x")).status_code == 404
    assert len((await client.get("/v1/sessions")).json()["sessions"]) == 2


async def test_concurrent_retries_of_one_fork_make_one_session(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    results = await asyncio.gather(
        *(fork(client, "s", headers={"Idempotency-Key": "k"}) for _ in range(5))
    )
    assert all(r.status_code == 201 for r in results), [r.text for r in results]
    assert all(r.json() == results[0].json() for r in results)
    assert len((await client.get("/v1/sessions")).json()["sessions"]) == 2


# --- deleting ----------------------------------------------------------------------


async def test_deleting_the_source_keeps_the_fork_whole(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    await append_ok(
        client,
        "s",
        [{"role": "user", "content": "Go."}, calling("c1"), result("c1", "out"), *users("m4")],
    )
    await fork_ok(client, "s", at_seq=3, id="f")
    await append_ok(client, "f", users("f4"))
    ctx = {fmt: await context(client, "f", fmt) for fmt in ("openai", "anthropic")}
    stored = await history(client, "f")
    session = await get_session(client, "f")
    assert (await client.delete("/v1/sessions/s")).status_code == 204
    assert (await client.get("/v1/sessions/s")).status_code == 404
    for fmt in ("openai", "anthropic"):
        assert (await context(client, "f", fmt))["messages"] == ctx[fmt]["messages"]
    assert await history(client, "f") == stored
    assert await get_session(client, "f") == session
    await assert_paired(client, "f")
    # It still grows, and navigates to the entries it shares with the deleted source.
    await append_ok(client, "f", users("f5"))
    await navigate_ok(client, "f", entry_id=stored[1]["id"])
    await append_ok(client, "f", [result("c1", "again")])
    assert await contents(client, "f") == ["Go.", "Looking.", "again"]
    await assert_paired(client, "f")


async def test_deleting_the_fork_keeps_the_source_whole(client: httpx.AsyncClient) -> None:
    await five(client, "s")
    await fork_ok(client, "s", at_seq=3, id="f")
    await append_ok(client, "f", users("f4"))
    await navigate_ok(client, "f", seq=2)
    await append_ok(client, "f", users("f3"))
    stored = await history(client, "s")
    session = await get_session(client, "s")
    tree = await whole_tree(client, "s")
    assert (await client.delete("/v1/sessions/f")).status_code == 204
    assert await history(client, "s") == stored
    assert await get_session(client, "s") == session
    assert await whole_tree(client, "s") == tree
    await append_ok(client, "s", users("m6"))
    assert await contents(client, "s") == ["m1", "m2", "m3", "m4", "m5", "m6"]


FAMILY_TABLES = ("entry", "tool_call", "branch")


async def family_rows(db_url: str, family: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for table in FAMILY_TABLES:
        rows = await db_rows(
            db_url, f"SELECT count(*) AS n FROM {table} WHERE session_id = $1", family
        )
        counts[table] = rows[0]["n"]
    return counts


async def test_deleting_every_session_of_a_family_leaves_no_rows(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await make_session(client, id="s")
    await append_ok(
        client, "s", [{"role": "user", "content": "Go."}, calling("c1"), result("c1", "out")]
    )
    await navigate_ok(client, "s", seq=2)
    await append_ok(client, "s", [result("c1", "other")])
    await fork_ok(client, "s", at_seq=2, id="f")
    await append_ok(client, "f", [result("c1", "fork's")])
    await fork_ok(client, "f", id="g")
    await append_ok(client, "g", users("g4"))
    await make_session(client, id="bystander")
    await append_ok(client, "bystander", [{"role": "user", "content": "Go."}, calling("c1")])
    bystander = await family_rows(db_url, "bystander")

    counts = await family_rows(db_url, "s")
    assert counts["entry"] == 6
    assert counts["tool_call"] >= 3
    assert counts["branch"] >= 4
    families = await db_rows(
        db_url, "SELECT DISTINCT family_id FROM session WHERE id <> $1", "bystander"
    )
    assert [r["family_id"] for r in families] == ["s"]

    # Deleted in an order where each delete leaves rows another session reaches.
    assert (await client.delete("/v1/sessions/s")).status_code == 204
    assert (await family_rows(db_url, "s"))["entry"] > 0
    assert await contents(client, "g") == ["Go.", "Looking.", "fork's", "g4"]
    assert (await client.delete("/v1/sessions/g")).status_code == 204
    assert await contents(client, "f") == ["Go.", "Looking.", "fork's"]
    assert (await client.delete("/v1/sessions/f")).status_code == 204
    assert await family_rows(db_url, "s") == {t: 0 for t in FAMILY_TABLES}
    marks = await db_rows(
        db_url, "SELECT count(*) AS n FROM prune_mark WHERE session_id = ANY($1)", ["s", "f", "g"]
    )
    assert marks[0]["n"] == 0
    # Another family is untouched.
    assert await family_rows(db_url, "bystander") == bystander
    assert await contents(client, "bystander") == ["Go.", "Looking."]


async def test_a_fork_named_like_a_deleted_session_of_its_family_owns_nothing_of_it(
    client: httpx.AsyncClient,
) -> None:
    entries = await five(client, "s")
    await fork_ok(client, "s", at_seq=2, id="f")
    await append_ok(client, "f", users("f3"))
    assert (await client.delete("/v1/sessions/s")).status_code == 204
    # A fork of f, named as the deleted source was.
    forked = await fork_ok(client, "f", id="s")
    assert texts(await context(client, "s")) == ["m1", "m2", "f3"]
    assert forked["entry_count"] == 3
    # m5 was the deleted session's, never on this one's path.
    r = await navigate(client, "s", entry_id=entries[4]["id"])
    assert_problem(r, 422, "entry_id")
    assert texts(await context(client, "s")) == ["m1", "m2", "f3"]
    # Its tree: the path it was forked from, f3 included, and nothing of the old "s".
    tree = await whole_tree(client, "s")
    assert sorted(e["label"] for e in tree["entries"]) == ["f3", "m1", "m2"]


# --- tenants -----------------------------------------------------------------------


@pytest.fixture
async def keyed(db_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app that wants API keys (each call passes its own)."""
    app = create_app(AUTH_SETTINGS, database_url=db_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def test_another_tenant_reaches_nothing_of_a_tree(
    keyed: httpx.AsyncClient, db_url: str
) -> None:
    a, b = (
        bearer(await create_key(db_url, "tenant-a")),
        bearer(await create_key(db_url, "tenant-b")),
    )
    # The same session id in both tenants: only the key tells them apart.
    for who in (a, b):
        r = await keyed.post("/v1/sessions", json={"id": "s", "model": "gpt-4o"}, headers=who)
        assert r.status_code == 201, r.text
    r = await keyed.post(
        "/v1/sessions/s/messages", json={"messages": users("a1", "a2", "a3")}, headers=a
    )
    assert r.status_code == 201, r.text
    a_entries = r.json()["entries"]
    r = await keyed.post("/v1/sessions/s/messages", json={"messages": users("b1")}, headers=b)
    assert r.status_code == 201, r.text
    await keyed.post("/v1/sessions", json={"id": "only-a", "model": "gpt-4o"}, headers=a)
    r = await keyed.post("/v1/sessions/only-a/messages", json={"messages": users("x")}, headers=a)
    assert r.status_code == 201, r.text
    a_before = (await keyed.get("/v1/sessions/s", headers=a)).json()
    a_tree = (await keyed.get("/v1/sessions/s/tree", headers=a)).json()
    b_before = (await keyed.get("/v1/sessions/s", headers=b)).json()

    # B cannot read, move or fork A's session.
    for method, path, body in (
        ("GET", "/v1/sessions/only-a/tree", None),
        ("POST", "/v1/sessions/only-a/navigate", {"seq": 1}),
        ("POST", "/v1/sessions/only-a/fork", {"id": "stolen"}),
    ):
        r = await keyed.request(method, path, json=body, headers=b)
        doc = assert_problem(r, 404, "only-a")
        assert "tenant" not in doc["detail"]
    # Nor reach A's entries from its own session of the same id.
    for entry in a_entries:
        r = await keyed.post("/v1/sessions/s/navigate", json={"entry_id": entry["id"]}, headers=b)
        assert_problem(r, 422, "entry_id")
    b_tree = (await keyed.get("/v1/sessions/s/tree", headers=b)).json()
    assert [e["label"] for e in b_tree["entries"]] == ["b1"]
    assert (await keyed.get("/v1/sessions/s", headers=b)).json() == b_before
    # A's sessions did not change, and no session "stolen" exists for either.
    assert (await keyed.get("/v1/sessions/s", headers=a)).json() == a_before
    assert (await keyed.get("/v1/sessions/s/tree", headers=a)).json() == a_tree
    for who in (a, b):
        assert (await keyed.get("/v1/sessions/stolen", headers=who)).status_code == 404
    # A forks its own, with an id B already uses: ids are per tenant.
    r = await keyed.post("/v1/sessions/s/fork", json={"id": "s2"}, headers=a)
    assert r.status_code == 201, r.text
    r = await keyed.post("/v1/sessions/s/fork", json={"id": "s2"}, headers=b)
    assert r.status_code == 201, r.text
    r = await keyed.get("/v1/sessions/s2/context", headers=b)
    assert texts(r.json()) == ["b1"]
    r = await keyed.get("/v1/sessions/s2/context", headers=a)
    assert texts(r.json()) == ["a1", "a2", "a3"]


async def test_a_tool_result_names_no_call_of_the_source_after_the_fork_point(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", users("Go."))
    await fork_ok(client, "s", id="f")
    await append_ok(client, "s", [calling("c1")])
    r = await append(client, "f", [result("c1", "not mine")])
    assert_problem(r, 422, "tool_call_id")
    assert await contents(client, "f") == ["Go."]


async def lock_waits(db_url: str, count: int) -> None:
    """Until ``count`` statements of the database wait on a lock."""
    for _ in range(500):
        rows = await db_rows(
            db_url,
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        if rows[0]["n"] >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{count} statements never waited on a lock")


async def test_a_fork_racing_a_create_of_its_new_id_is_409(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", users("hi"))
    # Hold inserts into branch: the create has inserted its (uncommitted) session row
    # and waits; the fork finds no session "x", and its insert waits on the create's.
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        async with conn.transaction():
            await conn.execute("LOCK TABLE branch IN SHARE MODE")
            create = asyncio.ensure_future(
                client.post("/v1/sessions", json={"id": "x", "model": "gpt-4o"})
            )
            await lock_waits(db_url, 1)
            forked = asyncio.ensure_future(fork(client, "s", id="x"))
            await lock_waits(db_url, 2)
    finally:
        await conn.close()
    created = await create
    assert created.status_code == 201, created.text
    r = await forked
    assert_problem(r, 409, "x")
    assert (await get_session(client, "x"))["entry_count"] == 0
