"""An upstream LLM that answers at once, for measuring compaction's own cost.

A raw asyncio HTTP/1.1 server: every POST gets a fixed OpenAI chat-completions
reply (a short structured summary), so a compaction's claim-to-commit time is
compactd's and PostgreSQL's, not a model's.
"""

from __future__ import annotations

import asyncio
import contextlib

import orjson

SUMMARY = (
    "## Goal\nFinish the task the user set.\n\n## Progress\n### Done\n- Read the files.\n\n"
    "## Next Steps\n- Run the tests."
)
_REPLY = orjson.dumps(
    {
        "id": "bench",
        "object": "chat.completion",
        "model": "bench-summarizer",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": SUMMARY},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040},
    }
)
_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
    + str(len(_REPLY)).encode()
    + b"\r\n\r\n"
    + _REPLY
)


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for raw in head.split(b"\r\n"):
                name, _, value = raw.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            writer.write(_RESPONSE)
            await writer.drain()
    writer.close()


async def start(port: int) -> asyncio.Server:
    return await asyncio.start_server(_serve, "127.0.0.1", port)
