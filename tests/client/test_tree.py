"""The client's tree methods (get_tree, navigate, fork) against a real compactd over
HTTP, each test once with :class:`AsyncCompactd` and once with :class:`Compactd`
(wrapped as :class:`~tests.client.test_client.Awaited`): a navigation back and an
append grow a new branch, a fork grows on its own, the tree comes a page at a time,
a navigation that summarizes waits for its branch summary, and the ``Idempotency-Key``
and ``If-Match`` each method takes reach the server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any, cast

import pytest
from compactd_client import (
    AsyncCompactd,
    Compactd,
    ConflictError,
    InvalidRequestError,
    PreconditionFailedError,
)
from compactd_client.types import Compaction, StoredEntry

from tests.client.relay import Drop, Relay, relay_to
from tests.client.test_client import MANUAL, Awaited
from tests.upstream_server import Upstream


def users(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text} for text in texts]


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages]


@pytest.fixture(params=["async", "sync"])
async def api(request: pytest.FixtureRequest, compactd_url: str) -> AsyncIterator[AsyncCompactd]:
    """A client of this test's compactd: the async one, or the sync one awaited."""
    if request.param == "async":
        async with AsyncCompactd(compactd_url) as client:
            yield client
    else:
        with Compactd(compactd_url) as sync:
            yield cast(AsyncCompactd, Awaited(sync))


async def five(api: AsyncCompactd, sid: str, **config: Any) -> list[StoredEntry]:
    """A session of five user messages m1..m5; their stored entries."""
    await api.create_session("gpt-4o", id=sid, config={**MANUAL, **config})
    return (await api.append_messages(sid, users("m1", "m2", "m3", "m4", "m5")))["entries"]


async def context_texts(api: AsyncCompactd, sid: str) -> list[str]:
    return texts((await api.get_context(sid))["messages"])


async def test_a_navigation_back_and_an_append_grow_a_new_branch(api: AsyncCompactd) -> None:
    entries = await five(api, "grow")
    before = await api.get_session("grow")

    with pytest.raises(PreconditionFailedError) as stale:
        await api.navigate("grow", seq=2, if_match=before["version"] - 1)
    assert stale.value.body["current_version"] == before["version"]
    assert await context_texts(api, "grow") == ["m1", "m2", "m3", "m4", "m5"]

    moved = await api.navigate("grow", seq=2, if_match=before["version"])
    assert moved["status"] == "moved"
    assert (moved["leaf_seq"], moved["leaf_id"]) == (2, entries[1]["id"])
    assert moved["abandoned_seqs"] == 3
    assert moved["branch_summary"] is None
    assert moved["session"]["version"] == before["version"] + 1
    assert moved["session"]["entry_count"] == 2
    assert moved["session"] == await api.get_session("grow")
    again = await api.navigate("grow", entry_id=entries[1]["id"])
    assert (again["status"], again["abandoned_seqs"]) == ("unchanged", 0)

    # The next append goes after the leaf: seq 3 of a new branch.
    b3 = await api.append_messages("grow", users("b3"), if_match=again["session"]["version"])
    assert [e["seq"] for e in b3["entries"]] == [3]
    assert await context_texts(api, "grow") == ["m1", "m2", "b3"]
    history = (await api.list_messages("grow"))["entries"]
    assert [e["message"]["content"] for e in history] == ["m1", "m2", "b3"]

    tree = await api.get_tree("grow")
    by_id = {e["id"]: e for e in tree["entries"]}
    assert len(by_id) == 6  # the old branch stays
    assert [e["id"] for e in tree["entries"] if e["on_path"]] == [
        entries[0]["id"],
        entries[1]["id"],
        b3["entries"][0]["id"],
    ]
    assert [e["id"] for e in tree["entries"] if e["leaf"]] == [b3["entries"][0]["id"]]
    assert (tree["leaf_seq"], tree["leaf_id"]) == (3, b3["entries"][0]["id"])
    assert by_id[entries[1]["id"]]["children"] == 2
    assert by_id[b3["entries"][0]["id"]]["parent_id"] == entries[1]["id"]
    new_branch = by_id[b3["entries"][0]["id"]]["branch"]
    assert new_branch != by_id[entries[2]["id"]]["branch"]
    assert [(p["from_seq"], p["to_seq"]) for p in tree["path"]] == [(1, 2), (3, 3)]
    assert tree["path"][-1]["branch"] == new_branch

    # Back to the old branch's end, by its entry's id: only b3 is left behind.
    old = await api.navigate("grow", entry_id=entries[4]["id"])
    assert (old["status"], old["leaf_seq"], old["abandoned_seqs"]) == ("moved", 5, 1)
    assert await context_texts(api, "grow") == ["m1", "m2", "m3", "m4", "m5"]

    with pytest.raises(InvalidRequestError) as beyond:
        await api.navigate("grow", seq=6)
    assert [e["field"] for e in beyond.value.errors] == ["seq"], beyond.value.body


