"""Compactions through the API with the extractive summarizer: the pivot, the
context after it, the archive, the triggers and bad input."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.main import create_app
from tests.compactions.helpers import (
    FOCUS,
    assert_the_summary_kept_the_focus,
    compaction,
    conversation,
    conversation_with_a_buried_term,
    drain,
    overflow_error,
)
from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session, history

# Nothing automatic: these tests compact by hand.
MANUAL = {
    "compaction": {"auto": False, "keep_recent_tokens": 3_000},
    "prune": {"auto": False},
}


async def fill(client: httpx.AsyncClient, sid: str, batches: list[list[dict[str, Any]]]) -> None:
    for batch in batches:
        await append_ok(client, sid, batch)


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def request(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/compactions", json=body)
    assert r.status_code == 202, r.text
    data: dict[str, Any] = r.json()
    return data


def assert_valid(ctx: dict[str, Any], fmt: str, *, pending: bool = False) -> None:
    check = check_openai_pairing if fmt == "openai" else check_anthropic_pairing
    assert check(ctx["messages"], allow_pending=pending) == []
    b = ctx["tokens"]["breakdown"]
    assert ctx["tokens"]["estimated"] <= ctx["tokens"]["budget"]
    assert b["summary"] >= 0


async def test_manual_compaction_moves_the_pivot_and_keeps_everything_stored(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="m", config=MANUAL)
    batches = conversation(24)
    await fill(client, "m", batches)
    before = await get_session(client, "m")
    stored_before = await history(client, "m")

    job = await request(client, "m")
    assert job["status"] == "queued"
    assert job["reason"] == "manual"
    assert job["auto"] is False
    assert (await get_session(client, "m"))["active_compaction_id"] == job["id"]
    assert await drain(app) == 1

    done = await compaction(client, "m", job["id"])
    assert done["status"] == "succeeded", done
    assert done["summarizer_used"] == "extractive"
    assert done["attempts"] == 1
    assert done["tokens_after"] < done["tokens_before"]
    assert "Fix the failing date parser" in done["summary"]
    assert "<read-files>" in done["summary"]
    assert "src/mod0.py" in done["details"]["read_files"]
    first_kept = done["first_kept_seq"]
    entry_seq = done["entry_seq"]
    assert entry_seq == before["entry_count"] + 1

    after = await get_session(client, "m")
    assert after["compaction_count"] == 1
    assert after["active_compaction_id"] is None
    assert after["entry_count"] == before["entry_count"] + 1
    assert after["context_tokens"] < before["context_tokens"]

    # The history: every message as it was, and the compaction entry after them.
    stored = await history(client, "m")
    assert [e["message"] for e in stored[:-1]] == [e["message"] for e in stored_before]
    assert stored[-1]["kind"] == "compaction"
    assert stored[-1]["seq"] == entry_seq

    for fmt in ("openai", "anthropic"):
        ctx = await context(client, "m", fmt)
        assert_valid(ctx, fmt)
        assert ctx["compaction"]["entry_seq"] == entry_seq
        assert ctx["compaction"]["first_kept_seq"] == first_kept
        b = ctx["tokens"]["breakdown"]
        assert b["summary"] > 0
        assert b["summary"] + b["messages"] + b["tool_outputs"] == after["context_tokens"]
    openai = await context(client, "m")
    # The system prompt stays first, the summary follows, then the kept entries.
    assert openai["messages"][0] == {"role": "system", "content": "You are a careful coding agent."}
    summary_message = openai["messages"][1]
    assert summary_message["role"] == "user"
    assert "compacted" in summary_message["content"]
    assert done["summary"] in summary_message["content"]
    kept = [e["message"] for e in stored_before if e["seq"] >= first_kept]
    assert openai["messages"][2:] == kept
    anthropic = await context(client, "m", "anthropic")
    assert anthropic["system"] == [{"type": "text", "text": "You are a careful coding agent."}]

    # The archive: exactly the messages the summary replaced, the system prompt not among them.
    r = await client.get(f"/v1/sessions/m/compactions/{job['id']}/source", params={"limit": 7})
    assert r.status_code == 200, r.text
    replaced: list[dict[str, Any]] = []
    page = r.json()
    while True:
        replaced.extend(page["entries"])
        if page["next_after_seq"] is None:
            break
        r = await client.get(
            f"/v1/sessions/m/compactions/{job['id']}/source",
            params={"limit": 7, "after_seq": page["next_after_seq"]},
        )
        page = r.json()
    expected = [e for e in stored_before if e["seq"] < first_kept and e["role"] != "system"]
    assert [e["seq"] for e in replaced] == [e["seq"] for e in expected]
    assert [e["message"] for e in replaced] == [e["message"] for e in expected]


async def test_the_extractive_summary_follows_the_instructions(
    app: Any, client: httpx.AsyncClient
) -> None:
    """A term the instructions name, said once in an old tool output that the
    summary would otherwise drop, is kept; the job's notes say so."""
    for sid in ("plain", "focused"):
        await make_session(client, id=sid, config=MANUAL)
        batches = conversation_with_a_buried_term()
        await fill(client, sid, batches)
    plain = await request(client, "plain")
    focused = await request(client, "focused", instructions=FOCUS)
    assert await drain(app) == 2
    plain = await compaction(client, "plain", plain["id"])
    focused = await compaction(client, "focused", focused["id"])
    assert_the_summary_kept_the_focus(plain, focused)
    assert not any("focus" in n for n in plain["details"]["notes"])


