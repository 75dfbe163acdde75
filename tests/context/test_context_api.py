"""The context the agent sends to its model, and the overflow verdict."""

from __future__ import annotations

import itertools
from typing import Any

import httpx

from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session, tool_call

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Inspect the repo.", "x_trace": "t-1"},
    {
        "role": "assistant",
        "content": "Running three tools.",
        "tool_calls": [
            tool_call("p1", "bash", '{"command": "ls"}'),
            tool_call("p2", "read", '{"path": "README.md"}'),
            tool_call("p3", "grep", '{"pattern": "TODO"}'),
        ],
    },
    # Results arrive out of order: the context must still pair them.
    {"role": "tool", "tool_call_id": "p3", "content": "app/x.py:1: TODO"},
    {"role": "tool", "tool_call_id": "p1", "content": "README.md\napp\n"},
    {"role": "tool", "tool_call_id": "p2", "content": "# compactd\n" * 20},
    {"role": "assistant", "content": "Found one TODO."},
    {"role": "user", "content": "Fix it."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("last", "edit", '{"path": "app/x.py"}')],
    },
]


async def _context(client: httpx.AsyncClient, session_id: str, fmt: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{session_id}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def test_openai_context_pairs_parallel_calls_and_keeps_the_pending_one(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="c")
    appended = await append_ok(client, "c", HISTORY)
    ctx = await _context(client, "c", "openai")
    msgs = ctx["messages"]
    assert ctx["format"] == "openai"
    assert ctx["system"] is None
    assert check_openai_pairing(msgs) == []
    assert [m["role"] for m in msgs] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "tool",
        "assistant",
        "user",
        "assistant",
    ]
    # Each result sits right behind the call, in the call's order.
    assert [m["tool_call_id"] for m in msgs[3:6]] == ["p1", "p2", "p3"]
    assert msgs[4]["content"] == "# compactd\n" * 20
    # The call still running at the end is kept, unanswered.
    assert [c["id"] for c in msgs[-1]["tool_calls"]] == ["last"]
    # Unknown client keys are history, not context.
    assert "x_trace" not in msgs[1]
    assert msgs[0] == {"role": "system", "content": "You are a coding agent."}

    s = await get_session(client, "c")
    assert ctx["version"] == s["version"] == appended["version"]
    assert ctx["state"] == "ok"
    assert ctx["compaction"] is None
    tokens = ctx["tokens"]
    b = tokens["breakdown"]
    assert b["summary"] + b["messages"] + b["tool_outputs"] + b["overhead"] == tokens["estimated"]
    tool_tokens = sum(e["tokens"] for e in appended["entries"] if e["role"] == "tool")
    assert b["tool_outputs"] == tool_tokens > 0
    assert b["messages"] == s["stored_tokens"] - tool_tokens
    assert b["overhead"] > 0
    assert tokens["budget"] == s["usable_tokens"]
    assert tokens["fraction"] == round(tokens["estimated"] / tokens["budget"], 4)


async def test_anthropic_context(client: httpx.AsyncClient) -> None:
    await make_session(client, id="c", model="claude-sonnet-4")
    await append_ok(client, "c", HISTORY)
    ctx = await _context(client, "c", "anthropic")
    assert ctx["format"] == "anthropic"
    assert ctx["system"] == [{"type": "text", "text": "You are a coding agent."}]
    msgs = ctx["messages"]
    assert all(m["role"] in ("user", "assistant") for m in msgs)
    assert check_anthropic_pairing(msgs) == []
    assert msgs[0] == {"role": "user", "content": [{"type": "text", "text": "Inspect the repo."}]}
    uses = [b for b in msgs[1]["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["input"]) for u in uses] == [
        ("p1", {"command": "ls"}),
        ("p2", {"path": "README.md"}),
        ("p3", {"pattern": "TODO"}),
    ]
    # All three results in the one user message that follows.
    assert msgs[2]["role"] == "user"
    assert [b["tool_use_id"] for b in msgs[2]["content"]] == ["p1", "p2", "p3"]
    # Roles alternate, as the Messages API requires.
    roles = [m["role"] for m in msgs]
    assert all(a != b for a, b in itertools.pairwise(roles))
    assert [b["id"] for b in msgs[-1]["content"] if b["type"] == "tool_use"] == ["last"]
    assert ctx["state"] == "ok"
    assert ctx["version"] == (await get_session(client, "c"))["version"]


async def test_anthropic_history_renders_as_anthropic_context(client: httpx.AsyncClient) -> None:
    await make_session(client, id="c", model="claude-sonnet-4")
    sent: list[dict[str, Any]] = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "b", "input": {"x": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t2", "content": "two"},
                {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
            ],
        },
    ]
    await append_ok(client, "c", sent, fmt="anthropic")
    ctx = await _context(client, "c", "anthropic")
    assert ctx["system"] == [{"type": "text", "text": "Be terse."}]
    assert check_anthropic_pairing(ctx["messages"], allow_pending=False) == []
    openai_ctx = await _context(client, "c", "openai")
    assert check_openai_pairing(openai_ctx["messages"], allow_pending=False) == []
    assert [m["tool_call_id"] for m in openai_ctx["messages"] if m["role"] == "tool"] == [
        "t1",
        "t2",
    ]


