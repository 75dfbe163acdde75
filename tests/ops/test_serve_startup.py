"""`compactd serve` as a person meets it (`make run`): on a terminal, progress while the
database starts and a short banner (where the data is, the migrations, open or keyed,
the docs, how to stop), logs as plain text; JSON lines when stderr is not a terminal; a
busy port or a database it cannot reach ends in one line saying what to do, exit 1,
no traceback. Run as the real command."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pty
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx

from app import __version__
from app.core.observability import JsonFormatter, TextFormatter, resolve_log_format
from app.serving.startup import StartupFacts, banner, database_place
from tests.conftest import TEST_SETTINGS
from tests.e2e.server import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPACTD = str(Path(sys.executable).parent / "compactd")
# How long a test waits for the command before it calls it stuck (never a timing check).
GIVE_UP_SECONDS = 120.0


def _env(**extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "COMPACTD_TIKTOKEN_CACHE_DIR": str(TEST_SETTINGS.tiktoken_cache_dir),
        "COMPACTD_COMPACTION_WORKERS": "0",
        "COMPACTD_LOG_LEVEL": "info",
        **extra,
    }
    for name in ("DATABASE_URL", "COMPACTD_DATABASE_URL", "COMPACTD_LOG_FORMAT"):
        if name not in extra:
            env.pop(name, None)
    return env


def _command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``compactd ARGS`` run to its end, with the tests' environment and ``env``."""
    return subprocess.run(
        [COMPACTD, *args],
        cwd=ROOT,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=GIVE_UP_SECONDS,
        check=False,
    )


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return _command("serve", *args, **env)


def assert_one_clear_line(done: subprocess.CompletedProcess[str]) -> str:
    print(f"exit {done.returncode}, stderr: {done.stderr!r}")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("compactd: ")
    return lines[0]


# ------------------------------------------------------------------ failures


async def test_a_busy_port_is_one_line_saying_what_to_do(db_url: str) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        started = time.perf_counter()
        done = await asyncio.to_thread(_run, "--port", str(port), DATABASE_URL=db_url)
        print(f"answered in {time.perf_counter() - started:.1f} s")
    line = assert_one_clear_line(done)
    assert f"port {port} on 127.0.0.1 is already in use" in line
    assert f"PORT={port + 1}" in line
    assert "--port" in line


async def test_an_unreachable_database_is_one_line_without_the_password() -> None:
    # A port bound and not listening: connections to it are refused.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()[1]
        url = f"postgresql://compactd:s3cret-pw@127.0.0.1:{dead}/compactd"
        done = await asyncio.to_thread(_run, "--port", str(free_port()), DATABASE_URL=url)
    line = assert_one_clear_line(done)
    assert f"cannot reach the database at 127.0.0.1:{dead}/compactd" in line
    assert "connection refused" in line
    assert "DATABASE_URL" in line
    assert "s3cret-pw" not in done.stderr


async def test_a_database_host_that_does_not_resolve_is_one_line() -> None:
    url = "postgresql://compactd:pw@no-such-host.invalid:5432/compactd"
    done = await asyncio.to_thread(_run, "--port", str(free_port()), DATABASE_URL=url)
    line = assert_one_clear_line(done)
    assert "no-such-host.invalid:5432/compactd" in line
    assert "DATABASE_URL" in line


async def test_a_database_that_does_not_exist_is_one_line(db_url: str) -> None:
    missing = urlunsplit(urlsplit(db_url)._replace(path="/no_such_database"))
    done = await asyncio.to_thread(_run, "--port", str(free_port()), DATABASE_URL=missing)
    line = assert_one_clear_line(done)
    assert "/no_such_database does not exist" in line


# ------------------------------------------------------------------- no terminal


async def served_without_a_terminal(port: int, env: dict[str, str], *visits: str) -> str:
    """What ``compactd serve`` writes to stderr with no terminal: started on ``port``
    with ``env``, waited for until healthy, each of ``visits`` read, then stopped."""
    process = await asyncio.create_subprocess_exec(
        COMPACTD,
        "serve",
        "--port",
        str(port),
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            deadline = time.monotonic() + GIVE_UP_SECONDS
            while True:
                assert process.returncode is None
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get("/healthz", timeout=2)).status_code == 200:
                        break
                assert time.monotonic() < deadline, "compactd serve did not start"
                await asyncio.sleep(0.1)
            for path in visits:
                assert (await http.get(path)).status_code == 200, path
    finally:
        process.terminate()
        await process.wait()
    assert process.stderr is not None
    return (await process.stderr.read()).decode()


async def test_without_a_terminal_the_log_is_json_lines(db_url: str) -> None:
    port = free_port()
    text = await served_without_a_terminal(port, _env(DATABASE_URL=db_url), "/docs")
    lines = text.splitlines()
    records = [json.loads(line) for line in lines]  # every line is JSON
    serving = [r for r in records if r["msg"] == "serving"]
    assert len(serving) == 1, records
    assert serving[0]["url"] == f"http://127.0.0.1:{port}"
    assert serving[0]["database"].startswith("PostgreSQL at ")
    assert serving[0]["keyed"] is False
    assert any(r["msg"] == "request" and r["path"] == "/docs" for r in records)