async def test_a_second_compaction_updates_the_first(app: Any, client: httpx.AsyncClient) -> None:
    await make_session(client, id="t", config=MANUAL)
    await fill(client, "t", conversation(20))
    first = await request(client, "t")
    await drain(app)
    first = await compaction(client, "t", first["id"])
    more = [
        [{"role": "user", "content": "Now also handle ISO week dates."}],
        *(b for b in conversation(20)[1:] if b[0]["role"] != "user"),
    ]
    # New call ids for the second half.
    for batch in more:
        for m in batch:
            for call in m.get("tool_calls") or []:
                call["id"] = "x" + call["id"]
            if m.get("tool_call_id"):
                m["tool_call_id"] = "x" + m["tool_call_id"]
    await fill(client, "t", more)
    second = await request(client, "t", instructions="Keep the ISO week work in focus.")
    await drain(app)
    second = await compaction(client, "t", second["id"])
    assert second["status"] == "succeeded"
    # The goal survives: carried from the first summary, not lost with its entries.
    assert "Fix the failing date parser" in second["summary"]
    assert "Now also handle ISO week dates." in second["summary"]
    # Files are cumulative across compactions.
    assert set(first["details"]["read_files"]) <= set(second["details"]["read_files"])
    assert second["first_kept_seq"] > first["first_kept_seq"]
    session = await get_session(client, "t")
    assert session["compaction_count"] == 2
    for fmt in ("openai", "anthropic"):
        ctx = await context(client, "t", fmt)
        assert_valid(ctx, fmt)
    # Only the latest summary is in the context.
    texts = [m["content"] for m in (await context(client, "t"))["messages"]]
    assert sum(1 for t in texts if isinstance(t, str) and "compacted" in t) == 1

    r = await client.get("/v1/sessions/t/compactions", params={"limit": 1})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [c["id"] for c in page["compactions"]] == [second["id"]]
    r = await client.get("/v1/sessions/t/compactions", params={"cursor": page["next_cursor"]})
    assert [c["id"] for c in r.json()["compactions"]] == [first["id"]]
    assert r.json()["next_cursor"] is None


async def test_a_second_request_gets_the_first(client: httpx.AsyncClient) -> None:
    await make_session(client, id="d", config=MANUAL)
    await fill(client, "d", conversation(12))
    first = await request(client, "d")
    again = await request(client, "d", strategy="narrative")
    assert again["id"] == first["id"]
    r = await client.get("/v1/sessions/d/compactions")
    assert len(r.json()["compactions"]) == 1


