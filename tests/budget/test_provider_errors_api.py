"""Provider errors forwarded by the agent: overflow recognised, the window relieved."""

from __future__ import annotations

import httpx

from tests.budget.test_prune_api import MANUAL, fill, work
from tests.conftest import make_session
from tests.helpers import assert_problem, get_session

ANTHROPIC = (
    '{"type":"error","error":{"type":"invalid_request_error",'
    '"message":"prompt is too long: 208310 tokens > 200000 maximum"}}'
)
RATE_LIMIT = (
    "Request too large for gpt-4o in organization org-abc on tokens per min (TPM): "
    "Limit 30000, Requested 41234. The input or output tokens must be reduced in order to run "
    "successfully."
)


async def test_an_overflow_error_prunes_with_no_minimum(client: httpx.AsyncClient) -> None:
    await make_session(client, id="e", config=MANUAL)
    await fill(client, "e", work(16))  # below the 20k minimum for an ordinary prune
    before = await get_session(client, "e")
    r = await client.post(
        "/v1/sessions/e/overflow-errors", json={"status": 400, "message": ANTHROPIC}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["overflow"] is True
    assert body["provider"] == "anthropic"
    assert body["requested_tokens"] == 208_310
    assert body["limit_tokens"] == 200_000
    assert body["recovery"]["action"] == "prune"
    saved = body["recovery"]["pruned"]["tokens_saved"]
    assert 0 < saved < 20_000
    after = await get_session(client, "e")
    assert after["context_tokens"] == before["context_tokens"] - saved
    assert body["verdict"]["estimated_tokens"] < before["context_tokens"]


async def test_other_errors_change_nothing(client: httpx.AsyncClient) -> None:
    await make_session(client, id="e", config=MANUAL)
    await fill(client, "e", work(16))
    before = await get_session(client, "e")
    for status, message in ((429, RATE_LIMIT), (500, "Internal server error"), (401, "bad key")):
        r = await client.post(
            "/v1/sessions/e/overflow-errors", json={"status": status, "message": message}
        )
        assert r.status_code == 200, r.text
        assert r.json()["overflow"] is False
        assert r.json()["recovery"] is None
    assert await get_session(client, "e") == before


async def test_bad_error_reports_are_rejected(client: httpx.AsyncClient) -> None:
    await make_session(client, id="e")
    r = await client.post("/v1/sessions/e/overflow-errors", json={"status": 400})
    assert_problem(r, 422, "message")
    r = await client.post("/v1/sessions/e/overflow-errors", json={"status": 99, "message": "x"})
    assert_problem(r, 422, "status")
    r = await client.post("/v1/sessions/zz/overflow-errors", json={"message": "x"})
    assert_problem(r, 404, "zz")
