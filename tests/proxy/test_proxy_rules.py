"""The proxy's rules, through the official SDKs: a provider's overflow relieved and
retried, credentials that pass through and are never kept, compactd's own key, and one
call at a time on a session."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import anthropic
import asyncpg
import openai
import pytest

from app.core.settings import Settings
from tests import postgres
from tests.ops.conftest import create_key
from tests.proxy.support import (
    PROVIDER_KEY,
    anthropic_client,
    anthropic_message,
    api,
    assert_stored,
    assert_valid_upstream,
    openai_client,
    proxy,
    settled,
)
from tests.upstream_server import Hang, Reply, Status, Upstream, prompt_tokens

SYSTEM: Any = {"role": "system", "content": "You read files and report what they hold."}
CLIENT_SIDE = ("openai", "anthropic", "httpx2", "httpcore2")
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
# A window compactd believes in, and knobs small enough for a short test to use them.
SMALL: dict[str, Any] = {
    "model": "gpt-4o",
    "context_window": 40_000,
    "max_output_tokens": 4_000,
    "config": {
        "prune": {"protect_tokens": 2_000, "minimum_tokens": 500},
        # As in the sessions the proxy creates: its agent always sends its real next message.
        "compaction": {"keep_recent_tokens": 2_500, "auto_continue": False},
    },
}


def file_output(call: dict[str, Any], turn: int) -> dict[str, Any]:
    lines = "\n".join(f"line {i} of the file read at turn {turn}: some text" for i in range(90))
    return {"role": "tool", "tool_call_id": call["id"], "content": lines}


@pytest.mark.parametrize("prune", [True, False])
async def test_a_provider_overflow_is_relieved_and_the_call_retried_once(
    db_url: str, settings: Settings, upstream: Upstream, prune: bool
) -> None:
    """The provider's window is smaller than the one compactd was told: its 400 is
    relieved (prune; an emergency compaction when pruning cannot do it) and the call
    retried with a smaller context, which the provider takes. The agent sees none of it."""
    upstream.behaviour = "agent"
    upstream.context_limit = 6_000
    session = {**SMALL, "config": {**SMALL["config"], "prune": {**SMALL["config"]["prune"]}}}
    session["config"]["prune"]["enabled"] = prune
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as http:
            r = await http.post("/v1/sessions", json={"id": "overflow-1", **session})
            assert r.status_code == 201, r.text
        history: list[Any] = []
        async with openai_client(base, "overflow-1") as client:
            for turn in range(12):
                history.append({"role": "user", "content": f"Read the next file ({turn})."})
                completion = await client.chat.completions.create(
                    model="gpt-4o", messages=[SYSTEM, *history], tools=TOOLS
                )
                message = completion.choices[0].message.model_dump(exclude_unset=True)
                history.append(message)
                for call in message.get("tool_calls") or []:
                    history.append(file_output(call, turn))
                    completion = await client.chat.completions.create(
                        model="gpt-4o", messages=[SYSTEM, *history], tools=TOOLS
                    )
                    history.append(completion.choices[0].message.model_dump(exclude_unset=True))

        sent = upstream.requests
        refused = [i for i, r in enumerate(sent) if prompt_tokens(r.json) > upstream.context_limit]
        assert refused, "the history outgrew the provider's window"
        for i in refused:
            # Each refusal was retried at once with the same call's context, made smaller.
            retry = sent[i + 1]
            assert prompt_tokens(retry.json) <= upstream.context_limit
            assert prompt_tokens(retry.json) < prompt_tokens(sent[i].json)
            assert retry.json["messages"][-1] == sent[i].json["messages"][-1]
        for request in sent:
            assert_valid_upstream(request, "openai", budget=36_000)
        async with api(base) as http:
            # Compacted for the model, whole in storage.
            await assert_stored(http, "overflow-1", "openai", history)
            jobs = (await http.get("/v1/sessions/overflow-1/compactions")).json()["compactions"]
            stats = (await http.get("/v1/sessions/overflow-1")).json()
        if prune:
            # Old file contents hidden: enough, and the overflow's compaction is queued.
            assert stats["pruned_tokens"] > 0
            assert [(j["reason"], j["status"]) for j in jobs] == [("overflow", "queued")]
        else:
            # Compacted on the spot; the queued compaction it stood in for is cancelled.
            assert stats["pruned_tokens"] == 0
            assert ("emergency", "succeeded") in [(j["reason"], j["status"]) for j in jobs]
            assert stats["active_compaction_id"] is None


async def test_an_overflow_that_cannot_be_relieved_reaches_the_agent(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Nothing to prune or compact: the retry would not be smaller, so the provider's
    error goes to the agent as it came, and the call is not retried."""
    upstream.context_limit = 5
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "overflow-2") as client:
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "Hello there."}]
                )
        assert "maximum context length" in refused.value.message
        assert refused.value.code == "context_length_exceeded"
        assert len(upstream.requests) == 1