async def test_cancel_a_queued_compaction(app: Any, client: httpx.AsyncClient) -> None:
    await make_session(client, id="c", config=MANUAL)
    await fill(client, "c", conversation(12))
    before = await get_session(client, "c")
    job = await request(client, "c")
    r = await client.post(f"/v1/sessions/c/compactions/{job['id']}/cancel")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "cancelled"
    assert await drain(app) == 0
    after = await get_session(client, "c")
    assert after["compaction_count"] == 0
    assert after["active_compaction_id"] is None
    assert after["entry_count"] == before["entry_count"]
    r = await client.post(f"/v1/sessions/c/compactions/{job['id']}/cancel")
    assert_problem(r, 409, "cancelled")
    r = await client.get(f"/v1/sessions/c/compactions/{job['id']}/source")
    assert_problem(r, 409, "cancelled")
    # A new one can be asked for at once.
    fresh = await request(client, "c")
    assert fresh["id"] != job["id"]


async def test_wait_returns_the_finished_compaction(db_url: str, settings: Settings) -> None:
    app = create_app(settings.model_copy(update={"compaction_workers": 1}), database_url=db_url)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            await make_session(client, id="w", config=MANUAL)
            await fill(client, "w", conversation(12))
            r = await client.post("/v1/sessions/w/compactions", json={"wait": 20})
            assert r.status_code == 202, r.text
            assert r.json()["status"] == "succeeded"
            assert (await get_session(client, "w"))["compaction_count"] == 1


async def test_bad_requests(client: httpx.AsyncClient) -> None:
    await make_session(client, id="b", config=MANUAL)
    await fill(client, "b", conversation(1))
    before = await get_session(client, "b")
    r = await client.post("/v1/sessions/b/compactions", json={})
    assert_problem(r, 409, "nothing to compact")
    r = await client.post("/v1/sessions/b/compactions", json={"instructions": "x" * 10_001})
    assert_problem(r, 422, "instructions")
    r = await client.post("/v1/sessions/b/compactions", json={"strategy": "poem"})
    assert_problem(r, 422, "strategy")
    r = await client.post("/v1/sessions/b/compactions", json={"wait": 1000})
    assert_problem(r, 422, "wait")
    r = await client.post("/v1/sessions/b/compactions", json={"surprise": 1})
    assert_problem(r, 422, "surprise")
    r = await client.post("/v1/sessions/nope/compactions", json={})
    assert_problem(r, 404, "nope")
    missing = "00000000-0000-4000-8000-000000000000"
    for path in ("", "/source"):
        r = await client.get(f"/v1/sessions/b/compactions/{missing}{path}")
        assert_problem(r, 404, missing)
    r = await client.post(f"/v1/sessions/b/compactions/{missing}/cancel")
    assert_problem(r, 404, missing)
    r = await client.get("/v1/sessions/b/compactions/not-a-uuid")
    assert_problem(r, 422, "compaction_id")
    r = await client.get("/v1/sessions/b/compactions", params={"cursor": "garbage!"})
    assert_problem(r, 422, "cursor")
    r = await client.patch("/v1/sessions/b", json={"config": {"compaction": {"enabled": False}}})
    assert r.status_code == 200, r.text
    await fill(client, "b", conversation(12)[1:])
    r = await client.post("/v1/sessions/b/compactions", json={})
    assert_problem(r, 409, "disabled")
    after = await get_session(client, "b")
    assert after["compaction_count"] == before["compaction_count"] == 0


# Automatic compaction. usable = 16,000 - 2,000 = 14,000; reserve 4,000: the
# threshold is 10,000 tokens, emergency at 0.95 x 14,000 = 13,300.
SMALL = {"context_window": 16_000, "max_output_tokens": 2_000}
AUTO = {
    "compaction": {"reserve_tokens": 4_000, "keep_recent_tokens": 3_000},
    "prune": {"auto": False},
}


