"""The recall tools through the proxy (config ``recall.proxy_tools``): offered to the
model beside the agent's tools, answered by compactd, never seen by the agent. The
official SDKs, whole and streamed, against the scripted upstream."""

from __future__ import annotations

from typing import Any

import pytest

from app.core.settings import Settings
from app.engine.proxy.recall import LAST_ROUND_NOTE, ROUNDS
from app.recall.agent_tools import definitions
from tests.proxy import test_anthropic_proxy as claude
from tests.proxy import test_openai_proxy as gpt
from tests.proxy.support import (
    anthropic_client,
    anthropic_message,
    api,
    assert_stored,
    assert_valid_upstream,
    openai_client,
    openai_stream_message,
    proxy,
)
from tests.upstream_server import Reply, ToolCalls, Upstream

FACT = "The deploy key lives in vault at secret/ops/deploy-7781."
RECALL = {"recall": {"proxy_tools": True}, "compaction": {"auto": False}}


async def _session(base: str, sid: str, model: str, config: dict[str, Any] = RECALL) -> None:
    async with api(base) as http:
        r = await http.post("/v1/sessions", json={"id": sid, "model": model, "config": config})
        assert r.status_code == 201, r.text


async def _ask_openai(
    base: str, sid: str, history: list[Any], stream: bool, tools: Any = gpt.TOOLS
) -> tuple[dict[str, Any], dict[str, str]]:
    """One agent call; the reply as the agent keeps it, and the response's headers."""
    async with openai_client(base, sid) as client:
        if stream:
            streamed = await client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=[gpt.SYSTEM, *history], tools=tools, stream=True
            )
            chunks = [chunk async for chunk in streamed.parse()]
            return openai_stream_message(chunks), dict(streamed.headers)
        whole = await client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[gpt.SYSTEM, *history], tools=tools
        )
        reply = whole.parse().choices[0].message.model_dump(exclude_unset=True)
        return reply, dict(whole.headers)


async def _ask_claude(
    base: str, sid: str, history: list[Any], stream: bool, tools: Any = claude.TOOLS
) -> tuple[dict[str, Any], dict[str, str]]:
    async with anthropic_client(base, sid) as client:
        kwargs: Any = {
            "model": claude.MODEL,
            "max_tokens": 512,
            "system": claude.SYSTEM,
            "messages": history,
            "tools": tools,
        }
        if stream:
            async with client.messages.stream(**kwargs) as streamed:
                message = await streamed.get_final_message()
                return anthropic_message(message), dict(streamed.response.headers)
        raw = await client.messages.with_raw_response.create(**kwargs)
        return anthropic_message(await raw.parse()), dict(raw.headers)


def _text_of(api_name: str, message: dict[str, Any]) -> str:
    if api_name == "openai":
        return str(message.get("content") or "")
    return "".join(b.get("text", "") for b in message["content"] if b["type"] == "text")


def _calls_of(api_name: str, message: dict[str, Any]) -> list[str]:
    if api_name == "openai":
        return [c["function"]["name"] for c in message.get("tool_calls") or ()]
    return [b["name"] for b in message["content"] if b["type"] == "tool_use"]


