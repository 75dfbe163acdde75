"""Every agent's wire as it is: what real agents send besides a plain Messages or Chat
Completions call reaches the upstream as they sent it (issue 28).

Claude Code (2.1.332, seen on a recording upstream) sends ``HEAD`` to its base URL, calls
``POST /v1/messages?beta=true``, names its betas in ``anthropic-beta``, and puts the
harness's context (environment, deferred tools) in ``role: "system"`` messages inside
``messages``, right after the user's turn, each with a per-turn ``output_config`` of its
own; its body carries ``context_management``, ``thinking``, ``output_config`` and
``metadata``. Only the history is compactd's to manage; the rest goes upstream as sent.
"""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from app.core.settings import Settings
from app.engine.window.context import check_anthropic_pairing
from tests.ops.conftest import create_key
from tests.proxy.support import (
    PROVIDER_KEY,
    anthropic_client,
    anthropic_message,
    api,
    proxy,
    settled,
    stored_history,
)
from tests.upstream_server import Reply, ToolCalls, Upstream

MODEL = "claude-opus-4-8"
# As Claude Code 2.1.332 names them: no mid-conversation-system beta, yet it sends system
# messages (the request's own messages then allow them).
BETAS = [
    "claude-code-20250219",
    "interleaved-thinking-2025-05-14",
    "context-management-2025-06-27",
    "per-turn-control-2026-07-01",
    "mid-conversation-tool-changes-2026-07-01",
    "effort-2025-11-24",
]
# Claude Code's JS SDK adds it to every beta call (this Python SDK does not).
BETA_QUERY = {"beta": "true"}
EFFORT = {"effort": "medium"}
CONTEXT_MANAGEMENT = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
SYSTEM: Any = [
    {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332;"},
    {
        "type": "text",
        "text": "You are Claude Code, Anthropic's official CLI for Claude.",
        "cache_control": {"type": "ephemeral"},
    },
]


def _tool(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "description": f"The {name} tool.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "What to run."}},
            "required": ["command"],
            "additionalProperties": False,
        },
    }


def _system_message(text: str, *, blocks: bool) -> dict[str, Any]:
    content: Any = (
        [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}] if blocks else text
    )
    return {"role": "system", "content": content, "output_config": EFFORT}


ENVIRONMENT = "# Environment\n - Primary working directory: /work/app\n - Platform: linux"
DEFERRED = "The following deferred tools are now available via ToolSearch:\nCronCreate"


# --- HEAD on a base URL ---------------------------------------------------------------


async def test_head_on_a_base_url_is_a_200_that_needs_nothing(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Claude Code's reachability check: an empty 200, with neither session header nor
    compactd key (here the service has keys), and nothing stored or sent upstream. The
    routes themselves answer another method with a 405 in the provider's shape."""
    key = await create_key(db_url, "tenant-head")
    with proxy(settings, db_url, upstream) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            for path in (
                "/proxy/anthropic",
                "/proxy/anthropic/",
                "/proxy/openai/v1",
                "/proxy/openai/v1/",
            ):
                r = await http.head(path)
                assert r.status_code == 200, (path, r.status_code)
                assert r.content == b""
                assert r.headers["content-length"] == "0"
            # The check is HEAD's only: anything else on a base needs the key.
            assert (await http.get("/proxy/anthropic")).status_code == 401
            assert (await http.head("/proxy/anthropic/v1")).status_code == 401
            keyed = {"X-Compactd-Key": key}
            for path, shape in (
                ("/proxy/anthropic/v1/messages", "anthropic"),
                ("/proxy/openai/v1/chat/completions", "openai"),
            ):
                for method in ("GET", "HEAD"):
                    r = await http.request(method, path, headers=keyed)
                    assert r.status_code == 405, (method, path, r.status_code)
                    assert "POST" in r.headers["allow"]
                    if method == "GET":
                        error = r.json()
                        if shape == "anthropic":
                            assert error["type"] == "error"
                            assert error["error"]["type"] == "invalid_request_error"
                        else:
                            assert error["error"]["type"] == "invalid_request_error"
            listed = await http.get("/v1/sessions", headers={"Authorization": f"Bearer {key}"})
            assert listed.status_code == 200, listed.text
            assert listed.json()["sessions"] == []
    assert upstream.requests == []


# --- query strings --------------------------------------------------------------------


async def test_the_agent_s_query_string_reaches_the_upstream(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """A beta call as Claude Code makes it goes to ``/v1/messages?beta=true``;
    an OpenAI client's query (an Azure ``api-version``) goes on as sent."""
    upstream.script([Reply("Hi."), Reply("Hello.")])
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, "query-anthropic") as client:
            message = await client.beta.messages.create(
                model=MODEL,
                max_tokens=64,
                messages=[{"role": "user", "content": "Hi?"}],
                betas=BETAS,
                extra_query=BETA_QUERY,
            )
        assert message.content[0].type == "text"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            r = await http.post(
                "/proxy/openai/v1/chat/completions?api-version=2024-10-21&tag=a%2Fb&tag=c",
                json={"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello?"}]},
                headers={
                    "X-Compactd-Session": "query-openai",
                    "Authorization": f"Bearer {PROVIDER_KEY}",
                },
            )
            assert r.status_code == 200, r.text
    first, second = upstream.requests
    assert (first.path, first.query) == ("/v1/messages", "beta=true")
    assert first.headers["anthropic-beta"] == ",".join(BETAS)
    assert (second.path, second.query) == (
        "/v1/chat/completions",
        "api-version=2024-10-21&tag=a%2Fb&tag=c",
    )


