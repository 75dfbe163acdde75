"""The ``compactd`` command: serve, worker, migrate, keys, openapi."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from app.core.observability import configure_logging
from app.core.settings import Settings, get_settings

if TYPE_CHECKING:
    import asyncpg

    from app.keys.repository import KeyRow

T = TypeVar("T")


def _openapi_document() -> str:
    from app.main import create_app

    spec = create_app().openapi()
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def cmd_serve(args: argparse.Namespace) -> int:
    from app.serving.startup import StartupError

    try:
        return _serve(args)
    except StartupError as exc:
        print(f"compactd: {exc}", file=sys.stderr)
        return 1


def _serve(args: argparse.Namespace) -> int:
    """Bind the port, start or reach the database, migrate, then serve; each slow step
    is logged as it starts, and the way it fails is one line (StartupError)."""
    from app import __version__
    from app.core import migrations
    from app.core.database import resolve_database_url
    from app.core.settings import redacted_url, unknown_variable_lines
    from app.keys.auth import is_loopback, open_bind_refusal
    from app.main import create_app
    from app.serving.server import serve
    from app.serving.startup import (
        StartupError,
        StartupFacts,
        banner,
        base_url,
        database_place,
        database_problem,
        first_line,
        is_terminal,
        listening_socket,
        quiet_uvicorn_startup,
        step,
    )

    settings = get_settings()
    host = args.host or settings.host
    port = args.port or settings.port
    workers = settings.serve_workers if args.workers is None else args.workers
    if not 1 <= workers <= MAX_SERVE_WORKERS:
        raise StartupError(f"--workers must be between 1 and {MAX_SERVE_WORKERS} (it is {workers})")
    # First, so that a busy port is said before the database starts.
    sock = listening_socket(host, port)
    try:
        if settings.database_url:
            url = resolve_database_url(settings)
            database = f"PostgreSQL at {database_place(url)} (DATABASE_URL)"
        else:
            first = not (settings.data_dir / "PG_VERSION").exists()
            doing = "creating and starting" if first else "starting"
            with step(f"{doing} the embedded PostgreSQL in {settings.data_dir}"):
                try:
                    url = resolve_database_url(settings)
                except Exception as exc:
                    raise StartupError(
                        f"the embedded PostgreSQL did not start in {settings.data_dir}: "
                        f"{first_line(exc)} (set COMPACTD_DATA_DIR to a writable folder, "
                        "or DATABASE_URL to a PostgreSQL of yours)"
                    ) from None
            database = f"embedded PostgreSQL, data in {settings.data_dir}"
        try:
            before, _ = _run(_database_state(url))
            if args.no_migrate:
                at = before
            else:
                with step("applying the database migrations"):
                    migrations.upgrade(url)
                at = migrations.head_revision()
            keyed = _run(_database_state(url))[1]
        except Exception as exc:
            raise StartupError(
                database_problem(exc, url, settings.db_connect_timeout_seconds)
            ) from None
        head = migrations.head_revision()
        if at != head:
            state = f"at {at or 'none'}, behind the code's {head}: run `compactd migrate`"
        elif before != at:
            state = f"at {at} (applied now, from {before or 'an empty database'})"
        else:
            state = f"at {at}, up to date"
        refusal = open_bind_refusal(host, keyed, args.insecure_no_auth or settings.insecure_no_auth)
        if refusal:
            print(f"compactd: {refusal}", file=sys.stderr)
            return 2
        app = create_app(settings, database_url=url) if workers == 1 else None
    except BaseException:
        sock.close()
        raise
    proxy = (
        ("openai", redacted_url(settings.proxy_openai_url, keep_user=False)),
        ("anthropic", redacted_url(settings.proxy_anthropic_url, keep_user=False)),
    )
    facts = StartupFacts(
        __version__,
        host,
        port,
        database,
        state,
        keyed=keyed,
        loopback=is_loopback(host),
        workers=workers,
        proxy=proxy,
        warnings=tuple(unknown_variable_lines(os.environ)),
    )
    terminal = is_terminal()
    if terminal:
        quiet_uvicorn_startup()

    def started() -> None:
        if terminal:
            print(banner(facts), file=sys.stderr, flush=True)
        else:
            log = logging.getLogger("compactd.serve")
            log.info(
                "serving",
                extra={
                    "url": base_url(host, port),
                    "database": database,
                    "migrations": state,
                    "keyed": keyed,
                    "workers": workers,
                    "proxy_openai_url": proxy[0][1],
                    "proxy_anthropic_url": proxy[1][1],
                },
            )

    # uvicorn re-raises the SIGTERM it caught once it has shut down; with the default
    # handler that kills the process before atexit runs, and an embedded PostgreSQL
    # would outlive it. Exiting through SystemExit runs atexit (which stops it).
    signal.signal(signal.SIGTERM, _exit_on_signal)
    if app is None:
        return _serve_processes(_ServeChild(settings, url, host, port), workers, sock, started)
    serve(app, settings, host, port, sock=sock, on_started=started)
    return 0


MAX_SERVE_WORKERS = 64


@dataclass(frozen=True)
class _ServeChild:
    """What each server process of ``serve --workers N`` runs (in a spawned interpreter:
    it is pickled, so it carries the parent's settings and the database URL it
    resolved, an embedded PostgreSQL's socket included). The first process runs the
    compaction workers, the search indexer and the webhook dispatcher; the others
    none: ``COMPACTD_COMPACTION_WORKERS`` stays the count for the whole command, and
    jobs queued in any process wake them through ``NOTIFY``."""

    settings: Settings
    database_url: str
    host: str
    port: int

    def __call__(self, index: int, sock: socket.socket, started: Callable[[], None]) -> None:
        from app.main import create_app
        from app.serving.server import serve
        from app.serving.startup import is_terminal, quiet_uvicorn_startup

        settings = self.settings
        configure_logging(settings.log_level, settings.log_format)
        if is_terminal():
            quiet_uvicorn_startup()
        if index > 0:
            settings = settings.model_copy(update={"compaction_workers": 0})
        app = create_app(settings, database_url=self.database_url)
        serve(app, settings, self.host, self.port, sock=sock, on_started=started)


def _serve_processes(
    child: _ServeChild, workers: int, sock: socket.socket, started: Callable[[], None]
) -> int:
    """Run ``workers`` server processes on ``sock`` until a signal stops them (see
    app.serving.supervisor); their metrics are shared (app.core.metrics)."""
    from app.core import metrics
    from app.serving.server import GRACEFUL_SHUTDOWN_SECONDS
    from app.serving.supervisor import ServerProcesses

    # A child stops as one server does: its requests, then its compaction jobs.
    stop_seconds = GRACEFUL_SHUTDOWN_SECONDS + child.settings.compaction_shutdown_grace_seconds
    logging.getLogger("compactd.serve").info("starting %d server processes…", workers)
    try:
        with metrics.shared_folder():
            return ServerProcesses(
                child,
                workers,
                sock,
                stop_seconds=stop_seconds + 5,
                on_serving=started,
                on_exit=metrics.process_ended,
            ).run()
    finally:
        sock.close()


async def _database_state(url: str) -> tuple[str | None, bool]:
    """The database's migration revision (None: not migrated) and whether any API key
    exists. Connecting is bounded as the service's connections are."""
    import asyncpg

    from app.keys import repository

    conn = await _connect(url)
    try:
        try:
            revision = await conn.fetchval("SELECT version_num FROM alembic_version")
        except asyncpg.UndefinedTableError:
            return None, False
        try:
            return revision, await repository.any_exist(conn)
        except asyncpg.UndefinedTableError:
            return revision, False  # not migrated that far yet (serve --no-migrate)
    finally:
        await conn.close()


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    import asyncio

    return asyncio.run(coro)


async def _connect(url: str) -> asyncpg.Connection[asyncpg.Record]:
    import asyncpg

    from app.core.database import driver_bounds_of, libpq_url

    # Bounded as the service's connections are: a hung database fails the command.
    bounds = driver_bounds_of(get_settings())
    return await asyncpg.connect(libpq_url(url), **bounds)


def cmd_worker(args: argparse.Namespace) -> int:
    """Compaction workers without the HTTP API, for scaling out. SIGTERM or
    SIGINT stops claiming; jobs in hand get the grace period to finish."""
    import asyncio

    import uvloop

    from app.compactions.worker import WorkerConfig, WorkerPool
    from app.core import model_catalog
    from app.core.database import create_engine, resolve_database_url, worker_settings
    from app.core.outbound import Outbound
    from app.core.tokenizer import load_encodings
    from app.engine.accounting.tokens import register_encodings
    from app.webhooks.dispatcher import Dispatcher

    settings = get_settings()
    count = args.count if args.count is not None else max(1, settings.compaction_workers)
    metrics_port = args.metrics_port or settings.worker_metrics_port
    if metrics_port:
        from prometheus_client import start_http_server

        start_http_server(metrics_port, addr=args.metrics_host)
    register_encodings(load_encodings())
    model_catalog.use(settings.catalog)
    url = resolve_database_url(settings)

    async def run() -> None:
        # The workers' longer statement_timeout (their reads of a long history).
        engine = create_engine(url, worker_settings(settings))
        outbound = Outbound(settings)  # a client per outbound purpose, as in serve
        pool = WorkerPool(
            engine,
            WorkerConfig.from_settings(settings),
            outbound,
            count=count,
            grace_seconds=settings.compaction_shutdown_grace_seconds,
            extras=[Dispatcher(engine, outbound.webhooks, settings)],
        )
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        pool.start()
        logging.getLogger("compactd.worker").info("%d compaction worker(s) running", count)
        try:
            await stopping.wait()
        finally:
            await pool.close()
            await outbound.aclose()
            await engine.dispose()

    uvloop.run(run())
    return 0


def cmd_migrate(args: argparse.Namespace) -> int:
    from app.core import migrations
    from app.core.database import resolve_database_url

    url = resolve_database_url()
    if args.revision.startswith("-") or args.downgrade:
        migrations.downgrade(url, args.revision)
    else:
        migrations.upgrade(url, args.revision)
    print(f"migrated to {args.revision}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """Create, list, revoke and delete API keys. Secrets are printed once, never stored."""
    import asyncpg

    from app.core.database import resolve_database_url
    from app.keys import repository, tokens

    async def run() -> int:
        conn = await _connect(resolve_database_url())
        try:
            if args.keys_command == "create":
                if not tokens.valid_tenant(args.tenant):
                    print(
                        f"compactd: invalid tenant {args.tenant!r}: 1-128 characters of "
                        "letters, digits, '.', '_' and '-', starting with a letter or digit",
                        file=sys.stderr,
                    )
                    return 2
                row, token = await repository.create(conn, args.tenant, args.name)
                print(token)
                print(
                    f"created key {row.id} for tenant {row.tenant_id!r}; this is the only "
                    "time the key is shown: store it now",
                    file=sys.stderr,
                )
                return 0
            if args.keys_command == "revoke":
                key_id = _key_id(args.key)
                revoked = await repository.revoke(conn, key_id)
                if revoked is None:
                    print(f"compactd: no key {key_id!r}", file=sys.stderr)
                    return 1
                print(f"revoked key {revoked.id} of tenant {revoked.tenant_id!r}")
                return 0
            if args.keys_command == "delete":
                return await _delete_keys(conn, args)
            rows = await repository.list_keys(conn, args.tenant)
            if args.json:
                print(json.dumps([_key_doc(r) for r in rows], indent=2))
                return 0
            print(f"{'ID':<14}{'TENANT':<24}{'STATUS':<9}{'CREATED':<22}{'REVOKED':<22}NAME")
            for r in rows:
                revoked_at = _when(r.revoked_at) if r.revoked_at else "-"
                print(
                    f"{r.id:<14}{r.tenant_id:<24}{_status(r):<9}{_when(r.created_at):<22}"
                    f"{revoked_at:<22}{r.name or ''}"
                )
            if not rows and args.tenant is None:
                print("(no keys: the service is open, for the tenant 'default', on loopback)")
            return 0
        except asyncpg.UndefinedTableError:
            print("compactd: the database is not migrated: run `compactd migrate`", file=sys.stderr)
            return 1
        finally:
            await conn.close()

    return _run(run())


def _key_id(text: str) -> str:
    """A key's id, given the key itself or its id."""
    from app.keys import tokens

    parsed = tokens.parse(text)
    return parsed[0] if parsed else text


async def _delete_keys(conn: asyncpg.Connection, args: argparse.Namespace) -> int:
    """``keys delete KEY_OR_ID`` or ``keys delete --all [--tenant NAME]``: the way back
    from keys (revoked ones included, which still lock the service) to open mode."""
    from app.keys import repository

    if args.all == (args.key is not None) or (args.tenant and not args.all):
        print(
            "compactd: name one key (its id or the key) or pass --all (with --tenant: "
            "that tenant's keys)",
            file=sys.stderr,
        )
        return 2
    if args.all:
        deleted = await repository.delete_all(conn, args.tenant)
    else:
        key_id = _key_id(args.key)
        one = await repository.delete(conn, key_id)
        if one is None:
            print(f"compactd: no key {key_id!r}", file=sys.stderr)
            return 1
        deleted = [one]
    for row in deleted:
        print(f"deleted key {row.id} of tenant {row.tenant_id!r} ({_status(row)})")
    if not await repository.any_exist(conn):
        print(
            "no key is left: the service is open again, for the tenant 'default', within "
            "COMPACTD_AUTH_CACHE_SECONDS (on loopback only: `serve` refuses a public address "
            "without keys)"
        )
    return 0


def _status(row: KeyRow) -> str:
    return "revoked" if row.revoked_at else "active"


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _key_doc(row: KeyRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "tenant": row.tenant_id,
        "name": row.name,
        "created_at": row.created_at.isoformat(),
        "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None,
        "status": _status(row),
    }


def cmd_openapi(args: argparse.Namespace) -> int:
    doc = _openapi_document()
    if args.output == "-":
        sys.stdout.write(doc)
    else:
        Path(args.output).write_text(doc, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``compactd`` command line; each subcommand sets ``func``."""
    parser = argparse.ArgumentParser(prog="compactd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API (migrates first)")
    serve.add_argument("--host", help="bind address (default COMPACTD_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default COMPACTD_PORT, 8080)")
    serve.add_argument(
        "--workers",
        type=int,
        help="server processes on the one port (default COMPACTD_SERVE_WORKERS, 1); "
        "the compaction workers run in the first",
    )
    serve.add_argument("--no-migrate", action="store_true", help="do not run migrations at start")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without API keys on a non-loopback address (COMPACTD_INSECURE_NO_AUTH)",
    )
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run compaction workers only (no HTTP API)")
    worker.add_argument(
        "--count", type=int, help="workers in this process (default COMPACTD_COMPACTION_WORKERS)"
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port (default COMPACTD_WORKER_METRICS_PORT: none)",
    )
    worker.add_argument(
        "--metrics-host", default="0.0.0.0", help="the metrics port's address (default 0.0.0.0)"
    )
    worker.set_defaults(func=cmd_worker)

    keys = sub.add_parser("keys", help="create, list, revoke and delete API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="a new key for a tenant (printed once)")
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument("--name", help="a label, e.g. who holds the key")
    revoke = keys_sub.add_parser("revoke", help="revoke a key (by its id or the whole key)")
    revoke.add_argument("key", help="the key's id (as `keys list` shows it) or the key")
    delete = keys_sub.add_parser(
        "delete",
        help="delete a key, or every key (--all): with none left the service is open again",
    )
    delete.add_argument("key", nargs="?", help="the key's id (as `keys list` shows it) or the key")
    delete.add_argument("--all", action="store_true", help="every key (revoked ones too)")
    delete.add_argument("--tenant", help="with --all: only this tenant's keys")
    listing = keys_sub.add_parser("list", help="the keys (revoked ones too), without secrets")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    keys.set_defaults(func=cmd_keys)

    migrate = sub.add_parser("migrate", help="run the database migrations")
    migrate.add_argument(
        "revision", nargs="?", default="head", help="target revision (default head)"
    )
    migrate.add_argument("--downgrade", action="store_true", help="downgrade to the revision")
    migrate.set_defaults(func=cmd_migrate)

    openapi = sub.add_parser("openapi", help="write the OpenAPI document")
    openapi.add_argument(
        "-o", "--output", default="openapi/openapi.json", help="file, or - for stdout"
    )
    openapi.set_defaults(func=cmd_openapi)
    _plain_help(parser)
    return parser


class _PlainHelp(argparse.HelpFormatter):
    """Help as plain text: the docstrings' and help strings' ``literal`` and `code`
    marks become plain words and 'quoted words'."""

    @staticmethod
    def _plain(text: str) -> str:
        import re

        text = re.sub(r"``([^`]+)``", r"\1", text)
        return re.sub(r"`([^`]+)`", r"'\1'", text)

    def _format_text(self, text: str) -> str:
        return super()._format_text(self._plain(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return self._plain(super()._expand_help(action))


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """``parser`` and its subcommands, to any depth, print plain help; a subcommand
    without a description takes its one-line help as one."""
    parser.formatter_class = _PlainHelp
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                if child.description is None and helps.get(name):
                    child.description = str(helps[name])[:1].upper() + str(helps[name])[1:] + "."
                _plain_help(child)


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    from app.core.settings import settings_problems, unknown_variable_lines

    args = build_parser().parse_args(argv)
    try:
        settings = get_settings()
    except ValidationError as exc:  # one line per bad setting, no traceback
        for problem in settings_problems(exc):
            print(f"compactd: {problem}", file=sys.stderr)
        return 1
    configure_logging(settings.log_level, settings.log_format)
    if args.func is not cmd_openapi:
        for line in unknown_variable_lines(os.environ):
            logging.getLogger("compactd").warning(line)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
