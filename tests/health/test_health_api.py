"""Liveness and readiness probes."""

from __future__ import annotations

import httpx

from app.core.migrations import head_revision


async def test_healthz(client: httpx.AsyncClient) -> None:
    r = await client.get("/healthz")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


async def test_readyz_reports_the_migration_head(client: httpx.AsyncClient) -> None:
    r = await client.get("/readyz")
    assert r.status_code == 200, r.text
    assert r.json() == {"status": "ready", "database": "ok", "migration": head_revision()}


async def test_unknown_route_is_a_problem_document(client: httpx.AsyncClient) -> None:
    r = await client.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.headers["content-type"].startswith("application/problem+json")
    r = await client.put("/v1/sessions")
    assert r.status_code == 405
    assert r.headers["content-type"].startswith("application/problem+json")
