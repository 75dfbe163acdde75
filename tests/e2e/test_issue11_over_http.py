"""Issue 11's "Context and accounting" and "Hostile and odd input" items, and its
seed 000 leftovers, each through a real uvicorn server configured as
``compactd serve`` configures it, with its compaction workers running inside it
as in production (the extractive summarizer, or a real scripted upstream LLM).

Each test asserts the fixed, user-visible behaviour, so it fails on the old one.
The items already tested over a real server elsewhere are not repeated here:
out-of-range cursors (tests/sessions/test_cursors.py), one request stalling the
service (tests/e2e/test_request_bounds.py), tenant starvation
(tests/e2e/test_fairness.py), a hung database
(tests/resilience/test_frozen_postgres.py), slow and huge headers
(tests/e2e/test_request_heads.py) and a restarted embedded Postgres
(tests/resilience/test_embedded_restart.py).

One server (and one database) serves the module's tests that need no upstream;
each session has its own id. The two upstream tests each start a server of
their own, pointed at their own scripted upstream.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from app.compactions.pivot import CONTINUE_TEXT
from app.core.settings import Settings
from app.engine.accounting.budget import (
    CALIBRATION_ALPHA,
    CALIBRATION_MAX,
    CALIBRATION_MIN_COUNTED,
    CALIBRATION_RATIO_MAX,
)
from app.engine.accounting.tokens import MAX_TOKENS_PER_PART, REPLY_PRIMING_TOKENS, count_text
from app.engine.compaction.summary import summary_from_context_message
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.main import create_app
from tests import postgres
from tests.compactions.helpers import (
    FOCUS,
    assert_the_summary_kept_the_focus,
    conversation_with_a_buried_term,
)
from tests.compactions.test_accounting import AUTO, SMALL_CHAT, SYSTEM, WINDOW, late_agent, step
from tests.compactions.worker_support import SHORT, SUMMARY, seeded
from tests.conftest import TEST_SETTINGS, make_session
from tests.e2e.server import running
from tests.helpers import append, append_ok, assert_problem, get_session, history, tool_call
from tests.messages.test_append_and_history import opaque_reasoning_turn
from tests.upstream_server import Reply, Status, Upstream

JSON = {"content-type": "application/json"}
TERMINAL = {"succeeded", "failed", "cancelled"}
# Nothing automatic: the tests that compact by hand.
MANUAL = {"compaction": {"auto": False}, "prune": {"auto": False}}


def serving(settings: Settings, **update: Any) -> Settings:
    """The test settings with compaction workers inside the server, as in production."""
    return settings.model_copy(
        update={"compaction_workers": 1, "compaction_poll_seconds": 0.2, **update}
    )


@pytest.fixture(scope="module")
def base_url(admin_url: str) -> Iterator[str]:
    """One real server for the module, extractive summarizer, on its own database."""
    url = asyncio.run(postgres.clone(admin_url))
    try:
        with running(create_app(serving(TEST_SETTINGS), database_url=url)) as base:
            yield base
    finally:
        asyncio.run(postgres.drop(admin_url, url))


@pytest.fixture
async def client(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as c:
        yield c


# --- reading what the server did ---------------------------------------------------


async def get_json(client: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    r = await client.get(path, params=params)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def context(client: httpx.AsyncClient, sid: str, fmt: str = "openai") -> dict[str, Any]:
    return await get_json(client, f"/v1/sessions/{sid}/context", format=fmt)


async def usage(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/usage", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def jobs(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = (
        await get_json(client, f"/v1/sessions/{sid}/compactions", limit=100)
    )["compactions"]
    return listed


async def compact(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    """A manual compaction, waited for (the server's worker runs it)."""
    r = await client.post(f"/v1/sessions/{sid}/compactions", json={"wait": 30, **body})
    assert r.status_code == 202, r.text
    return await finished(client, sid, r.json()["id"])


async def finished(client: httpx.AsyncClient, sid: str, cid: str) -> dict[str, Any]:
    """The compaction once the server's worker is done with it."""
    deadline = time.monotonic() + 60
    while True:
        job = await get_json(client, f"/v1/sessions/{sid}/compactions/{cid}")
        if job["status"] in TERMINAL:
            return job
        assert time.monotonic() < deadline, f"compaction {cid} never finished: {job}"
        await asyncio.sleep(0.05)


async def overflow_error(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    """Forward Anthropic's context-overflow error; the recovery it started."""
    body = {"status": 400, "message": "prompt is too long: 208310 tokens > 200000 maximum"}
    r = await client.post(f"/v1/sessions/{sid}/overflow-errors", json=body)
    assert r.status_code == 200, r.text
    recovery: dict[str, Any] = r.json()["recovery"]
    return recovery


def texts(message: dict[str, Any]) -> list[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [b["text"] for b in content or [] if b.get("type") == "text"]


def assert_roles_alternate(messages: list[dict[str, Any]]) -> None:
    roles = [m["role"] for m in messages]
    assert roles[0] == "user", roles
    assert all(a != b for a, b in itertools.pairwise(roles)), roles


# --- Context and accounting ---------------------------------------------------------


async def test_the_anthropic_context_alternates_roles_after_a_compaction(
    client: httpx.AsyncClient,
) -> None:
    """The summary's user message was followed directly by the kept user message:
    two user turns in a row, which some Anthropic-compatible endpoints refuse."""
    sid = await seeded(client, 12, cut="user", config=MANUAL, id="alternate")
    job = await compact(client, sid)
    assert job["status"] == "succeeded", job
    kept = next(e for e in await history(client, sid) if e["seq"] == job["first_kept_seq"])
    assert kept["role"] == "user"

    ctx = await context(client, sid, "anthropic")
    assert_roles_alternate(ctx["messages"])
    assert check_anthropic_pairing(ctx["messages"]) == []
    # One user message: the summary, then the kept user text.
    opening = texts(ctx["messages"][0])
    assert summary_from_context_message(opening[0]) is not None
    assert opening[1:] == [kept["message"]["content"]]
    # The OpenAI context keeps the messages as sent.
    ctx = await context(client, sid, "openai")
    assert check_openai_pairing(ctx["messages"]) == []
    assert [m["role"] for m in ctx["messages"][:3]] == ["system", "user", "user"]


async def test_a_stale_continue_never_follows_the_summary_after_two_compactions(
    client: httpx.AsyncClient,
) -> None:
    """An automatic compaction leaves a "continue" prompt; a later compaction whose
    cut falls on it used to keep it at the head: the summary, then a stale
    continue (OpenAI), or two user turns (Anthropic before runs were merged)."""
    config = {
        "compaction": {"threshold": 0.5, "keep_recent_tokens": 2_500, "auto_continue": True},
        "prune": {"enabled": False},
    }
    await make_session(client, id="stale", **WINDOW, config=config)
    await append_ok(
        client,
        "stale",
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the parser."}],
    )
    # The agent works (a reply with a call, then its result) until an append
    # queues a compaction; it ends on a result, so a "continue" follows it.
    for k in range(40):
        reply, result = step(k)
        answer = await append_ok(client, "stale", [reply, result])
        if answer["compaction"] is not None:
            break
    assert answer["compaction"] is not None
    first = await finished(client, "stale", answer["compaction"]["id"])
    assert first["status"] == "succeeded", first
    assert first["details"]["continued"] is True
    stored = await history(client, "stale")
    prompt = next(e for e in stored if e["kind"] == "continue")
    assert prompt["seq"] == first["entry_seq"] + 1

    # More work, then a manual compaction whose cut would fall on the old prompt:
    # keep exactly what the context holds from it on.
    for more in range(k + 1, k + 4):
        await append_ok(client, "stale", list(step(more)))
    stored = await history(client, "stale")
    keep = sum(e["tokens"] for e in stored if e["seq"] >= prompt["seq"])
    r = await client.patch(
        "/v1/sessions/stale", json={"config": {"compaction": {"keep_recent_tokens": keep}}}
    )
    assert r.status_code == 200, r.text
    second = await compact(client, "stale")
    assert second["status"] == "succeeded", second
    # The stale prompt went with what it followed, into the summary.
    assert second["first_kept_seq"] > prompt["seq"]

    ctx = await context(client, "stale", "openai")
    assert check_openai_pairing(ctx["messages"]) == []
    pieces = [t for m in ctx["messages"] for t in texts(m)]
    at = next(i for i, t in enumerate(pieces) if summary_from_context_message(t) is not None)
    assert pieces[at + 1] != CONTINUE_TEXT, pieces[at : at + 2]
    assert CONTINUE_TEXT not in pieces
    ctx = await context(client, "stale", "anthropic")
    assert_roles_alternate(ctx["messages"])
    assert check_anthropic_pairing(ctx["messages"]) == []
    assert CONTINUE_TEXT not in [t for m in ctx["messages"] for t in texts(m)]


async def test_a_usage_report_after_the_replys_append_does_not_compact_again(
    client: httpx.AsyncClient,
) -> None:
    """The reply's append queued a compaction, which the server's worker committed
    before the agent reported the usage of the call that produced the reply. That
    late report (no context_version) measured the context served before the
    compaction: it used to re-inflate the estimate and queue a second one."""
    await make_session(client, id="late", **WINDOW, config=AUTO)
    _, answer, prompt = await late_agent(client, "late")
    assert answer["compaction"]["reason"] == "threshold"
    done = await finished(client, "late", answer["compaction"]["id"])
    assert done["status"] == "succeeded", done
    before = await get_session(client, "late")
    # A prompt the provider counted a little over the threshold: as the base of
    # the estimate after the compaction, it would queue another one.
    prompt = max(prompt, answer["overflow"]["threshold_tokens"] + 50)
    assert prompt < 1.5 * (before["context_tokens"] + REPLY_PRIMING_TOKENS)

    late = await usage(client, "late", input_tokens=prompt)
    assert late["stale"] is True
    assert late["compaction"] is None
    assert late["overflow"]["estimated_tokens"] == done["tokens_after"]
    assert late["overflow"]["action"] == "none"
    after = await get_session(client, "late")
    assert after["calibration_factor"] == before["calibration_factor"]
    assert after["active_compaction_id"] is None
    assert [j["id"] for j in await jobs(client, "late")] == [done["id"]]


async def test_one_odd_usage_report_moves_the_factor_by_one_step_at_most(
    client: httpx.AsyncClient,
) -> None:
    """A large prompt against a tiny counted context sent the factor from 1.0 to
    its clamp (3.0) at once, tripling every estimate after it."""
    await make_session(client, id="odd")
    small = await append_ok(client, "odd", [{"role": "user", "content": "Hi."}])
    assert small["context_tokens"] < CALIBRATION_MIN_COUNTED
    body = await usage(client, "odd", input_tokens=6_000)  # an unstored system prompt, say
    assert body["calibration_factor"] == 1.0
    assert body["overflow"]["estimated_tokens"] == 6_000  # still the estimate's exact base
    turn = [{"role": "user", "content": "Explain the failing test output. " * 200}]
    later = await append_ok(client, "odd", turn)
    counted = later["context_tokens"] + REPLY_PRIMING_TOKENS
    assert counted >= CALIBRATION_MIN_COUNTED
    # A ratio no tokenizer explains (30x) is clamped into the window (seed 002) and
    # moves the factor one EMA step toward the window's edge, not to the bound; a
    # plausible one (3.9x) then moves it one step toward itself.
    odd = await usage(client, "odd", input_tokens=30 * counted)
    first = 1.0 + CALIBRATION_ALPHA * (CALIBRATION_RATIO_MAX - 1.0)
    assert odd["calibration_factor"] == pytest.approx(first, abs=1e-3)
    assert first < CALIBRATION_MAX
    moved = await usage(client, "odd", input_tokens=round(3.9 * counted))
    step_to = first + CALIBRATION_ALPHA * (3.9 - first)
    assert moved["calibration_factor"] == pytest.approx(step_to, abs=1e-3)
    assert (await get_session(client, "odd"))["calibration_factor"] == moved["calibration_factor"]


async def test_a_compaction_that_would_grow_the_context_is_not_committed(
    client: httpx.AsyncClient,
) -> None:
    """A manual compaction of a small session went from 169 to 278 tokens."""
    await make_session(client, id="grow", config={"compaction": {"keep_recent_tokens": 10}})
    await append_ok(client, "grow", SMALL_CHAT)
    before = await get_session(client, "grow")
    stored = await history(client, "grow")
    ctx_before = await context(client, "grow")
    job = await compact(client, "grow")
    assert job["status"] == "cancelled", job
    assert "not committed" in job["error"]
    assert "summary is longer than the history it replaces" in job["error"]
    assert job["entry_seq"] is None
    after = await get_session(client, "grow")
    for key in ("entry_count", "context_tokens", "compaction_count", "version"):
        assert after[key] == before[key], key
    assert after["compaction_failures"] == 0
    assert await history(client, "grow") == stored
    ctx_after = await context(client, "grow")
    assert ctx_after["messages"] == ctx_before["messages"]
    assert ctx_after["compaction"] is None


async def test_overflow_and_context_give_one_figure_right_after_a_compaction(
    client: httpx.AsyncClient,
) -> None:
    """/overflow said 329 and /context 332: the context added the reply's priming,
    the verdict did not."""
    sid = await seeded(client, 12, cut="split", config=MANUAL, id="one")
    job = await compact(client, sid)
    assert job["status"] == "succeeded", job
    verdict = await get_json(client, f"/v1/sessions/{sid}/overflow")
    assert verdict["estimated_tokens"] == job["tokens_after"]
    for fmt in ("openai", "anthropic"):
        tokens = (await context(client, sid, fmt))["tokens"]
        assert tokens["estimated"] == verdict["estimated_tokens"], fmt
        assert tokens["fraction"] == verdict["fraction"], fmt


async def test_recoveries_that_find_nothing_to_compact_do_not_stop_automatic_compaction(
    client: httpx.AsyncClient,
) -> None:
    """Each counted as a failed automatic compaction, so three of them stopped
    automatic compaction. Here a pinned system prompt alone takes the window past
    the threshold, there is nothing to summarize, and the provider refuses the
    context four times in a row."""
    manual = {**AUTO, "compaction": {"threshold": 0.5, "keep_recent_tokens": 2_500, "auto": False}}
    await make_session(client, id="recover", **WINDOW, config=manual)
    answer = await append_ok(
        client,
        "recover",
        [{"role": "system", "content": SYSTEM * 3}, {"role": "user", "content": "Fix the parser."}],
    )
    assert answer["overflow"]["action"] == "compact"
    # Automatic compaction on only now, so that no threshold compaction was queued
    # by the append: the recoveries are what is under test.
    r = await client.patch("/v1/sessions/recover", json={"config": {"compaction": {"auto": True}}})
    assert r.status_code == 200, r.text
    assert await jobs(client, "recover") == []
    for round_ in range(1, 5):
        recovery = await overflow_error(client, "recover")
        assert recovery["action"] == "compact"
        job = await finished(client, "recover", recovery["compaction"]["id"])
        assert job["status"] == "cancelled", job
        assert job["reason"] == "overflow"
        assert "nothing to compact" in job["error"]
        session = await get_session(client, "recover")
        assert session["compaction_failures"] == 0, round_
        assert session["auto_compaction"] == "held", round_

    # Automatic compaction still runs once there is something to compact.
    steps = [m for k in range(7) for m in step(k)]
    answer = await append_ok(client, "recover", steps)
    assert answer["compaction"] is not None, answer["overflow"]
    assert answer["compaction"]["reason"] == "threshold"
    job = await finished(client, "recover", answer["compaction"]["id"])
    assert job["status"] == "succeeded", job
    assert (await get_session(client, "recover"))["compaction_count"] == 1


async def test_the_extractive_summarizer_follows_the_instructions(
    client: httpx.AsyncClient,
) -> None:
    """The instructions were ignored without a word. A term they name, said once in
    an old tool output that the summary otherwise drops, is kept; the job's notes
    say so."""
    for sid in ("plain", "focused"):
        config = {**MANUAL, "compaction": {"auto": False, "keep_recent_tokens": 3_000}}
        await make_session(client, id=sid, config=config)
        batches = conversation_with_a_buried_term()
        for batch in batches:
            await append_ok(client, sid, batch)
    plain = await compact(client, "plain")
    focused = await compact(client, "focused", instructions=FOCUS)
    assert_the_summary_kept_the_focus(plain, focused)


async def test_the_readmes_overflow_example_starts_recovery_after_the_walk_through(
    client: httpx.AsyncClient,
) -> None:
    """The walk-through of docs/api.md, then its "More to try" overflow example: the
    error is about the context read after the compaction, so recovery starts (it
    answered ``stale``); the recovery ends cancelled, as docs/api.md says, since
    its summary would not make so little history smaller."""
    r = await client.post(
        "/v1/sessions",
        json={
            "id": "demo",
            "model": "gpt-4o",
            "metadata": {"team": "infra"},
            "config": {"compaction": {"keep_recent_tokens": 50}},
        },
    )
    assert r.status_code == 201, r.text
    log = "".join(f"tests/test_api.py::test_endpoint_{i:03d} PASSED\n" for i in range(1, 151))
    await append_ok(
        client,
        "demo",
        [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Why does test_login fail? Fix it."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("call_1", "bash", '{"command": "pytest -v"}')],
            },
            {
                "role": "tool",
                "tool_call_id": "call_1",
                "content": log + "FAILED tests/test_auth.py::test_login - AssertionError: "
                "expected 200, got 401\n1 failed, 150 passed in 3.2s",
            },
        ],
    )
    assert (await usage(client, "demo", input_tokens=2270, output_tokens=25))["stale"] is False
    await append_ok(
        client,
        "demo",
        [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("call_2", "read_file", '{"path": "app/auth.py"}')],
            },
            {
                "role": "tool",
                "tool_call_id": "call_2",
                "content": "def login(user, password):\n    token = make_token(user)\n"
                "    return check(token, password)\n",
            },
            {
                "role": "assistant",
                "content": "login() passes the token to check() instead of the user.",
            },
            {"role": "user", "content": "Fix it, and keep the public API unchanged."},
        ],
    )
    job = await compact(client, "demo", instructions="Keep the failing test names.")
    assert job["status"] == "succeeded", job
    assert job["tokens_after"] < job["tokens_before"]
    verdict = await get_json(client, "/v1/sessions/demo/overflow")
    ctx = await context(client, "demo", "anthropic")
    assert ctx["tokens"]["estimated"] == verdict["estimated_tokens"] == job["tokens_after"]

    recovery = await overflow_error(client, "demo")
    assert recovery["stale"] is False
    assert recovery["action"] == "compact"
    assert recovery["compaction"]["reason"] == "overflow"
    done = await finished(client, "demo", recovery["compaction"]["id"])
    assert done["status"] == "cancelled", done
    assert "not committed" in done["error"]