# --- role "system" messages -----------------------------------------------------------


async def _claude_code_call(client: Any, history: list[Any], *, tools: list[Any]) -> dict[str, Any]:
    """One streamed call as Claude Code makes it (the SDK's beta namespace)."""
    async with client.beta.messages.stream(
        model=MODEL,
        max_tokens=32_000,
        system=SYSTEM,
        messages=history,
        tools=tools,
        betas=BETAS,
        thinking={"type": "adaptive"},
        context_management=CONTEXT_MANAGEMENT,
        output_config=EFFORT,
        metadata={"user_id": '{"device_id":"d1","session_id":"s1"}'},
        extra_query=BETA_QUERY,
    ) as streamed:
        final = await streamed.get_final_message()
    return anthropic_message(final)


def _roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


async def test_system_messages_inside_messages_pass_through_with_their_role(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Claude Code's ``role: "system"`` messages reach the upstream as system messages,
    in their place and with their own keys, never as ``<system>`` text in a user turn;
    they are stored as system entries, and matched on the next call (which re-sends the
    first one as a string rather than blocks, as Claude Code does)."""
    upstream.script(
        [
            ToolCalls((("Bash", {"command": "ls"}),), text="Looking.", ids=("toolu_01",)),
            Reply("Two files: a.py and b.py."),
            Reply("You are welcome."),
        ]
    )
    tools = [_tool("Bash"), _tool("Read")]
    prompt = {
        "role": "user",
        "content": [
            {"type": "text", "text": "<system-reminder>\nAttribution...\n</system-reminder>"},
            {"type": "text", "text": "List the files here."},
        ],
    }
    sid = "cc-system-messages"
    with proxy(settings, db_url, upstream) as base:
        async with anthropic_client(base, sid) as client:
            history: list[Any] = [prompt, _system_message(ENVIRONMENT, blocks=True)]
            first = await _claude_code_call(client, history, tools=tools)
            result = {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_01",
                        "content": "a.py\nb.py",
                        "cache_control": {"type": "ephemeral"},
                    }
                ],
            }
            history = [
                prompt,
                _system_message(ENVIRONMENT, blocks=False),
                first,
                result,
                _system_message(DEFERRED, blocks=True),
            ]
            second = await _claude_code_call(client, history, tools=tools)
            history += [second, {"role": "user", "content": "Thanks."}]
            third = await _claude_code_call(client, history, tools=tools)
        assert third["content"][0]["text"] == "You are welcome."
        sent = upstream.requests
        assert len(sent) == 3
        for request in sent:
            assert "<system>" not in request.body.decode()
            messages = request.json["messages"]
            assert (
                check_anthropic_pairing(messages, allow_pending=False, system_messages=True) == []
            )
            assert request.query == "beta=true"
        environment = {
            "role": "system",
            "content": [{"type": "text", "text": ENVIRONMENT}],
            "output_config": EFFORT,
        }
        deferred = {**environment, "content": [{"type": "text", "text": DEFERRED}]}
        assert sent[0].json["messages"][1] == environment
        assert _roles(sent[1].json["messages"]) == ["user", "system", "assistant", "user", "system"]
        assert sent[1].json["messages"][4] == deferred
        assert _roles(sent[2].json["messages"]) == [
            "user",
            "system",
            "assistant",
            "user",
            "system",
            "assistant",
            "user",
        ]
        assert sent[2].json["messages"][1] == environment
        assert sent[2].json["messages"][4] == deferred
        async with api(base) as http:
            session = await settled(http, sid, 8)
            stored = await stored_history(http, sid, "anthropic")
            children = (await http.get("/v1/sessions", params={"parent_id": sid})).json()
        assert session["entry_count"] == 8  # nothing diverged: one session, one history
        assert children["sessions"] == []
        assert _roles(stored) == [
            "user",
            "system",
            "assistant",
            "user",
            "system",
            "assistant",
            "user",
            "assistant",
        ]
        # As first sent: its blocks with their cache_control, and its own keys.
        assert stored[1] == _system_message(ENVIRONMENT, blocks=True)
        assert stored[4] == _system_message(DEFERRED, blocks=True)


async def test_a_compaction_keeps_the_system_messages_whole(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """A history that outgrows the provider's window is compacted on the spot: the
    system messages are not the user's requests and are not summarized away; they are
    kept whole (the ones before the cut as the context's top-level system, after the
    agent's own), and every request stays valid for the API."""
    upstream.context_limit = 5_000
    sid = "cc-system-compacted"
    tools = [_tool("Bash")]
    turns = 10
    upstream.script(
        [
            step
            for turn in range(turns)
            for step in (
                ToolCalls((("Bash", {"command": f"cat f{turn}"}),), ids=(f"toolu_{turn:02d}",)),
                Reply(f"File {turn} read."),
            )
        ]
    )
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as http:
            r = await http.post(
                "/v1/sessions",
                json={
                    "id": sid,
                    "model": MODEL,
                    "context_window": 40_000,
                    "max_output_tokens": 4_000,
                    "config": {
                        "prune": {"enabled": False},
                        "compaction": {"keep_recent_tokens": 1_500, "auto_continue": False},
                    },
                },
            )
            assert r.status_code == 201, r.text
        history: list[Any] = []
        async with anthropic_client(base, sid) as client:
            for turn in range(turns):
                history += [
                    {"role": "user", "content": f"Read file {turn}."},
                    _system_message(f"Turn {turn}: the environment is unchanged.", blocks=False),
                ]
                reply = await _claude_code_call(client, history, tools=tools)
                lines = "\n".join(f"line {i} of file {turn}: some text here" for i in range(90))
                history += [
                    reply,
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": f"toolu_{turn:02d}",
                                "content": lines,
                            }
                        ],
                    },
                ]
                history.append(await _claude_code_call(client, history, tools=tools))
        sent = upstream.requests
        last = sent[-1].json
        # Compacted: the context opens with the summary, the first turns' outputs gone.
        opening = last["messages"][0]["content"][0]["text"]
        assert opening.startswith("The conversation history before this point was compacted")
        assert "line 0 of file 0" not in orjson.dumps(last["messages"]).decode()
        # A system message is no request of the user's: the summary does not quote it as one.
        assert "Turn 0: the environment" not in opening
        for request in sent:
            assert (
                check_anthropic_pairing(
                    request.json["messages"], allow_pending=True, system_messages=True
                )
                == []
            )
            # The agent's own system prompt first, as sent.
            assert request.json["system"][: len(SYSTEM)] == SYSTEM
        kept = orjson.dumps([last["system"], last["messages"]]).decode()
        for turn in range(turns):
            assert f"Turn {turn}: the environment is unchanged." in kept, turn
        async with api(base) as http:
            jobs = (await http.get(f"/v1/sessions/{sid}/compactions")).json()["compactions"]
        assert any(j["status"] == "succeeded" for j in jobs), jobs


