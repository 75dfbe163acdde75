"""Pinned messages on append: ``pinned: true`` on a message, in either format,
is kept with the stored message and given back in the history, never shown to
the model; what cannot stand alone in a context is refused, and nothing of the
batch is stored."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import make_session
from tests.helpers import append, append_ok, assert_problem, get_session, history, tool_call


async def context(client: httpx.AsyncClient, sid: str, fmt: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


def keys_of(value: Any) -> set[str]:
    """Every key of every object in ``value``, however deep."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_of(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_of(v)}
    return set()


async def test_openai_messages_are_pinned_and_given_back_never_to_the_model(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="p")
    body = await append_ok(
        client,
        "p",
        [
            {"role": "user", "content": "Always use tabs.", "pinned": True},
            {"role": "assistant", "content": "Tabs it is.", "pinned": True},
            {"role": "user", "content": "Now fix the parser.", "pinned": False},
        ],
    )
    assert [e["role"] for e in body["entries"]] == ["user", "assistant", "user"]
    stored = await history(client, "p")
    assert [e["message"] for e in stored] == [
        {"role": "user", "content": "Always use tabs.", "pinned": True},
        {"role": "assistant", "content": "Tabs it is.", "pinned": True},
        {"role": "user", "content": "Now fix the parser.", "pinned": False},
    ]
    anthropic = await history(client, "p", "anthropic")
    assert [e["message"].get("pinned") for e in anthropic] == [True, True, False]
    for fmt in ("openai", "anthropic"):
        ctx = await context(client, "p", fmt)
        assert "pinned" not in keys_of(ctx["messages"])
        assert ctx["messages"][0]["content"] in (
            "Always use tabs.",
            [{"type": "text", "text": "Always use tabs."}],
        )
    # Counted as any message: the flag costs no tokens.
    plain = await make_session(client, id="q")
    await append_ok(
        client,
        plain["id"],
        [
            {"role": "user", "content": "Always use tabs."},
            {"role": "assistant", "content": "Tabs it is."},
            {"role": "user", "content": "Now fix the parser."},
        ],
    )
    assert (await get_session(client, "q"))["context_tokens"] == (await get_session(client, "p"))[
        "context_tokens"
    ]


async def test_anthropic_messages_are_pinned_and_given_back(client: httpx.AsyncClient) -> None:
    await make_session(client, id="a")
    await append_ok(
        client,
        "a",
        [
            {"role": "user", "content": "Answer in French.", "pinned": True},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "D'accord."}],
                "pinned": True,
            },
        ],
        "anthropic",
    )
    stored = await history(client, "a", "anthropic")
    assert [e["message"] for e in stored] == [
        {"role": "user", "content": "Answer in French.", "pinned": True},
        {"role": "assistant", "content": [{"type": "text", "text": "D'accord."}], "pinned": True},
    ]
    openai = await history(client, "a")
    assert [e["message"]["pinned"] for e in openai] == [True, True]
    ctx = await context(client, "a", "anthropic")
    assert "pinned" not in keys_of(ctx["messages"])


ANSWERED: list[dict[str, Any]] = [
    {"role": "user", "content": "start"},
    {"role": "assistant", "content": None, "tool_calls": [tool_call("c1")]},
]

