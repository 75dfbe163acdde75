"""Shared by the worker fault and race tests: sessions whose cut falls where a
test wants it, the upstream's requests read back, and the jobs' rows."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.compactions.repository import CompactionRepository, JobRow
from app.core.database import driver_connection
from app.core.tenancy import DEFAULT_TENANT
from tests.compactions.helpers import conversation
from tests.conftest import make_session
from tests.helpers import append_ok, get_session, history
from tests.upstream_server import RecordedRequest

# A reply clean_reply accepts as a summary (the server's default one echoes
# "<conversation>" and is refused as an echo of the prompt).
SUMMARY = (
    "## Goal\nFix the failing date parser in src/dates.py without touching tests/.\n\n"
    "## Progress\n- Read the modules one by one; no change made yet."
)
SHORT = "Date parser fix: modules read, no edits yet"


async def seeded(
    client: httpx.AsyncClient,
    steps: int = 12,
    *,
    cut: str = "user",
    config: dict[str, Any] | None = None,
    words: int = 400,
    **session: Any,
) -> str:
    """A session holding ``conversation(steps)``, with ``keep_recent_tokens`` set so
    that the cut falls exactly at the last user message (``cut="user"``: no split
    turn) or at the assistant message three steps before the end (``cut="split"``:
    inside the turn of the last user message that started before it)."""
    s = await make_session(client, config=config or {}, **session)
    sid: str = s["id"]
    for batch in conversation(steps, words):
        await append_ok(client, sid, batch)
    await keep_from(client, sid, cut)
    return sid


async def keep_from(client: httpx.AsyncClient, sid: str, cut: str) -> int:
    """Set ``keep_recent_tokens`` to what the history holds from the chosen entry
    on; returns that entry's seq."""
    entries = [e for e in await history(client, sid) if e["role"] not in ("system", "developer")]
    entries = [e for e in entries if e["kind"] == "message"]
    users = [i for i, e in enumerate(entries) if e["role"] == "user"]
    if cut == "user":
        target = users[-1]
    else:
        assistants = [i for i, e in enumerate(entries) if e["role"] == "assistant"]
        target = assistants[-3]
        assert users[0] < max(u for u in users if u < target), "the split turn needs a history"
    keep = sum(e["tokens"] for e in entries[target:])
    r = await client.patch(
        f"/v1/sessions/{sid}", json={"config": {"compaction": {"keep_recent_tokens": keep}}}
    )
    assert r.status_code == 200, r.text
    seq: int = entries[target]["seq"]
    return seq


async def request_compaction(client: httpx.AsyncClient, sid: str, **body: Any) -> dict[str, Any]:
    r = await client.post(f"/v1/sessions/{sid}/compactions", json=body)
    assert r.status_code == 202, r.text
    data: dict[str, Any] = r.json()
    assert data["status"] == "queued"
    return data


async def assert_api_answers(client: httpx.AsyncClient, sid: str) -> None:
    """Every public read of the session answers without a 5xx (or any error)."""
    for path in (
        f"/v1/sessions/{sid}",
        f"/v1/sessions/{sid}/compactions",
        f"/v1/sessions/{sid}/context?format=openai",
        f"/v1/sessions/{sid}/context?format=anthropic",
        f"/v1/sessions/{sid}/overflow",
    ):
        r = await client.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text)


async def compaction_entries(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    return [e for e in await history(client, sid) if e["kind"] == "compaction"]


async def compaction_count(client: httpx.AsyncClient, sid: str) -> int:
    count: int = (await get_session(client, sid))["compaction_count"]
    return count


def prompt_of(request: RecordedRequest) -> str:
    """The user prompt of a recorded upstream request (either API)."""
    messages = request.json["messages"]
    users = [m for m in messages if m["role"] == "user"]
    assert len(users) == 1, messages
    content = users[0]["content"]
    assert isinstance(content, str), content
    return content


def system_of(request: RecordedRequest) -> str:
    body = request.json
    if request.path.endswith("/messages"):
        system: str = body["system"]
        return system
    first = body["messages"][0]
    assert first["role"] == "system", body["messages"]
    content: str = first["content"]
    return content


async def job_row(engine: AsyncEngine, sid: str, cid: str | uuid.UUID) -> JobRow:
    async with driver_connection(engine) as driver:
        job = await CompactionRepository(DEFAULT_TENANT).get(driver, sid, uuid.UUID(str(cid)))
    assert job is not None
    return job


async def expire_lease(engine: AsyncEngine, job_id: uuid.UUID) -> None:
    """Time travel: the job's lease ended a second ago, as if its worker died."""
    async with driver_connection(engine) as driver:
        done = await driver.execute(
            "UPDATE compaction SET lease_expires_at = now() - interval '1 second' "
            "WHERE id = $1 AND status = 'running'",
            job_id,
        )
    assert done == "UPDATE 1", done