# --- Hostile and odd input ----------------------------------------------------------

NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e400"]


@pytest.mark.parametrize("literal", NOT_FINITE)
async def test_numbers_that_are_not_finite_are_a_422_naming_the_field_and_store_nothing(
    client: httpx.AsyncClient, literal: str
) -> None:
    """They were stored as null."""
    sid = f"nf-{literal.lstrip('-').lower()}-{'neg' if literal.startswith('-') else 'pos'}"
    raw = (
        f'{{"model": "gpt-4o", "id": "{sid}", "metadata": {{"runs": [1, {{"score": {literal}}}]}}}}'
    )
    r = await client.post("/v1/sessions", content=raw, headers=JSON)
    doc = assert_problem(r, 422, "metadata.runs[1].score", "not a finite number")
    assert [e["field"] for e in doc["errors"]] == ["metadata.runs[1].score"]
    assert_problem(await client.get(f"/v1/sessions/{sid}"), 404)

    await make_session(client, id=sid, metadata={"team": "a"})
    await append_ok(client, sid, [{"role": "user", "content": "Go."}])
    before = await get_session(client, sid)
    stored = await history(client, sid)
    cases = [
        (
            f'{{"metadata": {{"score": {literal}}}}}',
            "PATCH",
            f"/v1/sessions/{sid}",
            "metadata.score",
        ),
        (
            '{"format": "anthropic", "messages": [{"role": "assistant", "content":'
            f' [{{"type": "tool_use", "id": "n2", "name": "f", "input": {{"n": {literal}}}}}]}}]}}',
            "POST",
            f"/v1/sessions/{sid}/messages",
            "messages[0].content[0].input.n",
        ),
        (
            '{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "n1",'
            ' "type": "function", "function": {"name": "f", "arguments": "{\\"n\\": '
            + literal
            + '}"}}]}]}',
            "POST",
            f"/v1/sessions/{sid}/messages",
            "messages[0].tool_calls[0].function.arguments",
        ),
    ]
    for body, method, path, field in cases:
        r = await client.request(method, path, content=body, headers=JSON)
        doc = assert_problem(r, 422, field)
        assert [e["field"] for e in doc["errors"]] == [field]
    after = await get_session(client, sid)
    assert after["version"] == before["version"]
    assert after["metadata"] == {"team": "a"}
    assert await history(client, sid) == stored


