"""Accounting around compactions (issue 11), through the API with real workers:
which context a usage report measured when it comes after the reply's append,
one compaction per model call, summaries that would not make the context
smaller, recoveries that find nothing to cut, and one estimate for /overflow
and /context."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from app.engine.accounting.budget import CALIBRATION_ALPHA
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from tests.compactions.helpers import compaction, drain, overflow_error
from tests.conftest import make_session
from tests.helpers import append_ok, get_session, history

# usable = 20,000 - 2,000 = 18,000; compaction at 9,000; emergency at 17,100.
WINDOW = {"context_window": 20_000, "max_output_tokens": 2_000}
AUTO = {
    "compaction": {"threshold": 0.5, "keep_recent_tokens": 2_500},
    "prune": {"enabled": False},
}
# A long system prompt: pinned, it stays in every context, so a compaction
# saves less than a third and a late report is not "far above" the new context.
SYSTEM = "You are a careful coding agent. " + "Follow the house rules in every step. " * 420
# A short chat: a summary of it would be longer than what it replaces.
SMALL_CHAT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Why does test_login fail?"},
    {"role": "assistant", "content": "check() gets the token instead of the user."},
    {"role": "user", "content": "Fix it."},
    {"role": "assistant", "content": "Done: login() now passes the user."},
    {"role": "user", "content": "Thanks."},
]
# The provider counts 5% more than the stored counts.
PROVIDER = 1.05


def step(k: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """A model reply (long reasoning, one call) and the call's short result."""
    reply = {
        "role": "assistant",
        "content": f"Step {k}: " + f"reasoning about module {k} and its parser. " * 70,
        "tool_calls": [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "bash", "arguments": f'{{"command": "pytest t{k}.py"}}'},
            }
        ],
    }
    return reply, {"role": "tool", "tool_call_id": f"c{k}", "content": f"{k} passed"}


