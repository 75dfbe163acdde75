"""The ``compactd`` command behind PgBouncer in transaction pooling, as docs/deployment.md
sets it up (``DATABASE_URL`` the pooler's, ``COMPACTD_DATABASE_POOLER=pgbouncer``,
``COMPACTD_DATABASE_DIRECT_URL`` Postgres itself): each command is a process of its own,
whose statements meet the server connections the ones before left, so ``migrate`` and
``keys`` run twice; then ``serve`` (which migrates and checks the keys first) answers
with a key, and its in-process worker, woken over the direct connection, compacts."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import make_url

from app.core.settings import Settings
from tests.compactions.helpers import conversation
from tests.e2e.server import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPACTD = str(Path(sys.executable).parent / "compactd")
MANUAL_COMPACTION = {"compaction": {"auto": False, "keep_recent_tokens": 500}}


def _environment(pooled_url: str, direct_url: str, settings: Settings) -> dict[str, str]:
    environment = {
        **os.environ,
        "DATABASE_URL": make_url(pooled_url).set(drivername="postgresql").render_as_string(False),
        "COMPACTD_DATABASE_POOLER": "pgbouncer",
        "COMPACTD_DATABASE_DIRECT_URL": direct_url,
        "COMPACTD_TIKTOKEN_CACHE_DIR": str(settings.tiktoken_cache_dir),
        "COMPACTD_LOG_LEVEL": "warning",
        "COMPACTD_LOG_FORMAT": "text",
        "COMPACTD_COMPACTION_WORKERS": "1",
        "COMPACTD_COMPACTION_POLL_SECONDS": "600",  # only a NOTIFY wakes the worker
    }
    environment.pop("COMPACTD_DATABASE_URL", None)
    return environment


async def _compactd(environment: dict[str, str], *argv: str) -> str:
    process = await asyncio.create_subprocess_exec(
        COMPACTD,
        *argv,
        cwd=ROOT,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, (argv, out.decode(), err.decode())
    return out.decode()


def _text(log: Path) -> str:
    return log.read_text(errors="replace")


@contextlib.asynccontextmanager
async def _serving(environment: dict[str, str], log: Path) -> AsyncIterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as output:
        process = await asyncio.create_subprocess_exec(
            COMPACTD, "serve", "--port", str(port), cwd=ROOT, env=environment,
            stdout=output, stderr=output,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        async with httpx.AsyncClient(base_url=base, timeout=2) as probe:
            while True:
                assert process.returncode is None, _text(log)
                with contextlib.suppress(httpx.TransportError):
                    if (await probe.get("/readyz")).status_code == 200:
                        break
                assert time.monotonic() < deadline, f"serve did not start:\n{_text(log)}"
                await asyncio.sleep(0.1)
        yield base
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()


@pytest.mark.slow
async def test_migrate_keys_and_serve_through_the_pooler(
    pooled_url: str, db_url: str, settings: Settings, tmp_path: Path
) -> None:
    environment = _environment(pooled_url, db_url, settings)
    for _ in range(2):
        assert "migrated to head" in await _compactd(environment, "migrate")
    tokens = [
        (await _compactd(environment, "keys", "create", "--tenant", "t")).strip() for _ in range(2)
    ]
    for _ in range(2):
        listed = await _compactd(environment, "keys", "list", "--tenant", "t")
        assert len(listed.strip().splitlines()) == 3  # the header and the two keys

    log = tmp_path / "serve.log"
    async with (
        _serving(environment, log) as base,
        httpx.AsyncClient(
            base_url=base, headers={"Authorization": f"Bearer {tokens[1]}"}, timeout=30
        ) as client,
    ):
        r = await client.post(
            "/v1/sessions", json={"model": "gpt-4o", "id": "s", "config": MANUAL_COMPACTION}
        )
        assert r.status_code == 201, r.text
        for batch in conversation(12):
            r = await client.post("/v1/sessions/s/messages", json={"messages": batch})
            assert r.status_code == 201, r.text
        r = await client.post("/v1/sessions/s/compactions", json={"wait": 20})
        assert r.status_code == 202, r.text
        assert r.json()["status"] == "succeeded", r.json()
        r = await client.get("/v1/sessions/s/context")
        assert r.status_code == 200, r.text
        assert r.json()["compaction"]["first_kept_seq"] > 1
        assert (await client.get("/v1/sessions/s")).json()["compaction_count"] == 1
    served = _text(log)
    assert "statement_timeout through the pooler" not in served, served
    assert "Traceback" not in served, served
