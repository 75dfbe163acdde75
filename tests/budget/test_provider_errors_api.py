"""Provider errors forwarded by the agent: overflow recognised, the window relieved."""

from __future__ import annotations

from typing import Any

import httpx

from tests.budget.test_prune_api import MANUAL, fill, work
from tests.conftest import make_session
from tests.helpers import assert_problem, get_session

ANTHROPIC = (
    '{"type":"error","error":{"type":"invalid_request_error",'
    '"message":"prompt is too long: 208310 tokens > 200000 maximum"}}'
)
# https://github.com/microsoft/vscode/issues/289219 (GitHub Copilot)
COPILOT = (
    '{"error":{"message":"prompt token count of 1236658 exceeds the limit of 128000",'
    '"code":"model_max_prompt_tokens_exceeded"}}'
)
# synthetic figures in huggingface/text-generation-inference router/src/validation.rs: an
# output cap, which compaction cannot cure
TGI_OUTPUT_CAP = "Input validation error: `max_new_tokens` must be <= 4096. Given: 8192"
# openai/codex codex-rs test malformed_prompt_token_limit_errors_remain_invalid_requests
MANTLE_WITHOUT_COUNT = "prompt tokens (many) exceed model maximum (278528) for openai.gpt-5.6-sol"
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
    refused = (
        (429, RATE_LIMIT),
        (500, "Internal server error"),
        (401, "bad key"),
        (400, ""),  # a bodiless 400 says nothing; only a 413 is read as "too large"
        (422, TGI_OUTPUT_CAP),
        (400, MANTLE_WITHOUT_COUNT),
    )
    for status, message in refused:
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


async def report(client: httpx.AsyncClient, sid: str, status: int, message: str) -> dict[str, Any]:
    r = await client.post(
        f"/v1/sessions/{sid}/overflow-errors", json={"status": status, "message": message}
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


async def queued(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    r = await client.get(f"/v1/sessions/{sid}/compactions")
    assert r.status_code == 200, r.text
    return [c for c in r.json()["compactions"] if c["status"] == "queued"]


async def test_a_newly_recognised_wording_starts_recovery(client: httpx.AsyncClient) -> None:
    await make_session(client, id="c", config={"prune": {"auto": False}})
    await fill(client, "c", work(6))
    assert await queued(client, "c") == []
    body = await report(client, "c", 400, COPILOT)
    assert body["overflow"] is True
    assert body["provider"] == "github_copilot"
    assert (body["requested_tokens"], body["limit_tokens"]) == (1_236_658, 128_000)
    assert body["recovery"]["action"] == "compact"
    job = body["recovery"]["compaction"]
    assert (job["reason"], job["status"], job["created"]) == ("overflow", "queued", True)
    [listed] = await queued(client, "c")
    assert (listed["id"], listed["reason"], listed["auto"]) == (job["id"], "overflow", True)


async def test_a_bare_413_starts_recovery(client: httpx.AsyncClient) -> None:
    # A provider that refuses the request for its size with no body at all (Cerebras's
    # "413 status code (no body)"): the agent forwards the status and an empty message.
    await make_session(client, id="b", config={"prune": {"auto": False}})
    await fill(client, "b", work(6))
    body = await report(client, "b", 413, "")
    assert (body["overflow"], body["provider"]) == (True, None)
    assert (body["requested_tokens"], body["limit_tokens"]) == (None, None)
    job = body["recovery"]["compaction"]
    assert (job["reason"], job["status"]) == ("overflow", "queued")
    assert [c["id"] for c in await queued(client, "b")] == [job["id"]]


async def test_a_413_that_is_a_rate_limit_changes_nothing(client: httpx.AsyncClient) -> None:
    # https://github.com/continuedev/continue/issues/10218: Groq sends its tokens-per-minute
    # limit as a 413; waiting, not compacting, is the cure.
    groq_tpm = (
        "413 Request too large for model `llama-3.3-70b-versatile` in organization "
        "`org_01kgg5588eftc8k70aes4864eb` service tier `on_demand` on tokens per minute "
        "(TPM): Limit 12000, Requested 14137, please reduce your message size and try again."
    )
    await make_session(client, id="g", config=MANUAL)
    await fill(client, "g", work(6))
    before = await get_session(client, "g")
    body = await report(client, "g", 413, groq_tpm)
    assert (body["overflow"], body["recovery"]) == (False, None)
    assert await get_session(client, "g") == before
    assert await queued(client, "g") == []
