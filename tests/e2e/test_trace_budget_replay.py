"""The real traces in a 32k window: usage reports, verdicts and automatic pruning.

Each trace is replayed turn by turn through a real uvicorn server, as its agent
would: before each assistant message is appended, the usage its model call
reported (DeepSeek's real ``prompt_tokens``) is sent. The agent sent its whole
history, while the session's context is pruned; so the report is scaled to
the context by the trace's own ratio of reported to counted tokens, which is
what DeepSeek would have reported for the pruned context.

Checked along the way: every context is valid for its provider, the running
totals equal the context's own figures, and the stored history is exactly what
was sent. The totals are printed (``pytest -s``) for the record.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.settings import Settings
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.main import create_app
from tests import traces
from tests.e2e.server import running
from tests.helpers import history

WINDOW = {"context_window": 32_768, "max_output_tokens": 4_096}
# Pruning scaled to the window: the default 40k protected would cover all of it.
# Compaction is off: this replay measures usage, verdicts and pruning alone
# (tests/e2e/test_trace_compaction_replay.py replays with compaction).
CONFIG = {
    "prune": {"protect_tokens": 8_000, "minimum_tokens": 4_000},
    "compaction": {"auto": False},
}


def reported_prompt(message: dict[str, Any]) -> int | None:
    usage = ((message.get("extra") or {}).get("response") or {}).get("usage") or {}
    value = usage.get("prompt_tokens")
    return value if isinstance(value, int) and value > 0 else None


async def _replay(client: httpx.AsyncClient, path: Path) -> dict[str, Any]:
    messages = traces.load(path)
    session = await traces.create_session(client, path, "b-", **WINDOW, config=CONFIG)
    sid = session["id"]
    stats: dict[str, Any] = {
        "reports": 0,
        "actions": collections.Counter(),
        "prunes": 0,
        "saved": 0,
        "max_error": 0.0,
    }
    turns = traces.turns(messages)
    for n, batch in enumerate(turns):
        prompt = reported_prompt(batch[0]) if batch[0]["role"] == "assistant" else None
        if prompt is not None:
            # What the provider would report for the context the session holds now.
            whole = session["stored_tokens"] + REPLY_PRIMING_TOKENS
            shown = session["context_tokens"] + REPLY_PRIMING_TOKENS
            actual = round(prompt * shown / whole)
            # The estimate just before the report, against the report.
            r = await client.get(f"/v1/sessions/{sid}/overflow")
            estimated = r.json()["estimated_tokens"]
            if stats["reports"] >= 10:
                stats["max_error"] = max(stats["max_error"], abs(estimated - actual) / actual)
            r = await client.post(f"/v1/sessions/{sid}/usage", json={"input_tokens": actual})
            assert r.status_code == 200, r.text
            body = r.json()
            stats["reports"] += 1
            stats["actions"][body["overflow"]["action"]] += 1
            if body["pruned"] and body["pruned"]["pruned"]:
                stats["prunes"] += 1
                stats["saved"] += body["pruned"]["tokens_saved"]
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": batch})
        assert r.status_code == 201, f"{path.name} turn {n}: {r.text}"
        body = r.json()
        if body["pruned"] and body["pruned"]["pruned"]:
            stats["prunes"] += 1
            stats["saved"] += body["pruned"]["tokens_saved"]
        session = (await client.get(f"/v1/sessions/{sid}")).json()
        if n % 5 == 0:
            await _check_context(client, sid, "openai", session, batch[-1]["role"] == "assistant")

    pending = messages[-1]["role"] == "assistant"
    for fmt in ("openai", "anthropic"):
        await _check_context(client, sid, fmt, session, pending)
    # Pruning changed what the model sees, never what is stored.
    stored = [e["message"] for e in await history(client, sid)]
    assert stored == messages, f"{path.name}: the stored history changed"
    assert session["pruned_tokens"] == stats["saved"]
    stats["session"] = session
    return stats


async def _check_context(
    client: httpx.AsyncClient, sid: str, fmt: str, session: dict[str, Any], pending: bool
) -> None:
    r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
    assert r.status_code == 200, r.text
    ctx = r.json()
    check = check_openai_pairing if fmt == "openai" else check_anthropic_pairing
    assert check(ctx["messages"], allow_pending=pending) == []
    b = ctx["tokens"]["breakdown"]
    assert b["messages"] + b["tool_outputs"] == session["context_tokens"]


@pytest.mark.slow
async def test_replay_every_trace_in_a_32k_window(db_url: str, settings: Settings) -> None:
    with running(create_app(settings, database_url=db_url)) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            results = await traces.replay_all(client, _replay)

    actions: collections.Counter[str] = collections.Counter()
    for s in results:
        actions.update(s["actions"])
    reports = sum(s["reports"] for s in results)
    prunes = sum(s["prunes"] for s in results)
    saved = sum(s["saved"] for s in results)
    stored = sum(s["session"]["stored_tokens"] for s in results)
    context = sum(s["session"]["context_tokens"] for s in results)
    factors = sorted(s["session"]["calibration_factor"] for s in results)
    worst = max(s["max_error"] for s in results)
    print(
        f"\n32k replay of {len(results)} traces: {reports} usage reports, verdicts {dict(actions)};"
        f" {prunes} automatic prunes saved {saved} tokens; context {context} of {stored}"
        f" stored tokens at the end; calibration factors {factors[0]:.3f}..{factors[-1]:.3f};"
        f" worst estimate error after 10 reports {worst:.1%}"
    )
    assert reports > 1000
    assert prunes > 0
    assert saved > 0
    # DeepSeek's tokenizer is not o200k: every session learned a factor of its own.
    assert all(0.5 <= f <= 3.0 for f in factors)
