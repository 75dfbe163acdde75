"""Alembic environment: async, with the URL handed over by compactd."""

from __future__ import annotations

import asyncio
from logging.config import fileConfig

from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

import app.compactions.models
import app.keys.models
import app.proxy.models
import app.store.tables  # noqa: F401  (registers the tables)
from alembic import context
from app.core.database import Base

config = context.config
if config.config_file_name is not None and config.attributes.get("configure_logger", True):
    fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        from app.core.database import resolve_database_url

        url = resolve_database_url()
    return str(url)


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


async def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    # Unnamed statements only: a migration runs each statement once, and a named one
    # would stay on a transaction pooler's shared server (docs/deployment.md, PgBouncer).
    no_cache = {"statement_cache_size": 0, "prepared_statement_cache_size": 0}
    engine = create_async_engine(_url(), connect_args=no_cache)
    async with engine.connect() as conn:
        await conn.run_sync(_run)
    await engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    asyncio.run(run_migrations_online())
