"""The async engine and its pool, the ORM base of the tables (Alembic's metadata), and
the typed driver connections every request runs on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated, Any, TypedDict, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import asyncpg
import asyncpg.transaction
import orjson
from fastapi import Depends, Request
from sqlalchemy import URL, Engine, MetaData, event, make_url
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DBAPIError, DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.util import greenlet_spawn

from app.core import embedded
from app.core.driver import Driver, Isolation
from app.core.errors import ProblemError, ServiceUnavailable
from app.core.settings import Settings

log = logging.getLogger("compactd")

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
    """The engine, its pool and every connection bounded on the client side.

    Postgres's ``statement_timeout`` bounds a statement only while the server runs:
    one that is frozen (a stalled disk or network looks the same) answers nothing.
    So each database call is bounded here too: opening a connection
    (``db_connect_timeout_seconds``), waiting for a pooled one
    (``db_pool_timeout_seconds``) and each command, COMMIT included
    (``db_command_timeout_seconds``, above the statement timeout so that Postgres
    cancels a merely slow statement first and the connection is kept). A command past
    its bound drops its connection (Postgres rolls the transaction back when it sees
    that) and the request gets 503; a COMMIT past it may yet have committed, and a 503
    never claims otherwise.

    Behind a transaction pooler (``database_pooler``), consecutive transactions of one
    connection run on different server connections, shared with other clients. So the
    connections send no startup parameters (PgBouncer refuses them, and a session-level
    SET would outlive the transaction on a server that others then use): the role's
    settings give ``statement_timeout`` (checked at the first connection, see
    :func:`_check_pooled_settings`). And they use only the unnamed prepared statement:
    asyncpg sends its Parse and Describe with a Flush, not a Sync, so the statement and
    its execution never straddle a switch of server connection, and nothing named is
    left on a server for another client to collide with.
    """
    bounds = driver_bounds_of(settings)
    connect_args: dict[str, Any] = {"connection_class": BoundedConnection, **bounds}
    if pooled(settings):
        connect_args["prepared_statement_cache_size"] = 0  # SQLAlchemy's own cache
    else:
        # Every query is a keyed lookup; the append's write statement (CTEs over
        # unnest) cost more to plan on each call than to run. See docs/deployment.md.
        connect_args["server_settings"] = _server_settings(settings)
    engine = create_async_engine(
        url,
        pool_size=settings.db_pool_size,
        max_overflow=settings.db_max_overflow,
        pool_timeout=settings.db_pool_timeout_seconds,
        json_serializer=_dumps,
        json_deserializer=orjson.loads,
        connect_args=connect_args,
    )
    event.listen(engine.sync_engine, "checkout", _skip_closed)
    event.listen(engine.sync_engine, "handle_error", _drop_when_unanswered)
    if pooled(settings):
        event.listen(engine.sync_engine, "connect", _check_pooled_settings(settings))
    _BOUNDS[engine.sync_engine] = bounds
    if settings.database_direct_url:
        _DIRECT[engine.sync_engine] = to_async_url(settings.database_direct_url)
    return engine


def worker_settings(settings: Settings) -> Settings:
    """``settings`` for the engine of the compaction workers and the search indexer: their
    reads of a long history and their commits may take longer than a request may wait,
    so their ``statement_timeout`` is ``db_worker_statement_timeout_seconds`` and their
    command bound 5 s above it (behind a transaction pooler the statement_timeout is the
    role's: only the command bound is raised)."""
    statement = settings.db_worker_statement_timeout_seconds
    update: dict[str, float] = {
        "db_command_timeout_seconds": max(settings.db_command_timeout_seconds, statement + 5)
    }
    if not pooled(settings):
        update["db_statement_timeout_seconds"] = statement
    return settings.model_copy(update=update)


def pooled(settings: Settings) -> bool:
    """Whether ``database_url`` goes through a transaction pooler."""
    return settings.database_pooler != "none"


class DriverBounds(TypedDict, total=False):
    """What ``asyncpg.connect`` needs besides the URL: the client-side bounds, and behind
    a transaction pooler no statement cache (every raw connection, the CLI's included)."""

    timeout: float
    command_timeout: float
    statement_cache_size: int


_BOUNDS: weakref.WeakKeyDictionary[Engine, DriverBounds] = weakref.WeakKeyDictionary()
_DIRECT: weakref.WeakKeyDictionary[Engine, str] = weakref.WeakKeyDictionary()


def driver_bounds_of(settings: Settings) -> DriverBounds:
    """asyncpg's client-side bounds: ``timeout`` (to connect) and ``command_timeout``;
    behind a transaction pooler, ``statement_cache_size=0`` too (unnamed statements only:
    a named one prepared in one transaction is not on the next one's server)."""
    bounds: DriverBounds = {
        "timeout": settings.db_connect_timeout_seconds,
        "command_timeout": settings.db_command_timeout_seconds,
    }
    if pooled(settings):
        bounds["statement_cache_size"] = 0
    return bounds


def driver_bounds(engine: AsyncEngine) -> DriverBounds:
    """The bounds of ``engine``'s connections, for a connection opened apart from its
    pool (the workers' LISTEN connection); none for an engine made elsewhere."""
    return DriverBounds(**_BOUNDS.get(engine.sync_engine, {}))


def listen_url(engine: AsyncEngine) -> str:
    """Where ``engine``'s process LISTENs, as a plain libpq URL for ``asyncpg.connect``:
    ``database_direct_url`` when set (a transaction pooler cannot carry a LISTEN: the
    server connection that registered it serves other clients once the statement ends,
    and the notifications never reach this one), else the engine's own URL."""
    direct = _DIRECT.get(engine.sync_engine)
    return libpq_url(make_url(direct) if direct is not None else engine.url)


def libpq_url(url: URL | str) -> str:
    """A SQLAlchemy asyncpg URL as a plain libpq URL that ``asyncpg.connect`` reads."""
    url = make_url(url)
    if "ssl" in url.query:  # SQLAlchemy's asyncpg name; in a DSN asyncpg reads sslmode
        url = url.update_query_dict({"sslmode": url.query["ssl"]}).difference_update_query(["ssl"])
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def unanswered(error: BaseException | None) -> bool:
    """Whether ``error`` is the driver giving up on a server that did not answer a
    command, or a connection attempt, within its bound."""
    return isinstance(error, TimeoutError) and _raised_by_the_driver(error)


class BoundedTransaction(asyncpg.transaction.Transaction):
    """A transaction block that gives up at once on a server that stopped answering.

    After a command timed out, asyncpg asks the server to cancel it and makes the
    ROLLBACK wait for that answer: up to another ``command_timeout`` from a frozen
    server. The connection is dropped instead; Postgres rolls back when it sees that.
    """

    __slots__ = ()

    async def __aexit__(self, extype: Any, ex: object, tb: Any) -> None:
        if isinstance(ex, BaseException) and unanswered(ex):
            self._connection.terminate()  # type: ignore[attr-defined]  # asyncpg's own field
            return
        await super().__aexit__(extype, ex, tb)


if TYPE_CHECKING:
    _Connection = asyncpg.Connection[asyncpg.Record]  # generic in the stubs only
else:
    _Connection = asyncpg.Connection


class BoundedConnection(_Connection):
    """The service's asyncpg connections: their transactions are bounded (above)."""

    def transaction(
        self,
        *,
        isolation: Isolation | None = None,
        readonly: bool = False,
        deferrable: bool = False,
    ) -> BoundedTransaction:
        # As asyncpg.Connection.transaction, with the bounded block.
        super().transaction()  # the same checks (the connection is open)
        return BoundedTransaction(self, isolation, readonly, deferrable)


def _drop_when_unanswered(context: ExceptionContext) -> None:
    """A command on an ORM path that the server did not answer in time: drop the
    connection now (see :class:`BoundedTransaction`), so that the rollback that follows
    is immediate and the pool never hands the connection out again; the TimeoutError
    goes on to become a 503."""
    if not unanswered(context.original_exception):
        return
    connection = context.connection
    if connection is not None and not connection.invalidated:
        with contextlib.suppress(Exception):
            driver = connection.connection.driver_connection
            if driver is not None:
                driver.terminate()
    context.is_disconnect = True
    context.invalidate_pool_on_disconnect = False  # the others may be fine


def _server_settings(settings: Settings) -> dict[str, str]:
    # A statement that waits past the timeout (a lock held too long, say) is
    # cancelled by Postgres, its transaction rolls back and the request gets a 503:
    # the only safe way to bound a handler, which is never cancelled from outside.
    return {
        "plan_cache_mode": "force_generic_plan",
        "statement_timeout": str(statement_timeout_ms(settings)),
    }


def statement_timeout_ms(settings: Settings) -> int:
    return int(settings.db_statement_timeout_seconds * 1000)


_POOLED_SETTINGS_SQL = """
SELECT setting::bigint AS statement_timeout, current_user AS role, current_database() AS db
FROM pg_settings WHERE name = 'statement_timeout'
"""


def _check_pooled_settings(settings: Settings) -> Any:
    """A ``connect`` listener for an engine behind a transaction pooler: its first
    connection reads the ``statement_timeout`` that the database gives the service's role
    (``ALTER ROLE … IN DATABASE … SET``: every server connection the pooler opens has it)
    and warns, with the statement to run, when it is not ``db_statement_timeout_seconds``.
    A mismatch is not fatal: the driver's command timeout still bounds every command."""
    expected = statement_timeout_ms(settings)
    checked = False

    def check(dbapi_connection: Any, _record: Any) -> None:
        nonlocal checked
        if checked:
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(_POOLED_SETTINGS_SQL)
            found, role, db = cursor.fetchone()
        except Exception as exc:  # the next connection checks again
            log.debug("could not read statement_timeout through the pooler: %r", exc)
            return
        finally:
            cursor.close()
            with contextlib.suppress(Exception):
                dbapi_connection.rollback()
        checked = True
        if found != expected:
            log.warning(
                "statement_timeout through the pooler is %d ms, not the %d ms of "
                "COMPACTD_DB_STATEMENT_TIMEOUT_SECONDS: behind a transaction pooler it comes "
                "from the role, so run ALTER ROLE %s IN DATABASE %s SET statement_timeout = "
                "%d (docs/deployment.md, Behind PgBouncer)",
                found,
                expected,
                _identifier(role),
                _identifier(db),
                expected,
            )

    return check


def _identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _skip_closed(_dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Never hand out a pooled connection the server has already closed.

    A restarted or failed-over Postgres closes every connection; asyncpg sees
    the socket close at once, even on an idle pooled connection, so checking
    costs nothing (unlike ``pool_pre_ping``, a round trip per checkout). The
    pool then replaces the connection, and no request fails on a stale one.
    """
    driver = record.driver_connection
    if driver is not None and driver.is_closed():
        raise DisconnectionError("the pooled connection was closed by the server")


# What a database that cannot serve us right now raises: it is down, starting,
# stopping or full, or it dropped the connection. SQLAlchemy wraps these (in a
# DBAPIError whose ``orig`` is caused by the driver's error); the raw asyncpg
# paths below see them as they are.
UNAVAILABLE = (
    # Refused, no socket file, reset, and timed out: TimeoutError is an OSError, and the
    # driver raises it when a connection or a command is not answered within its bound.
    OSError,
    asyncpg.PostgresConnectionError,  # class 08, and "closed in the middle of operation"
    asyncpg.exceptions.AdminShutdownError,  # 57P01: a fast shutdown, pg_terminate_backend
    asyncpg.exceptions.CrashShutdownError,  # 57P02
    asyncpg.exceptions.CannotConnectNowError,  # 57P03: starting up or shutting down
    asyncpg.exceptions.TooManyConnectionsError,  # 53300
    # target_session_attrs=read-write and no host accepts writes: a failover in progress
    # (the old primary down, the standby not yet promoted).
    asyncpg.exceptions.TargetServerAttributeNotMatched,
    asyncpg.exceptions.QueryCanceledError,  # 57014: statement_timeout (a lock wait, say)
    PoolTimeout,  # no pooled connection came free within pool_timeout
)


def unavailable_cause(exc: BaseException) -> BaseException | None:
    """The error that says the database cannot be reached, if ``exc`` is or
    wraps one; None for anything else (a bug, bad SQL, a constraint)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        error = todo.pop()
        if id(error) in seen:
            continue
        seen.add(id(error))
        found: BaseException = error
        if isinstance(error, OSError) and not _raised_by_the_driver(error):
            pass  # a file or socket of our own: a bug, not the database
        elif isinstance(error, UNAVAILABLE):
            return found
        if isinstance(error, asyncpg.InterfaceError) and "closed" in str(error):
            return found  # "connection is closed", "connection was closed"
        if isinstance(error, DBAPIError):
            # OperationalError: SQLAlchemy's word for a database that failed us.
            if error.connection_invalidated or isinstance(error, OperationalError):
                return error
            if isinstance(error.orig, BaseException):
                todo.append(error.orig)
        if error.__cause__ is not None:
            todo.append(error.__cause__)
        elif error.__context__ is not None and not error.__suppress_context__:
            # Raised while handling one (a ROLLBACK on a connection being dropped).
            todo.append(error.__context__)
    return None


_DRIVER_MODULES = ("asyncpg", "sqlalchemy", "app.core.database")


def _raised_by_the_driver(error: BaseException) -> bool:
    """Whether an OSError came out of the database driver or the pool (a refused or
    reset connection, a missing socket file), not from the app's own I/O."""
    tb = error.__traceback__
    while tb is not None:
        module = tb.tb_frame.f_globals.get("__name__", "")
        if module.startswith(_DRIVER_MODULES):
            return True
        tb = tb.tb_next
    return False


class DatabaseTimeout(ServiceUnavailable):
    """A statement ran past ``statement_timeout`` (a slow query, or a lock waited on too
    long): the database is there, the query took too long. Its transaction rolled back."""

    type, title = "database-timeout", "Database query took too long"


def unavailable(cause: BaseException | None = None) -> ServiceUnavailable:
    """The 503 for a database that cannot serve the request now: retry shortly. ``cause``
    (what :func:`unavailable_cause` found) a statement cancelled by ``statement_timeout``:
    the 503 says the query took too long, not that the database is unavailable."""
    if isinstance(cause, asyncpg.exceptions.QueryCanceledError):
        return DatabaseTimeout(
            "the database query took too long and was cancelled (statement_timeout); "
            "nothing was changed, retry shortly",
            headers={"Retry-After": "2"},
        )
    return ServiceUnavailable(
        "the database is unavailable; retry shortly", headers={"Retry-After": "2"}
    )


@asynccontextmanager
async def driver_connection(engine: AsyncEngine) -> AsyncIterator[Driver]:
    """A pooled connection as a bare asyncpg connection, outside any transaction.

    For the hot paths (append), where SQLAlchemy's per-statement work costs more
    than the query itself: each statement is its own transaction unless the
    caller opens one (``driver.transaction()``). A database that cannot be
    reached, when the connection is taken or while it is used, raises
    ``ServiceUnavailable`` (a 503); a dropped connection is invalidated, so the
    pool never hands it out again.
    """
    try:
        # The pool's connection as it is: one hop into SQLAlchemy's pool to take it and
        # one to give it back, no Connection object around it (half the CPU of
        # engine.connect() with get_raw_connection(), on every hot request).
        proxied = await engine.raw_connection()
        try:
            driver = cast(Driver, proxied.driver_connection)
            try:
                yield driver
            except ProblemError:
                raise
            except Exception as exc:
                cause = unavailable_cause(exc)
                if unanswered(cause) and not driver.is_closed():
                    # Not answered within command_timeout: the connection is in an
                    # unknown state, and a graceful close would wait on it again.
                    driver.terminate()
                down = driver.is_closed() or cause is not None
                # A statement_timeout leaves a healthy connection behind (the transaction
                # rolled back); InternalClientError a broken one: never reuse that.
                timed_out = isinstance(cause, asyncpg.exceptions.QueryCanceledError)
                broken = (down and not timed_out) or isinstance(exc, asyncpg.InternalClientError)
                if broken and proxied.is_valid:
                    await greenlet_spawn(proxied.invalidate, exc)
                if down:
                    log.warning("database unavailable: %r", exc)
                    raise unavailable(cause) from exc
                raise
        finally:
            # Back to the pool (an invalidated one is not), even when the request is
            # cancelled meanwhile: shielded, as SQLAlchemy's AsyncConnection exits.
            await asyncio.shield(greenlet_spawn(proxied.close))
    except ProblemError:
        raise
    except Exception as exc:
        # Taking the connection failed (checkout, connect), or giving it back did.
        if (cause := unavailable_cause(exc)) is None:
            raise
        log.warning("database unavailable: %r", exc)
        raise unavailable(cause) from exc


async def get_engine(request: Request) -> AsyncEngine:
    engine: AsyncEngine = request.app.state.engine
    return engine


EngineDep = Annotated[AsyncEngine, Depends(get_engine)]


def resolve_database_url(settings: Settings | None = None) -> str:
    """``DATABASE_URL`` as an asyncpg URL, or the embedded server's when unset."""
    from app.core import embedded
    from app.core.settings import get_settings

    settings = settings or get_settings()
    if settings.database_url:
        return to_async_url(settings.database_url)
    return embedded.start(settings.data_dir)


def to_async_url(url: str) -> str:
    """A libpq URL as a SQLAlchemy asyncpg URL (:func:`embedded.to_async_url`), its hosts
    moved to the query when it names several (``postgresql://u@h1:5432,h2:5433/db``, as
    ``pg_autoctl show uri`` gives a pg_auto_failover formation): SQLAlchemy's URL parses
    one host and port in the authority, while both it and asyncpg read libpq's
    ``host=h1,h2&port=5432,5433``. asyncpg then tries the hosts in order and, with
    ``target_session_attrs=read-write``, keeps the one that accepts writes: after a
    failover, each new connection finds the new primary by itself."""
    url = embedded.to_async_url(url)
    parts = urlsplit(url)
    userinfo, at, hostlist = parts.netloc.rpartition("@")
    if "," not in hostlist or "[" in hostlist:  # one host (or IPv6, left as it is)
        return url
    hosts, ports = [], []
    for item in hostlist.split(","):
        host, _, port = item.partition(":")
        hosts.append(host)
        ports.append(port or "5432")
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(key in ("host", "port") for key, _ in query):
        raise ValueError("the database URL names its hosts both before the path and in the query")
    query += [("host", ",".join(hosts)), ("port", ",".join(ports))]
    netloc = userinfo + at if at else ""
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query, safe=",")))
