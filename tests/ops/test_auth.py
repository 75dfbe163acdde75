"""API keys and tenants: Bearer on every /v1 route, one tenant per key, and another
tenant's session is a 404 on every path, never a 403 that confirms it exists."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from app.keys import tokens
from tests.compactions.helpers import drain
from tests.helpers import assert_problem
from tests.ops.conftest import bearer, create_key, revoke_key

MESSAGES = [
    {"role": "system", "content": "You are a careful coding agent."},
    {"role": "user", "content": "Fix the failing test in parser.py, please. " * 40},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read", "arguments": '{"path": "parser.py"}'},
            }
        ],
    },
    {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "".join(f"def parse_{i}(x):\n    return x + {i}\n" for i in range(300)),
    },
    {"role": "assistant", "content": "The parser returns its input unchanged. " * 30},
    {"role": "user", "content": "Go on, and keep the tests green. " * 30},
    # A last short turn, so that the cut falls after the long output and the summary
    # is smaller than what it replaces (else the compaction is not committed).
    {"role": "assistant", "content": "Done: parse now handles every case."},
    {"role": "user", "content": "Thanks."},
]


async def _tenant_session(app: Any, client: httpx.AsyncClient, key: str) -> tuple[str, str]:
    """A session with history and a finished compaction, for the key's tenant."""
    config = {"compaction": {"auto": False, "keep_recent_tokens": 500}}
    r = await client.post(
        "/v1/sessions", json={"model": "gpt-4o", "config": config}, headers=bearer(key)
    )
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    r = await client.post(
        f"/v1/sessions/{sid}/messages", json={"messages": MESSAGES}, headers=bearer(key)
    )
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/v1/sessions/{sid}/compactions",
        json={"summarizer": "extractive"},
        headers=bearer(key),
    )
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    cid = r.json()["id"]
    r = await client.get(f"/v1/sessions/{sid}/compactions/{cid}", headers=bearer(key))
    assert r.json()["status"] == "succeeded", r.text
    return sid, cid


# Every route under a session, with a body it would accept: a 404 must come from the
# tenant check, not from validation.
SESSION_ROUTES: dict[tuple[str, str], dict[str, Any] | None] = {
    ("GET", "/v1/sessions/{session_id}"): None,
    ("PATCH", "/v1/sessions/{session_id}"): {"metadata": {"who": "a"}},
    ("DELETE", "/v1/sessions/{session_id}"): None,
    ("POST", "/v1/sessions/{session_id}/messages"): {
        "messages": [{"role": "user", "content": "hi"}]
    },
    ("GET", "/v1/sessions/{session_id}/messages"): None,
    ("GET", "/v1/sessions/{session_id}/context"): None,
    ("GET", "/v1/sessions/{session_id}/overflow"): None,
    ("POST", "/v1/sessions/{session_id}/usage"): {"input_tokens": 1000},
    ("POST", "/v1/sessions/{session_id}/prune"): {"dry_run": True},
    ("POST", "/v1/sessions/{session_id}/overflow-errors"): {
        "message": "This model's maximum context length is 128000 tokens."
    },
    ("POST", "/v1/sessions/{session_id}/compactions"): {},
    ("GET", "/v1/sessions/{session_id}/compactions"): None,
    ("GET", "/v1/sessions/{session_id}/compactions/{compaction_id}"): None,
    ("POST", "/v1/sessions/{session_id}/compactions/{compaction_id}/cancel"): None,
    ("GET", "/v1/sessions/{session_id}/compactions/{compaction_id}/source"): None,
    ("GET", "/v1/sessions/{session_id}/tree"): None,
    ("POST", "/v1/sessions/{session_id}/navigate"): {"seq": 1},
    ("POST", "/v1/sessions/{session_id}/fork"): {"id": "stolen"},
    ("GET", "/v1/sessions/{session_id}/search"): None,
    ("POST", "/v1/sessions/{session_id}/tool-calls"): {
        "tool_call": {"type": "tool_use", "id": "t", "name": "history_read", "input": {}}
    },
    ("GET", "/v1/sessions/{session_id}/events"): None,
}
# Streams that never end: B's own read of them is tested over a real server
# (tests/events), not here.
STREAMS = {("GET", "/v1/sessions/{session_id}/events")}
# The query a GET route needs besides its path (a 404 must not be a 422 first).
QUERIES: dict[tuple[str, str], dict[str, str]] = {
    ("GET", "/v1/sessions/{session_id}/search"): {"q": "parse"},
}


