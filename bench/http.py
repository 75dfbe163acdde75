"""A minimal HTTP/1.1 keep-alive client for load generation.

On this 2-core machine the load generator shares the CPU with the service and
PostgreSQL. httpx spends about 2.5 ms of CPU per request, more than the service
itself, so a benchmark driven by it measures the client. This client does only
what the benchmark needs: one persistent connection, a request written as one
buffer, the status line, Content-Length and the body read back. Every response
is still checked by the caller.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> Connection:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()

    @property
    def closed(self) -> bool:
        """Whether the server has closed the connection (or it was never opened)."""
        return self._reader is None or self._reader.at_eof()

    def close(self) -> None:
        """Close without waiting (a connection dropped by a pool)."""
        if self._writer is not None:
            self._writer.close()

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        """Send one request and return the status and the body."""
        assert self._reader is not None
        assert self._writer is not None
        payload = b"" if body is None else orjson.dumps(body)
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        if body is not None:
            head.append("Content-Type: application/json")
        head.append(f"Content-Length: {len(payload)}")
        head.extend(f"{k}: {v}" for k, v in (headers or {}).items())
        self._writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
        raw_head = await self._reader.readuntil(b"\r\n\r\n")
        lines = raw_head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding":
                raise RuntimeError("chunked responses are not supported by the bench client")
        return status, await self._reader.readexactly(length)
