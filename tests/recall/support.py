"""Shared by recall's API tests: searching, paging through every hit, and each stored
entry's searchable text worked out from the history the API gives back (a tool
result's after the line naming its call)."""

from __future__ import annotations

from typing import Any

import httpx

from app.engine.formats import openai_format
from app.engine.search_text import call_line, search_text
from tests.helpers import history

# Nothing automatic: the tests drive compaction and pruning by hand.
MANUAL: dict[str, Any] = {"compaction": {"auto": False}, "prune": {"auto": False}}


async def search(
    client: httpx.AsyncClient,
    sid: str,
    q: str,
    headers: dict[str, str] | None = None,
    **params: Any,
) -> dict[str, Any]:
    r = await client.get(
        f"/v1/sessions/{sid}/search", params={"q": q, **params}, headers=headers or {}
    )
    assert r.status_code == 200, r.text
    page: dict[str, Any] = r.json()
    return page


async def every_hit(
    client: httpx.AsyncClient, sid: str, q: str, **params: Any
) -> list[dict[str, Any]]:
    """Every hit, page after page (50 a page unless ``limit`` says otherwise)."""
    params.setdefault("limit", 50)
    hits: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = await search(client, sid, q, **params, **({"cursor": cursor} if cursor else {}))
        hits.extend(page["hits"])
        cursor = page["next_cursor"]
        if cursor is None:
            return hits


async def searchable(client: httpx.AsyncClient, sid: str) -> dict[int, tuple[str, str]]:
    """Each entry of the session's path: its kind and its searchable text, worked out
    by app.engine.search_text from the stored message the history gives back."""
    out = {}
    calls: dict[str, tuple[str, str | None]] = {}
    for entry in await history(client, sid):
        parsed = openai_format.parse_message(entry["message"], "message")
        for call in parsed.tool_calls():
            calls[call["id"]] = (call["name"], call.get("arguments"))
        found = calls.pop(parsed.tool_call_id or "", None) if parsed.role == "tool" else None
        line = call_line(*found) if found is not None else ""
        out[entry["seq"]] = (entry["kind"], search_text(parsed.parts, line))
    return out
