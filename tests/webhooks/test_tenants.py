"""Two tenants (API keys), each with a webhook and a hook and a session of the same
id: nothing of one reaches the other's receiver, and neither can see, change, test or
read the log of the other's webhooks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.main import create_app
from tests.compactions.helpers import conversation, drain
from tests.helpers import assert_problem
from tests.ops.conftest import AUTH_SETTINGS, bearer, create_key
from tests.webhooks.receiver import Inbox
from tests.webhooks.support import (
    create_webhook,
    delivery_log,
    dispatch,
    documented_verify,
    event_log,
)

TENANTS = ("acme", "globex")


@pytest.fixture
async def keyed(db_url: str) -> AsyncIterator[tuple[Any, httpx.AsyncClient, dict[str, str]]]:
    """An app that requires API keys, a client of it, and each tenant's key."""
    keys = {tenant: await create_key(db_url, tenant) for tenant in TENANTS}
    application = create_app(AUTH_SETTINGS, database_url=db_url)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
            yield application, c, keys


async def _activity(client: httpx.AsyncClient, key: str) -> None:
    """Session ``s``: appends, a prune, and a compaction queued."""
    headers = bearer(key)
    r = await client.post(
        "/v1/sessions",
        json={
            "id": "s",
            "model": "gpt-4o",
            "context_window": 20_000,
            "config": {
                "compaction": {"auto": False, "keep_recent_tokens": 500},
                "prune": {"auto": False},
            },
        },
        headers=headers,
    )
    assert r.status_code == 201, r.text
    for batch in conversation(12):
        r = await client.post("/v1/sessions/s/messages", json={"messages": batch}, headers=headers)
        assert r.status_code == 201, r.text
    r = await client.post(
        "/v1/sessions/s/prune",
        json={"protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 0},
        headers=headers,
    )
    assert r.status_code == 200, r.text
    r = await client.post(
        "/v1/sessions/s/compactions", json={"summarizer": "extractive"}, headers=headers
    )
    assert r.status_code == 202, r.text


async def test_nothing_crosses_tenants(
    keyed: tuple[Any, httpx.AsyncClient, dict[str, str]], inbox: Inbox
) -> None:
    app, client, keys = keyed
    verify = documented_verify()
    # Without a key: refused, nothing made.
    r = await client.post("/v1/webhooks", json={"url": inbox.url("x")})
    assert r.status_code == 401, r.text
    made = {t: await create_webhook(client, bearer(keys[t]), url=inbox.url(t)) for t in TENANTS}
    hooks = {
        t: await create_webhook(client, bearer(keys[t]), url=inbox.url(f"{t}-hook"), hook=True)
        for t in TENANTS
    }
    for tenant in TENANTS:
        await _activity(client, keys[tenant])
    assert await drain(app) == 2
    await dispatch(app)

    for tenant, other in (TENANTS, TENANTS[::-1]):
        mine = {e["id"] for e in await event_log(app, tenant)}
        theirs = {e["id"] for e in await event_log(app, other)}
        assert mine
        assert not mine & theirs
        got = inbox.received(tenant)
        assert {r.headers["webhook-id"] for r in got} == mine
        assert len(got) == len(mine)
        assert all(verify(made[tenant]["secret"], r.headers, r.body) for r in got)
        assert not any(verify(made[other]["secret"], r.headers, r.body) for r in got)
        # Each tenant's hook was called for its own compaction only.
        [called] = inbox.received(f"{tenant}-hook")
        assert verify(hooks[tenant]["secret"], called.headers, called.body)
        compactions = await client.get("/v1/sessions/s/compactions", headers=bearer(keys[tenant]))
        [job] = compactions.json()["compactions"]
        assert called.json["data"]["compaction_id"] == job["id"]

        # The other's webhooks do not exist for this tenant.
        listed = await client.get("/v1/webhooks", headers=bearer(keys[tenant]))
        assert {w["id"] for w in listed.json()["webhooks"]} == {
            made[tenant]["id"],
            hooks[tenant]["id"],
        }
        foreign = made[other]["id"]
        for method, path, body in [
            ("GET", f"/v1/webhooks/{foreign}", None),
            ("PATCH", f"/v1/webhooks/{foreign}", {"enabled": False}),
            ("POST", f"/v1/webhooks/{foreign}/test", None),
            ("GET", f"/v1/webhooks/{foreign}/deliveries", None),
            ("DELETE", f"/v1/webhooks/{foreign}", None),
        ]:
            r = await client.request(method, path, json=body, headers=bearer(keys[tenant]))
            assert_problem(r, 404, foreign)
        log = await delivery_log(client, made[tenant]["id"], bearer(keys[tenant]))
        assert {d["event_id"] for d in log} == mine
    # Untouched by the other tenant's attempts.
    for tenant in TENANTS:
        r = await client.get(f"/v1/webhooks/{made[tenant]['id']}", headers=bearer(keys[tenant]))
        assert r.json()["enabled"] is True
