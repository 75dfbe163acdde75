"""Appending messages and reading the stored history back."""

from __future__ import annotations

import base64
import random
from typing import Any

import httpx

from app.engine.accounting.tokens import MAX_TOKENS_PER_PART, count_text
from tests.conftest import make_session
from tests.helpers import append, append_ok, assert_problem, get_session, history, tool_call

OPENAI_TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a careful coding agent."},
    {
        "role": "user",
        "content": "List the files, then read the README.",
        "x_client_tag": {"k": [1, 2]},
    },
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Two independent calls.",
        "tool_calls": [
            tool_call("call_a", "bash", '{"command": "ls"}'),
            {**tool_call("call_b", "read", '{"path": "README.md"}'), "x_call_meta": 7},
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "README.md\napp\n"},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "# compactd"}]},
    {"role": "assistant", "content": "There are two entries.", "name": "agent-1"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "And this picture?"},
            {
                "type": "image_url",
                "image_url": {"url": "https://example.com/a.png", "detail": "low"},
            },
        ],
    },
]


async def test_append_openai_returns_entries_with_seq_and_tokens(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    r = await append(client, "s", OPENAI_TURN)
    assert r.status_code == 201, r.text
    body = r.json()
    entries = body["entries"]
    assert [e["seq"] for e in entries] == list(range(1, len(OPENAI_TURN) + 1))
    assert [e["role"] for e in entries] == [m["role"] for m in OPENAI_TURN]
    assert all(e["tokens"] > 0 for e in entries)
    assert len({e["id"] for e in entries}) == len(entries)
    assert body["version"] == 2
    assert r.headers["etag"] == '"2"'
    assert body["context_tokens"] == sum(e["tokens"] for e in entries)
    assert body["overflow"]["action"] == "none"
    assert body["overflow"]["estimated_tokens"] >= body["context_tokens"]

    # A longer message costs more tokens than a short one.
    more = await append_ok(client, "s", [{"role": "user", "content": "word " * 500}])
    assert more["entries"][0]["seq"] == len(OPENAI_TURN) + 1
    assert more["entries"][0]["tokens"] > 400

    s = await get_session(client, "s")
    assert s["entry_count"] == len(OPENAI_TURN) + 1
    assert s["stored_tokens"] == body["context_tokens"] + more["entries"][0]["tokens"]
    assert s["version"] == 3


async def test_history_gives_back_what_was_sent_including_unknown_keys(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", OPENAI_TURN)
    stored = await history(client, "s")
    assert [e["message"] for e in stored] == OPENAI_TURN
    assert [e["seq"] for e in stored] == list(range(1, len(OPENAI_TURN) + 1))
    assert all(e["source_format"] == "openai" and e["kind"] == "message" for e in stored)
    assert all(e["pruned_at"] is None for e in stored)
    # Tool results are labelled with the tool that produced them.
    assert [e["tool_name"] for e in stored if e["role"] == "tool"] == ["bash", "read"]


async def test_history_pages_by_after_seq(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    sent = [{"role": "user", "content": f"message {i}"} for i in range(10)]
    await append_ok(client, "s", sent[:4])
    await append_ok(client, "s", sent[4:])

    r = await client.get("/v1/sessions/s/messages", params={"limit": 4})
    page = r.json()
    assert [e["seq"] for e in page["entries"]] == [1, 2, 3, 4]
    assert page["next_after_seq"] == 4
    r = await client.get("/v1/sessions/s/messages", params={"limit": 4, "after_seq": 4})
    assert [e["seq"] for e in r.json()["entries"]] == [5, 6, 7, 8]
    r = await client.get("/v1/sessions/s/messages", params={"limit": 4, "after_seq": 8})
    page = r.json()
    assert [e["seq"] for e in page["entries"]] == [9, 10]
    assert page["next_after_seq"] is None

    assert [e["message"] for e in await history(client, "s", limit=3)] == sent
    r = await client.get("/v1/sessions/s/messages", params={"after_seq": 10})
    assert r.json() == {"entries": [], "next_after_seq": None}


async def test_history_rejects_bad_paging(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    for params in ({"after_seq": -1}, {"limit": 0}, {"limit": 100_000}, {"format": "xml"}):
        assert_problem(await client.get("/v1/sessions/s/messages", params=params), 422)


ANTHROPIC_TURN: list[dict[str, Any]] = [
    {"role": "user", "content": "What is in the repo?"},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "I should look.", "signature": "sig-1"},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read", "input": {"path": "a.py"}},
        ],
    },
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.py\n"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_2",
                "content": [{"type": "text", "text": "print(1)"}],
                "is_error": True,
            },
            {"type": "text", "text": "Now summarise."},
        ],
    },
    {"role": "assistant", "content": [{"type": "text", "text": "One file printing 1."}]},
]