REFUSED: list[tuple[str, str, list[dict[str, Any]], str, str]] = [
    (
        "an openai tool result",
        "openai",
        [{"role": "tool", "tool_call_id": "c1", "content": "ok", "pinned": True}],
        "messages[0].pinned",
        "tool result cannot be pinned",
    ),
    (
        "an openai assistant with tool calls",
        "openai",
        [
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {
                "role": "assistant",
                "content": "more",
                "tool_calls": [tool_call("c2")],
                "pinned": True,
            },
        ],
        "messages[1].pinned",
        "tool calls cannot be pinned",
    ),
    (
        "a flag that is not a boolean",
        "openai",
        [
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "user", "content": "x", "pinned": "yes"},
        ],
        "messages[1].pinned",
        "true or false",
    ),
    (
        "an anthropic user message with tool results",
        "anthropic",
        [
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "c1", "content": "ok"},
                    {"type": "text", "text": "and keep this"},
                ],
                "pinned": True,
            }
        ],
        "messages[0].pinned",
        "tool result cannot be pinned",
    ),
    (
        "an anthropic assistant with tool use",
        "anthropic",
        [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "ok"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "next"},
                    {"type": "tool_use", "id": "c2", "name": "bash", "input": {}},
                ],
                "pinned": True,
            },
        ],
        "messages[1].pinned",
        "tool calls cannot be pinned",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "batch", "field", "why"),
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
async def test_what_cannot_stand_alone_is_refused_and_nothing_is_stored(
    client: httpx.AsyncClient, fmt: str, batch: list[dict[str, Any]], field: str, why: str
) -> None:
    await make_session(client, id="r")
    await append_ok(client, "r", ANSWERED)
    before = await get_session(client, "r")
    r = await append(client, "r", batch, fmt)
    doc = assert_problem(r, 422, field)
    assert why in doc["detail"] + " ".join(e["detail"] for e in doc.get("errors") or [])
    after = await get_session(client, "r")
    for key in ("entry_count", "version", "stored_tokens", "context_tokens"):
        assert after[key] == before[key], key
    assert len(await history(client, "r")) == before["entry_count"]
    # The same batch unpinned is stored: the flag was the only fault.
    fixed = [{k: v for k, v in m.items() if k != "pinned"} for m in batch]
    await append_ok(client, "r", fixed, fmt)


async def test_pinned_entries_alone_over_the_budget_make_the_verdict_say_so(
    client: httpx.AsyncClient,
) -> None:
    """The pinned entries count in the context like the system prompt: when they
    alone exceed the window, no compaction can relieve it, and every verdict says
    so rather than hiding them."""
    await make_session(
        client,
        id="big",
        context_window=64_000,
        max_output_tokens=1_000,
        config={"compaction": {"keep_recent_tokens": 500}, "prune": {"auto": False}},
    )
    rules = "Follow this house rule in every step of the work. " * 800
    # Pinned within a quarter of the window they were pinned in; the window then shrinks.
    await append_ok(client, "big", [{"role": "user", "content": rules, "pinned": True}])
    r = await client.patch("/v1/sessions/big", json={"context_window": 8_000})
    assert r.status_code == 200, r.text
    body = await append_ok(client, "big", [{"role": "user", "content": "Start."}])
    verdict = body["overflow"]
    assert verdict["estimated_tokens"] > verdict["usable_tokens"]
    assert verdict["overflow"] is True
    assert verdict["action"] == "emergency"
    for k in range(4):
        body = await append_ok(
            client,
            "big",
            [
                {"role": "user", "content": f"Step {k}: " + "do the next thing. " * 40},
                {"role": "assistant", "content": f"Done with step {k}. " + "ok " * 40},
            ],
        )
    # The emergency compactions summarize what they can; the pinned rules stay.
    assert body["overflow"]["overflow"] is True
    session = await get_session(client, "big")
    ctx = await context(client, "big", "openai")
    assert ctx["state"] == "overflow"
    assert ctx["tokens"]["estimated"] > ctx["tokens"]["budget"]
    assert session["context_tokens"] >= (await history(client, "big"))[0]["tokens"]
    # A compaction ran and cut after the rules: they stay, first, before the summary.
    assert session["compaction_count"] >= 1
    assert ctx["messages"][0] == {"role": "user", "content": rules}
    assert "compacted" in ctx["messages"][1]["content"]


async def test_pinned_messages_take_at_most_a_quarter_of_the_window(
    client: httpx.AsyncClient,
) -> None:
    """Beyond it no compaction could bring the context under its threshold: every
    append would start one more that cannot help."""
    await make_session(client, id="pin-cap", context_window=24_000, max_output_tokens=1_000)
    session = await get_session(client, "pin-cap")
    limit = session["usable_tokens"] // 4
    words = "alpha beta gamma delta " * 200  # ~800 tokens
    pinned_ok = 0
    for i in range(limit // 800 + 2):
        r = await client.post(
            "/v1/sessions/pin-cap/messages",
            json={"messages": [{"role": "user", "content": f"{i} {words}", "pinned": True}]},
        )
        if r.status_code != 201:
            break
        pinned_ok += 1
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    assert "messages[0].pinned" in r.text, problem
    assert f"{limit:,}" in r.text, problem
    # The refused batch stored nothing; the session is as the last accepted append left it.
    assert pinned_ok >= 2
    assert len(await history(client, "pin-cap")) == pinned_ok
    # Unpinned messages are still welcome.
    await append_ok(client, "pin-cap", [{"role": "user", "content": words}])
