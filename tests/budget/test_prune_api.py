"""Pruning through the API: marks, placeholders, totals, and what stays stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session, history, tool_call

PLACEHOLDER = "[Old tool result content cleared]"


def output(k: int, words: int) -> str:
    """Tool output of about ``words`` tokens, distinct per ``k``."""
    return f"run {k}\n" + "\n".join(f"line {i} of run {k}: ok" for i in range(words // 8))


def work(steps: int, words: int = 2400, skill_every: int = 0) -> list[list[dict[str, Any]]]:
    """Batches as an agent appends them: a user turn every third step, then per
    step an assistant call and its result (~3,000 tokens of bash output; every
    ``skill_every``-th step a ``skill`` call instead)."""
    batches: list[list[dict[str, Any]]] = []
    for k in range(steps):
        if k % 3 == 0:
            batches.append([{"role": "user", "content": f"Go on with part {k // 3}."}])
        name = "skill" if skill_every and k % skill_every == 0 else "bash"
        batches.append(
            [
                {
                    "role": "assistant",
                    "content": f"Step {k}.",
                    "tool_calls": [tool_call(f"c{k}", name)],
                },
                {"role": "tool", "tool_call_id": f"c{k}", "content": output(k, words)},
            ]
        )
    batches.append([{"role": "user", "content": "Now summarise."}])
    batches.append([{"role": "assistant", "content": "Done."}])
    return batches


async def fill(client: httpx.AsyncClient, sid: str, batches: list[list[dict[str, Any]]]) -> None:
    for batch in batches:
        await append_ok(client, sid, batch)


async def prune(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/prune", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


# No automatic pruning: these tests drive it by hand.
# Nothing automatic: these tests drive pruning by hand.
MANUAL = {"prune": {"auto": False}, "compaction": {"auto": False}}


async def test_dry_run_names_outputs_and_changes_nothing(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p", config=MANUAL)
    await fill(client, "p", work(30))
    before = await get_session(client, "p")
    plan = await prune(client, "p", dry_run=True)
    assert plan["dry_run"] is True
    assert plan["pruned"], plan
    assert plan["tokens_saved"] >= 20_000
    assert plan["protected_tokens"] >= 40_000
    assert await get_session(client, "p") == before


async def test_prune_hides_old_outputs_and_keeps_them_stored(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p", config=MANUAL)
    await fill(client, "p", work(30))
    before = await get_session(client, "p")
    stored_before = await history(client, "p")
    result = await prune(client, "p")
    pruned_seqs = {p["seq"] for p in result["pruned"]}
    assert result["reason"] is None
    assert result["tokens_saved"] >= 20_000
    after = await get_session(client, "p")
    assert after["context_tokens"] == before["context_tokens"] - result["tokens_saved"]
    assert after["version"] == before["version"] + 1 == result["version"]
    assert after["pruned_tokens"] == result["tokens_saved"]
    assert after["prune_count"] == 1

    # The oldest outputs went; the newest 40k tokens of output stayed.
    outputs = [e for e in stored_before if e["role"] == "tool"]
    assert pruned_seqs == {e["seq"] for e in outputs[: len(pruned_seqs)]}
    kept_tokens = sum(e["tokens"] for e in outputs if e["seq"] not in pruned_seqs)
    assert kept_tokens >= 40_000

    # Stored history: every original output, now marked.
    stored = await history(client, "p")
    assert [e["message"] for e in stored] == [e["message"] for e in stored_before]
    for e in stored:
        assert (e["pruned_at"] is not None) == (e["seq"] in pruned_seqs)
        assert e["erased_bytes"] is None

    # The model's view: placeholders, every call still answered.
    for fmt in ("openai", "anthropic"):
        ctx = await context(client, "p", fmt)
        if fmt == "openai":
            assert check_openai_pairing(ctx["messages"]) == []
            tool_texts = [m["content"] for m in ctx["messages"] if m["role"] == "tool"]
        else:
            assert check_anthropic_pairing(ctx["messages"]) == []
            tool_texts = [
                b["content"]
                for m in ctx["messages"]
                for b in m["content"]
                if b["type"] == "tool_result"
            ]
        assert tool_texts.count(PLACEHOLDER) == len(pruned_seqs)
        # The context's own figures agree with the session's running total.
        breakdown = ctx["tokens"]["breakdown"]
        assert breakdown["messages"] + breakdown["tool_outputs"] == after["context_tokens"]


async def test_prune_is_idempotent(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p", config=MANUAL)
    await fill(client, "p", work(30))
    first = await prune(client, "p")
    assert first["pruned"]
    session = await get_session(client, "p")
    again = await prune(client, "p")
    assert again["pruned"] == []
    assert again["tokens_saved"] == 0
    assert again["reason"] in ("nothing_prunable", "below_minimum")
    assert await get_session(client, "p") == session


async def test_below_minimum_prunes_nothing(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p", config=MANUAL)
    await fill(client, "p", work(18))  # ~43k tokens of output: little beyond the 40k kept
    result = await prune(client, "p")
    assert result["pruned"] == []
    assert result["reason"] == "below_minimum"
    assert 0 < result["candidate_tokens"] < 20_000


async def test_protected_tools_and_text_are_never_pruned(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p", config=MANUAL)
    await fill(client, "p", work(30, skill_every=5))
    stored = {e["seq"]: e for e in await history(client, "p")}
    result = await prune(client, "p", minimum_tokens=0, protect_tokens=0, protect_turns=0)
    assert result["pruned"]
    for p in result["pruned"]:
        entry = stored[p["seq"]]
        assert entry["role"] == "tool"
        assert entry["tool_name"] != "skill"
    assert any(e["tool_name"] == "skill" for e in stored.values())


async def test_protected_tools_take_patterns(client: httpx.AsyncClient) -> None:
    """Seed 000's set, a name and a prefix: ``["skill", "tool-*"]``."""
    config = {**MANUAL, "prune": {**MANUAL["prune"], "protected_tools": ["skill", "tool-*"]}}
    await make_session(client, id="p", config=config)
    batches = work(30, skill_every=5)
    for batch in batches:  # every third bash call is a "Tool-Search" one
        for m in batch:
            for call in m.get("tool_calls", []):
                k = int(call["id"][1:])
                if call["function"]["name"] == "bash" and k % 3 == 0:
                    call["function"]["name"] = "Tool-Search"
    await fill(client, "p", batches)
    r = await client.get("/v1/sessions/p")
    assert r.json()["config"]["prune"]["protected_tools"] == ["skill", "tool-*"]
    stored = {e["seq"]: e for e in await history(client, "p")}
    result = await prune(client, "p", minimum_tokens=0, protect_tokens=0, protect_turns=0)
    pruned = {stored[p["seq"]]["tool_name"] for p in result["pruned"]}
    assert pruned == {"bash"}
    names = {e["tool_name"] for e in stored.values()}
    assert {"skill", "Tool-Search", "bash"} <= names