async def append_until(
    client: httpx.AsyncClient, sid: str, batches: list[list[dict[str, Any]]], key: str
) -> tuple[int, dict[str, Any]]:
    for n, batch in enumerate(batches):
        body = await append_ok(client, sid, batch)
        if body[key]:
            return n, body
    raise AssertionError(f"no append reported {key}")


async def test_threshold_compaction_is_queued_and_the_context_continues(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="a", **SMALL, config=AUTO)
    batches = conversation(40, words=300)
    n, body = await append_until(client, "a", batches, "compaction")
    assert body["overflow"]["action"] == "compact"
    started = body["compaction"]
    assert started["reason"] == "threshold"
    assert started["status"] == "queued"
    assert started["created"] is True
    # While it is queued, appends do not queue another.
    body = await append_ok(client, "a", batches[n + 1])
    assert body["compaction"] is None
    assert await drain(app) == 1
    done = await compaction(client, "a", started["id"])
    assert done["status"] == "succeeded"
    assert done["auto"] is True
    assert done["details"]["continued"] is True
    session = await get_session(client, "a")
    assert session["auto_compaction"] == "on"
    ctx = await context(client, "a")
    assert_valid(ctx, "openai")
    assert ctx["state"] == "ok"
    # The agent was mid-work (its last message a tool result): told to go on.
    assert ctx["messages"][-1] == {"role": "user", "content": "Continue if you have next steps."}
    stored = await history(client, "a")
    assert [e["kind"] for e in stored[-2:]] == ["compaction", "continue"]


@pytest.mark.parametrize(("finish_reason", "continued"), [("stop", False), ("length", True)])
async def test_continue_only_when_the_agent_did_not_stop(
    app: Any, client: httpx.AsyncClient, finish_reason: str, continued: bool
) -> None:
    await make_session(client, id="s", config={"prune": {"auto": False}})
    await fill(client, "s", conversation(12))
    r = await client.post(
        "/v1/sessions/s/usage", json={"input_tokens": 9_000, "finish_reason": finish_reason}
    )
    assert r.status_code == 200, r.text
    await append_ok(client, "s", [{"role": "assistant", "content": "All done."}])
    recovery = await overflow_error(client, "s")
    job = recovery["compaction"]
    assert await drain(app) == 1
    assert (await compaction(client, "s", job["id"]))["details"]["continued"] is continued
    last = (await context(client, "s"))["messages"][-1]
    if continued:  # cut off by the length limit: told to go on
        assert last == {"role": "user", "content": "Continue if you have next steps."}
    else:  # it ended on its own: nothing is put in its mouth
        assert last == {"role": "assistant", "content": "All done."}
        assert all(e["kind"] != "continue" for e in await history(client, "s"))


def window_filler() -> list[dict[str, Any]]:
    """One batch of outputs that takes a SMALL window past 95% at once."""
    return [
        {
            "role": "assistant",
            "content": "Reading everything.",
            "tool_calls": [
                {
                    "id": f"big{i}",
                    "type": "function",
                    "function": {"name": "bash", "arguments": '{"command": "cat big.txt"}'},
                }
                for i in range(4)
            ],
        },
        *[
            {
                "role": "tool",
                "tool_call_id": f"big{i}",
                "content": "\n".join(f"row {n} {i}: payload data" for n in range(130)),
            }
            for i in range(4)
        ],
    ]


