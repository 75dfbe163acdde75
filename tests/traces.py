"""The real agent sessions in tests/data/traces (MIT-licensed data from
SWE-agent/mini-swe-agent, see its README.md), as lists of OpenAI messages."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Awaitable, Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

TRACES_DIR = Path(__file__).resolve().parent / "data" / "traces"
TRACE_COUNT = 23


def trace_files() -> list[Path]:
    """The 23 traces the repository carries; fewer is an error, never a reason to skip
    (a test parametrized over an empty list would pass having checked nothing)."""
    files = sorted(TRACES_DIR.glob("*.traj.json.gz"))
    if len(files) != TRACE_COUNT:
        raise RuntimeError(f"{TRACES_DIR}: {len(files)} traces, expected {TRACE_COUNT}")
    return files


@cache
def load(path: Path) -> list[dict[str, Any]]:
    """The trace's messages a client would store: the non-standard final ``exit``
    record (the submitted patch, not a chat message) is dropped."""
    with gzip.open(path) as f:
        data = json.load(f)
    return [m for m in data["messages"] if m["role"] != "exit"]


def turns(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Batches as an agent appends them: the opening prompt, then each assistant
    message, then the tool results that answer it."""
    batches: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            if current:
                batches.append(current)
            batches.append([m])
            current = []
        else:
            current.append(m)
    if current:
        batches.append(current)
    return batches


async def replay_all(
    client: Any, replay: Callable[[Any, Path], Awaitable[T]], concurrency: int = 4
) -> list[T]:
    """``replay(client, path)`` for every trace, ``concurrency`` at a time."""
    sem = asyncio.Semaphore(concurrency)

    async def one(path: Path) -> T:
        async with sem:
            return await replay(client, path)

    return list(await asyncio.gather(*(one(p) for p in trace_files())))


async def create_session(
    client: httpx.AsyncClient, path: Path, prefix: str = "", **fields: Any
) -> dict[str, Any]:
    """The trace's session, a DeepSeek agent's, with ``fields`` (a window, a config):
    its id is ``prefix`` and the trace's name."""
    sid = prefix + path.name.split(".")[0].replace("__", "-")
    r = await client.post("/v1/sessions", json={"model": "deepseek-chat", "id": sid, **fields})
    assert r.status_code == 201, r.text
    session: dict[str, Any] = r.json()
    return session


async def finished_compactions(client: httpx.AsyncClient, sid: str) -> list[dict[str, Any]]:
    """The session's compactions, once every queued or running one has ended (within
    60 s each)."""
    r = await client.get(f"/v1/sessions/{sid}/compactions")
    for job in r.json()["compactions"]:
        deadline = time.monotonic() + 60
        while job["status"] in ("queued", "running"):
            assert time.monotonic() < deadline, job
            await asyncio.sleep(0.05)
            job = (await client.get(f"/v1/sessions/{sid}/compactions/{job['id']}")).json()
    r = await client.get(f"/v1/sessions/{sid}/compactions", params={"limit": 200})
    jobs: list[dict[str, Any]] = r.json()["compactions"]
    return jobs
