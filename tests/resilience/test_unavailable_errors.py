"""Which database errors are a 503 (retry shortly) and which stay a 500 (a bug),
on the raw asyncpg paths and through SQLAlchemy, with no database needed."""

from __future__ import annotations

import socket
from typing import Any

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from pydantic import ValidationError
from sqlalchemy.dialects.postgresql.asyncpg import AsyncAdapt_asyncpg_dbapi
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from app.core.database import unavailable_cause
from app.core.http import install_error_handlers
from app.core.settings import Settings
from tests.resilience.support import assert_unavailable

_DBAPI: Any = AsyncAdapt_asyncpg_dbapi


def wrapped(error: Exception, *, invalidated: bool = False) -> DBAPIError:
    """``error`` as SQLAlchemy raises it: its dbapi error, caused by the driver's."""
    dbapi = _DBAPI(asyncpg)
    try:
        try:
            raise error
        except Exception as driver_error:
            raise dbapi.Error(str(driver_error)) from driver_error
    except Exception as adapted:
        result = DBAPIError.instance(
            "SELECT 1", None, adapted, dbapi.Error, connection_invalidated=invalidated
        )
    assert isinstance(result, DBAPIError)
    return result


UNAVAILABLE = [
    asyncpg.exceptions.CannotConnectNowError("the database system is starting up"),
    asyncpg.exceptions.CannotConnectNowError("the database system is shutting down"),
    asyncpg.exceptions.AdminShutdownError("terminating connection due to administrator command"),
    asyncpg.exceptions.TooManyConnectionsError("sorry, too many clients already"),
    asyncpg.exceptions.ConnectionDoesNotExistError(
        "connection was closed in the middle of operation"
    ),
    asyncpg.InterfaceError("cannot perform operation: connection is closed"),
    PoolTimeout("QueuePool limit of size 5 overflow 30 reached"),
]
BUGS = [
    asyncpg.exceptions.UndefinedColumnError('column "nope" does not exist'),
    asyncpg.exceptions.UniqueViolationError("duplicate key value"),
    asyncpg.InterfaceError("the number of query arguments cannot exceed 32767"),
    ValueError("a bug"),
]


@pytest.mark.parametrize("error", UNAVAILABLE, ids=repr)
def test_unavailable_raw_and_wrapped(error: Exception) -> None:
    assert unavailable_cause(error) is error
    assert unavailable_cause(wrapped(error)) is not None


@pytest.mark.parametrize("error", BUGS, ids=repr)
def test_other_errors_are_not_unavailability(error: Exception) -> None:
    assert unavailable_cause(error) is None
    assert unavailable_cause(wrapped(error)) is None


def test_an_invalidated_connection_is_unavailability() -> None:
    assert unavailable_cause(wrapped(asyncpg.InternalClientError("x"), invalidated=True))


async def driver_os_error(kind: str) -> OSError:
    """An OSError as asyncpg raises it when Postgres cannot be reached."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        if kind == "timeout":
            listener.listen()  # the handshake completes; no server ever answers
        target: dict[str, Any] = {
            "refused": {"host": "127.0.0.1", "port": port},  # bound, not listening
            "no socket file": {"host": "/nonexistent/compactd-test"},  # Postgres is down
            "timeout": {"host": "127.0.0.1", "port": port, "timeout": 0.2},
        }[kind]
        try:
            await asyncpg.connect(user="compactd", database="compactd", **target)
        except OSError as exc:
            return exc
    raise AssertionError(f"{kind}: connected")


@pytest.mark.parametrize("kind", ["refused", "no socket file", "timeout"])
async def test_os_errors_from_the_driver_are_unavailability(kind: str) -> None:
    error = await driver_os_error(kind)
    assert unavailable_cause(error) is error
    assert unavailable_cause(wrapped(error)) is not None
    # Fresh ones for the app: raising an error through it drops its traceback.
    assert_unavailable(await get(app_raising(await driver_os_error(kind))))
    assert_unavailable(await get(app_raising(wrapped(await driver_os_error(kind)))))


@pytest.mark.parametrize(
    "error",
    [FileNotFoundError(2, "app/prompts/system.md"), TimeoutError(), ConnectionResetError(104)],
    ids=repr,
)
async def test_the_apps_own_os_errors_are_bugs(error: OSError) -> None:
    """A missing file of our own or a timeout of our own is a bug to see, not a 503."""
    assert unavailable_cause(error) is None
    r = await get(app_raising(error))
    assert r.status_code == 500, r.text


def raised_while_handling_a_disconnect(*, suppress: bool) -> Exception:
    """A ROLLBACK's error, raised while a dropped connection's error is handled."""
    try:
        try:
            raise asyncpg.exceptions.AdminShutdownError("terminating connection")
        except Exception:
            if suppress:
                raise asyncpg.InternalClientError("cannot switch to state 12") from None
            raise asyncpg.InternalClientError("cannot switch to state 12")  # noqa: B904
    except Exception as exc:
        return exc
    raise AssertionError("unreachable")


def test_raised_while_handling_a_disconnect() -> None:
    assert unavailable_cause(raised_while_handling_a_disconnect(suppress=False)) is not None
    assert unavailable_cause(raised_while_handling_a_disconnect(suppress=True)) is None


def app_raising(error: Exception) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise error

    return app


async def get(app: FastAPI) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get("/boom")


SQLALCHEMY_UNAVAILABLE: list[Any] = [
    *(wrapped(e) for e in UNAVAILABLE),
    OperationalError("SELECT 1", None, Exception("connection refused")),
    InterfaceError(
        "SELECT 1", None, Exception("connection is closed"), connection_invalidated=True
    ),
]


@pytest.mark.parametrize("error", [*UNAVAILABLE, *SQLALCHEMY_UNAVAILABLE], ids=repr)
async def test_a_503_with_retry_after(error: Exception) -> None:
    assert_unavailable(await get(app_raising(error)))


@pytest.mark.parametrize("error", [*BUGS[:3], *(wrapped(e) for e in BUGS)], ids=repr)
async def test_a_bug_stays_a_500(error: Exception) -> None:
    r = await get(app_raising(error))
    assert r.status_code == 500, r.text


def test_the_command_bound_must_outlast_the_statement_timeout() -> None:
    """Postgres cancels a slow statement first and keeps the connection; the client's
    bound is for a server that cannot answer at all."""
    with pytest.raises(ValidationError, match="must exceed db_statement_timeout_seconds"):
        Settings(db_statement_timeout_seconds=30, db_command_timeout_seconds=30)
    assert Settings(db_statement_timeout_seconds=0, db_command_timeout_seconds=1)
    defaults = Settings()
    assert defaults.db_command_timeout_seconds > defaults.db_statement_timeout_seconds