async def test_a_navigation_retried_with_its_key_moves_once(api: AsyncCompactd) -> None:
    await five(api, "once")
    first = await api.navigate("once", seq=2, idempotency_key="back-to-m2")
    await api.append_messages("once", users("b3"))
    # The same key answers the first answer, and does not move again (which would
    # leave b3 behind).
    replayed = await api.navigate("once", seq=2, idempotency_key="back-to-m2")
    assert replayed == first
    assert await context_texts(api, "once") == ["m1", "m2", "b3"]
    # Without the key it is a navigation of its own.
    fresh = await api.navigate("once", seq=2)
    assert (fresh["status"], fresh["abandoned_seqs"]) == ("moved", 1)
    assert await context_texts(api, "once") == ["m1", "m2"]


async def test_a_fork_grows_on_its_own(api: AsyncCompactd) -> None:
    entries = await five(api, "source")
    await api.update_session("source", {"metadata": {"team": "a"}})

    forked = await api.fork("source", at_seq=3, id="forked", metadata={"team": "b"})
    assert forked["id"] == "forked"
    assert forked["metadata"] == {"team": "b"}
    assert forked["model"] == "gpt-4o"
    assert forked["config"]["compaction"]["auto"] is False  # the source's
    assert forked["entry_count"] == 3
    assert forked == await api.get_session("forked")
    assert await context_texts(api, "forked") == ["m1", "m2", "m3"]

    f4 = await api.append_messages("forked", users("f4"))
    assert [e["seq"] for e in f4["entries"]] == [4]
    assert await context_texts(api, "forked") == ["m1", "m2", "m3", "f4"]
    assert await context_texts(api, "source") == ["m1", "m2", "m3", "m4", "m5"]
    tree = await api.get_tree("forked")
    assert [e["id"] for e in tree["entries"] if e["on_path"]] == [
        *(e["id"] for e in entries[:3]),
        f4["entries"][0]["id"],
    ]

    # By default: at the source's leaf, with its metadata, under a new id.
    whole = await api.fork("source")
    assert whole["id"] not in ("source", "forked")
    assert (whole["entry_count"], whole["metadata"]) == (5, {"team": "a"})

    # A retry with the key gets the same fork, created once.
    keyed = await api.fork("source", at_seq=1, idempotency_key="fork-once")
    assert await api.fork("source", at_seq=1, idempotency_key="fork-once") == keyed
    again = await api.fork("source", at_seq=1)
    assert again["id"] != keyed["id"]

    with pytest.raises(InvalidRequestError) as beyond:
        await api.fork("source", at_seq=9)
    assert [e["field"] for e in beyond.value.errors] == ["at_seq"], beyond.value.body
    with pytest.raises(ConflictError):
        await api.fork("source", id="forked")
    await api.create_session("gpt-4o", id="empty")
    with pytest.raises(ConflictError):
        await api.fork("empty")


