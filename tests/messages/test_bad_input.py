"""Rejected appends: a clear 4xx problem naming the field, and nothing stored."""

from __future__ import annotations

import random
import string
from typing import Any

import httpx
import pytest

from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session, history, tool_call

GOOD = {"role": "user", "content": "fine"}
# Random, so Postgres cannot compress it under its index-row limit.
RANDOM_ID = "".join(random.Random(3).choice(string.ascii_letters) for _ in range(6000))


async def _seeded(client: httpx.AsyncClient) -> dict[str, Any]:
    """A session with one answered call (c_done) and one open call (c_open)."""
    await make_session(client, id="s")
    await append_ok(
        client,
        "s",
        [
            {"role": "user", "content": "start"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [tool_call("c_done"), tool_call("c_open")],
            },
            {"role": "tool", "tool_call_id": "c_done", "content": "ok"},
        ],
    )
    return await get_session(client, "s")


async def _assert_unchanged(client: httpx.AsyncClient, before: dict[str, Any]) -> None:
    after = await get_session(client, "s")
    assert after["entry_count"] == before["entry_count"]
    assert after["version"] == before["version"]
    assert after["stored_tokens"] == before["stored_tokens"]
    assert len(await history(client, "s")) == before["entry_count"]


BAD_BATCHES: list[tuple[str, dict[str, Any], str]] = [
    ("unknown role", {"messages": [GOOD, {"role": "robot", "content": "x"}]}, "messages[1].role"),
    (
        "result for no call",
        {"messages": [GOOD, {"role": "tool", "tool_call_id": "nope", "content": "x"}]},
        "messages[1].tool_call_id",
    ),
    (
        "second result for an answered call",
        {"messages": [{"role": "tool", "tool_call_id": "c_done", "content": "again"}]},
        "messages[0].tool_call_id",
    ),
    (
        "two results for one call in a batch",
        {
            "messages": [
                {"role": "tool", "tool_call_id": "c_open", "content": "1"},
                {"role": "tool", "tool_call_id": "c_open", "content": "2"},
            ]
        },
        "messages[1].tool_call_id",
    ),
    (
        "duplicate call id in a batch",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call("d1"), tool_call("d1")],
                }
            ]
        },
        "d1",
    ),
    (
        "call id still waiting for its result",
        {
            "messages": [
                GOOD,
                {"role": "assistant", "content": None, "tool_calls": [tool_call("c_open")]},
            ]
        },
        "messages[1]",
    ),
    (
        "result before its call",
        {
            "messages": [
                {"role": "tool", "tool_call_id": "n1", "content": "early"},
                {"role": "assistant", "content": None, "tool_calls": [tool_call("n1")]},
            ]
        },
        "messages[0].tool_call_id",
    ),
    (
        "arguments not JSON",
        {
            "messages": [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call("a1", "f", "{oops")],
                }
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        "arguments not an object",
        {
            "messages": [
                {"role": "assistant", "content": None, "tool_calls": [tool_call("a1", "f", "[1]")]}
            ]
        },
        "messages[0].tool_calls[0].function.arguments",
    ),
    (
        "NUL in content",
        {"messages": [{"role": "user", "content": "a\u0000b"}]},
        "messages[0].content",
    ),
    (
        "NUL deep in a part",
        {"messages": [GOOD, {"role": "user", "content": [{"type": "text", "text": "\u0000"}]}]},
        "messages[1].content[0].text",
    ),
    ("messages not a list", {"messages": "hello"}, "messages"),
    ("messages missing", {"format": "openai"}, "messages"),
    ("content a number", {"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    ("message not an object", {"messages": [GOOD, "hi"]}, "messages[1]"),
    ("format xml", {"messages": [GOOD], "format": "xml"}, "format"),
    ("empty messages", {"messages": []}, "messages"),
    ("user without content", {"messages": [{"role": "user"}]}, "messages[0].content"),
    (
        "tool_calls on a user",
        {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        "messages[0].tool_calls",
    ),
    (
        "unknown part type",
        {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
        "messages[0].content[0].type",
    ),
    ("unknown top-level key", {"messages": [GOOD], "extra": 1}, "extra"),
    (
        "anthropic bad block",
        {
            "format": "anthropic",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_use", "id": "x", "name": "y", "input": {}}],
                }
            ],
        },
        "messages[0].content[0].type",
    ),
    (
        "anthropic tool_use input not an object",
        {
            "format": "anthropic",
            "messages": [
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "x", "name": "y", "input": "ls"}],
                }
            ],
        },
        "messages[0].content[0].input",
    ),
    (
        "anthropic result for no call",
        {
            "format": "anthropic",
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "ghost", "content": "x"}],
                }
            ],
        },
        "ghost",
    ),
    (
        "anthropic tool role",
        {"format": "anthropic", "messages": [{"role": "tool", "content": "x"}]},
        "messages[0].role",
    ),
]


