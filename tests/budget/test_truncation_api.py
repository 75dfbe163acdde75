"""Ingest truncation: long tool outputs are cut in the model's view, kept whole in storage."""

from __future__ import annotations

from typing import Any

import httpx

from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from tests.conftest import make_session
from tests.helpers import append_ok, history, tool_call


def shell_log(lines: int) -> str:
    return "\n".join(
        f"[{i:05d}] collecting tests/test_module_{i}.py ... PASSED" for i in range(lines)
    )


def call_and_result(call_id: str, tool: str, content: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Run it."},
        {"role": "assistant", "content": None, "tool_calls": [tool_call(call_id, tool)]},
        {"role": "tool", "tool_call_id": call_id, "content": content},
    ]


async def tool_view(client: httpx.AsyncClient, sid: str) -> str:
    r = await client.get(f"/v1/sessions/{sid}/context")
    assert r.status_code == 200, r.text
    ctx = r.json()
    assert check_openai_pairing(ctx["messages"]) == []
    (text,) = [m["content"] for m in ctx["messages"] if m["role"] == "tool"]
    assert isinstance(text, str)
    return text


async def test_a_long_shell_output_keeps_head_and_tail(client: httpx.AsyncClient) -> None:
    await make_session(client, id="t")
    log = shell_log(20_000)  # ~1.1 MB
    body = await append_ok(client, "t", call_and_result("c1", "bash", log))
    tokens = body["entries"][-1]["tokens"]
    assert 1_000 < tokens <= 4_200  # the cap, give or take the notice

    shown = await tool_view(client, "t")
    lines = log.split("\n")
    assert shown.startswith("\n".join(lines[:60]))
    assert shown.endswith(lines[-1])
    assert "omitted" in shown
    assert len(shown) < len(log) // 50

    # The stored history keeps every byte, and says what the view left out.
    (result,) = [e for e in await history(client, "t") if e["role"] == "tool"]
    assert result["message"]["content"] == log
    assert result["omitted_bytes"] > 1_000_000
    assert result["omitted_lines"] > 19_000
    assert result["tokens"] == tokens


async def test_grep_output_keeps_the_leading_matches(client: httpx.AsyncClient) -> None:
    await make_session(client, id="g")
    matches = "\n".join(f"src/mod_{i}.py:{i}: TODO fix this" for i in range(30_000))
    await append_ok(client, "g", call_and_result("c1", "grep", matches))
    shown = await tool_view(client, "g")
    assert shown.startswith("src/mod_0.py:0: TODO fix this\nsrc/mod_1.py:1:")
    assert "src/mod_29999.py" not in shown
    assert "omitted" in shown


async def test_the_session_maps_its_own_tools(client: httpx.AsyncClient) -> None:
    config = {"truncate": {"categories": {"run_suite": "match_list"}}}
    await make_session(client, id="m", config=config)
    log = shell_log(20_000)
    await append_ok(client, "m", call_and_result("c1", "run_suite", log))
    shown = await tool_view(client, "m")
    last = log.rsplit("\n", 1)[1]
    assert not shown.endswith(last)  # leading matches only, no tail
    assert shown.startswith(log[:200])


async def test_short_outputs_and_disabled_truncation_are_left_whole(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="s")
    await append_ok(client, "s", call_and_result("c1", "bash", shell_log(50)))
    assert await tool_view(client, "s") == shell_log(50)

    await make_session(client, id="off", config={"truncate": {"enabled": False}})
    log = shell_log(5_000)
    body = await append_ok(client, "off", call_and_result("c1", "bash", log))
    assert body["entries"][-1]["tokens"] > 50_000
    assert await tool_view(client, "off") == log


async def test_anthropic_results_are_cut_too(client: httpx.AsyncClient) -> None:
    await make_session(client, id="a")
    log = shell_log(20_000)
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Run it."},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "tu1", "name": "bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "tu1", "content": log}],
        },
    ]
    await append_ok(client, "a", messages, fmt="anthropic")
    r = await client.get("/v1/sessions/a/context", params={"format": "anthropic"})
    ctx = r.json()
    assert check_anthropic_pairing(ctx["messages"]) == []
    (block,) = [b for m in ctx["messages"] for b in m["content"] if b["type"] == "tool_result"]
    text = block["content"] if isinstance(block["content"], str) else block["content"][0]["text"]
    assert "omitted" in text
    assert len(text) < 30_000
