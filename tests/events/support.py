"""Reading server-sent events from a real compactd server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson


async def read_events(
    base: str,
    path: str,
    count: int,
    *,
    headers: dict[str, str] | None = None,
    params: dict[str, Any] | None = None,
    within: float = 20.0,
) -> list[dict[str, Any]]:
    """The first ``count`` events of a stream (each: its SSE ``id``, ``event`` and the
    parsed ``data``); fails after ``within`` seconds."""
    out: list[dict[str, Any]] = []

    async def read() -> None:
        async with (
            httpx.AsyncClient(base_url=base, timeout=None) as client,
            client.stream("GET", path, headers=headers or {}, params=params or {}) as r,
        ):
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            frame: dict[str, Any] = {}
            async for line in r.aiter_lines():
                if line == "":
                    if "data" in frame:
                        out.append(frame)
                        if len(out) >= count:
                            return
                    frame = {}
                elif line.startswith(":") or line.startswith("retry:"):
                    continue
                else:
                    name, _, value = line.partition(": ")
                    frame[name] = orjson.loads(value) if name == "data" else value

    async with asyncio.timeout(within):
        await read()
    return out
