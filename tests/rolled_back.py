"""API tests inside one rolled-back connection: one app and one database copy for a
whole package of tests, each test in a savepoint rolled back at its end.

Every request runs its SQL on the driver (``app.core.database.driver_connection``),
which takes its connection from the app's engine. Here that engine's pool holds one
connection (``StaticPool``), opened once, with a transaction begun on it that is
never committed: a request's own transaction blocks become savepoints inside it, a
test's writes are gone when its savepoint rolls back, and the next test finds the
database as migrated. What a test costs is then its requests, not a database copy
and an app's start and stop.

What such a test cannot see, it must not ask for: commits seen by another
connection (workers, the event stream's LISTEN, the search indexer), two statements
at once, a serializable transaction block, or clocks that move within
the database (``now()`` is the outer transaction's start for the whole package). A
test that brings its own settings, or reads the database itself, gets the usual app
and database copy (:func:`app`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import orjson
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import StaticPool
from sqlalchemy.util import greenlet_spawn

from app.core.database import BoundedConnection, driver_bounds_of, statement_timeout_ms
from app.core.driver import Driver
from app.core.settings import Settings
from app.main import create_app
from tests import postgres
from tests.conftest import TEST_SETTINGS


@dataclass
class Shared:
    """The package's app, its one connection and the transaction around every test."""

    app: Any
    driver: Driver

    @contextlib.asynccontextmanager
    async def test(self) -> AsyncIterator[Any]:
        """The app for one test, whose writes are rolled back at its end."""
        savepoint = self.driver.transaction()
        await savepoint.start()
        try:
            yield self.app
        finally:
            await savepoint.rollback()


def one_connection_engine(url: str, settings: Settings) -> AsyncEngine:
    """An engine like the app's (app.core.database.create_engine) over one connection."""
    return create_async_engine(
        url,
        poolclass=StaticPool,
        json_serializer=lambda value: orjson.dumps(value).decode(),
        json_deserializer=orjson.loads,
        connect_args={
            "connection_class": BoundedConnection,
            **driver_bounds_of(settings),
            "server_settings": {
                "plan_cache_mode": "force_generic_plan",
                "statement_timeout": str(statement_timeout_ms(settings)),
            },
        },
    )


@contextlib.asynccontextmanager
async def shared_app(clones: postgres.Clones, settings: Settings) -> AsyncIterator[Shared]:
    """An app started once on a database copy, its requests on one connection held in
    a transaction that is rolled back at the end."""
    url = await clones.take(ahead=False)
    try:
        app = create_app(settings, database_url=url)
        async with app.router.lifespan_context(app):
            own = app.state.engine
            engine = one_connection_engine(url, settings)
            proxied = await engine.raw_connection()
            driver = cast(Driver, proxied.driver_connection)
            # Repeatable read: the blocks that ask for it (a compaction's read) nest in
            # it; on one connection every statement sees the same rows either way.
            outer = driver.transaction(isolation="repeatable_read")
            await outer.start()
            app.state.engine = engine
            try:
                yield Shared(app, driver)
            finally:
                app.state.engine = own
                await outer.rollback()
                await greenlet_spawn(proxied.close)
                await engine.dispose()
    finally:
        await clones.give_back(url, behind=False)


# The fixtures a package's conftest imports to run its API tests this way.


@pytest.fixture(scope="package")
async def shared(clones: postgres.Clones) -> AsyncIterator[Shared]:
    async with shared_app(clones, TEST_SETTINGS) as found:
        yield found


@pytest.fixture
async def shared_test_app(shared: Shared) -> AsyncIterator[Any]:
    async with shared.test() as found:
        yield found


@pytest.fixture
async def own_app(db_url: str, settings: Settings) -> AsyncIterator[Any]:
    """The usual app, on a database copy of the test's own."""
    application = create_app(settings, database_url=db_url)
    async with application.router.lifespan_context(application):
        yield application


@pytest.fixture
def app(request: pytest.FixtureRequest, settings: Settings) -> Any:
    """The shared app in a savepoint; the usual one for a test that brings its own
    settings or reads its database itself (``db_url``)."""
    own = settings is not TEST_SETTINGS or "db_url" in request.fixturenames
    return request.getfixturevalue("own_app" if own else "shared_test_app")
