"""What the proxy adds to a model call.

The scripted upstream (``python -m tests.upstream_server``, its own process) answers
every call at once, so what is measured is the proxy, Postgres and HTTP. An agent-like
session of N stored messages (a user question, a tool call, its result and an answer,
over and over) calls through the proxy, re-sending its whole history each time as agents
do; each call is paired with the same request sent straight to the upstream, just
before it. Printed, at 100 and at 10,000 stored messages: p50 and p99 of both, and of
the *paired differences* (each proxied call less its own direct call: the proxy's added
latency, target <= 5 ms at p50, flat in the history's length); then the same for
streamed calls' time to first byte. The p99 of the differences is not p99(proxied) -
p99(direct): two tails that need not come from the same calls.

The sessions' window is 16,000 tokens: the 10,000-message history (about 450,000
tokens) was compacted on the way, as it would have been, so its context is bounded (and
about as large as the whole 100-message one), while the agent's requests carry the whole
history. The direct call takes the agent's whole request, the proxied one's upstream
call the context: both are what an agent without and with compactd would pay. Between
two calls the agent does its own work for 20 ms (runs its tools): the proxy stores the
last reply then, off the call's path, as it would for a real agent. The direct call of a
pair goes first, so that it never shares the machine with that storing.

Raw HTTP/1.1 on keep-alive connections, bodies serialized before the clock starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson

SYSTEM = {"role": "system", "content": "You are a coding agent. Use the tools to inspect code."}
CALLS = 300
TTFB_CALLS = 100
# What an agent does between two calls (run its tools): the proxy stores the last reply
# then, off the call's path.
AGENT_WORK_SECONDS = 0.02
# The sessions' window: small enough that the 10,000-message history's context is
# bounded by it (about as large as the whole 100-message one), so that what grows is the
# history alone.
SESSION = {
    "model": "gpt-4o",
    "context_window": 16_000,
    "max_output_tokens": 2_000,
    "config": {"compaction": {"threshold": 0.8, "auto_continue": False}},
}


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def history(n: int) -> list[dict[str, Any]]:
    """``n`` messages of an agent's session, in turns of four."""
    out: list[dict[str, Any]] = []
    k = 0
    while len(out) < n:
        call = f"call_b{k}"
        out += [
            {"role": "user", "content": f"Step {k}: look at module_{k % 97}.py and fix the bug."},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call,
                        "type": "function",
                        "function": {
                            "name": "bash",
                            "arguments": orjson.dumps(
                                {"command": f"cat module_{k % 97}.py"}
                            ).decode(),
                        },
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": call,
                "content": "\n".join(f"def f{i}(x):\n    return x + {i}" for i in range(8)),
            },
            {"role": "assistant", "content": f"Fixed the off-by-one in module_{k % 97}.py."},
        ]
        k += 1
    return out[:n] if out[n - 1]["role"] != "user" else out[: n - 1]


