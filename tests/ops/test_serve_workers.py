"""`compactd serve --workers N` as an operator meets it: N server processes on one port
whose metrics add up at /metrics, a dead one replaced, SIGTERM stopping them all as
one server stops, a killed `serve` leaving none behind, the compaction workers in the
first process only (woken by a job another process queued), and a server process that
cannot start stopping `serve` with status 3. Run as the real command."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.e2e.serve_workers import COMPACTD, GIVE_UP_SECONDS, ROOT, ServeWorkers, gone


def gauge(text: str, name: str) -> float:
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found is not None, f"{name} not in /metrics"
    return float(found.group(1))


def is_folder(path: str) -> bool:
    return Path(path).is_dir()


def started_pids(server: ServeWorkers) -> dict[int, int]:
    """Server process index -> pid, the latest start of each, from the log."""
    pids: dict[int, int] = {}
    for line in server.lines():
        found = re.fullmatch(r"server process (\d+) started \(pid (\d+)\)", line.get("msg", ""))
        if found:
            pids[int(found.group(1))] = int(found.group(2))
    return pids


async def metrics(server: ServeWorkers) -> str:
    async with server.client() as http:
        r = await http.get("/metrics")
        assert r.status_code == 200, r.text
        return r.text


@pytest.mark.slow
async def test_a_dead_server_process_is_replaced_and_sigterm_stops_them_all(
    db_url: str, tmp_path: Path
) -> None:
    server = ServeWorkers(db_url, 2, tmp_path / "serve.log", COMPACTD_DB_POOL_SIZE="3")
    try:
        await server.start()
        first = server.children()
        assert len(first) == 2, first
        assert sorted(started_pids(server).values()) == first
        serving = server.serving()
        assert serving is not None
        assert serving["workers"] == 2
        # The metrics folder the serve process made for them (no PROMETHEUS_MULTIPROC_DIR
        # given): where the server processes keep their metrics.
        folder = psutil.Process(first[0]).environ()["PROMETHEUS_MULTIPROC_DIR"]
        assert is_folder(folder)
        # A process that is starting makes its file empty before sizing it: /metrics
        # still answers (prometheus_client failed the whole read on an empty file).
        (Path(folder) / "counter_999999999.db").touch()
        # Each process's pool, summed: two pools of 3.
        deadline = time.monotonic() + GIVE_UP_SECONDS
        while gauge(await metrics(server), "compactd_db_pool_size") != 6:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)

        victim = first[1]
        os.kill(victim, signal.SIGKILL)
        await server.until(
            lambda: victim not in server.children() and len(server.children()) == 2,
            "the killed server process was not replaced",
        )
        replaced = [d for d in server.lines() if "was killed by SIGKILL" in str(d.get("msg", ""))]
        assert replaced, "the supervisor said nothing of the dead process"
        assert f"(pid {victim})" in replaced[0]["msg"]
        await server.until(
            lambda: len(started_pids(server)) == 2 and victim not in started_pids(server).values(),
            "the new server process did not say it started",
        )
        new = started_pids(server)
        assert new[0] == first[0]  # the other one served on
        # The new one serves (its pool counted), the dead one's pool no longer is.
        while gauge(await metrics(server), "compactd_db_pool_size") != 6 or not (
            await _serves_through(server)
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)

        children = server.children()
        started = time.monotonic()
        assert await server.stop(signal.SIGTERM) == 128 + signal.SIGTERM
        print(f"stopped in {time.monotonic() - started:.1f} s")
        assert all(gone(pid) for pid in children)
        assert not is_folder(folder)  # its metrics folder removed with it
        log = server.log.read_text()
        print(log[-3000:])
        assert "Traceback" not in log
        assert "did not stop within" not in log  # they stopped by themselves
    finally:
        await server.close()


async def _serves_through(server: ServeWorkers) -> bool:
    """Requests on new connections are all answered (whichever process takes them)."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with server.client(limits=limits) as http:
        answers = await asyncio.gather(*(http.get("/healthz") for _ in range(10)))
    return all(r.status_code == 200 for r in answers)