async def test_erase_clears_the_stored_output_and_says_how_much(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="p", config={"prune": {"auto": False, "erase": True}})
    await fill(client, "p", work(30))
    result = await prune(client, "p")
    pruned_seqs = {p["seq"] for p in result["pruned"]}
    stored = await history(client, "p")
    for e in stored:
        if e["seq"] in pruned_seqs:
            assert e["message"]["content"] == PLACEHOLDER
            assert e["erased_bytes"] > 1000
        else:
            assert e["erased_bytes"] is None


async def test_disabled_prunes_nothing(client: httpx.AsyncClient) -> None:
    await make_session(client, id="p", config={"prune": {"enabled": False}})
    await fill(client, "p", work(30))
    result = await prune(client, "p")
    assert result["reason"] == "disabled"
    assert result["pruned"] == []


async def test_an_append_that_moves_the_verdict_prunes_by_itself(
    client: httpx.AsyncClient,
) -> None:
    # A 100k window: the verdict reaches prune as the outputs pile up.
    await make_session(client, id="a", context_window=100_000, max_output_tokens=4_000)
    responses: list[dict[str, Any]] = []
    for batch in work(36):
        responses.append(await append_ok(client, "a", batch))
    auto = [r["pruned"] for r in responses if r["pruned"] and r["pruned"]["pruned"]]
    assert auto, [r["overflow"]["action"] for r in responses]
    first = auto[0]
    assert first["tokens_saved"] >= 20_000
    session = await get_session(client, "a")
    assert session["prune_count"] >= 1
    ctx = await context(client, "a")
    assert check_openai_pairing(ctx["messages"]) == []
    breakdown = ctx["tokens"]["breakdown"]
    assert breakdown["messages"] + breakdown["tool_outputs"] == session["context_tokens"]