async def test_bad_batches_are_422_naming_the_field_and_store_nothing(
    client: httpx.AsyncClient,
) -> None:
    # One database for every case (a clone costs more than the requests); each
    # case is checked on its own and all failures are reported together.
    before = await _seeded(client)
    failures: list[str] = []
    for name, body, field in BAD_BATCHES:
        r = await client.post("/v1/sessions/s/messages", json=body)
        try:
            assert_problem(r, 422, field)
            await _assert_unchanged(client, before)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    assert not failures, "\n".join(failures)


async def test_lone_surrogate_is_422(client: httpx.AsyncClient) -> None:
    before = await _seeded(client)
    raw = (
        b'{"messages": [{"role": "user", "content": "ok"},'
        b' {"role": "user", "content": "x\\ud800y"}]}'
    )
    r = await client.post(
        "/v1/sessions/s/messages", content=raw, headers={"content-type": "application/json"}
    )
    assert_problem(r, 422, "messages[1].content", "surrogate")
    # An escaped backslash before "ud800" is plain text, and is stored.
    ok = b'{"messages": [{"role": "user", "content": "path C:\\\\ud800"}]}'
    r = await client.post(
        "/v1/sessions/s/messages", content=ok, headers={"content-type": "application/json"}
    )
    assert r.status_code == 201, r.text
    stored = await history(client, "s")
    assert stored[-1]["message"]["content"] == "path C:\\ud800"
    assert len(stored) == before["entry_count"] + 1


async def test_invalid_utf8_is_400(client: httpx.AsyncClient) -> None:
    before = await _seeded(client)
    raw = b'{"messages": [{"role": "user", "content": "caf\xe9"}]}'
    r = await client.post(
        "/v1/sessions/s/messages", content=raw, headers={"content-type": "application/json"}
    )
    assert_problem(r, 400, "UTF-8")
    await _assert_unchanged(client, before)


@pytest.mark.parametrize(("depth", "status"), [(300, 422), (5_000, 400)])
async def test_deeply_nested_bodies_are_refused(
    client: httpx.AsyncClient, depth: int, status: int
) -> None:
    """Past 128 levels a body is refused by name (the JSON encoder stops at 255);
    past the parser's own limit it is a 400 that says why."""
    before = await _seeded(client)
    nested = "[" * depth + "]" * depth
    raw = '{"messages": [{"role": "user", "content": "x", "meta": ' + nested + "}]}"
    r = await client.post(
        "/v1/sessions/s/messages", content=raw, headers={"content-type": "application/json"}
    )
    assert_problem(r, status, "nest")
    await _assert_unchanged(client, before)
    tools = '{"input_tokens": 5, "tools": [' + '{"a":' * depth + "1" + "}" * depth + "]}"
    r = await client.post(
        "/v1/sessions/s/usage", content=tools, headers={"content-type": "application/json"}
    )
    assert_problem(r, status, "nest")
    await _assert_unchanged(client, before)


async def test_deeply_nested_tool_arguments_are_refused(client: httpx.AsyncClient) -> None:
    """OpenAI arguments are JSON the service parses (for the Anthropic view): nested
    past 128 levels they are refused by name, as the body's own JSON is. At 300
    levels they were a 500: the Anthropic view could not be written."""
    before = await _seeded(client)
    field = "messages[0].tool_calls[0].function.arguments"
    for depth in (129, 300):
        arguments = '{"a": ' + "[" * depth + "]" * depth + "}"
        r = await client.post(
            "/v1/sessions/s/messages",
            json={
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [tool_call("deep", "f", arguments)],
                    }
                ]
            },
        )
        doc = assert_problem(r, 422, field, "nests")
        assert [e["field"] for e in doc["errors"]] == [field]
        await _assert_unchanged(client, before)
    ok = '{"a": ' + "[" * 120 + "]" * 120 + "}"
    await append_ok(
        client,
        "s",
        [
            {"role": "assistant", "content": None, "tool_calls": [tool_call("deep", "f", ok)]},
            {"role": "tool", "tool_call_id": "deep", "content": "done"},
        ],
    )
    r = await client.get("/v1/sessions/s/context", params={"format": "anthropic"})
    assert r.status_code == 200, r.text


async def test_body_that_is_not_json_is_422(client: httpx.AsyncClient) -> None:
    before = await _seeded(client)
    r = await client.post(
        "/v1/sessions/s/messages",
        content=b'{"messages": [',
        headers={"content-type": "application/json"},
    )
    assert_problem(r, 422, "body", "JSON")
    await _assert_unchanged(client, before)


