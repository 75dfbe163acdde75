"""The async engine, the ORM base, and the per-request session dependency."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import asyncpg
import orjson
from fastapi import Depends, Request
from sqlalchemy import MetaData
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase

from app.core.errors import ServiceUnavailable
from app.core.settings import Settings

# Postgres's own naming style, so Alembic names match what psql shows.
NAMING_CONVENTION = {
    "ix": "%(table_name)s_%(column_0_N_name)s_idx",
    "uq": "%(table_name)s_%(column_0_N_name)s_key",
    "ck": "%(table_name)s_%(constraint_name)s_check",
    "fk": "%(table_name)s_%(column_0_N_name)s_fkey",
    "pk": "%(table_name)s_pkey",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def create_engine(url: str, settings: Settings) -> AsyncEngine:
    return create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
        json_serializer=_dumps,
        json_deserializer=orjson.loads,
        # Every query is a keyed lookup; the append's write statement (CTEs over
        # unnest) cost more to plan on each call than to run. See the README.
        connect_args={"server_settings": {"plan_cache_mode": "force_generic_plan"}},
    )


def sessionmaker(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False, autoflush=False)


async def get_db(request: Request) -> AsyncIterator[AsyncSession]:
    """One transaction per request: the only place that commits or rolls back."""
    maker: async_sessionmaker[AsyncSession] = request.app.state.sessionmaker
    async with maker() as db:
        try:
            yield db
            await db.commit()
        except BaseException:
            await db.rollback()
            raise


# What a dropped or refused connection raises from asyncpg itself (the raw paths
# below); SQLAlchemy wraps the same as OperationalError on its own paths.
DISCONNECTS = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    OSError,
)


@asynccontextmanager
async def driver_connection(engine: AsyncEngine) -> AsyncIterator[Any]:
    """A pooled connection as a bare asyncpg connection, outside any transaction.

    For the hot paths (append), where SQLAlchemy's per-statement work costs more
    than the query itself: each statement is its own transaction unless the
    caller opens one (``driver.transaction()``). A dropped connection is
    invalidated, so the pool never hands it out again, and the request gets a 503.
    """
    async with engine.connect() as connection:
        proxied = await connection.get_raw_connection()
        try:
            yield proxied.driver_connection
        except DISCONNECTS as exc:
            await connection.invalidate(exc)
            raise ServiceUnavailable(
                "the database is unavailable; retry shortly", headers={"Retry-After": "2"}
            ) from exc


async def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


EngineDep = Annotated[AsyncEngine, Depends(get_engine)]


# scope="function": commit before the response is sent, so a client that got its
# 201 always finds what it wrote on its next request.
DbDep = Annotated[AsyncSession, Depends(get_db, scope="function")]


def resolve_database_url(settings: Settings | None = None) -> str:
    """``DATABASE_URL`` as an asyncpg URL, or the embedded server's when unset."""
    from app.core import embedded
    from app.core.settings import get_settings

    settings = settings or get_settings()
    if settings.database_url:
        return embedded.to_async_url(settings.database_url)
    return embedded.start(settings.data_dir)
