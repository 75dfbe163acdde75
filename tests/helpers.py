"""Small HTTP helpers shared by the API tests."""

from __future__ import annotations

from typing import Any

import httpx

PROBLEM_JSON = "application/problem+json"


def assert_problem(r: httpx.Response, status: int, *names: str) -> dict[str, Any]:
    """``r`` is a problem document with ``status`` whose detail or errors mention every name."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith(PROBLEM_JSON), r.headers["content-type"]
    doc: dict[str, Any] = r.json()
    assert doc["status"] == status
    assert doc["title"]
    text = doc["detail"] + " " + " ".join(e["field"] for e in doc.get("errors") or [])
    for name in names:
        assert name in text, f"{name!r} not named in {doc}"
    return doc


async def get_session(client: httpx.AsyncClient, session_id: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{session_id}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


async def append(
    client: httpx.AsyncClient,
    session_id: str,
    messages: list[dict[str, Any]],
    fmt: str = "openai",
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    return await client.post(
        f"/v1/sessions/{session_id}/messages",
        json={"messages": messages, "format": fmt},
        headers=headers or {},
    )


async def append_ok(
    client: httpx.AsyncClient, session_id: str, messages: list[dict[str, Any]], fmt: str = "openai"
) -> dict[str, Any]:
    r = await append(client, session_id, messages, fmt)
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


async def history(
    client: httpx.AsyncClient, session_id: str, fmt: str = "openai", limit: int = 1000
) -> list[dict[str, Any]]:
    """Every stored entry, following next_after_seq to the end."""
    entries: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(
            f"/v1/sessions/{session_id}/messages",
            params={"after_seq": after, "limit": limit, "format": fmt},
        )
        assert r.status_code == 200, r.text
        page = r.json()
        entries.extend(page["entries"])
        if page["next_after_seq"] is None:
            return entries
        after = page["next_after_seq"]


def tool_call(
    call_id: str, name: str = "bash", arguments: str = '{"command": "ls"}'
) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