async def test_empty_session_context(client: httpx.AsyncClient) -> None:
    await make_session(client, id="c")
    ctx = await _context(client, "c", "openai")
    assert ctx["messages"] == []
    assert ctx["state"] == "ok"
    assert ctx["version"] == 1
    b = ctx["tokens"]["breakdown"]
    assert b["messages"] == b["tool_outputs"] == b["summary"] == 0


async def test_context_rejects_unknown_format_and_session(client: httpx.AsyncClient) -> None:
    await make_session(client, id="c")
    assert_problem(
        await client.get("/v1/sessions/c/context", params={"format": "xml"}), 422, "format"
    )
    assert_problem(await client.get("/v1/sessions/nope/context"), 404)
    assert_problem(await client.get("/v1/sessions/nope/overflow"), 404)


async def test_overflow_escalates_as_the_window_fills(client: httpx.AsyncClient) -> None:
    # usable = 2000 - 200 = 1800; trigger = max(180, 1800 - reserve) with reserve 300 -> 1500;
    # prune from 0.8 x 1500 = 1200; emergency at 0.95 x 1800 = 1710.
    await make_session(
        client,
        id="o",
        model="gpt-4o",
        context_window=2000,
        max_output_tokens=200,
        # The verdict alone: no automatic compaction to relieve the window.
        config={"compaction": {"reserve_tokens": 300, "auto": False}},
    )
    r = await client.get("/v1/sessions/o/overflow")
    assert r.status_code == 200, r.text
    v = r.json()
    assert set(v) == {
        "estimated_tokens",
        "usable_tokens",
        "threshold_tokens",
        "fraction",
        "calibration_factor",
        "overflow",
        "action",
    }
    assert v["usable_tokens"] == 1800
    assert v["threshold_tokens"] == 1500
    # Nothing stored yet: the reply's priming alone, the figure /context gives too.
    assert v["estimated_tokens"] == REPLY_PRIMING_TOKENS
    assert (await _context(client, "o", "openai"))["tokens"]["estimated"] == REPLY_PRIMING_TOKENS
    assert v["action"] == "none"
    assert v["overflow"] is False
    assert v["calibration_factor"] == 1.0

    chunk = "alpha beta gamma delta " * 25  # ~100 tokens
    seen: list[str] = []
    last_estimate = 0
    for _ in range(40):
        body = await append_ok(client, "o", [{"role": "user", "content": chunk}])
        v = (await client.get("/v1/sessions/o/overflow")).json()
        assert v == body["overflow"]
        assert v["estimated_tokens"] > last_estimate
        last_estimate = v["estimated_tokens"]
        assert v["fraction"] == round(v["estimated_tokens"] / 1800, 4)
        if not seen or seen[-1] != v["action"]:
            seen.append(v["action"])
        if v["overflow"]:
            break
    assert seen == ["none", "prune", "compact", "emergency"]
    assert v["overflow"] is True
    assert v["estimated_tokens"] > 1800
    ctx = await _context(client, "o", "openai")
    assert ctx["state"] == "overflow"


async def test_context_state_follows_the_verdict(client: httpx.AsyncClient) -> None:
    await make_session(
        client,
        id="o",
        context_window=2000,
        max_output_tokens=200,
        config={"compaction": {"threshold": 0.5}},
    )
    await append_ok(client, "o", [{"role": "user", "content": "word " * 1000}])
    ctx = await _context(client, "o", "openai")
    v = (await client.get("/v1/sessions/o/overflow")).json()
    assert v["threshold_tokens"] == 900
    assert v["action"] == "compact"
    assert ctx["state"] == "compact"