async def test_credentials_pass_through_and_are_never_stored_or_logged(
    db_url: str, settings: Settings, upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    for quiet in ("httpx", "httpcore"):  # as the service configures them (configure_logging)
        caplog.set_level(logging.WARNING, logger=quiet)
    caplog.set_level(logging.DEBUG)  # last: it sets the capturing handler's level too
    organization, project = "org-secret-b6c1d0e2", "proj_secret_5e8a7c"
    upstream.behaviour = "agent"
    upstream.script([Reply("First."), Status(401)])
    with proxy(settings, db_url, upstream, log_level="debug") as base:
        async with openai.AsyncOpenAI(
            base_url=f"{base}/proxy/openai/v1",
            api_key=PROVIDER_KEY,
            organization=organization,
            project=project,
            default_headers={"X-Compactd-Session": "secrets-1"},
            max_retries=0,
        ) as client:
            history: list[Any] = [{"role": "user", "content": "Hi."}]
            first = await client.chat.completions.create(model="gpt-4o", messages=history)
            history += [first.choices[0].message.model_dump(exclude_unset=True)]
            history += [{"role": "user", "content": "And again."}]
            with pytest.raises(openai.AuthenticationError):
                await client.chat.completions.create(model="gpt-4o", messages=history)
            async for _ in await client.chat.completions.create(
                model="gpt-4o", messages=history, tools=TOOLS, stream=True
            ):
                pass
        async with anthropic.AsyncAnthropic(
            base_url=f"{base}/proxy/anthropic",
            api_key=PROVIDER_KEY,
            default_headers={"X-Compactd-Session": "secrets-2", "anthropic-beta": "beta-x"},
            max_retries=0,
        ) as claude:
            await claude.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=100,
                messages=[{"role": "user", "content": "Hi."}],
            )

    sent = upstream.requests
    assert len(sent) == 4
    for request in sent[:3]:
        assert request.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
        assert request.headers["openai-organization"] == organization
        assert request.headers["openai-project"] == project
    # (This SDK sends its key as a Bearer token; older ones as x-api-key.)
    assert PROVIDER_KEY in (
        sent[3].headers.get("x-api-key"),
        sent[3].headers.get("authorization", "")[7:],
    )
    assert sent[3].headers["anthropic-beta"] == "beta-x"
    assert sent[3].headers["anthropic-version"]

    secrets = (PROVIDER_KEY, organization, project)
    # Not in any row of any table.
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        tables = [
            r["tablename"]
            for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ]
        dump = "\n".join(
            [
                row[0]
                for table in tables
                for row in await conn.fetch(f'SELECT row_to_json(t)::text FROM "{table}" AS t')
            ]
        )
    finally:
        await conn.close()
    assert "secrets-1" in dump  # the dump does hold the sessions
    for secret in secrets:
        assert secret not in dump
    # Not in any log record, message or field.
    # The service's records: the SDKs' own (openai, anthropic and their HTTP stack) are
    # the test's client side.
    served = [r for r in caplog.records if not r.name.startswith(CLIENT_SIDE)]
    assert any(r.name.startswith("compactd") for r in served)
    for record in served:
        text = f"{record.getMessage()} {record.__dict__}"
        for secret in secrets:
            assert secret not in text, record