def _tool_results(api_name: str, body: dict[str, Any]) -> list[str]:
    """The texts of the tool results at the end of an upstream request."""
    messages = body["messages"]
    if api_name == "openai":
        out = []
        for m in reversed(messages):
            if m["role"] != "tool":
                break
            out.append(m["content"])
        return out[::-1]
    last = messages[-1]
    return [b["content"] for b in last["content"] if b.get("type") == "tool_result"]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_the_model_looks_up_history_and_the_agent_sees_only_the_answer(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str, stream: bool
) -> None:
    ask = _ask_openai if api_name == "openai" else _ask_claude
    model = "gpt-4o" if api_name == "openai" else claude.MODEL
    own_tools = gpt.TOOLS if api_name == "openai" else claude.TOOLS
    sid = f"recall-{api_name}-{stream}"
    upstream.script(
        [
            Reply("Noted."),
            ToolCalls((("history_search", {"query": "deploy-7781"}),), text="Let me check."),
            Reply("It is at secret/ops/deploy-7781."),
        ]
    )
    with proxy(settings, db_url, upstream) as base:
        await _session(base, sid, model)
        history: list[Any] = [{"role": "user", "content": FACT}]
        reply, _ = await ask(base, sid, history, stream)
        history.append(reply)
        history.append({"role": "user", "content": "Where is the deploy key?"})
        reply, headers = await ask(base, sid, history, stream)
        history.append(reply)

        assert _text_of(api_name, reply) == "It is at secret/ops/deploy-7781."
        assert _calls_of(api_name, reply) == []
        assert headers["x-compactd-recall-rounds"] == "1"
        sent = upstream.requests
        assert len(sent) == 3
        for request in sent:
            assert_valid_upstream(request, api_name)
            # The agent's tools, then the recall tools; every request whole.
            assert request.json["tools"] == [*own_tools, *definitions(api_name)]  # type: ignore[arg-type]
            assert "stream" not in request.json
        # The round: the model's call of the tool, and compactd's result that found it.
        found = _tool_results(api_name, sent[2].json)
        assert len(found) == 1
        assert "[seq 1 · user]" in found[0]
        assert "secret/ops/«deploy-7781»" in found[0]
        assert sent[2].json["messages"][: len(sent[1].json["messages"])] == sent[1].json["messages"]
        async with api(base) as http:
            # Stored: what the agent sent and received, not the round.
            await assert_stored(http, sid, api_name, history)
            session = (await http.get(f"/v1/sessions/{sid}")).json()
        assert session["usage_count"] == 2  # one report a call, of its first request


@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_the_agents_own_calls_in_a_recall_reply_are_made_again_after_the_round(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str
) -> None:
    ask = _ask_openai if api_name == "openai" else _ask_claude
    model = "gpt-4o" if api_name == "openai" else claude.MODEL
    sid = f"mixed-{api_name}"
    upstream.script(
        [
            ToolCalls((("history_read", {"from_seq": 1}), ("read_file", {"path": "a.py"}))),
            ToolCalls((("read_file", {"path": "a.py"}),)),
        ]
    )
    with proxy(settings, db_url, upstream) as base:
        await _session(base, sid, model)
        history: list[Any] = [{"role": "user", "content": FACT}]
        reply, headers = await ask(base, sid, history, False)
        assert _calls_of(api_name, reply) == ["read_file"]
        assert headers["x-compactd-recall-rounds"] == "1"
        sent = upstream.requests
        assert len(sent) == 2
        assert_valid_upstream(sent[1], api_name)
        # The round keeps the call compactd answered, not the agent's.
        round_call = sent[1].json["messages"][-2]
        assert _calls_of(api_name, round_call) == ["history_read"]
        assert FACT in _tool_results(api_name, sent[1].json)[0]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_rounds_are_bounded_and_the_agent_never_gets_a_recall_call(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str, stream: bool
) -> None:
    ask = _ask_openai if api_name == "openai" else _ask_claude
    model = "gpt-4o" if api_name == "openai" else claude.MODEL
    sid = f"rounds-{api_name}-{stream}"
    upstream.script(
        [
            ToolCalls((("history_search", {"query": f"deploy {k}"}),), text=f"Looking {k}.")
            for k in range(ROUNDS)
        ]
    )
    with proxy(settings, db_url, upstream) as base:
        await _session(base, sid, model)
        history: list[Any] = [{"role": "user", "content": FACT}]
        reply, headers = await ask(base, sid, history, stream)
        history.append(reply)
        sent = upstream.requests
        assert len(sent) == ROUNDS
        assert headers["x-compactd-recall-rounds"] == str(ROUNDS - 1)
        # The last reply, its recall call left out.
        assert _calls_of(api_name, reply) == []
        assert _text_of(api_name, reply) == f"Looking {ROUNDS - 1}."
        # The results before the last request say it is the last.
        assert all(LAST_ROUND_NOTE in text for text in _tool_results(api_name, sent[-1].json))
        assert not any(LAST_ROUND_NOTE in t for t in _tool_results(api_name, sent[-2].json))
        for request in sent:
            assert_valid_upstream(request, api_name)
        async with api(base) as http:
            await assert_stored(http, sid, api_name, history)