def _v1_routes(app: Any) -> set[tuple[str, str]]:
    return {
        (method.upper(), path)
        for path, item in app.openapi()["paths"].items()
        if path.startswith("/v1/")
        for method in item
    }


def test_the_table_names_every_session_route(auth_app: Any) -> None:
    """A new route under a session must be added to the isolation test."""
    under_session = {r for r in _v1_routes(auth_app) if "{session_id}" in r[1]}
    assert under_session == set(SESSION_ROUTES)


async def test_a_key_of_tenant_a_gets_404_on_every_path_of_tenant_b(
    auth_app: Any, anon: httpx.AsyncClient, db_url: str
) -> None:
    key_a = await create_key(db_url, "tenant-a")
    key_b = await create_key(db_url, "tenant-b")
    sid, cid = await _tenant_session(auth_app, anon, key_b)
    before = (await anon.get(f"/v1/sessions/{sid}", headers=bearer(key_b))).json()

    for (method, template), body in SESSION_ROUTES.items():
        path = template.format(session_id=sid, compaction_id=cid)
        query = QUERIES.get((method, template))
        r = await anon.request(method, path, json=body, params=query, headers=bearer(key_a))
        doc = assert_problem(r, 404)
        assert "tenant" not in doc["detail"], doc  # says nothing about who owns it
        if method == "GET" and (method, template) not in STREAMS:  # B reads the same path
            mine = await anon.get(path, params=query, headers=bearer(key_b))
            assert mine.status_code == 200, (path, mine.text)

    listed = (await anon.get("/v1/sessions", headers=bearer(key_a))).json()
    assert [s["id"] for s in listed["sessions"]] == []

    # B still sees its session unchanged: A's attempts stored nothing.
    after = (await anon.get(f"/v1/sessions/{sid}", headers=bearer(key_b))).json()
    assert after == before
    job = await anon.get(f"/v1/sessions/{sid}/compactions/{cid}", headers=bearer(key_b))
    assert job.status_code == 200
    assert job.json()["status"] == "succeeded"


async def test_two_tenants_may_use_the_same_session_id(
    anon: httpx.AsyncClient, db_url: str
) -> None:
    key_a = await create_key(db_url, "tenant-a")
    key_b = await create_key(db_url, "tenant-b")
    for key, model in ((key_a, "gpt-4o"), (key_b, "claude-sonnet-4")):
        r = await anon.post(
            "/v1/sessions", json={"id": "shared", "model": model}, headers=bearer(key)
        )
        assert r.status_code == 201, r.text
    a = (await anon.get("/v1/sessions/shared", headers=bearer(key_a))).json()
    b = (await anon.get("/v1/sessions/shared", headers=bearer(key_b))).json()
    assert (a["model"], b["model"]) == ("gpt-4o", "claude-sonnet-4")


async def test_every_v1_route_wants_a_key_once_one_exists(
    auth_app: Any, anon: httpx.AsyncClient, db_url: str
) -> None:
    await create_key(db_url, "tenant-a")
    for method, template in sorted(_v1_routes(auth_app)):
        path = template.format(
            session_id="s1",
            compaction_id="00000000-0000-0000-0000-000000000000",
            webhook_id="00000000-0000-0000-0000-000000000000",
        )
        r = await anon.request(method, path)
        assert_problem(r, 401, "Authorization")
        assert r.headers["www-authenticate"].startswith("Bearer")
    # Ops routes stay open for probes and scrapers.
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await anon.get(path)).status_code == 200


