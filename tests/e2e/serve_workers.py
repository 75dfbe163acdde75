"""`compactd serve --workers N` as a child process of a test, on a free port, with the
server processes it starts (found by pid: the tests signal them one by one)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.conftest import TEST_SETTINGS
from tests.e2e.server import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPACTD = str(Path(sys.executable).parent / "compactd")
# How long a test waits for the command before it calls it stuck (never a timing check).
GIVE_UP_SECONDS = 120.0


class ServeWorkers:
    """`compactd serve --no-migrate --workers N` on ``db_url``; its log (JSON lines) in
    ``log``. ``env``: more environment (``COMPACTD_*`` settings, PROMETHEUS_MULTIPROC_DIR)."""

    def __init__(self, db_url: str, workers: int, log: Path, **env: str) -> None:
        self.db_url = db_url
        self.workers = workers
        self.log = log
        self.env = env
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.process: asyncio.subprocess.Process | None = None
        self.seen: set[int] = set()  # every server process pid seen, to clean up after

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        """Start it; return once every server process serves (the "serving" line)."""
        environment = {
            **os.environ,
            "DATABASE_URL": self.db_url,
            "COMPACTD_TIKTOKEN_CACHE_DIR": str(TEST_SETTINGS.tiktoken_cache_dir),
            "COMPACTD_LOG_LEVEL": "info",
            "COMPACTD_LOG_FORMAT": "json",
            "COMPACTD_COMPACTION_WORKERS": "0",
            **self.env,
        }
        for name in ("COMPACTD_DATABASE_URL", "COMPACTD_SERVE_WORKERS"):
            if name not in self.env:
                environment.pop(name, None)
        if "PROMETHEUS_MULTIPROC_DIR" not in self.env:
            environment.pop("PROMETHEUS_MULTIPROC_DIR", None)
        with self.log.open("ab") as output:
            self.process = await asyncio.create_subprocess_exec(
                COMPACTD,
                "serve",
                "--no-migrate",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
                cwd=ROOT,
                env=environment,
                stdout=output,
                stderr=output,
            )
        await self.until(lambda: self.serving() is not None, "compactd serve did not start")
        self.children()

    def lines(self) -> list[dict[str, Any]]:
        """The log's JSON lines so far (anything else, e.g. a traceback, skipped)."""
        found = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                doc = json.loads(line)
                if isinstance(doc, dict):
                    found.append(doc)
        return found

    def serving(self) -> dict[str, Any] | None:
        return next((d for d in self.lines() if d.get("msg") == "serving"), None)

    def children(self) -> list[int]:
        """The pids of its server processes running now."""
        try:
            found = psutil.Process(self.pid).children()
        except psutil.NoSuchProcess:
            return []
        pids = []
        for child in found:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                spawned = "spawn_main" in " ".join(child.cmdline())
                if spawned and child.status() != psutil.STATUS_ZOMBIE:
                    pids.append(child.pid)
        self.seen.update(pids)
        return sorted(pids)

    async def until(self, done: Any, failure: str) -> None:
        deadline = time.monotonic() + GIVE_UP_SECONDS
        while not done():
            assert self.process is not None
            assert self.process.returncode is None, f"{failure}: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"{failure}: {self.log.read_text()}"
            await asyncio.sleep(0.05)

    async def stop(self, sig: int = signal.SIGTERM) -> int:
        """Send ``sig`` to the serve process; its exit status once it has ended."""
        assert self.process is not None
        self.process.send_signal(sig)
        return await asyncio.wait_for(self.process.wait(), GIVE_UP_SECONDS)

    async def close(self) -> None:
        """Whatever still runs of it, killed (a test that failed midway)."""
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        for pid in self.seen:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                child = psutil.Process(pid)
                if "spawn_main" in " ".join(child.cmdline()):  # still ours, not a reused pid
                    child.kill()

    def client(self, **options: Any) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.base_url, timeout=60, **options)


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie not yet reaped counts as ended)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True