# --- every other field as sent ----------------------------------------------------------


def _claude_code_body(history: list[Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": history,
        "system": SYSTEM,
        "tools": [_tool(f"Tool{i:02d}") for i in range(24)],
        "metadata": {"user_id": '{"device_id":"f88b","account_uuid":"","session_id":"738b"}'},
        "max_tokens": 32_000,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "context_management": CONTEXT_MANAGEMENT,
        "output_config": EFFORT,
        "temperature": 1,
        "a_field_no_one_knows": {"nested": [1, 2.5, None, "x"], "flag": True},
        "stream": True,
    }


CLAUDE_CODE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": ",".join(BETAS),
    "anthropic-dangerous-direct-browser-access": "true",
    "user-agent": "claude-cli/2.1.332 (external, sdk-cli)",
    "x-app": "cli",
    "x-claude-code-session-id": "738b05e6-5da4-443e-a147-9a3ff074218b",
    "x-stainless-retry-count": "0",
    "x-stainless-timeout": "600",
    "x-api-key": PROVIDER_KEY,
}


@pytest.mark.parametrize("call", [1, 2])
async def test_every_field_but_the_history_reaches_the_upstream_byte_equal(
    db_url: str, settings: Settings, upstream: Upstream, call: int
) -> None:
    """A Claude-Code-shaped request (system blocks with cache_control, 24 tools,
    metadata, thinking, context_management, an unknown field, several betas, ?beta=true):
    the upstream gets every top-level field but ``messages`` as the same bytes, in the
    same order, and every header of the agent's but the connection's and compactd's."""
    upstream.script(
        [ToolCalls((("Tool00", {"command": "ls"}),), ids=("toolu_01",)), Reply("Done.")]
    )
    sid = f"cc-fields-{call}"
    history: list[Any] = [
        {"role": "user", "content": "List the files."},
        _system_message(ENVIRONMENT, blocks=True),
    ]
    with proxy(settings, db_url, upstream) as base:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            headers = {**CLAUDE_CODE_HEADERS, "X-Compactd-Session": sid}
            bodies = []
            for turn in range(call):
                body = orjson.dumps(_claude_code_body(history))
                bodies.append(body)
                r = await http.post(
                    "/proxy/anthropic/v1/messages?beta=true",
                    content=body,
                    headers={**headers, "content-type": "application/json"},
                )
                assert r.status_code == 200, r.text
                assert r.headers["content-type"].startswith("text/event-stream")
                if turn + 1 < call:
                    await settled(http, sid, 3)
                    history += [
                        {
                            "role": "assistant",
                            "content": [
                                {
                                    "type": "tool_use",
                                    "id": "toolu_01",
                                    "name": "Tool00",
                                    "input": {"command": "ls"},
                                }
                            ],
                        },
                        {
                            "role": "user",
                            "content": [
                                {
                                    "type": "tool_result",
                                    "tool_use_id": "toolu_01",
                                    "content": "a.py",
                                }
                            ],
                        },
                    ]
    received = upstream.requests[-1]
    sent = orjson.loads(bodies[-1])
    assert received.query == "beta=true"
    assert list(received.json) == list(sent), "the same fields, in the same order"
    for name, value in sent.items():
        if name == "messages":
            continue
        piece = orjson.dumps(name) + b":" + orjson.dumps(value)
        assert piece in received.body, name
        assert piece in bodies[-1]
    assert (
        check_anthropic_pairing(
            received.json["messages"], allow_pending=False, system_messages=True
        )
        == []
    )
    assert received.json["messages"][1]["role"] == "system"
    for name, value in CLAUDE_CODE_HEADERS.items():
        assert received.headers.get(name) == value, name
    assert not any(k.startswith("x-compactd-") for k in received.headers)
    assert_valid_upstream_headers(received.headers)


def assert_valid_upstream_headers(headers: dict[str, str]) -> None:
    """The one body compactd sends is JSON, and its length is its own."""
    assert headers["content-type"] == "application/json"
    assert "content-length" in headers
