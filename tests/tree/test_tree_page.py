"""GET /v1/sessions/{id}/tree: pages that walk the whole tree exactly once, bad
cursors and limits, each entry's label, parent, children, on_path and leaf,
and the active path as runs of seqs per branch."""

from __future__ import annotations

import base64
from typing import Any

import httpx

from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, tool_call
from tests.tree.support import fork_ok, navigate_ok, result, tree_page, users, whole_tree

LONG = "  Fix   the parser,\n\tplease:  " + "the week-53 case " * 20


async def branched(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    """A tree of four branches; its entries by label (every label differs)::

    m1 ─ m2 ─ m3 ─ m4 ─ m5          branch 0
     │         └─ b4 ─ b5           branch B1 (after m3)
     │              └─ c5           branch B2 (after b4)
     └─ d2                          branch B3 (after m1): the active one
    """
    await make_session(client, id="t")
    await append_ok(client, "t", users("m1", "m2", "m3", "m4", "m5"))
    await navigate_ok(client, "t", seq=3)
    await append_ok(client, "t", users("b4", "b5"))
    await navigate_ok(client, "t", seq=4)
    await append_ok(client, "t", users("c5"))
    await navigate_ok(client, "t", seq=1)
    await append_ok(client, "t", users("d2"))
    tree = await whole_tree(client, "t")
    by_label = {e["label"]: e for e in tree["entries"]}
    assert len(by_label) == len(tree["entries"]) == 9
    return by_label


async def test_pages_walk_the_tree_exactly_once(client: httpx.AsyncClient) -> None:
    everything = await branched(client)
    whole = await tree_page(client, "t", limit=1000)
    assert whole["next_cursor"] is None
    order = [(e["branch"], e["seq"]) for e in whole["entries"]]
    assert order == sorted(order)
    for limit in (1, 2, 4, 8, 9, 10):
        seen: list[str] = []
        cursor: str | None = None
        pages = 0
        while True:
            params: dict[str, Any] = {"limit": limit}
            if cursor is not None:
                params["cursor"] = cursor
            page = await tree_page(client, "t", **params)
            pages += 1
            assert len(page["entries"]) <= limit
            seen.extend(e["id"] for e in page["entries"])
            # Every page tells the same leaf and path.
            assert (page["leaf_seq"], page["leaf_id"], page["path"]) == (
                whole["leaf_seq"],
                whole["leaf_id"],
                whole["path"],
            )
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert page["entries"], "a cursor after an empty page"
        assert seen == [e["id"] for e in whole["entries"]], limit
        assert len(set(seen)) == len(everything)
        assert pages == -(-len(everything) // limit), limit  # no empty last page


async def test_bad_cursors_and_limits_are_422(client: httpx.AsyncClient) -> None:
    await branched(client)

    def encoded(raw: str) -> str:
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    for cursor in (
        "garbage!",
        "%%%",
        encoded("1.2.3"),
        encoded("a.b"),
        encoded("-1.2"),
        encoded(f"{2**63}.1"),
        encoded("1"),
        base64.urlsafe_b64encode(b"\xff\xfe.1").decode(),
        "x" * 513,
    ):
        r = await client.get("/v1/sessions/t/tree", params={"cursor": cursor})
        assert_problem(r, 422, "cursor")
    for limit in (0, -1, 1001, "ten"):
        r = await client.get("/v1/sessions/t/tree", params={"limit": limit})
        assert_problem(r, 422, "limit")
    # A cursor past the end is an empty last page.
    page = await tree_page(client, "t", cursor=encoded(f"{2**62}.1"))
    assert (page["entries"], page["next_cursor"]) == ([], None)


async def test_parents_children_and_the_active_path(client: httpx.AsyncClient) -> None:
    e = await branched(client)
    parent = {label: entry["parent_id"] for label, entry in e.items()}
    assert parent["m1"] is None
    for child, of in (("m2", "m1"), ("m5", "m4"), ("b4", "m3"), ("b5", "b4"), ("c5", "b4")):
        assert parent[child] == e[of]["id"], child
    assert parent["d2"] == e["m1"]["id"]
    children = {label: entry["children"] for label, entry in e.items()}
    assert children == {
        "m1": 2, "m2": 1, "m3": 2, "m4": 1, "m5": 0, "b4": 2, "b5": 0, "c5": 0, "d2": 0
    }  # fmt: skip
    # Depths: seq is the depth on the entry's path.
    assert {label: entry["seq"] for label, entry in e.items()} == {
        "m1": 1, "m2": 2, "m3": 3, "m4": 4, "m5": 5, "b4": 4, "b5": 5, "c5": 5, "d2": 2
    }  # fmt: skip
    branch = {label: entry["branch"] for label, entry in e.items()}
    assert branch["m1"] == branch["m5"] == 0
    assert branch["b4"] == branch["b5"]
    assert len({branch["m1"], branch["b4"], branch["c5"], branch["d2"]}) == 4

    page = await whole_tree(client, "t")
    assert (page["leaf_seq"], page["leaf_id"]) == (2, e["d2"]["id"])
    assert page["path"] == [
        {"branch": 0, "from_seq": 1, "to_seq": 1},
        {"branch": branch["d2"], "from_seq": 2, "to_seq": 2},
    ]
    assert_path_marks(page, {"m1", "d2"}, "d2")

    # To c5: the path runs through three branches.
    await navigate_ok(client, "t", entry_id=e["c5"]["id"])
    page = await whole_tree(client, "t")
    assert (page["leaf_seq"], page["leaf_id"]) == (5, e["c5"]["id"])
    assert page["path"] == [
        {"branch": 0, "from_seq": 1, "to_seq": 3},
        {"branch": branch["b4"], "from_seq": 4, "to_seq": 4},
        {"branch": branch["c5"], "from_seq": 5, "to_seq": 5},
    ]
    assert_path_marks(page, {"m1", "m2", "m3", "b4", "c5"}, "c5")
    # To m2, in the middle of branch 0: the path is that branch's first run.
    await navigate_ok(client, "t", entry_id=e["m2"]["id"])
    page = await whole_tree(client, "t")
    assert page["path"][0] == {"branch": 0, "from_seq": 1, "to_seq": 2}
    assert [s["to_seq"] for s in page["path"]][-1] == 2
    assert_path_marks(page, {"m1", "m2"}, "m2")
    # Nothing of the tree was lost on the way.
    assert len(page["entries"]) == 9


def assert_path_marks(page: dict[str, Any], on_path: set[str], leaf: str) -> None:
    entries = page["entries"]
    assert {e["label"] for e in entries if e["on_path"]} == on_path
    assert [e["label"] for e in entries if e["leaf"]] == [leaf]
    # The on-path entries are exactly the path's runs.
    runs = {(s["branch"], q) for s in page["path"] for q in range(s["from_seq"], s["to_seq"] + 1)}
    assert {(e["branch"], e["seq"]) for e in entries if e["on_path"]} == runs


async def test_labels(client: httpx.AsyncClient) -> None:
    await make_session(client, id="l")
    await append_ok(
        client,
        "l",
        [
            {"role": "system", "content": "You are careful."},
            {"role": "user", "content": LONG},
            {"role": "assistant", "content": None, "tool_calls": [tool_call("c1", "read")]},
            result("c1", "def parse(x):\n    return x"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("c2", "grep"), tool_call("c3", "sed")],
            },
            result("c2", "3 matches"),
            result("c3", "done"),
            {"role": "assistant", "content": "Says why.", "tool_calls": [tool_call("c4", "bash")]},
            result("c4", "ok"),
        ],
    )
    entries = (await tree_page(client, "l"))["entries"]
    labels = [e["label"] for e in entries]
    assert labels[0] == "You are careful."
    assert labels[1] == " ".join(LONG.split())[:100]
    assert len(labels[1]) == 100
    assert labels[2] == "calls read"
    assert labels[3] == "def parse(x): return x"
    assert labels[4] == "calls grep, sed"
    assert labels[5:7] == ["3 matches", "done"]
    assert labels[7] == "Says why."
    assert [e["role"] for e in entries] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "tool", "assistant", "tool"
    ]  # fmt: skip
    assert all(e["kind"] == "message" for e in entries)
    assert all(e["tokens"] > 0 for e in entries)
    assert not any(e["pinned"] for e in entries)