async def test_emergency_compacts_in_the_append(client: httpx.AsyncClient) -> None:
    # Outputs kept whole, so that one batch can fill the window.
    config = {**AUTO, "truncate": {"enabled": False}}
    await make_session(client, id="e", **SMALL, config=config)
    batches = conversation(40, words=300)
    _, body = await append_until(client, "e", batches, "compaction")
    queued = body["compaction"]
    assert queued["reason"] == "threshold"
    # No worker runs here; one batch of outputs takes the window past 95% at once.
    body = await append_ok(client, "e", window_filler())
    assert body["compaction"] is not None, body["overflow"]
    assert body["compaction"]["reason"] == "emergency"
    assert body["compaction"]["status"] == "succeeded"
    # The context fits again: the summary and the batch, which has no cut point inside.
    assert body["overflow"]["action"] != "emergency", body["overflow"]
    assert not body["overflow"]["overflow"]
    session = await get_session(client, "e")
    assert session["compaction_count"] == 1
    # The queued one stays queued; it plans again from the new pivot when it runs.
    assert session["active_compaction_id"] == queued["id"]
    for fmt in ("openai", "anthropic"):
        assert_valid(await context(client, "e", fmt), fmt)
    job = await compaction(client, "e", body["compaction"]["id"])
    assert job["summarizer_used"] == "extractive"
    assert job["tokens_after"] < job["tokens_before"]
    # The continuity gate ran on the emergency path too, and the job says what it found.
    gate = job["details"]["gate"]
    assert gate["checked"]["terms"] >= 1, gate  # the first request names a term
    assert "missing_after" in gate, gate


async def test_an_emergency_compaction_follows_the_sessions_instructions(
    client: httpx.AsyncClient,
) -> None:
    """The session's standing compaction.instructions are the extractive summary's
    focus on the emergency path too, not only in the worker."""
    config = {
        **AUTO,
        "compaction": {
            "reserve_tokens": 4_000,
            "keep_recent_tokens": 3_000,
            "instructions": "Keep `big.txt` in view",
        },
        "truncate": {"enabled": False},
    }
    await make_session(client, id="e", **SMALL, config=config)
    await append_until(client, "e", conversation(40, words=300), "compaction")
    body = await append_ok(client, "e", window_filler())
    assert body["compaction"]["reason"] == "emergency", body
    job = await compaction(client, "e", body["compaction"]["id"])
    assert "instructions used as its focus" in " ".join(job["details"]["notes"]), job["details"]
    assert "Keep `big.txt` in view" in job["summary"]


async def test_overflow_error_starts_a_compaction(app: Any, client: httpx.AsyncClient) -> None:
    await make_session(client, id="o", config={"prune": {"auto": False}})
    await fill(client, "o", conversation(12))
    recovery = await overflow_error(client, "o")
    assert recovery["action"] == "compact"
    assert recovery["compaction"]["reason"] == "overflow"
    assert await drain(app) == 1
    done = await compaction(client, "o", recovery["compaction"]["id"])
    assert done["status"] == "succeeded"


async def test_low_yield_holds_automatic_compaction(app: Any, client: httpx.AsyncClient) -> None:
    # Two messages, then one turn of parallel calls with no point to cut inside
    # it: only the two messages can be summarized, which saves little (with two
    # short ones the summary would be longer than they are: not committed, see
    # tests/compactions/test_accounting.py).
    await make_session(
        client,
        id="y",
        config={"compaction": {"keep_recent_tokens": 3_000}, "prune": {"auto": False}},
    )
    await append_ok(client, "y", [{"role": "user", "content": "Hi."}])
    reply = "Hello. " + "I will think about the parser module carefully. " * 40
    await append_ok(client, "y", [{"role": "assistant", "content": reply}])
    ids = [f"p{i}" for i in range(6)]
    await append_ok(
        client,
        "y",
        [
            {
                "role": "assistant",
                "content": "Reading all of them.",
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"command": "cat a.py"}'},
                    }
                    for i in ids
                ],
            },
            *[
                {
                    "role": "tool",
                    "tool_call_id": i,
                    "content": "\n".join(f"{i} line {n}: x = {n}" for n in range(150)),
                }
                for i in ids
            ],
        ],
    )
    job = await request(client, "y")
    await drain(app)
    done = await compaction(client, "y", job["id"])
    assert done["status"] == "succeeded"
    assert done["details"]["summarized_entries"] == 2
    assert 0 < done["tokens_before"] - done["tokens_after"] < 0.05 * done["tokens_before"]
    session = await get_session(client, "y")
    assert session["auto_compaction"] == "held"
    # New history lifts the hold.
    await append_ok(client, "y", [{"role": "user", "content": "Go on."}])
    assert (await get_session(client, "y"))["auto_compaction"] == "on"
