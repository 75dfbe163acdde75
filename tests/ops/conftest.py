"""API keys for the tests, made the way `compactd keys create` makes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from app.core.settings import Settings
from app.keys import repository
from app.main import create_app
from tests import postgres
from tests.conftest import TEST_SETTINGS

# Keys are read again on every request: revocations show at once.
AUTH_SETTINGS = TEST_SETTINGS.model_copy(update={"auth_cache_seconds": 0.0})


async def create_key(db_url: str, tenant: str, name: str | None = None) -> str:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        _, token = await repository.create(conn, tenant, name)
        return token
    finally:
        await conn.close()


async def revoke_key(db_url: str, key_id: str) -> None:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        assert await repository.revoke(conn, key_id) is not None
    finally:
        await conn.close()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
async def auth_app(db_url: str) -> AsyncIterator[Any]:
    application = create_app(AUTH_SETTINGS, database_url=db_url)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
async def anon(auth_app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the auth app that sends no key unless told to."""
    transport = httpx.ASGITransport(app=auth_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://compactd.test") as c:
        yield c


def settings_with(**changes: Any) -> Settings:
    return TEST_SETTINGS.model_copy(update=changes)