async def test_a_forks_tree_and_its_sources(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", users("m1", "m2", "m3", "m4"))
    await fork_ok(client, "s", at_seq=2, id="f")
    await append_ok(client, "f", users("f3"))
    await navigate_ok(client, "f", seq=1)
    await append_ok(client, "f", users("g2"))

    source = {e["label"]: e for e in (await whole_tree(client, "s"))["entries"]}
    assert sorted(source) == ["m1", "m2", "m3", "m4"]
    assert source["m2"]["children"] == 1  # the fork's f3 is not in this tree
    assert source["m1"]["children"] == 1
    assert all(e["on_path"] for e in source.values())

    page = await whole_tree(client, "f")
    mine = {e["label"]: e for e in page["entries"]}
    assert sorted(mine) == ["f3", "g2", "m1", "m2"]
    assert mine["m1"]["children"] == 2
    assert mine["m2"]["children"] == 1
    assert {k for k, v in mine.items() if v["on_path"]} == {"m1", "g2"}
    assert mine["f3"]["parent_id"] == mine["m2"]["id"]
    assert page["path"] == [
        {"branch": 0, "from_seq": 1, "to_seq": 1},
        {"branch": mine["g2"]["branch"], "from_seq": 2, "to_seq": 2},
    ]


async def test_an_empty_sessions_tree(client: httpx.AsyncClient) -> None:
    await make_session(client, id="e")
    page = await tree_page(client, "e")
    assert page == {"entries": [], "leaf_seq": 0, "leaf_id": None, "path": [], "next_cursor": None}