async def test_keyed_mode_takes_compactd_s_key_in_its_own_header(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    key = await create_key(db_url, "tenant-a")
    other = await create_key(db_url, "tenant-b")
    upstream.script([Reply("Hello, tenant A.")])
    with proxy(settings, db_url, upstream, auth_cache_seconds=0.0) as base:
        async with openai_client(base, "keyed-1") as anonymous:
            with pytest.raises(openai.AuthenticationError) as refused:
                await anonymous.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "Hi."}]
                )
        assert "X-Compactd-Key" in refused.value.message
        assert refused.value.body["type"] == "authentication_error"  # type: ignore[index]
        async with openai_client(base, "keyed-1", **{"X-Compactd-Key": "cpd_bad_key"}) as forged:
            with pytest.raises(openai.AuthenticationError):
                await forged.chat.completions.create(
                    model="gpt-4o", messages=[{"role": "user", "content": "Hi."}]
                )
        assert upstream.requests == []

        async with openai_client(base, "keyed-1", **{"X-Compactd-Key": key}) as client:
            reply = await client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Hi."}]
            )
        assert reply.choices[0].message.content == "Hello, tenant A."
        (request,) = upstream.requests
        assert request.headers["authorization"] == f"Bearer {PROVIDER_KEY}"
        assert "x-compactd-key" not in request.headers
        assert key not in request.body.decode()

        async with api(base) as http:
            await settled(http, "keyed-1", 2, headers={"Authorization": f"Bearer {key}"})
            mine = await http.get(
                "/v1/sessions/keyed-1/messages", headers={"Authorization": f"Bearer {key}"}
            )
            assert mine.status_code == 200
            assert len(mine.json()["entries"]) == 2
            theirs = await http.get(
                "/v1/sessions/keyed-1", headers={"Authorization": f"Bearer {other}"}
            )
            assert theirs.status_code == 404