async def test_append_anthropic_and_read_back(client: httpx.AsyncClient) -> None:
    await make_session(client, id="a", model="claude-sonnet-4")
    body = await append_ok(client, "a", ANTHROPIC_TURN, fmt="anthropic")
    # The tool results become entries of their own, behind the assistant's call.
    roles = [e["role"] for e in body["entries"]]
    assert roles == ["user", "assistant", "tool", "tool", "user", "assistant"]
    assert [e["seq"] for e in body["entries"]] == [1, 2, 3, 4, 5, 6]
    assert all(e["tokens"] > 0 for e in body["entries"])

    stored = await history(client, "a", fmt="anthropic")
    assert all(e["source_format"] == "anthropic" for e in stored)
    assert stored[0]["message"] == ANTHROPIC_TURN[0]
    assert stored[1]["message"] == ANTHROPIC_TURN[1]
    assert stored[2]["message"]["content"][0] == ANTHROPIC_TURN[2]["content"][0]
    assert stored[3]["message"]["content"][0] == ANTHROPIC_TURN[2]["content"][1]
    assert stored[-1]["message"] == ANTHROPIC_TURN[-1]

    # The same history in OpenAI form: the call and its results line up.
    as_openai = [e["message"] for e in await history(client, "a", fmt="openai")]
    calls = as_openai[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["toolu_1", "toolu_2"]
    assert calls[0]["function"]["name"] == "bash"
    assert as_openai[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "a.py\n"}
    assert as_openai[3]["tool_call_id"] == "toolu_2"


def opaque_reasoning_turn() -> list[dict[str, Any]]:
    """A prompt and, in Anthropic form, a reply with a 1 MB encrypted reasoning block:
    an opaque part that counts over MAX_TOKENS_PER_PART."""
    blob = base64.b64encode(random.Random(7).randbytes(750_000)).decode()
    assert count_text(blob) > MAX_TOKENS_PER_PART
    return [
        {"role": "user", "content": "think hard"},
        {
            "role": "assistant",
            "content": [
                {"type": "redacted_thinking", "data": blob},
                {"type": "text", "text": "ok"},
            ],
        },
    ]


async def test_an_opaque_reasoning_block_costs_at_most_the_per_part_cap(
    client: httpx.AsyncClient,
) -> None:
    """Seed 000's MAX_TOKENS_PER_PART: a 1 MB encrypted reasoning block is an
    estimate, capped at 50,000 tokens, and is stored whole."""
    await make_session(client, id="r", model="claude-sonnet-4", context_window=200_000)
    turn = opaque_reasoning_turn()
    body = await append_ok(client, "r", turn, fmt="anthropic")
    reply = body["entries"][1]
    assert reply["tokens"] == 3 + MAX_TOKENS_PER_PART + count_text("ok")
    session = await get_session(client, "r")
    assert session["stored_tokens"] == sum(e["tokens"] for e in body["entries"])
    stored = await history(client, "r", fmt="anthropic")
    assert stored[1]["message"] == turn[1]


async def test_openai_messages_read_back_in_anthropic_format(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", OPENAI_TURN)
    stored = [e["message"] for e in await history(client, "s", fmt="anthropic")]
    assert stored[0]["role"] == "system"
    assert stored[0]["content"] == "You are a careful coding agent."
    uses = [b for b in stored[2]["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [
        ("call_a", "bash", {"command": "ls"}),
        ("call_b", "read", {"path": "README.md"}),
    ]
    results = [b for m in stored[3:5] for b in m["content"] if b["type"] == "tool_result"]
    assert [b["tool_use_id"] for b in results] == ["call_a", "call_b"]


async def test_tool_result_in_a_later_batch_answers_an_earlier_call(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", [{"role": "user", "content": "go"}])
    await append_ok(
        client, "s", [{"role": "assistant", "content": None, "tool_calls": [tool_call("c1")]}]
    )
    body = await append_ok(client, "s", [{"role": "tool", "tool_call_id": "c1", "content": "done"}])
    assert body["entries"][0]["seq"] == 3
    stored = await history(client, "s")
    assert stored[2]["tool_name"] == "bash"
