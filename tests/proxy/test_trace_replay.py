"""Real agent sessions from tests/data/traces, replayed through the proxy with the OpenAI
SDK at a small window: the agent re-sends its whole history on every call, as it did,
and the upstream answers each call with the trace's own next assistant message. Every
request the upstream gets must be valid for OpenAI and within the session's budget,
however often the session was pruned and compacted on the way; the stored history must
be the whole of what the agent sent and received."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from tests import traces
from tests.proxy.support import (
    api,
    assert_stored,
    assert_valid_upstream,
    openai_client,
    openai_stream_message,
    proxy,
)
from tests.upstream_server import Reply, ToolCalls, Upstream

WINDOW = {"context_window": 24_000, "max_output_tokens": 4_000}
BUDGET = 20_000


def plain(message: dict[str, Any]) -> dict[str, Any]:
    """A trace message as an agent sends it: the chat fields only (the traces keep their
    harness's records beside them)."""
    keep = ("role", "content", "tool_call_id", "tool_calls", "name")
    out = {k: message[k] for k in keep if message.get(k) is not None}
    if "tool_calls" in out:
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": dict(c["function"])}
            for c in out["tool_calls"]
        ]
    return out


def answer(message: dict[str, Any]) -> Reply | ToolCalls:
    calls = message.get("tool_calls") or []
    if not calls:
        return Reply(message.get("content") or "")
    return ToolCalls(
        tuple((c["function"]["name"], c["function"]["arguments"]) for c in calls),
        text=message.get("content") or None,
        ids=tuple(c["id"] for c in calls),
    )


async def replay(base: str, upstream: Upstream, path: Path) -> tuple[int, int]:
    messages = [plain(m) for m in traces.load(path)]
    system: Any = messages[0]
    rest = messages[1:]
    assert system["role"] == "system"
    sid = "proxy-" + path.name.split(".")[0].replace("__", "-")
    async with api(base) as http:
        r = await http.post("/v1/sessions", json={"id": sid, "model": "deepseek-chat", **WINDOW})
        assert r.status_code == 201, r.text
    history: list[Any] = []
    seen = len(upstream.requests)
    calls = 0
    async with openai_client(base, sid) as client:
        for message in rest:
            if message["role"] != "assistant":
                history.append(message)
                continue
            upstream.script([answer(message)])
            if calls % 2:
                chunks = [
                    c
                    async for c in await client.chat.completions.create(
                        model="deepseek-chat", messages=[system, *history], stream=True
                    )
                ]
                history.append(openai_stream_message(chunks))
            else:
                completion = await client.chat.completions.create(
                    model="deepseek-chat", messages=[system, *history]
                )
                history.append(completion.choices[0].message.model_dump(exclude_unset=True))
            calls += 1
            for request in upstream.requests[seen:]:
                assert_valid_upstream(request, "openai", budget=BUDGET)
            seen = len(upstream.requests)
    async with api(base) as http:
        await assert_stored(http, sid, "openai", history)
        session = (await http.get(f"/v1/sessions/{sid}")).json()
    return calls, session["compaction_count"]


@pytest.mark.slow
async def test_real_traces_through_the_proxy_at_a_small_window(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    files = sorted(traces.trace_files(), key=lambda p: len(traces.load(p)))[:4]
    started = time.perf_counter()
    compacted = 0
    with proxy(settings, db_url, upstream, compaction_workers=1) as base:
        for path in files:
            calls, compactions = await replay(base, upstream, path)
            print(f"{path.name}: {calls} calls, {compactions} compactions")
            compacted += compactions > 0
    print(f"replayed {len(files)} traces in {time.perf_counter() - started:.1f} s")
    # The window is small enough that the traces had to be compacted to fit.
    assert compacted >= 2