async def test_the_tree_comes_a_page_at_a_time(api: AsyncCompactd) -> None:
    await five(api, "paged")
    await api.navigate("paged", seq=2)
    await api.append_messages("paged", users("b3", "b4"))
    await api.navigate("paged", seq=1)
    c2 = (await api.append_messages("paged", users("c2")))["entries"][0]

    whole = await api.get_tree("paged")
    assert whole["next_cursor"] is None
    assert len(whole["entries"]) == 8
    pages = [await api.get_tree("paged", limit=3)]
    while (cursor := pages[-1]["next_cursor"]) is not None:
        pages.append(await api.get_tree("paged", limit=3, cursor=cursor))
    assert [len(p["entries"]) for p in pages] == [3, 3, 2]
    assert [e for p in pages for e in p["entries"]] == whole["entries"]
    order = [(e["branch"], e["seq"]) for e in whole["entries"]]
    assert order == sorted(order)
    assert all((p["leaf_seq"], p["leaf_id"]) == (2, c2["id"]) for p in pages)
    assert [e["label"] for e in whole["entries"] if e["on_path"]] == ["m1", "c2"]

    with pytest.raises(InvalidRequestError) as bad:
        await api.get_tree("paged", cursor="not-a-cursor")
    assert [e["field"] for e in bad.value.errors] == ["cursor"], bad.value.body
    with pytest.raises(InvalidRequestError) as small:
        await api.get_tree("paged", limit=0)
    assert [e["field"] for e in small.value.errors] == ["query.limit"]


async def finished(api: AsyncCompactd, sid: str, job_id: str) -> Compaction:
    """The compaction once the worker is done with it (30 s at most)."""
    deadline = time.monotonic() + 30
    while (job := await api.get_compaction(sid, job_id))["status"] in ("queued", "running"):
        assert time.monotonic() < deadline, job
        await asyncio.sleep(0.1)
    return job


async def test_a_navigation_that_summarizes_waits_for_its_branch_summary(
    api: AsyncCompactd, upstream: Upstream
) -> None:
    entries = await five(api, "summed")
    config = (await api.get_session("summed"))["config"]["branch_summary"]
    assert config == {"enabled": False, "reserve_tokens": 16_384}
    patched = await api.update_session("summed", {"config": {"branch_summary": {"enabled": True}}})
    assert patched["config"]["branch_summary"]["enabled"] is True

    # summarize is the session's branch_summary.enabled unless the call says otherwise.
    pending = await api.navigate("summed", seq=2, instructions="Say what m4 asked.")
    assert pending["status"] == "pending"
    assert pending["session"]["entry_count"] == 5  # nothing moved yet
    job = pending["branch_summary"]
    assert job is not None
    assert (job["abandoned_from_seq"], job["abandoned_to_seq"]) == (3, 5)

    done = await finished(api, "summed", job["id"])
    assert done["status"] == "succeeded", done
    assert done["reason"] == "branch_summary"
    details = done["details"]
    assert details is not None
    assert details["abandoned_entries"] == 3
    navigation = details["navigation"]
    assert navigation is not None
    assert (navigation["common_seq"], navigation["target_seq"]) == (2, 2)
    assert navigation["from_next_seq"] == 6
    assert any("Say what m4 asked." in r.body.decode() for r in upstream.requests)

    # The leaf is the summary, after the target; the branch left stays in the tree.
    tree = await api.get_tree("summed")
    leaf = next(e for e in tree["entries"] if e["leaf"])
    assert (leaf["seq"], leaf["kind"], leaf["parent_id"]) == (3, "branch_summary", entries[1]["id"])
    assert len(tree["entries"]) == 6
    assert (await context_texts(api, "summed"))[:2] == ["m1", "m2"]

    # Told not to summarize, it moves at once.
    moved = await api.navigate("summed", seq=1, summarize=False)
    assert (moved["status"], moved["branch_summary"]) == ("moved", None)


@pytest.fixture
def relay(compactd_url: str) -> Iterator[Relay]:
    with relay_to(compactd_url) as r:
        yield r


def test_a_navigation_whose_answer_was_lost_moves_once(compactd_url: str, relay: Relay) -> None:
    """The retry carries the first attempt's key: it gets the first answer ("moved"),
    not the answer of a second navigation ("unchanged")."""
    with Compactd(compactd_url) as direct:
        direct.create_session("gpt-4o", id="lost", config=MANUAL)
        direct.append_messages("lost", users("m1", "m2", "m3"))
    relay.script([Drop()])
    with Compactd(relay.url, backoff=0.01) as api:
        moved = api.navigate("lost", seq=1)
    assert (moved["status"], moved["abandoned_seqs"]) == ("moved", 2)
    first, retry = (seen.headers.get("idempotency-key") for seen in relay.seen)
    assert first is not None
    assert retry == first
