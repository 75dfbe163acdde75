"""Sessions with a parent (``parent_id``): the side conversations of another session
(the proxy's title requests and subagents), listed by their parent, kept when it goes."""

from __future__ import annotations

import httpx

from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session


async def test_a_child_names_its_parent_and_is_listed_by_it(client: httpx.AsyncClient) -> None:
    parent = await make_session(client, id="agent-1")
    other = await make_session(client, id="agent-2")
    assert parent["parent_id"] is None
    first = await make_session(client, id="agent-1:title", parent_id="agent-1")
    second = await make_session(client, parent_id="agent-1")
    await make_session(client, id="agent-2:task", parent_id="agent-2")
    assert first["parent_id"] == "agent-1"
    assert (await get_session(client, second["id"]))["parent_id"] == "agent-1"

    r = await client.get("/v1/sessions", params={"parent_id": "agent-1"})
    assert r.status_code == 200, r.text
    assert [s["id"] for s in r.json()["sessions"]] == ["agent-1:title", second["id"]]
    # Paged, in creation order, like any list.
    page = (await client.get("/v1/sessions", params={"parent_id": "agent-1", "limit": 1})).json()
    assert [s["id"] for s in page["sessions"]] == ["agent-1:title"]
    rest = await client.get(
        "/v1/sessions", params={"parent_id": "agent-1", "cursor": page["next_cursor"]}
    )
    assert [s["id"] for s in rest.json()["sessions"]] == [second["id"]]
    assert rest.json()["next_cursor"] is None
    none = await client.get("/v1/sessions", params={"parent_id": other["id"] + "x"})
    assert none.json()["sessions"] == []
    everything = (await client.get("/v1/sessions")).json()["sessions"]
    assert len(everything) == 5


async def test_a_parent_that_does_not_exist_is_a_422_and_creates_nothing(
    client: httpx.AsyncClient,
) -> None:
    r = await client.post(
        "/v1/sessions", json={"model": "gpt-4o", "id": "orphan", "parent_id": "nobody"}
    )
    assert_problem(r, 422, "nobody", "parent_id")
    assert (await client.get("/v1/sessions/orphan")).status_code == 404
    bad = await client.post("/v1/sessions", json={"model": "gpt-4o", "parent_id": "no spaces"})
    assert_problem(bad, 422, "parent_id")


async def test_deleting_a_parent_keeps_its_children_parentless(client: httpx.AsyncClient) -> None:
    await make_session(client, id="parent")
    child = await make_session(client, id="parent:child", parent_id="parent")
    await append_ok(client, child["id"], [{"role": "user", "content": "A title, please."}])
    assert (await client.delete("/v1/sessions/parent")).status_code == 204
    kept = await get_session(client, child["id"])
    assert kept["parent_id"] is None
    assert kept["entry_count"] == 1
    listed = await client.get("/v1/sessions", params={"parent_id": "parent"})
    assert listed.json()["sessions"] == []
    # A new session under the old id starts with no children.
    await make_session(client, id="parent")
    listed = await client.get("/v1/sessions", params={"parent_id": "parent"})
    assert listed.json()["sessions"] == []