async def test_call_ids_anthropic_refuses_are_rewritten_in_its_view_only(
    client: httpx.AsyncClient,
) -> None:
    """Kimi names its calls ``functions.bash:0``; Anthropic accepts only
    ``[A-Za-z0-9_-]+``. The Anthropic view rewrites such ids (call and result
    alike); the OpenAI view and the stored history keep them."""
    import re

    await make_session(client, id="k")
    ids = ["functions.bash:0", "functions.bash:1", "call ok?"]
    await append_ok(
        client,
        "k",
        [
            {"role": "user", "content": "Look around."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call(i, "bash") for i in ids],
            },
            *({"role": "tool", "tool_call_id": i, "content": f"out {i}"} for i in ids),
        ],
    )
    anthropic = await _context(client, "k", "anthropic")
    assert check_anthropic_pairing(anthropic["messages"]) == []
    blocks = [b for m in anthropic["messages"] for b in m["content"]]
    used = [b["id"] for b in blocks if b["type"] == "tool_use"]
    answered = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
    assert len(set(used)) == 3
    assert set(used) == set(answered)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+", i) for i in used)

    openai = await _context(client, "k", "openai")
    assert check_openai_pairing(openai["messages"]) == []
    assert [c["id"] for c in openai["messages"][1]["tool_calls"]] == ids

    r = await client.get("/v1/sessions/k/messages", params={"format": "anthropic"})
    stored = [
        b for e in r.json()["entries"] for b in e["message"]["content"] if isinstance(b, dict)
    ]
    assert {b["id"] for b in stored if b.get("type") == "tool_use"} == set(ids)


async def test_a_call_id_used_again_in_a_later_turn(client: httpx.AsyncClient) -> None:
    """Providers that number calls per turn send ``call_0`` every turn. Once
    answered, an id may come back; each result answers the latest call with its
    id, and the model's view gives every call an id of its own."""
    await make_session(client, id="r", config={"prune": {"auto": False}})

    def turn(k: int) -> list[dict[str, Any]]:
        return [
            {"role": "user", "content": f"step {k}"},
            {"role": "assistant", "content": None, "tool_calls": [tool_call("call_0", "bash")]},
            {"role": "tool", "tool_call_id": "call_0", "content": f"output {k}: " + "ok " * 50},
        ]

    await append_ok(client, "r", turn(0))
    await append_ok(client, "r", turn(1) + turn(2))  # reused within one batch too
    # The result may come in its own append, answering the latest call_0.
    await append_ok(client, "r", turn(3)[:2])
    await append_ok(client, "r", turn(3)[2:])

    for fmt in ("openai", "anthropic"):
        ctx = await _context(client, "r", fmt)
        if fmt == "openai":
            assert check_openai_pairing(ctx["messages"]) == []
            calls = [c["id"] for m in ctx["messages"] for c in m.get("tool_calls") or []]
            results = [m["tool_call_id"] for m in ctx["messages"] if m["role"] == "tool"]
            outputs = [m["content"] for m in ctx["messages"] if m["role"] == "tool"]
        else:
            assert check_anthropic_pairing(ctx["messages"]) == []
            blocks = [b for m in ctx["messages"] for b in m["content"]]
            calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            outputs = [b["content"] for b in blocks if b["type"] == "tool_result"]
        assert len(set(calls)) == 4
        assert calls == results  # each call answered right after it, in order
        assert outputs == [f"output {k}: " + "ok " * 50 for k in range(4)]

    # The history gives back the ids as sent.
    r = await client.get("/v1/sessions/r/messages")
    sent = [e["message"] for e in r.json()["entries"]]
    assert [m["tool_call_id"] for m in sent if m["role"] == "tool"] == ["call_0"] * 4
    # Pruned, the reused calls stay paired.
    pruned = await client.post(
        "/v1/sessions/r/prune", json={"minimum_tokens": 0, "protect_tokens": 0, "protect_turns": 0}
    )
    assert pruned.status_code == 200, pruned.text
    assert pruned.json()["pruned"]
    ctx = await _context(client, "r", "anthropic")
    assert check_anthropic_pairing(ctx["messages"]) == []