async def test_without_any_key_the_service_is_open_as_the_default_tenant(
    anon: httpx.AsyncClient,
) -> None:
    r = await anon.post("/v1/sessions", json={"model": "gpt-4o"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert (await anon.get(f"/v1/sessions/{sid}")).status_code == 200


async def test_open_sessions_belong_to_the_default_tenant_once_keys_exist(
    anon: httpx.AsyncClient, db_url: str
) -> None:
    r = await anon.post("/v1/sessions", json={"id": "early", "model": "gpt-4o"})
    assert r.status_code == 201
    default_key = await create_key(db_url, "default")
    other_key = await create_key(db_url, "other")
    assert (await anon.get("/v1/sessions/early")).status_code == 401
    assert (await anon.get("/v1/sessions/early", headers=bearer(default_key))).status_code == 200
    assert (await anon.get("/v1/sessions/early", headers=bearer(other_key))).status_code == 404


@pytest.mark.parametrize(
    ("header", "named"),
    [
        ("Basic dXNlcjpwYXNz", "Bearer"),
        ("Bearer", "Bearer"),
        ("Bearer not-a-key", "malformed"),
        ("Bearer cpd_0123456789ab_" + "A" * 43, "not valid"),
    ],
)
async def test_bad_credentials_are_401(
    anon: httpx.AsyncClient, db_url: str, header: str, named: str
) -> None:
    await create_key(db_url, "tenant-a")
    r = await anon.get("/v1/sessions", headers={"Authorization": header})
    assert_problem(r, 401, named)


async def test_a_right_id_with_a_wrong_secret_is_refused(
    anon: httpx.AsyncClient, db_url: str
) -> None:
    key = await create_key(db_url, "tenant-a")
    key_id, secret = tokens.parse(key) or ("", "")
    forged = f"cpd_{key_id}_{secret[:-1]}{'B' if secret[-1] != 'B' else 'C'}"
    assert_problem(await anon.get("/v1/sessions", headers=bearer(forged)), 401, "not valid")
    assert (await anon.get("/v1/sessions", headers=bearer(key))).status_code == 200


async def test_a_revoked_key_is_refused_and_the_others_still_work(
    anon: httpx.AsyncClient, db_url: str
) -> None:
    kept = await create_key(db_url, "tenant-a")
    revoked = await create_key(db_url, "tenant-a")
    assert (await anon.get("/v1/sessions", headers=bearer(revoked))).status_code == 200
    await revoke_key(db_url, revoked[4:16])
    assert_problem(await anon.get("/v1/sessions", headers=bearer(revoked)), 401, "revoked")
    assert (await anon.get("/v1/sessions", headers=bearer(kept))).status_code == 200


async def test_revoking_the_last_key_locks_everyone_out_rather_than_opening(
    anon: httpx.AsyncClient, db_url: str
) -> None:
    key = await create_key(db_url, "tenant-a")
    await revoke_key(db_url, key[4:16])
    assert_problem(await anon.get("/v1/sessions"), 401, "Authorization")
    assert_problem(await anon.get("/v1/sessions", headers=bearer(key)), 401, "revoked")


async def test_failed_auth_is_logged_without_the_key(
    anon: httpx.AsyncClient, db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    key = await create_key(db_url, "tenant-a")
    key_id, secret = tokens.parse(key) or ("", "")
    wrong = f"cpd_{key_id}_{'Z' * 43}"
    caplog.set_level(logging.WARNING, logger="compactd.auth")
    await anon.get("/v1/sessions", headers=bearer(wrong))
    records = [r for r in caplog.records if r.name == "compactd.auth"]
    assert records, "the failure is logged"
    record = records[-1]
    assert record.getMessage() == "authentication failed"
    assert record.__dict__["key_id"] == key_id
    text = repr(record.__dict__)
    assert "Z" * 43 not in text
    assert secret not in text


def test_keys_have_a_public_id_and_a_secret_stored_as_a_hash() -> None:
    new = tokens.generate()
    parsed = tokens.parse(new.token)
    assert parsed is not None
    key_id, secret = parsed
    assert key_id == new.id
    assert secret not in new.secret_sha256.hex()
    assert tokens.matches(new.secret_sha256, key_id, secret)
    assert not tokens.matches(new.secret_sha256, key_id, secret[:-1] + "x")
    assert tokens.generate().token != new.token