@pytest.mark.slow
async def test_the_server_processes_stop_when_serve_is_killed(db_url: str, tmp_path: Path) -> None:
    # A folder of the test's: a killed serve cannot remove the one it would make.
    metrics = str(tmp_path / "metrics")
    server = ServeWorkers(db_url, 2, tmp_path / "serve.log", PROMETHEUS_MULTIPROC_DIR=metrics)
    try:
        await server.start()
        children = server.children()
        assert len(children) == 2
        assert await server.stop(signal.SIGKILL) == -signal.SIGKILL
        deadline = time.monotonic() + GIVE_UP_SECONDS
        while not all(gone(pid) for pid in children):
            assert time.monotonic() < deadline, "server processes outlived serve"
            await asyncio.sleep(0.1)
    finally:
        await server.close()


@pytest.mark.slow
async def test_compaction_workers_run_in_the_first_process_only(
    db_url: str, tmp_path: Path
) -> None:
    server = ServeWorkers(db_url, 2, tmp_path / "serve.log", COMPACTD_COMPACTION_WORKERS="1")
    try:
        await server.start()
        first = started_pids(server)[0]
        async with server.client() as http:
            r = await http.post(
                "/v1/sessions",
                json={
                    "id": "s",
                    "model": "gpt-4o",
                    "config": {"compaction": {"keep_recent_tokens": 10, "auto": False}},
                },
            )
            assert r.status_code == 201, r.text
            chat = [
                {"role": role, "content": f"{role} turn {i}: " + "words of the history " * 60}
                for i in range(6)
                for role in ("user", "assistant")
            ]
            r = await http.post("/v1/sessions/s/messages", json={"messages": chat})
            assert r.status_code == 201, r.text

        # While the first process is stopped, the other one takes every connection: it
        # queues the job, and nothing runs it.
        os.kill(first, signal.SIGSTOP)
        try:
            async with server.client() as http:
                r = await http.post("/v1/sessions/s/compactions", json={})
                assert r.status_code == 202, r.text
                job = r.json()["id"]
                await asyncio.sleep(3)  # three poll periods, and its NOTIFY long sent
                r = await http.get(f"/v1/sessions/s/compactions/{job}")
                assert r.json()["status"] == "queued", r.json()
        finally:
            os.kill(first, signal.SIGCONT)
        # The first process's worker takes it, woken by the NOTIFY or its poll.
        async with server.client() as http:
            deadline = time.monotonic() + GIVE_UP_SECONDS
            while True:
                r = await http.get(f"/v1/sessions/s/compactions/{job}")
                done: dict[str, Any] = r.json()
                if done["status"] not in ("queued", "running"):
                    break
                assert time.monotonic() < deadline, done
                await asyncio.sleep(0.1)
        assert done["status"] == "succeeded", done
        assert await server.stop(signal.SIGINT) == 0  # Ctrl-C
    finally:
        await server.close()


def test_a_server_process_that_cannot_start_stops_serve_with_status_3() -> None:
    script = (
        "import socket, sys\n"
        "from app.serving.supervisor import ServerProcesses\n"
        "from tests.ops.supervised import exits_at_once\n"
        "sock = socket.socket()\n"
        "sock.bind(('127.0.0.1', 0))\n"
        "sock.listen()\n"
        "sys.exit(ServerProcesses(exits_at_once, 2, sock, stop_seconds=10).run())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GIVE_UP_SECONDS,
        check=False,
    )
    print(done.stderr)
    assert done.returncode == 3
    assert "exited with status 1 before it could serve; stopping" in done.stderr


def test_a_number_of_processes_out_of_range_is_one_line() -> None:
    done = subprocess.run(
        [COMPACTD, "serve", "--workers", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=GIVE_UP_SECONDS,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip() == "compactd: --workers must be between 1 and 64 (it is 0)"
