"""The formation's URI as ``pg_autoctl show uri`` gives it, as the service reads it
(no formation needed: these run everywhere)."""

from __future__ import annotations

from asyncpg.connect_utils import (  # type: ignore[attr-defined]  # private: the DSN parser
    _parse_connect_dsn_and_args,
)
from sqlalchemy import make_url
from sqlalchemy.dialects.postgresql.asyncpg import dialect

from app.core.database import create_engine, listen_url, resolve_database_url
from tests.conftest import TEST_SETTINGS

URI = (
    "postgres://compactd@10.0.0.1:5432,10.0.0.2:6543/compactd"
    "?target_session_attrs=read-write&sslmode=prefer"
)


def test_a_multi_host_uri_reaches_asyncpg_with_every_host_and_read_write() -> None:
    url = resolve_database_url(TEST_SETTINGS.model_copy(update={"database_url": URI}))
    _, options = dialect().create_connect_args(make_url(url))  # type: ignore[no-untyped-call]
    assert options["host"] == ["10.0.0.1", "10.0.0.2"]
    assert options["port"] == [5432, 6543]
    assert options["target_session_attrs"] == "read-write"
    assert options["ssl"] == "prefer"
    assert (options["user"], options["database"]) == ("compactd", "compactd")


def test_a_host_without_a_port_takes_the_default_and_one_host_is_left_as_it_is() -> None:
    settings = TEST_SETTINGS.model_copy(update={"database_url": "postgresql://u@a,b:6000/d"})
    url = make_url(resolve_database_url(settings))
    assert (url.query["host"], url.query["port"]) == ("a,b", "5432,6000")
    one = TEST_SETTINGS.model_copy(update={"database_url": "postgresql://u:p@a:6000/d"})
    assert resolve_database_url(one) == "postgresql+asyncpg://u:p@a:6000/d"


async def test_the_listen_dsn_keeps_every_host_read_write_and_the_ssl_mode() -> None:
    """The LISTEN connection (workers, event hub) is a bare asyncpg.connect on a DSN: it
    must try every host, want the read-write one, and get sslmode as libpq's option (an
    unknown one is sent as a server setting, which Postgres refuses)."""
    url = resolve_database_url(TEST_SETTINGS.model_copy(update={"database_url": URI}))
    engine = create_engine(url, TEST_SETTINGS)
    try:
        addrs, params = _parse_connect_dsn_and_args(
            dsn=listen_url(engine), host=None, port=None, user=None, password=None,
            passfile=None, database=None, ssl=None, service=None, servicefile=None,
            direct_tls=None, server_settings=None, target_session_attrs=None,
            krbsrvname=None, gsslib=None,
        )  # fmt: skip
    finally:
        await engine.dispose()
    assert addrs == [("10.0.0.1", 5432), ("10.0.0.2", 6543)]
    assert params.target_session_attrs == "read-write"
    assert params.server_settings in (None, {})
    assert (params.user, params.database) == ("compactd", "compactd")
