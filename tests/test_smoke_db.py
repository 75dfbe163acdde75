"""The suite reaches a real, migrated Postgres."""

from __future__ import annotations

import httpx

from tests.conftest import make_session


async def test_create_and_read_session(client: httpx.AsyncClient) -> None:
    created = await make_session(client, id="smoke")
    r = await client.get("/v1/sessions/smoke")
    assert r.status_code == 200
    assert r.json()["id"] == created["id"] == "smoke"
    assert r.headers["etag"] == '"1"'
