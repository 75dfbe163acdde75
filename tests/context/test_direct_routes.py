"""The context read's direct route (app.core.direct) answers exactly as FastAPI's route:
every request below is sent to an app with the direct routes and to one without them,
on the same database, and the answers must be the same (status, content type, body). The
direct app must also really take the plain form without FastAPI's route, and label it
with the route's template in the metrics."""

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
from tests.context.test_context_api import HISTORY
from tests.helpers import append_ok, direct_and_fastapi
from tests.ops.conftest import AUTH_SETTINGS, bearer, create_key

PLAIN = ("", "?format=openai", "?format=anthropic")
NOT_PLAIN = (
    "?format=bogus",
    "?format=",
    "?format",
    "?format=openai&format=anthropic",
    "?format=anthropic&x=1",
    "?x=1",
    "?FORMAT=anthropic",
    "?format=%61nthropic",  # percent-encoded: FastAPI's to decode
    "?format=openai%00",
)


@pytest.fixture
async def both(db_url: str) -> AsyncIterator[list[httpx.AsyncClient]]:
    async with direct_and_fastapi(db_url, TEST_SETTINGS) as clients:
        yield clients


def _answer(r: httpx.Response) -> tuple[int, str, Any]:
    return r.status_code, r.headers["content-type"], orjson.loads(r.content)


async def _same(
    clients: list[httpx.AsyncClient], path: str, headers: dict[str, str] | None = None
) -> tuple[int, str, Any]:
    direct, fastapi = [await c.get(path, headers=headers) for c in clients]
    assert _answer(direct) == _answer(fastapi), path
    return _answer(direct)


async def test_every_form_of_a_context_read_gets_the_same_answer_both_ways(
    both: list[httpx.AsyncClient],
) -> None:
    client = both[0]
    await make_session(client, id="d1")
    await append_ok(client, "d1", HISTORY)
    # A pruned result shows a placeholder: the marks path of the assembly.
    r = await client.post(
        "/v1/sessions/d1/prune", json={"protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 0}
    )
    assert r.status_code == 200, r.text
    assert r.json()["pruned"], r.text
    await make_session(client, id="d2", model="claude-sonnet-4")
    await append_ok(client, "d2", HISTORY[1:3] + HISTORY[3:6], fmt="openai")

    for sid in ("d1", "d2"):
        for query in PLAIN:
            status, kind, body = await _same(both, f"/v1/sessions/{sid}/context{query}")
            assert status == 200, body
            assert kind == "application/json"
            assert body["format"] == ("anthropic" if "anthropic" in query else "openai")
        for query in NOT_PLAIN:
            await _same(both, f"/v1/sessions/{sid}/context{query}")
    # Not found, and ids that cannot exist.
    for sid in ("missing", "a%20b", "x" * 300, "%00"):
        status, kind, body = await _same(both, f"/v1/sessions/{sid}/context")
        assert status == 404, body
        assert kind == "application/problem+json"
    # The body checks of every route read Idempotency-Key, even on a GET.
    status, _, body = await _same(both, "/v1/sessions/d1/context", {"Idempotency-Key": "a\x00"})
    assert status == 422, body
    status, _, body = await _same(both, "/v1/sessions/d1/context", {"Idempotency-Key": "k"})
    assert status == 200, body
    # Paths the route does not match.
    for path in ("/v1/sessions/d1/context/", "/v1/sessions//context", "/v1/sessions/d1/contexts"):
        direct, fastapi = [await c.get(path) for c in both]
        assert direct.status_code == fastapi.status_code, path
        assert direct.content == fastapi.content, path
    # Other methods on the path.
    for method in ("HEAD", "POST", "DELETE"):
        direct, fastapi = [await c.request(method, "/v1/sessions/d1/context") for c in both]
        assert direct.status_code == fastapi.status_code == 405, method


async def test_tenants_are_kept_apart_both_ways(db_url: str) -> None:
    ours = bearer(await create_key(db_url, "ours"))
    theirs = bearer(await create_key(db_url, "theirs"))
    async with direct_and_fastapi(db_url, AUTH_SETTINGS) as clients:
        r = await clients[0].post(
            "/v1/sessions", json={"id": "t1", "model": "gpt-4o"}, headers=ours
        )
        assert r.status_code == 201, r.text
        r = await clients[0].post(
            "/v1/sessions/t1/messages",
            json={"messages": [{"role": "user", "content": "hi"}]},
            headers=ours,
        )
        assert r.status_code == 201, r.text
        status, _, body = await _same(clients, "/v1/sessions/t1/context", ours)
        assert status == 200, body
        assert [m["content"] for m in body["messages"]] == ["hi"]
        status, _, body = await _same(clients, "/v1/sessions/t1/context", theirs)
        assert status == 404, body
        status, _, body = await _same(clients, "/v1/sessions/t1/context")
        assert status == 401, body


def _served(metrics: str) -> float:
    found = re.search(
        r'^compactd_http_requests_total\{method="GET",'
        r'route="/v1/sessions/\{session_id\}/context",status="200"\} (\S+)$',
        metrics,
        re.M,
    )
    return float(found.group(1)) if found else 0.0


async def test_the_plain_form_never_reaches_fastapis_route_and_is_labelled_by_its_template(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="m1")
    await append_ok(client, "m1", HISTORY[:2])

    # FastAPI's route cannot answer while its engine dependency refuses: only the
    # direct route can.
    async def refused() -> None:
        raise ServiceUnavailable("FastAPI's route was asked")

    app.dependency_overrides[get_engine] = refused
    try:
        before = _served((await client.get("/metrics")).text)
        for query in PLAIN:
            r = await client.get(f"/v1/sessions/m1/context{query}")
            assert r.status_code == 200, r.text
        r = await client.get("/v1/sessions/m1/context?format=%61nthropic")
        assert r.status_code == 503, r.text
        assert "FastAPI's route was asked" in r.json()["detail"]
    finally:
        app.dependency_overrides.clear()
    assert _served((await client.get("/metrics")).text) == before + len(PLAIN)
    r = await client.get("/v1/sessions/m1/context?format=%61nthropic")
    assert r.status_code == 200, r.text
    assert r.json()["format"] == "anthropic"
