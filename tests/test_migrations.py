"""Alembic migrations from an empty database to head, down to base, and up again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest

from app.core import migrations
from tests import postgres

TABLES = {
    "branch",
    "session",
    "entry",
    "tool_call",
    "idempotency_record",
    "prune_mark",
    "compaction",
    "api_key",
    "event",
    "webhook",
    "webhook_delivery",
    "proxy_history",
    "tenant_summarizer_usage",
    "tenant_summarizer_hour",
}


@pytest.fixture
async def empty_db_url(admin_url: str) -> AsyncIterator[str]:
    name = f"m_{uuid.uuid4().hex[:16]}"
    conn = await asyncpg.connect(postgres.asyncpg_dsn(admin_url))
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = postgres.with_database(admin_url, name)
    yield url
    await postgres.drop(admin_url, url)


async def _tables(url: str) -> set[str]:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(url))
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {r["tablename"] for r in rows}
    finally:
        await conn.close()


async def _version(url: str) -> str | None:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(url))
    try:
        value: str | None = await conn.fetchval("SELECT version_num FROM alembic_version")
        return value
    finally:
        await conn.close()


async def test_upgrade_downgrade_upgrade(empty_db_url: str) -> None:
    assert await _tables(empty_db_url) == set()

    # Alembic's env.py runs its own event loop: keep it off this one.
    await asyncio.to_thread(migrations.upgrade, empty_db_url)
    assert await _tables(empty_db_url) == TABLES | {"alembic_version"}
    assert await _version(empty_db_url) == migrations.head_revision()

    await asyncio.to_thread(migrations.downgrade, empty_db_url, "base")
    assert await _tables(empty_db_url) == {"alembic_version"}
    assert await _version(empty_db_url) is None

    await asyncio.to_thread(migrations.upgrade, empty_db_url)
    assert await _tables(empty_db_url) >= TABLES
    assert await _version(empty_db_url) == migrations.head_revision()


async def test_migrated_schema_keys_every_table_by_session_first(db_url: str) -> None:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch(
            """
            SELECT c.conrelid::regclass::text AS tbl, c.conname, c.contype,
                   (SELECT a.attname FROM pg_attribute a
                     WHERE a.attrelid = c.conrelid AND a.attnum = c.conkey[1]) AS first_col
              FROM pg_constraint c
              JOIN pg_namespace n ON n.oid = c.connamespace
             WHERE n.nspname = 'public' AND c.contype IN ('p', 'u')
            """
        )
    finally:
        await conn.close()
    keys = {(r["tbl"], r["conname"]): r["first_col"] for r in rows}
    assert ("session", "session_pkey") in keys
    for (table, name), first in keys.items():
        if table in (
            "alembic_version",
            "api_key",
            "webhook",
            "tenant_summarizer_usage",
            "tenant_summarizer_hour",
        ):
            # api_key, webhook, the summarizer's spend per tenant: small tables keyed by
            # tenant that every node reads (reference tables)
            continue
        expected = "id" if table == "session" else "session_id"
        assert first == expected, f"{name} on {table} starts with {first}"


async def test_the_models_match_the_migrated_schema(db_url: str) -> None:
    """What the ORM maps is what Alembic built: no column, table or index drift."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy.ext.asyncio import create_async_engine

    from app.core.database import Base
    from app.main import create_app  # noqa: F401  (imports every model)

    engine = create_async_engine(db_url)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(
                lambda sync: compare_metadata(MigrationContext.configure(sync), Base.metadata)
            )
    finally:
        await engine.dispose()
    assert diff == []
