"""Running compaction workers for real in tests, and reading what they did."""

from __future__ import annotations

from typing import Any

import httpx

from app.compactions.summarizer import Backoff
from app.compactions.worker import Worker, WorkerConfig
from app.core.outbound import Outbound
from app.upstream.client import UpstreamConfig
from tests.conftest import TEST_SETTINGS
from tests.upstream_server import Upstream


def worker_config(
    upstream: Upstream | None = None,
    *,
    api: str = "openai",
    max_attempts: int = 3,
    lease_seconds: float = 10.0,
    timeout_seconds: float = 5.0,
    model: str | None = None,
) -> WorkerConfig:
    config = None
    if upstream is not None:
        config = UpstreamConfig(
            api=api,  # type: ignore[arg-type]
            base_url=upstream.url,
            timeout_seconds=timeout_seconds,
            api_key="sk-test",
        )
    return WorkerConfig(
        lease_seconds=lease_seconds,
        poll_seconds=0.05,
        # No waiting between attempts: the retries are what is under test.
        backoff=Backoff(base_seconds=0.0, cap_seconds=0.0, max_attempts=max_attempts),
        upstream=config,
        upstream_model=model,
    )


async def drain(app: Any, config: WorkerConfig | None = None, *, limit: int = 100) -> int:
    """Run a real worker until no job is due; the jobs it ran."""
    async with Outbound(TEST_SETTINGS) as http:
        worker = Worker(app.state.engine, config or worker_config(), http)
        done = 0
        while done < limit and await worker.run_once():
            done += 1
        return done


def conversation(steps: int, words: int = 400) -> list[list[dict[str, Any]]]:
    """Batches as a coding agent appends them: a task, then per step an assistant
    call (every fourth step two in parallel) and the results; a user turn every
    fifth step."""
    batches: list[list[dict[str, Any]]] = [
        [
            {"role": "system", "content": "You are a careful coding agent."},
            {
                "role": "user",
                "content": "Fix the failing date parser in src/dates.py. Never edit tests/.",
            },
        ]
    ]
    for k in range(steps):
        if k and k % 5 == 0:
            batches.append([{"role": "user", "content": f"Keep going with part {k // 5}."}])
        ids = [f"c{k}a", f"c{k}b"] if k % 4 == 3 else [f"c{k}"]
        calls = [
            {
                "id": i,
                "type": "function",
                "function": {"name": "bash", "arguments": f'{{"command": "cat src/mod{k}.py"}}'},
            }
            for i in ids
        ]
        batch: list[dict[str, Any]] = [
            {"role": "assistant", "content": f"Looking at module {k}.", "tool_calls": calls}
        ]
        for i in ids:
            body = "\n".join(f"line {n} of {i}: value = {n * k}" for n in range(words // 8))
            batch.append({"role": "tool", "tool_call_id": i, "content": body})
        batches.append(batch)
    return batches


# Instructions that name a term the summary would otherwise drop.
FOCUS = "What do we know of widget_seed?"


def conversation_with_a_buried_term() -> list[list[dict[str, Any]]]:
    """``conversation(20)`` with a term said once, in an old tool output."""
    batches = conversation(20)
    batches[2][1]["content"] += "\nnote: WIDGET_SEED=4711 comes from the fixture"
    return batches


def assert_the_summary_kept_the_focus(plain: dict[str, Any], focused: dict[str, Any]) -> None:
    """Two extractive compactions of ``conversation_with_a_buried_term``: ``plain``
    dropped the term; ``focused``, asked for FOCUS, kept it and its notes say so."""
    assert plain["status"] == focused["status"] == "succeeded"
    assert focused["summarizer_used"] == "extractive"
    assert "WIDGET_SEED" not in plain["summary"]
    assert f"Focus asked for: {FOCUS}" in focused["summary"]
    assert "WIDGET_SEED=4711 comes from the fixture" in focused["summary"]
    assert any("kept what names widget_seed" in n for n in focused["details"]["notes"])


async def compaction(client: httpx.AsyncClient, sid: str, cid: str) -> dict[str, Any]:
    r = await client.get(f"/v1/sessions/{sid}/compactions/{cid}")
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data


ANTHROPIC_OVERFLOW = "prompt is too long: 208310 tokens > 200000 maximum"


async def overflow_error(
    client: httpx.AsyncClient, sid: str, context_version: int | None = None
) -> dict[str, Any]:
    """Forward Anthropic's context-overflow error; the recovery it started."""
    body: dict[str, Any] = {"status": 400, "message": ANTHROPIC_OVERFLOW}
    if context_version is not None:
        body["context_version"] = context_version
    r = await client.post(f"/v1/sessions/{sid}/overflow-errors", json=body)
    assert r.status_code == 200, r.text
    recovery: dict[str, Any] = r.json()["recovery"]
    return recovery