@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_bad_arguments_get_a_result_that_says_so(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str
) -> None:
    ask = _ask_openai if api_name == "openai" else _ask_claude
    model = "gpt-4o" if api_name == "openai" else claude.MODEL
    sid = f"bad-{api_name}"
    upstream.script(
        [
            ToolCalls((("history_search", {"query": 5, "limit": "many"}),)),
            ToolCalls(
                (("history_read", "{not json" if api_name == "openai" else '{"from_seq": "x"}'),)
            ),
            Reply("Sorry."),
        ]
    )
    with proxy(settings, db_url, upstream) as base:
        await _session(base, sid, model)
        reply, _ = await ask(base, sid, [{"role": "user", "content": FACT}], False)
        assert _text_of(api_name, reply) == "Sorry."
        sent = upstream.requests
        assert len(sent) == 3
        first = _tool_results(api_name, sent[1].json)
        assert first[0].startswith("Error: ")
        assert "query" in first[0]
        if api_name == "anthropic":
            assert sent[1].json["messages"][-1]["content"][0]["is_error"] is True
        assert _tool_results(api_name, sent[2].json)[-1].startswith("Error: ")


@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_a_session_without_the_setting_or_an_agent_with_its_own_tool_is_left_alone(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str
) -> None:
    ask = _ask_openai if api_name == "openai" else _ask_claude
    model = "gpt-4o" if api_name == "openai" else claude.MODEL
    own = definitions(api_name)[:1]  # type: ignore[arg-type]  # the agent's history_search
    upstream.script(
        [Reply("Plain."), ToolCalls((("history_search", {"query": "x"}),)), Reply("Also.")]
    )
    with proxy(settings, db_url, upstream) as base:
        await _session(base, f"off-{api_name}", model, config={})
        reply, headers = await ask(
            base, f"off-{api_name}", [{"role": "user", "content": "hi"}], False
        )
        assert "x-compactd-recall-rounds" not in headers
        own_tools = gpt.TOOLS if api_name == "openai" else claude.TOOLS
        assert upstream.requests[0].json["tools"] == own_tools
        # The agent answers history_search itself: its call goes to the agent, and the
        # other recall tool is still offered.
        await _session(base, f"own-{api_name}", model)
        reply, headers = await ask(
            base, f"own-{api_name}", [{"role": "user", "content": "hi"}], False, tools=own
        )
        assert _calls_of(api_name, reply) == ["history_search"]
        assert headers["x-compactd-recall-rounds"] == "0"
        assert upstream.requests[1].json["tools"] == [*own, definitions(api_name)[1]]  # type: ignore[arg-type]


async def test_the_setting_is_a_session_config_field(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as http:
            r = await http.post("/v1/sessions", json={"id": "c", "model": "gpt-4o"})
            assert r.json()["config"]["recall"]["proxy_tools"] is False
            r = await http.patch(
                "/v1/sessions/c", json={"config": {"recall": {"proxy_tools": "yes please"}}}
            )
            assert r.status_code == 422, r.text
            assert "proxy_tools" in r.text
            r = await http.patch(
                "/v1/sessions/c", json={"config": {"recall": {"proxy_tools": True}}}
            )
            assert r.status_code == 200, r.text
            assert r.json()["config"]["recall"]["proxy_tools"] is True
