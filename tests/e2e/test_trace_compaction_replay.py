"""The real traces in a 16k window with automatic compaction, through a real
uvicorn server whose compaction workers run as they do in production.

Each trace is replayed turn by turn, with the usage its model reported (scaled
to the context the session holds, as in test_trace_budget_replay). After every
turn the context is read in both formats and must be under budget and valid:
no tool result without its call, no call without its result (except the
calls of a last assistant message still waiting for theirs). At the end the
stored history must be exactly what was sent, with the compaction entries
(and their "continue" prompts) in between. Run once with the extractive
summarizer and once with the test upstream LLM; the figures are printed
(``pytest -s``) for the record.
"""

from __future__ import annotations

import collections
import itertools
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.compactions.pivot import CONTINUE_TEXT
from app.core.settings import Settings
from app.engine.accounting.tokens import REPLY_PRIMING_TOKENS
from app.engine.compaction.summary import summary_from_context_message
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from app.main import create_app
from tests import traces
from tests.e2e.server import running
from tests.e2e.test_trace_budget_replay import reported_prompt
from tests.helpers import history
from tests.upstream_server import Upstream

# usable = 16,384 - 4,096 = 12,288; compaction at 12,288 - 4,096 = 8,192; emergency at 11,673.
WINDOW = {"context_window": 16_384, "max_output_tokens": 4_096}
CONFIG = {
    "compaction": {"reserve_tokens": 4_096},
    "prune": {"protect_tokens": 4_000, "minimum_tokens": 2_000},
}


def _pieces(message: dict[str, Any]) -> list[str | None]:
    """What a message says, piece by piece: its text, or None for anything else
    (a call, a result, an image)."""
    content = message.get("content")
    if message["role"] == "tool" or message.get("tool_calls"):
        return [content if isinstance(content, str) and content else None, None]
    if isinstance(content, str):
        return [content]
    return [b["text"] if b.get("type") == "text" else None for b in content or []] or [None]


def check(ctx: dict[str, Any], fmt: str, pending: bool, where: str) -> None:
    # Pairing, and for Anthropic roles alternating from the user's turn.
    pairing = check_openai_pairing if fmt == "openai" else check_anthropic_pairing
    assert pairing(ctx["messages"], allow_pending=pending) == [], where
    # A "continue" left by an earlier compaction never heads the kept part, right
    # after the summary. (When nothing was kept, the prompt of this compaction
    # itself comes next, rightly.)
    pivot = ctx["compaction"]
    if pivot is not None and pivot["first_kept_seq"] < pivot["entry_seq"]:
        pieces = [t for m in ctx["messages"] for t in _pieces(m)]
        for text, after in itertools.pairwise(pieces):
            if text is not None and summary_from_context_message(text) is not None:
                assert after != CONTINUE_TEXT, f"{where}: a stale continue follows the summary"
    tokens = ctx["tokens"]
    assert tokens["estimated"] <= tokens["budget"], f"{where}: over budget {tokens}"