# ------------------------------------------------------------------- a terminal


class Terminal:
    """`compactd serve` with a pseudo-terminal as its stdin, stdout and stderr."""

    def __init__(self, *args: str, **env: str) -> None:
        self.leader, follower = pty.openpty()
        self.process = subprocess.Popen(
            [COMPACTD, "serve", *args],
            cwd=ROOT,
            env=_env(**env),
            stdin=follower,
            stdout=follower,
            stderr=follower,
            start_new_session=True,
        )
        os.close(follower)
        self.screen = bytearray()

    def text(self) -> str:
        return self.screen.decode(errors="replace").replace("\r\n", "\n")

    def read_until(self, done: Callable[[str], bool], within: float = GIVE_UP_SECONDS) -> str:
        """What it wrote, read until ``done(text)``, it exits, or ``within`` seconds."""
        deadline = time.monotonic() + within
        while not done(self.text()) and time.monotonic() < deadline:
            ready, _, _ = select.select([self.leader], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(self.leader, 65536)
                except OSError:  # the other end is closed: the process exited
                    break
                if not chunk:
                    break
                self.screen += chunk
        return self.text()

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        os.close(self.leader)


def test_on_a_terminal_make_run_says_where_everything_is() -> None:
    """The first start of `make run` on a fresh machine: an embedded PostgreSQL in a new
    data folder, with progress while it starts, then the banner; Ctrl-C stops both."""
    # A short path: the Unix socket's path must fit in 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="cd-run-", dir="/tmp"))
    data = folder / "pgdata"
    port = free_port()
    terminal = Terminal("--port", str(port), COMPACTD_DATA_DIR=str(data))
    try:
        text = terminal.read_until(lambda t: "Press Ctrl-C to stop." in t)
        assert "Press Ctrl-C to stop." in text, text
        r = httpx.get(f"http://127.0.0.1:{port}/v1/sessions", timeout=10)
        assert r.status_code == 200
        terminal.read_until(lambda t: "GET /v1/sessions -> 200" in t)
        terminal.process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert terminal.process.wait(GIVE_UP_SECONDS) == 0
        text = terminal.read_until(lambda _: False, within=0.5)
        print(text)
        assert f"creating and starting the embedded PostgreSQL in {data}…" in text
        assert "applying the database migrations…" in text
        assert f"compactd {__version__} is serving on http://127.0.0.1:{port}" in text
        assert f"database    embedded PostgreSQL, data in {data}" in text
        assert "(applied now, from an empty database)" in text
        assert "open: no API keys exist, so it serves this machine only (loopback)" in text
        assert f"API docs    http://127.0.0.1:{port}/docs" in text
        assert "GET /v1/sessions -> 200" in text  # a request's log line, as text
        assert '{"ts"' not in text  # no JSON on a terminal
        assert "Started server process" not in text  # the banner says it instead
        # Ctrl-C stopped the embedded PostgreSQL too.
        assert not (data / "postmaster.pid").exists()
    finally:
        terminal.close()
        shutil.rmtree(folder, ignore_errors=True)


# --------------------------------------------------------------------- pieces


def test_the_banner_says_open_or_keyed() -> None:
    facts = StartupFacts(
        "1.2.3", "0.0.0.0", 9000, "PostgreSQL at db:5432/x", "at 0006", True, False
    )
    text = banner(facts)
    assert "serving on http://127.0.0.1:9000" in text
    assert "API keys required" in text
    assert "http://127.0.0.1:9000/docs" in text
    assert "Ctrl-C" in text
    ipv6 = StartupFacts("1", "::1", 9000, "d", "m", keyed=False, loopback=True)
    assert "http://[::1]:9000/docs" in banner(ipv6)
    assert database_place("postgresql+asyncpg://u:pw@h:6543/db") == "h:6543/db"
    assert database_place("postgresql+asyncpg://u@/db?host=/tmp/pg") == "/tmp/pg:5432/db"


def test_the_log_format_follows_the_terminal() -> None:
    class Stream:
        def __init__(self, tty: bool) -> None:
            self.tty = tty

        def isatty(self) -> bool:
            return self.tty

    assert resolve_log_format("auto", Stream(True)) == "text"  # type: ignore[arg-type]
    assert resolve_log_format("auto", Stream(False)) == "json"  # type: ignore[arg-type]
    assert resolve_log_format("json", Stream(True)) == "json"  # type: ignore[arg-type]
    record = logging.makeLogRecord(
        {
            "name": "compactd.http",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "request",
            "method": "POST",
            "path": "/v1/sessions",
            "status": 201,
            "duration_ms": 4.2,
            "request_id": "abc",
        }
    )
    assert TextFormatter().format(record).endswith(" POST /v1/sessions -> 201 (4.2 ms)")
    assert json.loads(JsonFormatter().format(record))["status"] == 201
