"""How API keys are known (app.core.auth.KeyStore): from one read of the key table kept
for auth_cache_seconds, so that a key id that is no key costs no database read, a new key
is accepted within a second of its creation (in another process, as `compactd keys
create` makes it), and a revocation shows within the cache period. See also
tests/e2e/test_fairness.py for a key's first use during a flood of forged keys."""

from __future__ import annotations

import asyncio
import secrets
import time

import httpx
import pytest

from app.core.database import create_engine
from app.core.errors import Unauthorized
from app.keys.auth import KeyStore
from app.main import create_app
from tests.helpers import key_table_locked
from tests.ops.conftest import bearer, create_key, revoke_key, settings_with

GIVE_UP_SECONDS = 30.0


def forged_key() -> str:
    return f"cpd_{secrets.token_hex(6)}_{secrets.token_urlsafe(32)[:43]}"


async def test_a_key_id_that_is_no_key_costs_no_database_read(db_url: str) -> None:
    """Before, each forged id was looked up (four at a time, in arrival order): with
    the key table locked, a forged key then waited for the lock instead of its 401."""
    key = await create_key(db_url, "tenant-a")
    # No statement timeout: a read that waits for the lock waits until it ends.
    settings = settings_with(db_statement_timeout_seconds=0, db_command_timeout_seconds=120)
    engine = create_engine(db_url, settings)
    try:
        keys = KeyStore(engine, cache_seconds=60, miss_refresh_seconds=60)
        assert await keys.tenant(f"Bearer {key}") == "tenant-a"
        assert keys.reads == 1
        async with key_table_locked(db_url):
            for _ in range(200):
                with pytest.raises(Unauthorized, match="not valid"):
                    await asyncio.wait_for(
                        keys.tenant(f"Bearer {forged_key()}"), timeout=GIVE_UP_SECONDS
                    )
            # Nor does the known key need one while the table is fresh.
            tenant = await asyncio.wait_for(keys.tenant(f"Bearer {key}"), GIVE_UP_SECONDS)
            assert tenant == "tenant-a"
        assert keys.reads == 1
    finally:
        await engine.dispose()


async def test_unknown_ids_read_the_table_at_most_once_per_interval(db_url: str) -> None:
    key = await create_key(db_url, "tenant-a")
    engine = create_engine(db_url, settings_with())
    try:
        keys = KeyStore(engine, cache_seconds=60, miss_refresh_seconds=0.3)
        assert await keys.tenant(f"Bearer {key}") == "tenant-a"
        # A crowd of forged ids at once, past the interval: one read, shared.
        await asyncio.sleep(0.3)
        results = await asyncio.gather(
            *(keys.tenant(f"Bearer {forged_key()}") for _ in range(100)),
            return_exceptions=True,
        )
        assert all(isinstance(r, Unauthorized) for r in results), results[:3]
        assert keys.reads == 2
        # A key created since (another process's connection): found by the next read.
        new = await create_key(db_url, "tenant-b")
        await asyncio.sleep(0.3)
        assert await keys.tenant(f"Bearer {new}") == "tenant-b"
        assert keys.reads == 3
    finally:
        await engine.dispose()


async def poll(client: httpx.AsyncClient, key: str, until: int) -> tuple[httpx.Response, float]:
    """GET /v1/sessions with ``key`` every 50 ms until the answer is ``until`` (or the
    test gives up); gives the last answer and the time taken."""
    started = time.perf_counter()
    while True:
        r = await client.get("/v1/sessions", headers=bearer(key))
        took = time.perf_counter() - started
        if r.status_code == until or took > GIVE_UP_SECONDS:
            return r, took
        assert r.status_code in (200, 401), r.text
        await asyncio.sleep(0.05)


async def test_a_new_key_is_accepted_within_a_second_and_a_revoked_one_refused(
    db_url: str,
) -> None:
    first = await create_key(db_url, "tenant-a")
    application = create_app(settings_with(auth_cache_seconds=2.0), database_url=db_url)
    async with application.router.lifespan_context(application):
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
            assert (await c.get("/v1/sessions", headers=bearer(first))).status_code == 200
            new = await create_key(db_url, "tenant-b")  # as `compactd keys create` does
            accepted, took = await poll(c, new, 200)
            print(f"\n[keys] a key created while serving was accepted after {took:.2f} s")
            assert accepted.status_code == 200, accepted.text
            await revoke_key(db_url, first[4:16])
            refused, took = await poll(c, first, 401)
            print(f"[keys] a revoked key was refused after {took:.2f} s (cache period 2 s)")
            assert refused.status_code == 401
            assert "revoked" in refused.json()["detail"]