async def _replay(client: httpx.AsyncClient, path: Path) -> dict[str, Any]:
    messages = traces.load(path)
    session = await traces.create_session(client, path, "c-", **WINDOW, config=CONFIG)
    sid = session["id"]
    fractions: list[float] = []
    for n, batch in enumerate(traces.turns(messages)):
        prompt = reported_prompt(batch[0]) if batch[0]["role"] == "assistant" else None
        if prompt is not None:
            # What the provider would report for the context the session holds now.
            whole = session["stored_tokens"] + REPLY_PRIMING_TOKENS
            shown = session["context_tokens"] + REPLY_PRIMING_TOKENS
            r = await client.post(
                f"/v1/sessions/{sid}/usage",
                json={"input_tokens": round(prompt * shown / whole), "finish_reason": "tool_calls"},
            )
            assert r.status_code == 200, r.text
        r = await client.post(f"/v1/sessions/{sid}/messages", json={"messages": batch})
        assert r.status_code == 201, f"{path.name} turn {n}: {r.text}"
        pending = batch[-1]["role"] == "assistant"
        for fmt in ("openai", "anthropic"):
            r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
            assert r.status_code == 200, r.text
            ctx = r.json()
            check(ctx, fmt, pending, f"{path.name} turn {n} ({fmt})")
        fractions.append(ctx["tokens"]["fraction"])
        session = (await client.get(f"/v1/sessions/{sid}")).json()

    # Let the last queued compaction finish, then check everything once more.
    jobs = await traces.finished_compactions(client, sid)
    pending = messages[-1]["role"] == "assistant"
    for fmt in ("openai", "anthropic"):
        r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
        check(r.json(), fmt, pending, f"{path.name} end ({fmt})")

    # Nothing stored was lost or changed: the messages as sent, and between them
    # only what compaction added.
    stored = await history(client, sid)
    assert [e["message"] for e in stored if e["kind"] == "message"] == messages, path.name
    added = collections.Counter(e["kind"] for e in stored if e["kind"] != "message")
    done = [j for j in jobs if j["status"] == "succeeded"]
    assert added["compaction"] == len(done), path.name
    assert all(j["status"] in ("succeeded", "cancelled", "failed") for j in jobs), jobs
    # Every archive holds exactly the messages its compaction replaced.
    for job in done[:2]:
        r = await client.get(
            f"/v1/sessions/{sid}/compactions/{job['id']}/source", params={"limit": 1000}
        )
        assert r.status_code == 200, r.text
        seqs = [e["seq"] for e in r.json()["entries"]]
        assert seqs
        assert all(s < job["first_kept_seq"] for s in seqs)
    session = (await client.get(f"/v1/sessions/{sid}")).json()
    return {
        "jobs": jobs,
        "continued": added["continue"],
        "max_fraction": max(fractions),
        "session": session,
    }


def summarize(results: list[dict[str, Any]], label: str) -> collections.Counter[str]:
    reasons: collections.Counter[str] = collections.Counter()
    statuses: collections.Counter[str] = collections.Counter()
    before = after = 0
    used: collections.Counter[str] = collections.Counter()
    for s in results:
        for j in s["jobs"]:
            statuses[j["status"]] += 1
            if j["status"] == "succeeded":
                reasons[j["reason"]] += 1
                before += j["tokens_before"]
                after += j["tokens_after"]
                used[j["summarizer_used"]] += 1
    errors = collections.Counter(
        (j["error"] or "")[:60] for s in results for j in s["jobs"] if j["status"] == "failed"
    )
    stored = sum(s["session"]["stored_tokens"] for s in results)
    context = sum(s["session"]["context_tokens"] for s in results)
    print(
        f"\n16k compaction replay ({label}) of {len(results)} traces: jobs {dict(statuses)};"
        f" succeeded by reason {dict(reasons)}, by summarizer {dict(used)};"
        f" tokens before {before} -> after {after} in total;"
        f" {sum(s['continued'] for s in results)} continue prompts;"
        f" highest context fraction after a turn {max(s['max_fraction'] for s in results):.3f};"
        f" context {context} of {stored} stored tokens at the end; failures {dict(errors)}"
    )
    return reasons


@pytest.mark.slow
async def test_replay_every_trace_in_a_16k_window_extractive(
    db_url: str, settings: Settings
) -> None:
    app = create_app(settings.model_copy(update={"compaction_workers": 2}), database_url=db_url)
    with running(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            results = await traces.replay_all(client, _replay)
    reasons = summarize(results, "extractive")
    assert reasons["threshold"] > len(results)
    for s in results:
        assert s["session"]["compaction_count"] >= 1


@pytest.mark.slow
async def test_replay_every_trace_in_a_16k_window_with_an_llm(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    configured = settings.model_copy(
        update={
            "compaction_workers": 2,
            "upstream_base_url": upstream.url,
            "upstream_timeout_seconds": 10.0,
        }
    )
    app = create_app(configured, database_url=db_url)
    with running(app) as base_url:
        async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
            results = await traces.replay_all(client, _replay)
    reasons = summarize(results, "test upstream LLM")
    assert reasons["threshold"] > len(results)
    used = collections.Counter(
        j["summarizer_used"] for s in results for j in s["jobs"] if j["status"] == "succeeded"
    )
    assert used["llm"] > 0
    assert upstream.requests
    assert all(not r.json.get("tools") for r in upstream.requests if r.json)
