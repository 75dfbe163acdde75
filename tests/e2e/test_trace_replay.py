"""Every real agent session in tests/data/traces, replayed through a real uvicorn server.

Each trace is appended turn by turn as its agent would (the prompt, each
assistant message, the tool results that answer it); the context is read in
both formats along the way. At the end the stored history must equal what was
sent, and every context must be valid for its provider.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.main import create_app
from tests import traces
from tests.e2e.server import running


async def _replay(client: httpx.AsyncClient, path: Path) -> dict[str, Any]:
    messages = traces.load(path)
    sid = (await traces.create_session(client, path))["id"]
    appended = 0
    counted = 0
    for n, batch in enumerate(traces.turns(messages)):
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": batch})
        assert r.status_code == 201, f"{path.name} turn {n}: {r.text}"
        body = r.json()
        assert [e["seq"] for e in body["entries"]] == list(
            range(appended + 1, appended + len(batch) + 1)
        )
        appended += len(batch)
        counted += sum(e["tokens"] for e in body["entries"])
        assert all(e["tokens"] > 0 for e in body["entries"])
        if n % 25 == 0:
            for fmt in ("openai", "anthropic"):
                await _check_context(
                    client, sid, fmt, expect_pending=batch[-1]["role"] == "assistant"
                )

    # The stored history equals what was sent, message for message.
    stored: list[dict[str, Any]] = []
    after = 0
    while True:
        r = await client.get(
            f"/v1/sessions/{sid}/messages", params={"after_seq": after, "limit": 1000}
        )
        assert r.status_code == 200
        page = r.json()
        stored.extend(e["message"] for e in page["entries"])
        if page["next_after_seq"] is None:
            break
        after = page["next_after_seq"]
    assert len(stored) == len(messages)
    for i, (sent, got) in enumerate(zip(messages, stored, strict=True)):
        assert got == sent, f"{path.name} message {i} differs"

    # A trace that ends on the agent's last tool call keeps it pending, and nothing else.
    for fmt in ("openai", "anthropic"):
        await _check_context(client, sid, fmt, expect_pending=messages[-1]["role"] == "assistant")
    session: dict[str, Any] = (await client.get(f"/v1/sessions/{sid}")).json()
    assert session["entry_count"] == len(messages)
    # The running totals are exactly the sum of the counts made once, on write.
    assert session["stored_tokens"] == session["context_tokens"] == counted
    return session


async def _check_context(
    client: httpx.AsyncClient, sid: str, fmt: str, *, expect_pending: bool
) -> None:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    ctx = r.json()
    if fmt == "openai":
        assert check_openai_pairing(ctx["messages"], allow_pending=expect_pending) == []
        assert ctx["system"] is None
    else:
        assert check_anthropic_pairing(ctx["messages"], allow_pending=expect_pending) == []
        assert ctx["system"], "the trace's system prompt goes to the top-level system"
        roles = [m["role"] for m in ctx["messages"]]
        assert all(a != b for a, b in itertools.pairwise(roles)), "roles must alternate"
    b = ctx["tokens"]["breakdown"]
    assert (
        ctx["tokens"]["estimated"]
        == b["summary"] + b["messages"] + b["tool_outputs"] + b["overhead"]
    )


@pytest.mark.slow
async def test_replay_every_trace_over_real_http(db_url: str, settings: Settings) -> None:
    files = traces.trace_files()
    assert len(files) == 23
    with running(create_app(settings, database_url=db_url)) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            sessions = await traces.replay_all(client, _replay)
    total_entries = sum(s["entry_count"] for s in sessions)
    assert total_entries == sum(len(traces.load(p)) for p in files)
    # Most of these sessions would overflow the small windows later issues replay them with.
    assert sum(s["context_tokens"] > 32_000 for s in sessions) >= 10