def items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages as the Responses API's input items (what Codex sends)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "tool":
            out.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        elif m.get("tool_calls"):
            out += [
                {
                    "type": "function_call",
                    "call_id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in m["tool_calls"]
            ]
        else:
            kind = "output_text" if m["role"] == "assistant" else "input_text"
            out.append(
                {
                    "type": "message",
                    "role": m["role"],
                    "content": [{"type": kind, "text": m["content"]}],
                }
            )
    return out


def streamed_items(events: bytes) -> list[dict[str, Any]]:
    """The output items of a streamed Responses answer (its ``response.completed``)."""
    for line in events.split(b"\n"):
        if line.startswith(b"data: {") and b'"response.completed"' in line:
            output: list[dict[str, Any]] = orjson.loads(line[6:])["response"]["output"]
            return output
    raise RuntimeError("the stream has no response.completed event")


def streamed_text(events: bytes) -> str:
    """The text of a streamed chat completion."""
    text = []
    for line in events.split(b"\n"):
        if line.startswith(b"data: {"):
            for choice in orjson.loads(line[6:]).get("choices") or ():
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


class _Http:
    """One keep-alive HTTP/1.1 connection: a request written at once, the answer read by
    Content-Length, or chunk by chunk with the time of its first body byte."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def get(self, path: str) -> tuple[int, bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        status, fields = await self.head()
        return status, await self.reader.readexactly(int(fields["content-length"]))

    def send(self, path: str, payload: bytes, headers: dict[str, str]) -> None:
        head = [f"POST {path} HTTP/1.1", "Host: bench", "Content-Type: application/json"]
        head += [f"Content-Length: {len(payload)}", *(f"{k}: {v}" for k, v in headers.items())]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)

    async def head(self) -> tuple[int, dict[str, str]]:
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        fields = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name:
                fields[name.strip().lower()] = value.strip()
        return int(lines[0].split(" ", 2)[1]), fields

    async def post(self, path: str, payload: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        self.send(path, payload, headers)
        status, fields = await self.head()
        if "content-length" in fields:
            return status, await self.reader.readexactly(int(fields["content-length"]))
        return status, b"".join([chunk async for chunk in self._chunks()])

    async def first_byte(
        self, path: str, payload: bytes, headers: dict[str, str]
    ) -> tuple[float, bytes, int]:
        """Seconds to the first body byte of a streamed answer, the answer, and its status."""
        started = time.perf_counter()
        self.send(path, payload, headers)
        status, fields = await self.head()
        if "content-length" in fields:  # not a stream: an error
            body = await self.reader.readexactly(int(fields["content-length"]))
            raise RuntimeError(f"{path}: {status} {body[:500]!r}")
        first = None
        chunks = []
        async for chunk in self._chunks():
            if first is None:
                first = time.perf_counter() - started
            chunks.append(chunk)
        return first or 0.0, b"".join(chunks), status

    async def _chunks(self) -> AsyncIterator[bytes]:
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            data = await self.reader.readexactly(size + 2)
            if size == 0:
                return
            yield data[:-2]


@contextlib.asynccontextmanager
async def _connect(port: int) -> AsyncIterator[_Http]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**24)
    try:
        yield _Http(reader, writer)
    finally:
        writer.close()
        await writer.wait_closed()


class _Wire:
    """One API's calls: its paths, its request around a history, its reply's messages."""

    def __init__(self, responses: bool) -> None:
        self.responses = responses
        self.name = "OpenAI Responses" if responses else "OpenAI chat completions"
        self.proxied = PROXIED_RESPONSES if responses else PROXIED
        self.direct = DIRECT_RESPONSES if responses else DIRECT

    def history(self, n: int) -> list[dict[str, Any]]:
        return items(history(n)) if self.responses else history(n)

    def user(self, text: str) -> dict[str, Any]:
        message = {"role": "user", "content": text}
        return items([message])[0] if self.responses else message

    def request(self, messages: list[dict[str, Any]], stream: bool) -> bytes:
        body: dict[str, Any] = (
            {
                "model": "gpt-4o",
                "instructions": SYSTEM["content"],
                "input": messages,
                "store": False,
            }
            if self.responses
            else {"model": "gpt-4o", "messages": [SYSTEM, *messages]}
        )
        if stream:
            body["stream"] = True
        return orjson.dumps(body)

    def reply(self, body: bytes) -> list[dict[str, Any]]:
        data = orjson.loads(body)
        if self.responses:
            output: list[dict[str, Any]] = data["output"]
            return output
        return [data["choices"][0]["message"]]

    def streamed(self, events: bytes) -> list[dict[str, Any]]:
        if self.responses:
            return streamed_items(events)
        return [{"role": "assistant", "content": streamed_text(events)}]


async def _session(
    proxy: _Http, sid: str, n: int, wire: _Wire
) -> tuple[list[dict[str, Any]], float]:
    """A new session whose first call stored ``n`` messages (and its reply); how long
    that first call took."""
    status, body = await proxy.post("/v1/sessions", orjson.dumps({"id": sid, **SESSION}), {})
    assert status == 201, body
    messages = wire.history(n)
    started = time.perf_counter()
    status, body = await proxy.post(wire.proxied, wire.request(messages, False), _headers(sid))
    assert status == 200, body[:500]
    messages += wire.reply(body)
    return messages, time.perf_counter() - started


def _headers(sid: str) -> dict[str, str]:
    return {"X-Compactd-Session": sid, "Authorization": "Bearer sk-bench"}


PROXIED, DIRECT = "/proxy/openai/v1/chat/completions", "/v1/chat/completions"
PROXIED_RESPONSES, DIRECT_RESPONSES = "/proxy/openai/v1/responses", "/v1/responses"


async def _case(
    port: int, upstream_port: int, n: int, per_session: int, wire: _Wire
) -> dict[str, Any]:
    """``CALLS`` calls and ``TTFB_CALLS`` streamed ones on sessions of ``n`` stored
    messages: a new session every ``per_session`` calls, so that the history stays near
    ``n`` (each call adds two). Each proxied call is paired with the same request sent
    directly, just before it."""
    samples: dict[str, Any] = {k: [] for k in ("proxy", "direct", "ttfb_p", "ttfb_d", "first")}
    async with _connect(port) as proxy, _connect(upstream_port) as upstream:
        sid, messages = "", list[dict[str, Any]]()
        for i in range(CALLS + TTFB_CALLS):
            if i % per_session == 0:
                sid = f"bench-proxy-{'responses-' if wire.responses else ''}{n}-{i}"
                messages, first_call = await _session(proxy, sid, n, wire)
                samples["first"].append(first_call)
                await asyncio.sleep(AGENT_WORK_SECONDS)
            messages.append(wire.user(f"And now step {i}?"))
            stream = i >= CALLS
            payload = wire.request(messages, stream)
            headers = _headers(sid)
            if stream:
                first, _, status = await upstream.first_byte(wire.direct, payload, headers)
                assert status == 200
                samples["ttfb_d"].append(first)
                first, events, status = await proxy.first_byte(wire.proxied, payload, headers)
                assert status == 200
                samples["ttfb_p"].append(first)
                messages += wire.streamed(events)
            else:
                t = time.perf_counter()
                status, _ = await upstream.post(wire.direct, payload, headers)
                samples["direct"].append(time.perf_counter() - t)
                assert status == 200
                t = time.perf_counter()
                status, body = await proxy.post(wire.proxied, payload, headers)
                samples["proxy"].append(time.perf_counter() - t)
                assert status == 200, body[:500]
                messages += wire.reply(body)
            await asyncio.sleep(AGENT_WORK_SECONDS)
        status, body = await proxy.get(f"/v1/sessions/{sid}")
        assert status == 200, body
        samples["session"] = orjson.loads(body)
    return samples


def paired(mine: list[float], theirs: list[float]) -> list[float]:
    """Each proxied call's time less its own direct call's."""
    assert len(mine) == len(theirs)
    return [p - d for p, d in zip(mine, theirs, strict=True)]


async def bench_proxy(port: int, upstream_port: int) -> None:
    chat, responses = _Wire(responses=False), _Wire(responses=True)
    cases = [(chat, 100, 10), (chat, 10_000, CALLS + TTFB_CALLS)]
    cases += [(responses, 100, 10), (responses, 1_000, 50)]
    for wire, n, per_session in cases:
        if n == 100:
            print(f"\nProxy ({wire.name}, scripted upstream answering at once)")
        s = await _case(port, upstream_port, n, per_session, wire)
        session = s["session"]
        print(
            f"  {n:>6} messages: a first call storing them took {pct(s['first'], 0.5):.0f} ms; "
            f"the last session: {session['entry_count']} entries, a context of "
            f"{session['context_tokens']:,} tokens, {session['compaction_count']} compactions"
        )
        for label, mine, theirs in (
            ("call", "proxy", "direct"),
            ("stream, time to first byte", "ttfb_p", "ttfb_d"),
        ):
            added = paired(s[mine], s[theirs])
            print(
                f"  {n:>6} stored, {label:<27} proxied p50 {pct(s[mine], 0.5):7.2f} ms "
                f"p99 {pct(s[mine], 0.99):7.2f} ms | direct p50 {pct(s[theirs], 0.5):7.2f} ms "
                f"p99 {pct(s[theirs], 0.99):7.2f} ms | added (paired, {len(added)}) "
                f"p50 {pct(added, 0.5):6.2f} ms p99 {pct(added, 0.99):6.2f} ms"
            )
        if n != 100:
            print("  (target: added <= 5 ms at p50, flat in history length)")


async def wait_for(port: int, seconds: float = 30.0) -> None:
    """Until something listens on ``port``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on port {port}") from None
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return