async def test_calls_on_one_session_take_turns(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Calls on one session at once: each waits for the one before, then is matched
    against the history it left. One sent with the same history (a retry while the first
    is still running) is the call that reply answered: it gets that reply, stored once,
    and no upstream call. One that does not carry the first one's reply departs from the
    stored history after its first message: it goes on on a branch from there."""
    upstream.script([Hang(0.5, then=Reply("The first answer.")), Reply("The other answer.")])
    history: list[Any] = [{"role": "user", "content": "Answer once."}]
    other: list[Any] = [*history, {"role": "user", "content": "Something else."}]
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "turns-1") as client:
            first = asyncio.ensure_future(
                client.chat.completions.create(model="gpt-4o", messages=history)
            )
            await asyncio.to_thread(upstream.wait_for, 1)  # the first holds the turn
            again = await client.chat.completions.create(model="gpt-4o", messages=history)
            assert first.done()  # the second waited for the first's turn to end
            answer = await first
            branched = await client.chat.completions.create(model="gpt-4o", messages=other)
        assert answer.choices[0].message.content == "The first answer."
        assert again.choices[0].message.content == "The first answer."
        assert again.choices[0].finish_reason == "stop"
        assert again.id == "chatcmpl-compactd-replay"
        assert branched.choices[0].message.content == "The other answer."
        assert len(upstream.requests) == 2
        assert upstream.requests[1].json["messages"] == other
        async with api(base) as http:
            await assert_stored(
                http,
                "turns-1",
                "openai",
                [*other, branched.choices[0].message.model_dump(exclude_unset=True)],
            )
            tree = (await http.get("/v1/sessions/turns-1/tree")).json()
            assert [(e["seq"], e["on_path"]) for e in tree["entries"]] == [
                (1, True),
                (2, False),
                (2, True),
                (3, True),
            ]


async def test_a_bad_body_is_refused_at_once_while_another_call_has_the_turn(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """A body that is no request is a 400 right away, whether the session's turn is free
    (the body is read with the turn taken) or another call has it (the body is read
    first): it never waits for the turn, nor takes it from the call that has it."""
    upstream.script([Hang(2.0, then=Reply("The slow answer."))])
    history: list[Any] = [{"role": "user", "content": "Take your time."}]
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "turns-bad") as client, api(base) as http:
            headers = {"X-Compactd-Session": "turns-bad", "Content-Type": "application/json"}
            free = await http.post(
                "/proxy/openai/v1/chat/completions", content=b"{not json", headers=headers
            )
            assert free.status_code == 400, free.text
            first = asyncio.ensure_future(
                client.chat.completions.create(model="gpt-4o", messages=history)
            )
            await asyncio.to_thread(upstream.wait_for, 1)  # the first has the turn
            started = asyncio.get_running_loop().time()
            busy = await http.post(
                "/proxy/openai/v1/chat/completions", content=b"{not json", headers=headers
            )
            took = asyncio.get_running_loop().time() - started
            assert busy.status_code == 400, busy.text
            assert busy.json()["error"]["param"] == "body"
            assert took < 1.0, took
            assert not first.done()
            answer = await first
        assert answer.choices[0].message.content == "The slow answer."
        assert len(upstream.requests) == 1


async def test_anthropic_overflow_is_relieved_too(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    upstream.behaviour = "agent"
    upstream.context_limit = 6_000
    tools: Any = [
        {
            "name": "read_file",
            "input_schema": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        }
    ]
    with proxy(settings, db_url, upstream) as base:
        async with api(base) as http:
            r = await http.post(
                "/v1/sessions", json={"id": "overflow-3", **SMALL, "model": "claude-sonnet-4-6"}
            )
            assert r.status_code == 201, r.text
        history: list[Any] = []
        async with anthropic_client(base, "overflow-3") as client:
            for turn in range(12):
                history.append({"role": "user", "content": f"Read the next file ({turn})."})
                while True:
                    reply = await client.messages.create(
                        model="claude-sonnet-4-6",
                        max_tokens=500,
                        system="You read files.",
                        messages=history,
                        tools=tools,
                    )
                    history.append(anthropic_message(reply))
                    uses = [b for b in reply.content if b.type == "tool_use"]
                    if not uses:
                        break
                    lines = "\n".join(f"line {i} read at turn {turn}" for i in range(120))
                    history.append(
                        {
                            "role": "user",
                            "content": [
                                {"type": "tool_result", "tool_use_id": u.id, "content": lines}
                                for u in uses
                            ],
                        }
                    )
                # The next user turn goes in its own message.
        sent = upstream.requests
        refused = [i for i, r in enumerate(sent) if prompt_tokens(r.json) > upstream.context_limit]
        assert refused
        for i in refused:
            assert prompt_tokens(sent[i + 1].json) <= upstream.context_limit
        for request in sent:
            assert_valid_upstream(request, "anthropic", budget=36_000)
            assert request.json["system"][0] == {"type": "text", "text": "You read files."} or (
                request.json["system"] == "You read files."
            )
        async with api(base) as http:
            await assert_stored(http, "overflow-3", "anthropic", history)


async def test_an_upstream_s_cookies_never_go_out_with_a_later_call(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """A cookie the upstream sets in its answer to one agent (a CDN's bot cookie, say) is
    neither passed back nor kept by compactd's client: no later call upstream, the same
    agent's or another's, carries it."""
    completion = {
        "id": "chatcmpl-cookie",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "First."},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14},
    }
    upstream.script(
        [
            Status(200, completion, {"set-cookie": "__cf_bm=agent-a-only; Path=/; HttpOnly"}),
            Reply("Second."),
            Reply("Third."),
        ]
    )
    with proxy(settings, db_url, upstream) as base:
        async with openai_client(base, "cookie-a") as a, openai_client(base, "cookie-b") as b:
            first = await a.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Hi"}]
            )
            assert "set-cookie" not in first.headers
            await b.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "Hello"}]
            )
            await a.chat.completions.create(
                model="gpt-4o",
                messages=[
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": "First."},
                    {"role": "user", "content": "And?"},
                ],
            )
    sent = upstream.requests
    assert len(sent) == 3
    assert [r.headers.get("cookie") for r in sent] == [None, None, None]