@pytest.fixture
def llm_settings(settings: Settings, upstream: Upstream) -> Settings:
    """A server whose workers summarize with the test's scripted upstream, retrying
    at once (the backoff is not under test). The lease is short so that the old
    failure stays quick to see: a retry record that cannot be written leaves the
    job to be claimed again only when its lease ends."""
    return serving(
        settings,
        upstream_base_url=upstream.url,
        upstream_api="openai",
        upstream_timeout_seconds=10.0,
        compaction_max_attempts=3,
        compaction_backoff_base_seconds=0.0,
        compaction_backoff_cap_seconds=0.0,
        compaction_lease_seconds=5.0,
    )


async def test_a_nul_in_the_upstream_replys_model_keeps_the_summary(
    db_url: str, llm_settings: Settings, upstream: Upstream
) -> None:
    """A NUL in a successful reply's ``model`` threw every good summary away (each
    paid call, then the extractive fallback)."""
    upstream.script([Reply(SUMMARY, model="summarizer\x00-2025", finish_reason="stop\x00")])
    upstream.script([Reply(SHORT, model="summarizer\x00-2025")])
    with running(create_app(llm_settings, database_url=db_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            sid = await seeded(client, 12, config=MANUAL, id="nul-model")
            job = await compact(client, sid)
            assert job["status"] == "succeeded", job
            assert job["summarizer_used"] == "llm", job
            assert job["attempts"] == 1
            assert job["error"] is None
            assert job["summary"].startswith(SUMMARY)
            assert job["short_summary"] == SHORT
            assert job["upstream_model"] == "summarizer-2025"
            assert len(upstream.requests) == 2  # two paid calls, both kept
            ctx = await context(client, sid)
            assert summary_from_context_message(texts(ctx["messages"][1])[0]) is not None
            assert SUMMARY.splitlines()[1] in texts(ctx["messages"][1])[0]


async def test_a_nul_in_an_upstream_error_is_recorded_as_the_upstreams_error(
    db_url: str, llm_settings: Settings, upstream: Upstream
) -> None:
    """A NUL in an upstream error message made the retry record unwritable: each
    attempt waited out its lease, the job was claimed more times than
    max_attempts, and its error was a database error instead of the upstream's."""
    nul_500 = Status(
        500, body={"error": {"message": "The engine\x00 is overloaded", "type": "server_error"}}
    )
    # Spare good replies after the three failures: a fourth claim would take them.
    upstream.script([nul_500] * 3 + [Reply(SUMMARY)] * 3)
    with running(create_app(llm_settings, database_url=db_url)) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            sid = await seeded(client, 12, config=MANUAL, id="nul-error")
            started = time.monotonic()
            job = await compact(client, sid)
            print(
                f"\n[upstream] 3 failed attempts, then the fallback: {time.monotonic() - started:.2f} s"
            )
            assert job["status"] == "succeeded", job
            assert job["summarizer_used"] == "extractive", job
            assert job["attempts"] == 3
            assert len(upstream.requests) == 3
            notes = job["details"]["notes"]
            assert len(notes) == 3, notes
            for note in notes:
                assert "The engine is overloaded" in note, note
                assert "HTTP 500" in note, note
            assert job["error"] == "; ".join(notes)
            assert (await get_session(client, sid))["compaction_count"] == 1


# --- Seed 000 leftovers -------------------------------------------------------------


async def test_protected_tools_take_patterns(client: httpx.AsyncClient) -> None:
    """Seed 000's set, a name and a prefix: ``["skill", "tool-*"]``. A pattern was
    taken as a literal tool name, so ``tool-search`` outputs were pruned."""
    config = {**MANUAL, "prune": {"auto": False, "protected_tools": ["skill", "tool-*"]}}
    await make_session(client, id="patterns", config=config)
    names = ["bash", "skill", "tool-search", "bash", "tool-read", "bash"] * 2
    await append_ok(client, "patterns", [{"role": "user", "content": "Look around."}])
    for k, name in enumerate(names):
        output = "\n".join(f"{name} line {n}: value {n * k}" for n in range(150))
        await append_ok(
            client,
            "patterns",
            [
                {
                    "role": "assistant",
                    "content": f"Step {k}.",
                    "tool_calls": [tool_call(f"c{k}", name)],
                },
                {"role": "tool", "tool_call_id": f"c{k}", "content": output},
            ],
        )
    await append_ok(client, "patterns", [{"role": "user", "content": "Now summarise."}])
    stored = {e["seq"]: e for e in await history(client, "patterns")}
    r = await client.post(
        "/v1/sessions/patterns/prune",
        json={"minimum_tokens": 0, "protect_tokens": 0, "protect_turns": 0},
    )
    assert r.status_code == 200, r.text
    pruned = {stored[p["seq"]]["tool_name"] for p in r.json()["pruned"]}
    assert pruned == {"bash"}
    ctx = await context(client, "patterns")
    shown = {m["tool_call_id"]: m["content"] for m in ctx["messages"] if m["role"] == "tool"}
    for k, name in enumerate(names):
        cleared = shown[f"c{k}"] == "[Old tool result content cleared]"
        assert cleared == (name == "bash"), (k, name, shown[f"c{k}"][:60])
    # Pruning hides outputs from the model; the stored history keeps them.
    kept = {e["seq"]: e["message"] for e in await history(client, "patterns")}
    assert kept == {seq: e["message"] for seq, e in stored.items()}


async def test_an_opaque_part_costs_at_most_max_tokens_per_part(
    client: httpx.AsyncClient,
) -> None:
    """Seed 000's MAX_TOKENS_PER_PART: a 1 MB encrypted reasoning block is an
    estimate, capped at 50,000 tokens, so one odd part cannot make the verdict
    jump; it is stored whole."""
    await make_session(client, id="opaque", model="claude-sonnet-4", context_window=200_000)
    turn = opaque_reasoning_turn()
    r = await append(client, "opaque", turn, fmt="anthropic")
    assert r.status_code == 201, r.text[:2000]
    body = r.json()
    assert body["entries"][1]["tokens"] == 3 + MAX_TOKENS_PER_PART + count_text("ok")
    assert body["overflow"]["estimated_tokens"] < 200_000 * 0.5
    session = await get_session(client, "opaque")
    assert session["stored_tokens"] == sum(e["tokens"] for e in body["entries"])
    stored = await history(client, "opaque", fmt="anthropic")
    assert stored[1]["message"] == turn[1]
