"""The append's direct route (app.core.direct) answers exactly as FastAPI's route. Each
request below goes to an app with the direct routes and to one without them, on the
same database, each against its own one of two sessions with the same history; the
answers must be the same but for the ids (status, content type, ETag, replay header,
body). The direct app must also really take the plain form without FastAPI's route."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import pytest

from app.core.database import get_engine
from app.core.errors import ServiceUnavailable
from tests.conftest import TEST_SETTINGS, make_session
from tests.helpers import direct_and_fastapi, tool_call

SIDS = ("direct", "fastapi")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
USER = {"role": "user", "content": "List the files."}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def both(db_url: str) -> AsyncIterator[list[httpx.AsyncClient]]:
    async with direct_and_fastapi(db_url, TEST_SETTINGS) as clients:
        yield clients


def _normal(r: httpx.Response, sid: str) -> tuple[Any, ...]:
    text = UUID.sub("UUID", r.content.decode()).replace(sid, "SID")
    body = orjson.loads(text) if text else None
    return (
        r.status_code,
        r.headers.get("content-type"),
        r.headers.get("etag"),
        r.headers.get("idempotent-replayed"),
        body,
    )


async def _same(
    both: list[httpx.AsyncClient],
    tag: str,
    *,
    json: Any = None,
    content: bytes | None = None,
    query: str = "",
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
) -> tuple[Any, ...]:
    answers = []
    for client, sid in zip(both, SIDS, strict=True):
        r = await client.post(
            f"/v1/sessions/{sid}-{tag}/messages{query}", json=json, content=content, headers=headers
        )
        answers.append(_normal(r, f"{sid}-{tag}"))
    assert answers[0] == answers[1], tag
    return answers[0]


async def _sessions(client: httpx.AsyncClient, tag: str, **body: Any) -> None:
    for sid in SIDS:
        await make_session(client, id=f"{sid}-{tag}", **body)


async def test_plain_appends_are_stored_and_answered_as_fastapis_route_does(
    both: list[httpx.AsyncClient],
) -> None:
    client = both[0]
    await _sessions(client, "a")
    status, kind, etag, _, body = await _same(both, "a", json={"messages": [USER]})
    assert (status, kind, etag) == (201, "application/json", '"2"'), body
    calls = {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call("c1", "bash", '{"command": "ls"}')],
    }
    result = {"role": "tool", "tool_call_id": "c1", "content": "README.md\n"}
    status, *_ = await _same(both, "a", json={"messages": [calls, result]}, query="?format=openai")
    assert status == 201
    # The provider request as the agent has it: system, tools, ignored fields.
    request = {
        "model": "gpt-4o",
        "temperature": 0,
        "system": "You are a coding agent.",
        "tools": [{"type": "function", "function": {"name": "bash", "parameters": {}}}],
        "messages": [{"role": "user", "content": "Go on."}],
    }
    status, *_ = await _same(both, "a", json=request)
    assert status == 201
    # Idempotency: stored once, replayed, refused with another body.
    keyed = {"Idempotency-Key": "turn-7"}
    first = await _same(both, "a", json={"messages": [USER]}, headers=keyed)
    again = await _same(both, "a", json={"messages": [USER]}, headers=keyed)
    assert first[0] == again[0] == 201
    assert again[3] == "true"
    assert first[4] == again[4]
    other = await _same(both, "a", json={"messages": [USER, USER]}, headers=keyed)
    assert other[0] == 422
    # If-Match: current and stale.
    version = first[4]["version"]
    status, *_ = await _same(
        both, "a", json={"messages": [USER]}, headers={"If-Match": str(version)}
    )
    assert status == 201
    status, *_ = await _same(both, "a", json={"messages": [USER]}, headers={"If-Match": "1"})
    assert status == 412
    # Errors the service finds (answered by the direct route itself).
    orphan = {"role": "tool", "tool_call_id": "nope", "content": "x"}
    status, kind, *_ = await _same(both, "a", json={"messages": [orphan]})
    assert (status, kind) == (422, "application/problem+json")
    status, *_ = await _same(both, "missing", json={"messages": [USER]})
    assert status == 404
    # Anthropic messages.
    await _sessions(client, "b", model="claude-sonnet-4")
    blocks = {"role": "user", "content": [{"type": "text", "text": "Hi."}]}
    status, *_ = await _same(both, "b", json={"messages": [blocks]}, query="?format=anthropic")
    assert status == 201
    status, *_ = await _same(both, "b", json={"messages": [blocks], "format": "anthropic"})
    assert status == 201


async def test_every_other_form_gets_fastapis_answer(both: list[httpx.AsyncClient]) -> None:
    await _sessions(both[0], "c")
    many = {"messages": [USER] * (TEST_SETTINGS.max_batch_messages + 1)}
    deep: Any = "x"
    for _ in range(200):
        deep = [deep]
    cases: list[dict[str, Any]] = [
        {"json": {"messages": [USER], "unknown": 1}},
        {"json": {"messages": []}},
        {"json": {"messages": [{"role": "user", "content": "a\x00b"}]}},
        {"content": b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "headers": JSON},
        {"json": {"messages": [USER], "n": 2**70}},
        {"json": [USER]},
        {"json": many},
        {"json": {"messages": [USER], "format": "other"}},
        {"json": {"messages": [USER], "format": "anthropic"}, "query": "?format=openai"},
        {"json": {"messages": [USER]}, "query": "?format=bogus"},
        {"json": {"messages": [USER], "deep": deep}},
        {"content": b""},
        {"content": b"{not json", "headers": JSON},
        {"content": b'{"messages": [{"role": "user", "content": "\xff"}]}', "headers": JSON},
        {"content": orjson.dumps({"messages": [USER]}), "headers": {"Content-Type": "text/plain"}},
        {"content": orjson.dumps({"messages": [USER]})},  # no Content-Type at all
        {"content": orjson.dumps({"messages": [USER]}), "headers": {"Content-Type": "json"}},
        {"json": {"messages": [USER]}, "headers": {"Idempotency-Key": "k" * 256}},
        {"json": {"messages": [USER]}, "headers": {"Idempotency-Key": ""}},
        {"json": {"messages": [USER]}, "headers": {"Idempotency-Key": "a\x00"}},
    ]
    for case in cases:
        status, kind, *_ = await _same(both, "c", **case)
        assert kind == "application/problem+json", case
        assert 400 <= status < 500, case
    # A body not sent as JSON: the route's 415, whichever app answers.
    status, _, _, _, problem = await _same(both, "c", content=orjson.dumps({"messages": [USER]}))
    assert status == 415, problem
    assert "Content-Type: application/json" in problem["detail"]
    # JSON with a charset, or an application/*+json type, is JSON (FastAPI's route).
    for kind in ("application/json; charset=utf-8", "application/vnd.api+json"):
        plain = orjson.dumps({"messages": [USER]})
        status, *_ = await _same(both, "c", content=plain, headers={"Content-Type": kind})
        assert status == 201, kind
    # Forms FastAPI's route stores: a query parameter it ignores, a header given twice
    # (it reads one), a body over the direct route's size.
    keys = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    status, *_ = await _same(both, "c", json={"messages": [USER]}, headers=keys)
    assert status == 201
    status, *_ = await _same(both, "c", json={"messages": [USER]}, query="?x=1")
    assert status == 201
    twice = [("If-Match", "9"), ("If-Match", "1")]
    status, *_ = await _same(both, "c", json={"messages": [USER]}, headers=twice)
    assert status in (201, 412)
    big = {"messages": [{"role": "user", "content": "word " * 20_000}]}
    status, *_ = await _same(both, "c", json=big)
    assert status == 201


async def test_the_plain_form_never_reaches_fastapis_route(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="m1")

    async def refused() -> None:
        raise ServiceUnavailable("FastAPI's route was asked")

    app.dependency_overrides[get_engine] = refused
    try:
        r = await client.post("/v1/sessions/m1/messages", json={"messages": [USER]})
        assert r.status_code == 201, r.text
        r = await client.post("/v1/sessions/m1/messages?x=1", json={"messages": [USER]})
        assert r.status_code == 503, r.text
        assert "FastAPI's route was asked" in r.json()["detail"]
    finally:
        app.dependency_overrides.clear()
    r = await client.get("/v1/sessions/m1/messages")
    assert [(e["seq"], e["role"]) for e in r.json()["entries"]] == [(1, "user")]
