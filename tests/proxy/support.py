"""What the proxy's tests share: a compactd server in front of the scripted upstream,
the official SDKs pointed at it, and the checks made after every call."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai

from app.core.settings import Settings
from app.engine.accounting import tokens
from app.engine.formats import anthropic_format, openai_format
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.main import create_app
from tests.e2e.server import running
from tests.upstream_server import RecordedRequest, Upstream

PROVIDER_KEY = "sk-test-provider-secret-7f3a9c1d2e"


@contextlib.contextmanager
def proxy(settings: Settings, db_url: str, upstream: Upstream, **overrides: Any) -> Iterator[str]:
    """compactd over real HTTP, its proxy's upstream the test's; yields its base URL."""
    base = upstream.url.removesuffix("/v1")
    configured = settings.model_copy(
        update={"proxy_openai_url": upstream.url, "proxy_anthropic_url": base, **overrides}
    )
    with running(create_app(configured, database_url=db_url)) as url:
        yield url


def openai_client(base: str, session: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{base}/proxy/openai/v1",
        api_key=PROVIDER_KEY,
        default_headers={"X-Compactd-Session": session, **headers},
        max_retries=0,
        timeout=60,
    )


def anthropic_client(base: str, session: str, **headers: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=f"{base}/proxy/anthropic",
        api_key=PROVIDER_KEY,
        default_headers={"X-Compactd-Session": session, **headers},
        max_retries=0,
        timeout=60,
    )


@contextlib.asynccontextmanager
async def api(base: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        yield client


async def stored_history(client: httpx.AsyncClient, sid: str, fmt: str) -> list[dict[str, Any]]:
    """The session's whole stored history (GET /v1/sessions/{id}/messages), in ``fmt``."""
    out: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(
            f"/v1/sessions/{sid}/messages",
            params={"after_seq": after, "limit": 1000, "format": fmt},
        )
        assert r.status_code == 200, r.text
        page = r.json()
        out.extend(e["message"] for e in page["entries"] if e["kind"] == "message")
        if page["next_after_seq"] is None:
            return out
        after = page["next_after_seq"]


def anthropic_runs(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Anthropic messages with string content as one text block and runs of one role
    as one message: the stored history gives each tool result its own message, the
    agent sends a turn's results (and what follows them) in one."""
    out: list[dict[str, Any]] = []
    for m in messages:
        content = m["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        if out and out[-1]["role"] == m["role"]:
            out[-1]["content"].extend(blocks)
        else:
            out.append({**m, "content": blocks})
    return out


# A call's reply is stored right after it is delivered: reads wait for it this long.
SETTLE_SECONDS = 30.0


async def assert_stored(
    client: httpx.AsyncClient, sid: str, fmt: str, expected: list[dict[str, Any]]
) -> None:
    """The stored history is exactly what the agent sent (its system prompt aside) and
    received, once the last reply is stored."""

    def same(stored: list[dict[str, Any]]) -> bool:
        if fmt == "openai":
            return stored == expected
        return anthropic_runs(stored) == anthropic_runs(expected)

    deadline = time.monotonic() + SETTLE_SECONDS
    stored = await stored_history(client, sid, fmt)
    while not same(stored) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
        stored = await stored_history(client, sid, fmt)
    if fmt == "openai":
        assert stored == expected
    else:
        assert anthropic_runs(stored) == anthropic_runs(expected)


async def settled(
    client: httpx.AsyncClient, sid: str, entries: int, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """The session once it holds ``entries`` entries (or as it is after the wait)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while True:
        r = await client.get(f"/v1/sessions/{sid}", headers=headers)
        assert r.status_code == 200, r.text
        session: dict[str, Any] = r.json()
        if session["entry_count"] >= entries or time.monotonic() > deadline:
            return session
        await asyncio.sleep(0.02)


def sent_tokens(request: RecordedRequest, api: str) -> int:
    """What compactd counts for the prompt the upstream received: its messages, system
    prompt and tools, as the session's own counting would."""
    body = request.json
    total = 0
    if api == "openai":
        for i, m in enumerate(body["messages"]):
            total += tokens.count_entry(openai_format.parse_message(m, f"messages[{i}]"))
    else:
        for i, m in enumerate(body["messages"]):
            for entry in anthropic_format.parse_message(m, f"messages[{i}]"):
                total += tokens.count_entry(entry)
        system = body.get("system")
        if isinstance(system, str):
            total += tokens.count_text(system)
        elif isinstance(system, list):
            total += sum(tokens.count_text(b["text"]) for b in system)
    if body.get("tools"):
        total += tokens.count_tools(body["tools"])
    return total


def assert_valid_upstream(request: RecordedRequest, api: str, budget: int | None = None) -> None:
    """The upstream received a context valid for its provider (every tool call answered,
    Anthropic's roles alternating from the user's) and, given ``budget``, within it."""
    body = request.json
    assert isinstance(body, dict)
    messages = body["messages"]
    if api == "openai":
        problems = check_openai_pairing(messages, allow_pending=False)
    else:
        problems = check_anthropic_pairing(messages, allow_pending=False)
        assert messages, "an Anthropic request needs a message"
    assert problems == [], problems
    credentials = request.headers.get("authorization", "") + request.headers.get("x-api-key", "")
    assert PROVIDER_KEY in credentials, "the agent's credentials go upstream"
    assert not any(k.startswith("x-compactd-") for k in request.headers)
    if budget is not None:
        assert sent_tokens(request, api) <= budget, (sent_tokens(request, api), budget)


def openai_stream_message(chunks: list[Any]) -> dict[str, Any]:
    """The assistant message an agent builds from the chunks its SDK yielded."""
    content: list[str] | None = None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content is not None:
                content = [*(content or []), delta.content]
            for call in delta.tool_calls or []:
                slot = calls.setdefault(
                    call.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                if call.id:
                    slot["id"] = call.id
                if call.function and call.function.name:
                    slot["function"]["name"] += call.function.name
                if call.function and call.function.arguments:
                    slot["function"]["arguments"] += call.function.arguments
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if content is None else "".join(content),
    }
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def anthropic_message(message: Any) -> dict[str, Any]:
    """An SDK's Message as the agent keeps it in its history."""
    return {
        "role": "assistant",
        "content": [block.model_dump(exclude_none=True) for block in message.content],
    }
