"""Undoing a compaction: a navigation to the entry before its summary gives back
the context as it was before it (messages, tokens, counters), the summary stays
in the tree off the path, and a navigation back to the summary brings the
compacted context back. Compactions run on a real worker (the app's own, with
``wait``) with the extractive summarizer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.main import create_app
from tests.compactions.helpers import conversation
from tests.conftest import make_session
from tests.helpers import append_ok, get_session, history
from tests.tree.support import (
    assert_paired,
    breakdown_total,
    context,
    fork_ok,
    navigate_ok,
    whole_tree,
)

CONFIG = {
    "compaction": {"auto": False, "keep_recent_tokens": 3_000},
    "prune": {"auto": False},
}


@pytest.fixture
async def worker_client(db_url: str, settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """A client of an app running one compaction worker."""
    app = create_app(settings.model_copy(update={"compaction_workers": 1}), database_url=db_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


async def compacted(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await client.post(
        f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive", "wait": 20}
    )
    assert r.status_code == 202, r.text
    job: dict[str, Any] = r.json()
    assert job["status"] == "succeeded", job
    return job


def same_context(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["messages"] == b["messages"]
    assert a.get("system") == b.get("system")
    assert a["tokens"]["breakdown"] == b["tokens"]["breakdown"]
    assert a["tokens"]["estimated"] == b["tokens"]["estimated"]
    assert a["compaction"] == b["compaction"]


async def test_navigating_before_a_compaction_undoes_it(
    worker_client: httpx.AsyncClient,
) -> None:
    client = worker_client
    await make_session(client, id="u", config=CONFIG)
    for batch in conversation(12):
        await append_ok(client, "u", batch)
    before = await get_session(client, "u")
    ctx_before = {fmt: await context(client, "u", fmt) for fmt in ("openai", "anthropic")}
    assert ctx_before["openai"]["compaction"] is None

    job = await compacted(client, "u")
    entry_seq = job["entry_seq"]
    assert entry_seq == before["entry_count"] + 1
    after = await get_session(client, "u")
    assert after["compaction_count"] == before["compaction_count"] + 1
    assert after["context_tokens"] < before["context_tokens"]
    ctx_after = {fmt: await context(client, "u", fmt) for fmt in ("openai", "anthropic")}
    assert ctx_after["openai"]["compaction"]["entry_seq"] == entry_seq
    summary_entry = (await history(client, "u"))[-1]
    assert (summary_entry["kind"], summary_entry["seq"]) == ("compaction", entry_seq)

    # Undo: the entry before the summary.
    moved = await navigate_ok(client, "u", seq=entry_seq - 1)
    assert (moved["status"], moved["leaf_seq"], moved["abandoned_seqs"]) == (
        "moved",
        entry_seq - 1,
        1,
    )
    undone = await get_session(client, "u")
    assert undone["compaction_count"] == before["compaction_count"]
    assert undone["context_tokens"] == before["context_tokens"]
    assert undone["stored_tokens"] == before["stored_tokens"]
    assert undone["entry_count"] == before["entry_count"]
    for fmt in ("openai", "anthropic"):
        now = await context(client, "u", fmt)
        same_context(now, ctx_before[fmt])
        assert breakdown_total(now) == undone["context_tokens"]
    await assert_paired(client, "u")
    assert [e["seq"] for e in await history(client, "u")] == list(range(1, entry_seq))

    # The summary stays in the tree, off the path.
    tree = await whole_tree(client, "u")
    summary = next(e for e in tree["entries"] if e["kind"] == "compaction")
    assert summary["id"] == summary_entry["id"]
    assert summary["seq"] == entry_seq
    assert summary["on_path"] is False
    assert summary["leaf"] is False
    assert tree["leaf_seq"] == entry_seq - 1
    parent = next(e for e in tree["entries"] if e["id"] == summary["parent_id"])
    assert (parent["seq"], parent["on_path"], parent["leaf"]) == (entry_seq - 1, True, True)

    # And back: the compacted context returns.
    back = await navigate_ok(client, "u", entry_id=summary["id"])
    assert (back["status"], back["leaf_seq"]) == ("moved", entry_seq)
    again = await get_session(client, "u")
    assert again["compaction_count"] == after["compaction_count"]
    assert again["context_tokens"] == after["context_tokens"]
    for fmt in ("openai", "anthropic"):
        same_context(await context(client, "u", fmt), ctx_after[fmt])
    await assert_paired(client, "u")


async def test_appending_after_an_undo_keeps_the_whole_history(
    worker_client: httpx.AsyncClient,
) -> None:
    """An undone compaction stays undone: the next append extends the full
    history, a fork there has it too, and a new compaction can run."""
    client = worker_client
    await make_session(client, id="u", config=CONFIG)
    for batch in conversation(12):
        await append_ok(client, "u", batch)
    before = await get_session(client, "u")
    job = await compacted(client, "u")
    await navigate_ok(client, "u", seq=job["entry_seq"] - 1)
    appended = await append_ok(client, "u", [{"role": "user", "content": "Carry on."}])
    assert [e["seq"] for e in appended["entries"]] == [job["entry_seq"]]
    session = await get_session(client, "u")
    assert session["compaction_count"] == 0
    assert session["context_tokens"] == before["context_tokens"] + appended["entries"][0]["tokens"]
    ctx = await context(client, "u")
    assert ctx["compaction"] is None
    assert ctx["messages"][-1] == {"role": "user", "content": "Carry on."}
    assert breakdown_total(ctx) == session["context_tokens"]

    forked = await fork_ok(client, "u", id="f")
    assert forked["compaction_count"] == 0
    assert forked["context_tokens"] == session["context_tokens"]
    assert (await context(client, "f"))["messages"] == ctx["messages"]

    second = await compacted(client, "u")
    assert second["entry_seq"] == job["entry_seq"] + 1
    assert (await get_session(client, "u"))["compaction_count"] == 1
    assert (await get_session(client, "f"))["compaction_count"] == 0
    await assert_paired(client, "u")


async def test_forks_of_a_compacted_session(worker_client: httpx.AsyncClient) -> None:
    """A fork after the summary has the compacted context; one before it has the
    whole history; both outlive the source and compact on their own."""
    client = worker_client
    await make_session(client, id="s", config=CONFIG)
    for batch in conversation(12):
        await append_ok(client, "s", batch)
    before = await context(client, "s")
    job = await compacted(client, "s")
    source = await get_session(client, "s")
    after = await context(client, "s")

    late = await fork_ok(client, "s", id="late")
    assert late["compaction_count"] == source["compaction_count"] == 1
    assert late["context_tokens"] == source["context_tokens"]
    assert (await context(client, "late"))["messages"] == after["messages"]
    early = await fork_ok(client, "s", id="early", at_seq=job["entry_seq"] - 1)
    assert early["compaction_count"] == 0
    assert (await context(client, "early"))["messages"] == before["messages"]

    assert (await client.delete("/v1/sessions/s")).status_code == 204
    for sid, want in (("late", after), ("early", before)):
        ctx = await context(client, sid)
        assert ctx["messages"] == want["messages"], sid
        assert breakdown_total(ctx) == (await get_session(client, sid))["context_tokens"]
        await assert_paired(client, sid)
    # Each compacts on its own: the late one after the source's summary.
    for batch in conversation(16)[len(conversation(12)) :]:
        for sid in ("late", "early"):
            await append_ok(client, sid, batch)
    for sid in ("late", "early"):
        done = await compacted(client, sid)
        session = await get_session(client, sid)
        assert session["compaction_count"] == (2 if sid == "late" else 1), sid
        ctx = await context(client, sid)
        assert ctx["compaction"]["entry_seq"] == done["entry_seq"]
        assert breakdown_total(ctx) == session["context_tokens"]
        await assert_paired(client, sid)
        r = await client.get(f"/v1/sessions/{sid}/compactions")
        assert r.status_code == 200, r.text


async def test_a_navigation_cancels_a_queued_compaction(client: httpx.AsyncClient) -> None:
    """The job was planned on the old path (the app of ``client`` runs no worker)."""
    await make_session(client, id="q", config=CONFIG)
    for batch in conversation(12):
        await append_ok(client, "q", batch)
    r = await client.post("/v1/sessions/q/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    job = r.json()
    assert (await get_session(client, "q"))["active_compaction_id"] == job["id"]
    await navigate_ok(client, "q", seq=5)
    session = await get_session(client, "q")
    assert session["active_compaction_id"] is None
    r = await client.get(f"/v1/sessions/q/compactions/{job['id']}")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert session["compaction_count"] == 0
    assert len(await history(client, "q")) == 5