async def test_auto_prune_can_be_turned_off(client: httpx.AsyncClient) -> None:
    await make_session(
        client,
        id="a",
        context_window=100_000,
        max_output_tokens=4_000,
        config={"prune": {"auto": False}},
    )
    for batch in work(36):
        body = await append_ok(client, "a", batch)
        assert body["pruned"] is None
    assert (await get_session(client, "a"))["prune_count"] == 0


async def test_an_idempotent_retry_returns_the_auto_prune_too(client: httpx.AsyncClient) -> None:
    await make_session(client, id="a", context_window=100_000, max_output_tokens=4_000)
    batches = work(36)
    for batch in batches[:-3]:
        await append_ok(client, "a", batch)
    headers = {"Idempotency-Key": "k-1"}
    msgs = {"messages": batches[-3]}
    first = await client.post("/v1/sessions/a/messages", json=msgs, headers=headers)
    again = await client.post("/v1/sessions/a/messages", json=msgs, headers=headers)
    assert first.status_code == again.status_code == 201
    assert first.content == again.content
    assert again.headers["idempotent-replayed"] == "true"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"protect_tokens": -1}, "protect_tokens"),
        ({"minimum_tokens": "lots"}, "minimum_tokens"),
        ({"dry_run": "maybe"}, "dry_run"),
        ({"protect": 5}, "protect"),
    ],
)
async def test_bad_prune_requests_are_rejected(
    client: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    await make_session(client, id="p", config=MANUAL)
    await fill(client, "p", work(25))
    before = await get_session(client, "p")
    assert_problem(await client.post("/v1/sessions/p/prune", json=body), 422, field)
    assert await get_session(client, "p") == before


async def test_prune_on_a_missing_session_is_404(client: httpx.AsyncClient) -> None:
    assert_problem(await client.post("/v1/sessions/ghost/prune", json={}), 404, "ghost")


async def test_bad_prune_config_is_rejected(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/sessions", json={"model": "gpt-4o", "config": {"prune": {"protect_tokens": -5}}}
    )
    assert_problem(r, 422, "config.prune.protect_tokens")
    r = await client.post(
        "/v1/sessions", json={"model": "gpt-4o", "config": {"prune": {"keep": 1}}}
    )
    assert_problem(r, 422, "config.prune.keep")


async def test_long_sessions_prune_as_the_engine_plans_over_every_entry(
    client: httpx.AsyncClient,
) -> None:
    """Pruning reads the view newest first, in chunks, only as far back as it can
    walk; over thousands of entries it must prune exactly what the planner would
    over all of them."""
    from app.engine.window.prune import Item, PruneSettings, plan_prune

    await make_session(client, id="long", config=MANUAL)

    async def add(steps: range) -> None:
        flat = [m for batch in work(steps.stop)[steps.start * 4 // 3 :] for m in batch]
        # Re-number the calls so each range is new to the session.
        renamed = []
        for m in flat:
            m = dict(m)
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": f"{c['id']}-{steps.start}"} for c in m["tool_calls"]]
            if m.get("tool_call_id"):
                m["tool_call_id"] = f"{m['tool_call_id']}-{steps.start}"
            renamed.append(m)
        for k in range(0, len(renamed), 400):  # a call and its result may straddle two appends
            await append_ok(client, "long", renamed[k : k + 400])

    def expected(stored: list[dict[str, Any]]) -> list[int]:
        items = [
            Item(
                seq=e["seq"],
                role=e["role"],
                tool_name=e["tool_name"],
                tokens=e["tokens"],
                pruned=e["pruned_at"] is not None,
            )
            for e in stored
        ]
        settings = PruneSettings(placeholder_tokens=20)
        return list(plan_prune(items, settings).seqs)

    await add(range(0, 900))
    stored = await history(client, "long")
    assert len(stored) > 2000
    first = await prune(client, "long")
    assert [p["seq"] for p in first["pruned"]] == expected(stored)
    assert first["pruned"]

    await add(range(900, 1500))
    stored = await history(client, "long")
    second = await prune(client, "long")
    assert [p["seq"] for p in second["pruned"]] == expected(stored)
    assert second["pruned"]
    assert min(p["seq"] for p in second["pruned"]) > max(p["seq"] for p in first["pruned"])


async def test_deleting_a_session_deletes_its_prune_marks(
    client: httpx.AsyncClient, db_url: str
) -> None:
    import asyncpg

    from tests import postgres

    await make_session(client, id="gone", config=MANUAL)
    await make_session(client, id="kept", config=MANUAL)
    for sid in ("gone", "kept"):
        await fill(client, sid, work(30))
        assert (await prune(client, sid))["pruned"]
    assert (await client.delete("/v1/sessions/gone")).status_code == 204
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        marks = await conn.fetch("SELECT session_id, count(*) FROM prune_mark GROUP BY 1")
    finally:
        await conn.close()
    assert {r["session_id"] for r in marks} == {"kept"}


async def test_concurrent_retries_of_an_auto_pruning_append_agree(
    client: httpx.AsyncClient,
) -> None:
    """The append and its automatic prune commit together: every retry with the
    key gets the same bytes, and no other append shares its version."""
    import asyncio

    await make_session(client, id="a", context_window=100_000, max_output_tokens=4_000)
    batches = work(36)
    # Which batch makes the first prune? Found on a twin session.
    pruning_at = None
    for i, batch in enumerate(batches):
        body = await append_ok(client, "a", batch)
        if body["pruned"] and body["pruned"]["pruned"]:
            pruning_at = i
            break
    assert pruning_at is not None

    await make_session(client, id="b", context_window=100_000, max_output_tokens=4_000)
    for batch in batches[:pruning_at]:
        await append_ok(client, "b", batch)
    headers = {"Idempotency-Key": "same"}
    msgs = {"messages": batches[pruning_at]}
    results = await asyncio.gather(
        *(client.post("/v1/sessions/b/messages", json=msgs, headers=headers) for _ in range(4))
    )
    assert {r.status_code for r in results} == {201}
    assert len({r.content for r in results}) == 1
    assert results[0].json()["pruned"]["pruned"]


async def test_concurrent_appends_never_share_a_version(client: httpx.AsyncClient) -> None:
    import asyncio

    await make_session(client, id="v", context_window=100_000, max_output_tokens=4_000)
    batches = work(40)
    await fill(client, "v", batches[:30])
    rest = [
        [
            {**m, "tool_call_id": f"{m['tool_call_id']}-w{w}"} if m["role"] == "tool" else m
            for m in batch
        ]
        for w, batch in enumerate(batches[30:])
    ]
    # Each writer appends a whole step: its call (renamed) and its result.
    for w, batch in enumerate(rest):
        for m in batch:
            if m.get("tool_calls"):
                m["tool_calls"] = [{**c, "id": f"{c['id']}-w{w}"} for c in m["tool_calls"]]
    results = await asyncio.gather(*(append_ok(client, "v", b) for b in rest))
    versions = [r["version"] for r in results]
    assert len(set(versions)) == len(versions)
    session = await get_session(client, "v")
    assert session["version"] == max(versions)


async def test_an_urgent_verdict_looks_again_without_new_output(
    client: httpx.AsyncClient,
) -> None:
    """One long user turn: at `prune` its outputs are protected as the current
    turn; once a usage report makes the verdict urgent, they are not."""
    await make_session(client, id="u", context_window=100_000, max_output_tokens=4_000)
    await append_ok(client, "u", [{"role": "user", "content": "Fix everything."}])
    steps = [b for b in work(24) if b[0]["role"] == "assistant"]
    for batch in steps:
        body = await append_ok(client, "u", batch)
    assert body["overflow"]["action"] == "prune"
    assert (await get_session(client, "u"))["prune_count"] == 0  # all in the one turn
    r = await client.post("/v1/sessions/u/usage", json={"input_tokens": 85_000})
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["pruned"] is not None
    assert report["pruned"]["pruned"], report["pruned"]


async def test_a_prune_never_adds_tokens(client: httpx.AsyncClient) -> None:
    """Long call ids on short outputs: the placeholder would cost more than the
    output; such outputs are left alone, even with no minimum."""
    await make_session(client, id="n", config=MANUAL)
    long_id = "call_" + "x" * 400
    for k in range(12):
        if k % 3 == 0:
            await append_ok(client, "n", [{"role": "user", "content": f"part {k}"}])
        cid = f"{long_id}-{k}"
        await append_ok(
            client,
            "n",
            [
                {"role": "assistant", "content": None, "tool_calls": [tool_call(cid)]},
                {"role": "tool", "tool_call_id": cid, "content": "ok"},
            ],
        )
    before = await get_session(client, "n")
    result = await prune(client, "n", minimum_tokens=0, protect_tokens=0, protect_turns=0)
    assert result["tokens_saved"] >= 0
    after = await get_session(client, "n")
    assert after["context_tokens"] <= before["context_tokens"]
