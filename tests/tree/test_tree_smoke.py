"""The tree's routes, end to end through the app: navigate back and write a new
branch, go back to the old one, fork, delete either."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conftest import make_session
from tests.helpers import append_ok, history


async def context(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/context")
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


async def test_navigate_back_write_a_branch_and_return(client: httpx.AsyncClient) -> None:
    await make_session(client, id="t")
    await append_ok(client, "t", [{"role": "user", "content": f"m{i}"} for i in range(1, 6)])
    r = await client.post("/v1/sessions/t/navigate", json={"seq": 3})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["leaf_seq"], body["abandoned_seqs"]) == ("moved", 3, 2)
    assert texts(await context(client, "t")) == ["m1", "m2", "m3"]
    await append_ok(client, "t", [{"role": "user", "content": "b4"}])
    assert texts(await context(client, "t")) == ["m1", "m2", "m3", "b4"]
    tree = (await client.get("/v1/sessions/t/tree")).json()
    assert len(tree["entries"]) == 6
    by_label = {e["label"]: e for e in tree["entries"]}
    assert by_label["m3"]["children"] == 2
    assert by_label["b4"]["leaf"]
    assert by_label["b4"]["on_path"]
    assert not by_label["m5"]["on_path"]
    # Back to the old leaf: the old path whole, and appends continue it.
    r = await client.post("/v1/sessions/t/navigate", json={"entry_id": by_label["m5"]["id"]})
    assert r.status_code == 200, r.text
    assert texts(await context(client, "t")) == ["m1", "m2", "m3", "m4", "m5"]
    await append_ok(client, "t", [{"role": "user", "content": "m6"}])
    assert texts(await context(client, "t")) == ["m1", "m2", "m3", "m4", "m5", "m6"]
    assert [e["message"]["content"] for e in await history(client, "t")] == [
        "m1", "m2", "m3", "m4", "m5", "m6"
    ]  # fmt: skip
    session = (await client.get("/v1/sessions/t")).json()
    assert session["entry_count"] == 6


async def test_fork_shares_the_path_and_grows_on_its_own(client: httpx.AsyncClient) -> None:
    await make_session(client, id="src")
    await append_ok(client, "src", [{"role": "user", "content": f"m{i}"} for i in range(1, 5)])
    r = await client.post("/v1/sessions/src/fork", json={"at_seq": 2, "id": "f"})
    assert r.status_code == 201, r.text
    assert r.json()["entry_count"] == 2
    assert texts(await context(client, "f")) == ["m1", "m2"]
    await append_ok(client, "f", [{"role": "user", "content": "f3"}])
    await append_ok(client, "src", [{"role": "user", "content": "m5"}])
    assert texts(await context(client, "f")) == ["m1", "m2", "f3"]
    assert texts(await context(client, "src")) == ["m1", "m2", "m3", "m4", "m5"]
    assert (await client.delete("/v1/sessions/src")).status_code == 204
    assert texts(await context(client, "f")) == ["m1", "m2", "f3"]
    # The source's id is free again, for a new family.
    await make_session(client, id="src")
    await append_ok(client, "src", [{"role": "user", "content": "new"}])
    assert texts(await context(client, "src")) == ["new"]
    assert texts(await context(client, "f")) == ["m1", "m2", "f3"]