async def jobs(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/compactions", params={"limit": 100})
    assert r.status_code == 200, r.text
    listed: list[dict[str, Any]] = r.json()["compactions"]
    return listed


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def usage(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/usage", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def overflow(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/overflow")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def provider_prompt(ctx: dict[str, Any]) -> int:
    """What the provider reports for a context it was sent."""
    b: dict[str, int] = ctx["tokens"]["breakdown"]
    return round(PROVIDER * (b["summary"] + b["messages"] + b["tool_outputs"] + b["overhead"]))


async def late_agent(client: httpx.AsyncClient, sid: str) -> tuple[int, dict[str, Any], int]:
    """An agent that reports usage after appending the model's reply, never
    sending context_version, until a reply's append queues a compaction.
    Returns the step, the append's answer and the prompt to report for it."""
    await append_ok(
        client,
        sid,
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the parser."}],
    )
    for k in range(40):
        reply, result = step(k)
        prompt = provider_prompt(await context(client, sid))  # ... the model call ...
        answer = await append_ok(client, sid, [reply])
        if answer["compaction"] is not None:
            return k, answer, prompt
        body = await usage(client, sid, input_tokens=prompt)
        assert body["stale"] is False
        assert body["compaction"] is None
        await append_ok(client, sid, [result])
    raise AssertionError("no compaction was queued")


async def test_a_usage_report_after_the_replys_append_does_not_compact_again(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The reply's append queued a compaction, which committed before the agent
    reported the usage of the call that produced the reply. That report (no
    context_version) is about the context served before the compaction: it
    must neither re-inflate the estimate nor start a second compaction."""
    await make_session(client, id="late", **WINDOW, config=AUTO)
    k, answer, prompt = await late_agent(client, "late")
    assert answer["compaction"]["reason"] == "threshold"
    assert await drain(app) == 1
    done = (await jobs(client, "late"))[0]
    assert done["status"] == "succeeded", done
    before = await get_session(client, "late")
    # The provider counted this call's prompt a little above the threshold (a
    # tokenizer is not a constant factor): as the estimate's base after the
    # compaction, it would queue a second one. And it is not "far above" the
    # compacted context, the old rule's only clue that the report was stale.
    prompt = max(prompt, answer["overflow"]["threshold_tokens"] + 50)
    assert prompt < 1.5 * (before["context_tokens"] + REPLY_PRIMING_TOKENS)

    late = await usage(client, "late", input_tokens=prompt)
    assert late["stale"] is True
    assert late["compaction"] is None
    assert late["overflow"]["estimated_tokens"] == done["tokens_after"]
    assert late["overflow"]["action"] == "none"
    after = await get_session(client, "late")
    assert after["calibration_factor"] == before["calibration_factor"]
    assert after["usage_count"] == before["usage_count"] + 1
    assert after["active_compaction_id"] is None
    assert len(await jobs(client, "late")) == 1
    assert await drain(app) == 0

    # The next call is made with the compacted context; its report, late too,
    # measures that context: it counts, and still nothing more to compact.
    _, result = step(k)
    await append_ok(client, "late", [result])
    ctx = await context(client, "late")
    reply, _ = step(k + 1)
    await append_ok(client, "late", [reply])
    prompt = provider_prompt(ctx)
    body = await usage(client, "late", input_tokens=prompt)
    assert body["stale"] is False
    assert body["reported_prompt_tokens"] == prompt
    assert body["compaction"] is None
    # The reply appended after the context was read is added to the report.
    replied = (await history(client, "late"))[-1]
    assert replied["message"]["role"] == "assistant"
    assert body["overflow"]["estimated_tokens"] == prompt + round(
        replied["tokens"] * body["calibration_factor"]
    )
    assert len(await jobs(client, "late")) == 1


async def test_a_late_report_while_its_compaction_is_queued_starts_no_other(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The same, with the compaction still queued when the report comes: the
    report measures the context as served (calibrating is fine), but the model
    call has its compaction already; even an emergency verdict starts no second."""
    await make_session(client, id="queued", **WINDOW, config=AUTO)
    _, answer, prompt = await late_agent(client, "queued")
    queued = answer["compaction"]["id"]
    session = await get_session(client, "queued")
    served_tokens = session["context_tokens"] - answer["entries"][0]["tokens"]

    # The provider says the prompt was 2.4 times what was counted: past the
    # emergency line.
    prompt = round(2.4 * (served_tokens + REPLY_PRIMING_TOKENS))
    body = await usage(client, "queued", input_tokens=prompt)
    assert body["compaction"] is None
    assert body["stale"] is False
    assert body["overflow"]["action"] == "emergency"
    # Calibrated against the served context (without the reply): one EMA step.
    factor = session["calibration_factor"]
    ratio = prompt / (served_tokens + REPLY_PRIMING_TOKENS)
    assert body["calibration_factor"] == round(factor + CALIBRATION_ALPHA * (ratio - factor), 6)
    reply_tokens = answer["entries"][0]["tokens"]
    assert body["overflow"]["estimated_tokens"] == prompt + round(
        reply_tokens * body["calibration_factor"]
    )
    listed = await jobs(client, "queued")
    assert [j["id"] for j in listed] == [queued]
    assert (await get_session(client, "queued"))["compaction_count"] == 0
    assert await drain(app) == 1
    assert [j["status"] for j in await jobs(client, "queued")] == ["succeeded"]


async def test_a_report_on_the_context_read_after_a_compaction_counts(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The other way round: the agent read the context after the compaction, so
    its report and its provider errors are about the new context, however far
    above the stored count its prompt is (a system prompt it does not store)."""
    await make_session(client, id="fresh", **WINDOW, config=AUTO)
    await late_agent(client, "fresh")
    assert await drain(app) == 1
    ctx = await context(client, "fresh")
    counted = ctx["tokens"]["estimated"]
    body = await usage(client, "fresh", input_tokens=2 * counted)
    assert body["stale"] is False
    assert body["reported_prompt_tokens"] == 2 * counted
    assert body["calibration_factor"] > 1.0

    # The example of docs/api.md: an overflow error after reading the compacted context
    # starts recovery (it was answered "stale" before).
    ctx = await context(client, "fresh")
    recovery = await overflow_error(client, "fresh")
    assert recovery["stale"] is False
    assert recovery["action"] == "compact"
    assert recovery["compaction"]["reason"] == "overflow"


async def test_a_compaction_that_would_make_the_context_larger_is_not_committed(
    app: Any, client: httpx.AsyncClient
) -> None:
    """A manual compaction of a small session went from 169 to 278 tokens."""
    await make_session(client, id="small", config={"compaction": {"keep_recent_tokens": 10}})
    await append_ok(client, "small", SMALL_CHAT)
    before = await get_session(client, "small")
    stored = await history(client, "small")
    ctx_before = await context(client, "small")
    r = await client.post("/v1/sessions/small/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = await compaction(client, "small", r.json()["id"])
    assert job["status"] == "cancelled", job
    assert job["cancel_requested"] is False
    assert "not committed" in job["error"]
    assert "summary is longer than the history it replaces" in job["error"]
    # The figures are the counted ones it was judged on: the context as stored now.
    assert f"counted tokens, not fewer than the {before['context_tokens']} " in job["error"]
    assert job["summary"] is None
    assert job["entry_seq"] is None
    after = await get_session(client, "small")
    for key in ("entry_count", "context_tokens", "compaction_count", "version"):
        assert after[key] == before[key], key
    assert after["compaction_failures"] == 0
    assert after["active_compaction_id"] is None
    # Automatic compaction waits for new history, as after a low-yield one.
    assert after["auto_compaction"] == "held"
    assert await history(client, "small") == stored
    ctx_after = await context(client, "small")
    assert ctx_after["messages"] == ctx_before["messages"]
    assert ctx_after["compaction"] is None
    await append_ok(client, "small", [{"role": "user", "content": "One more thing."}])
    assert (await get_session(client, "small"))["auto_compaction"] == "on"


async def test_an_emergency_compaction_that_would_not_help_is_not_committed(
    client: httpx.AsyncClient,
) -> None:
    # usable = 300 - 100 = 200: a window smaller than a summary.
    await make_session(
        client,
        id="tiny",
        context_window=300,
        max_output_tokens=100,
        config={"compaction": {"reserve_tokens": 50}, "prune": {"enabled": False}},
    )
    await append_ok(client, "tiny", [{"role": "system", "content": "You are a coding agent."}])
    for k in range(20):
        answer = await append_ok(
            client,
            "tiny",
            [
                {"role": "user", "content": f"Question {k}: why does test_{k} fail?"},
                {"role": "assistant", "content": f"Module {k} swaps its arguments."},
            ],
        )
        if answer["overflow"]["action"] == "emergency":
            break
    assert answer["overflow"]["action"] == "emergency"
    assert answer["compaction"] is None
    session = await get_session(client, "tiny")
    assert session["compaction_count"] == 0
    assert session["auto_compaction"] == "held"
    assert all(e["kind"] == "message" for e in await history(client, "tiny"))
    assert all(j["reason"] != "emergency" for j in await jobs(client, "tiny"))


async def test_recoveries_that_find_nothing_to_compact_are_not_failures(
    app: Any, client: httpx.AsyncClient
) -> None:
    """Three of them used to stop automatic compaction (three failed automatic
    compactions in a row do). Here the window is past the threshold with a
    system prompt alone (pinned: never summarized) and one short request."""
    await make_session(client, id="r", **WINDOW, config=AUTO)
    answer = await append_ok(
        client,
        "r",
        [{"role": "system", "content": SYSTEM * 3}, {"role": "user", "content": "Fix the parser."}],
    )
    assert answer["overflow"]["action"] == "compact"
    # The agent retries, and the provider refuses again, four times.
    for round_ in range(1, 5):
        recovery = await overflow_error(client, "r")
        assert recovery["action"] == "compact"
        assert await drain(app) == 1
        job = await compaction(client, "r", recovery["compaction"]["id"])
        assert job["status"] == "cancelled", job
        assert job["reason"] == "overflow"
        assert "nothing to compact" in job["error"]
        assert "not counted as a failed" in job["error"]
        session = await get_session(client, "r")
        assert session["compaction_failures"] == 0, round_
        assert session["auto_compaction"] == "held"

    # Automatic compaction still works once there is something to compact.
    queued = []
    for k in range(6):
        reply, result = step(k)
        answer = await append_ok(client, "r", [reply, result])
        queued.append(answer["compaction"])
        assert (await get_session(client, "r"))["auto_compaction"] == "on"
    assert queued[0] is not None
    assert queued[0]["reason"] == "threshold"
    assert await drain(app) == 1
    assert (await compaction(client, "r", queued[0]["id"]))["status"] == "succeeded"


async def test_automatic_compactions_that_find_nothing_to_compact_are_not_failures(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The same class as the recoveries above: with a pinned system prompt alone past
    the threshold, each append queued a threshold compaction that found nothing and
    failed, and three of them stopped automatic compaction for good."""
    await make_session(client, id="t", **WINDOW, config=AUTO)
    answer = await append_ok(
        client,
        "t",
        [{"role": "system", "content": SYSTEM * 3}, {"role": "user", "content": "Fix the parser."}],
    )
    for round_ in range(1, 5):
        queued = answer["compaction"]
        assert queued is not None, (round_, answer)
        assert queued["reason"] == "threshold", (round_, answer)
        assert await drain(app) == 1
        job = await compaction(client, "t", queued["id"])
        assert job["status"] == "cancelled", job
        assert "nothing to compact" in job["error"]
        session = await get_session(client, "t")
        assert session["compaction_failures"] == 0, round_
        assert session["auto_compaction"] == "held", round_
        # Held: no other compaction until new history arrives.
        r = await client.post("/v1/sessions/t/usage", json={"input_tokens": 13_000})
        assert r.status_code == 200, r.text
        assert r.json()["compaction"] is None
        answer = await append_ok(client, "t", [{"role": "user", "content": f"Still {round_}?"}])
    assert (await get_session(client, "t"))["auto_compaction"] != "stopped"


async def test_overflow_and_context_give_one_figure(app: Any, client: httpx.AsyncClient) -> None:
    """/overflow said 329 and /context 332 right after a compaction: the context
    added the reply's priming, the verdict did not."""
    await make_session(client, id="one", **WINDOW, config=AUTO)

    async def agree() -> int:
        verdict = await overflow(client, "one")
        for fmt in ("openai", "anthropic"):
            tokens = (await context(client, "one", fmt))["tokens"]
            assert tokens["estimated"] == verdict["estimated_tokens"], fmt
            assert tokens["fraction"] == verdict["fraction"], fmt
        estimated: int = verdict["estimated_tokens"]
        return estimated

    assert await agree() == REPLY_PRIMING_TOKENS
    _, answer, _ = await late_agent(client, "one")
    assert await agree() == answer["overflow"]["estimated_tokens"]
    assert await drain(app) == 1
    done = (await jobs(client, "one"))[0]
    assert done["status"] == "succeeded", done
    assert await agree() == done["tokens_after"]
    session = await get_session(client, "one")
    b = (await context(client, "one"))["tokens"]["breakdown"]
    assert b["summary"] + b["messages"] + b["tool_outputs"] == session["context_tokens"]
    factor = session["calibration_factor"]
    assert done["tokens_after"] == round(session["context_tokens"] * factor) + b["overhead"]
    # After a report, and calibrated.
    await usage(client, "one", input_tokens=done["tokens_after"] + 400)
    await agree()
    await append_ok(client, "one", [{"role": "user", "content": "Go on."}])
    await agree()


async def test_a_compaction_is_judged_on_counted_tokens_not_on_the_reported_base(
    app: Any, client: httpx.AsyncClient
) -> None:
    """The provider counts 30% fewer tokens than the tokenizer, and one report
    moved the factor only one EMA step (to 0.94). The estimate before the
    compaction is the reported prompt (the exact base), the one after it the
    counted context x 0.94: comparing the two refused a compaction that cut the
    counted context by a quarter, "the summary is longer than the history it
    replaces". Counted tokens before and after decide, like with like."""
    await make_session(
        client,
        id="fewer",
        context_window=200_000,
        max_output_tokens=8_000,
        config={"compaction": {"keep_recent_tokens": 2_500}, "prune": {"enabled": False}},
    )
    await append_ok(
        client,
        "fewer",
        [{"role": "system", "content": SYSTEM * 4}, {"role": "user", "content": "Fix the parser."}],
    )
    for k in range(12):
        await append_ok(client, "fewer", list(step(k)))
    ctx = await context(client, "fewer")
    counted = ctx["tokens"]["estimated"]  # no report yet: counted x 1.0 + overhead
    body = await usage(client, "fewer", input_tokens=round(0.7 * counted))
    assert body["calibration_factor"] == pytest.approx(
        1.0 + CALIBRATION_ALPHA * (0.7 - 1.0), abs=1e-4
    )
    before = await get_session(client, "fewer")

    r = await client.post("/v1/sessions/fewer/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = await compaction(client, "fewer", r.json()["id"])
    after = await get_session(client, "fewer")
    print(
        f"counted {before['context_tokens']} -> {after['context_tokens']}, "
        f"job {job['status']}: {job['tokens_before']} -> {job['tokens_after']} ({job['error']})"
    )
    assert job["status"] == "succeeded", job
    assert job["error"] is None
    assert after["context_tokens"] < 0.9 * before["context_tokens"]
    assert after["compaction_count"] == 1
    # Not taken for a low-yield compaction either: automatic ones go on.
    assert after["auto_compaction"] == "on"
    ctx = await context(client, "fewer")
    assert ctx["compaction"]["entry_seq"] == job["entry_seq"]