async def test_body_over_the_limit_is_413(client: httpx.AsyncClient) -> None:
    before = await _seeded(client)
    big = "x" * (2 * 1024 * 1024 + 10)
    r = await client.post(
        "/v1/sessions/s/messages", json={"messages": [{"role": "user", "content": big}]}
    )
    assert_problem(r, 413, "limit")
    await _assert_unchanged(client, before)

    # Streamed without a Content-Length, the limit holds too.
    async def chunks() -> Any:
        yield b'{"messages": [{"role": "user", "content": "'
        for _ in range(3):
            yield b"y" * (1024 * 1024)
        yield b'"}]}'

    r = await client.post(
        "/v1/sessions/s/messages", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(r, 413)
    await _assert_unchanged(client, before)


async def test_one_bad_message_rejects_the_whole_batch(client: httpx.AsyncClient) -> None:
    before = await _seeded(client)
    r = await client.post(
        "/v1/sessions/s/messages",
        json={
            "messages": [
                {"role": "tool", "tool_call_id": "c_open", "content": "answer"},
                {"role": "user", "content": "good"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [tool_call("z", "f", "not json")],
                },
            ]
        },
    )
    assert_problem(r, 422, "messages[2]")
    await _assert_unchanged(client, before)
    # The open call is still open: its answer is accepted now.
    ok = await append_ok(
        client, "s", [{"role": "tool", "tool_call_id": "c_open", "content": "answer"}]
    )
    assert ok["entries"][0]["seq"] == before["entry_count"] + 1


async def test_unknown_session_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/sessions/ghost/messages", json={"messages": [GOOD]})
    assert_problem(r, 404, "ghost")
    assert_problem(await client.get("/v1/sessions/ghost/messages"), 404)


async def test_impossible_session_ids_are_404_not_500(client: httpx.AsyncClient) -> None:
    for session_id in ["a%00b", "x" * 300, "x" * 2000, "%C3%A9t%C3%A9", "a%20b", "%FF", "-x"]:
        base = f"/v1/sessions/{session_id}"
        assert_problem(await client.post(f"{base}/messages", json={"messages": [GOOD]}), 404)
        assert_problem(await client.get(f"{base}/messages"), 404)
        assert_problem(await client.get(f"{base}/context"), 404)
        assert_problem(await client.get(f"{base}/overflow"), 404)
        assert_problem(await client.get(base), 404)
        assert_problem(await client.patch(base, json={}), 404)
        assert_problem(await client.delete(base), 404)


async def test_unstorable_idempotency_key_is_422(client: httpx.AsyncClient) -> None:
    before = await _seeded(client)
    r = await client.post(
        "/v1/sessions/s/messages",
        json={"messages": [GOOD]},
        headers={b"Idempotency-Key": b"a\x00b"},
    )
    assert_problem(r, 422, "Idempotency-Key")
    await _assert_unchanged(client, before)


NOT_FINITE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400"]


@pytest.mark.parametrize("literal", NOT_FINITE)
async def test_numbers_that_are_not_finite_are_422_naming_the_field(
    client: httpx.AsyncClient, literal: str
) -> None:
    """They were once stored as null; now nothing is stored but what was sent.
    ``@`` in each body below stands for the literal."""
    before = await _seeded(client)
    cases = [
        # Anywhere in the body's own JSON: an unmodelled key, a part's extra key.
        (
            '{"messages": [{"role": "user", "content": "x", "meta": {"score": @}}]}',
            "messages[0].meta.score",
        ),
        (
            '{"messages": [{"role": "user", "content": [{"type": "text", "text": "x",'
            ' "cache": [0, @]}]}]}',
            "messages[0].content[0].cache[1]",
        ),
        (
            '{"format": "anthropic", "messages": [{"role": "assistant", "content":'
            ' [{"type": "tool_use", "id": "n2", "name": "f", "input": {"n": @}}]}]}',
            "messages[0].content[0].input.n",
        ),
        # Inside OpenAI arguments, a JSON string the service parses: the same rule.
        (
            '{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "n1",'
            ' "type": "function", "function": {"name": "f", "arguments": "{\\"n\\": @}"}}]}]}',
            "messages[0].tool_calls[0].function.arguments",
        ),
    ]
    for template, field in cases:
        r = await client.post(
            "/v1/sessions/s/messages",
            content=template.replace("@", literal),
            headers={"content-type": "application/json"},
        )
        doc = assert_problem(r, 422, field)
        assert [e["field"] for e in doc["errors"]] == [field]
        await _assert_unchanged(client, before)
    # And in a usage report's tool definitions.
    r = await client.post(
        "/v1/sessions/s/usage",
        content='{"input_tokens": 5, "tools": [{"name": "f", "max": @}]}'.replace("@", literal),
        headers={"content-type": "application/json"},
    )
    assert_problem(r, 422, "tools[0].max", "not a finite number")
    await _assert_unchanged(client, before)


async def test_finite_numbers_are_stored_as_sent(client: httpx.AsyncClient) -> None:
    await _seeded(client)
    raw = (
        '{"messages": [{"role": "user", "content": "x",'
        ' "meta": {"big": 1e308, "tiny": 5e-324, "neg": -0.25, "n": -9223372036854775808}}]}'
    )
    r = await client.post(
        "/v1/sessions/s/messages", content=raw, headers={"content-type": "application/json"}
    )
    assert r.status_code == 201, r.text
    stored = (await history(client, "s"))[-1]["message"]
    assert stored["meta"] == {"big": 1e308, "tiny": 5e-324, "neg": -0.25, "n": -(2**63)}
