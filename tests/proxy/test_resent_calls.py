"""A call sent again: an SDK that timed out and retries, an agent that lost an answer.
The stored history stays what the agent sent and received, and the session is never
stuck on a reply the agent did not get."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import openai
import pytest

from app.core.settings import Settings
from tests.proxy.support import (
    PROVIDER_KEY,
    anthropic_message,
    api,
    assert_stored,
    openai_stream_message,
    proxy,
    stored_history,
)
from tests.upstream_server import Hang, Reply, ToolCalls, Upstream

MODEL = {"openai": "gpt-4o", "anthropic": "claude-sonnet-4-6"}
Client = openai.AsyncOpenAI | anthropic.AsyncAnthropic


def client_of(base: str, api_name: str, session: str, timeout: float, retries: int) -> Client:
    headers = {"X-Compactd-Session": session}
    if api_name == "openai":
        return openai.AsyncOpenAI(
            base_url=f"{base}/proxy/openai/v1",
            api_key=PROVIDER_KEY,
            default_headers=headers,
            max_retries=retries,
            timeout=timeout,
        )
    return anthropic.AsyncAnthropic(
        base_url=f"{base}/proxy/anthropic",
        api_key=PROVIDER_KEY,
        default_headers=headers,
        max_retries=retries,
        timeout=timeout,
    )


async def ask(client: Client, history: list[Any], stream: bool = False) -> dict[str, Any]:
    """One call with ``history``; the reply as the agent keeps it in its history."""
    if isinstance(client, openai.AsyncOpenAI):
        if stream:
            chunks = [
                c
                async for c in await client.chat.completions.create(
                    model=MODEL["openai"], messages=history, stream=True
                )
            ]
            return openai_stream_message(chunks)
        completion = await client.chat.completions.create(model=MODEL["openai"], messages=history)
        return completion.choices[0].message.model_dump(exclude_unset=True)
    if stream:
        async with client.messages.stream(
            model=MODEL["anthropic"], max_tokens=64, messages=history
        ) as events:
            return anthropic_message(await events.get_final_message())
    message = await client.messages.create(
        model=MODEL["anthropic"], max_tokens=64, messages=history
    )
    return anthropic_message(message)


def texts(messages: list[dict[str, Any]]) -> list[str]:
    out: list[str] = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            out.append(content)
        for block in content if isinstance(content, list) else ():
            if block.get("type") == "text":
                out.append(block["text"])
    return out


@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_an_sdk_that_times_out_and_retries_is_not_stuck(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str
) -> None:
    """The SDK gives up after 1 s and retries; the model answers the first request
    after 2 s, to nobody. The call succeeds (or times out cleanly), the next call on the
    session is matched, and the stored history holds no reply the agent never got."""
    upstream.script([Hang(2.0, then=Reply("The slow answer.")), Reply("The quick answer.")])
    sid = f"retried-{api_name}"
    history: list[Any] = [{"role": "user", "content": "Answer, if you can."}]
    with proxy(settings, db_url, upstream) as base:
        async with (
            client_of(base, api_name, sid, timeout=1, retries=1) as impatient,
            client_of(base, api_name, sid, timeout=60, retries=0) as patient,
        ):
            try:
                reply = await ask(impatient, history)
            except (openai.APITimeoutError, anthropic.APITimeoutError):
                # Failed cleanly (a slow machine): the agent sends the call again.
                reply = await ask(patient, history)
            history.append(reply)
            history.append({"role": "user", "content": "Next."})
            history.append(await ask(patient, history))
        async with api(base) as http:
            await assert_stored(http, sid, api_name, history)
            stored = await stored_history(http, sid, api_name)
    assert "The slow answer." not in texts(stored)


@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_a_reply_the_agent_hung_up_on_is_not_stored(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str
) -> None:
    """The agent gave up before the model answered: the answer is not sent to anyone,
    and not stored (its usage is reported: the provider spent the tokens). The agent's
    next try is matched as the call it is, and answered."""
    upstream.script([Hang(1.5, then=Reply("Too late.")), Reply("In time.")])
    sid = f"hung-up-{api_name}"
    history: list[Any] = [{"role": "user", "content": "Quick, please."}]
    with proxy(settings, db_url, upstream) as base:
        async with client_of(base, api_name, sid, timeout=0.5, retries=0) as impatient:
            with pytest.raises((openai.APITimeoutError, anthropic.APITimeoutError)):
                await ask(impatient, history)
        async with client_of(base, api_name, sid, timeout=60, retries=0) as patient:
            # Waits for the first call's turn: the model's late answer came and went.
            history.append(await ask(patient, history))
        assert texts(history)[-1] == "In time."
        assert len(upstream.requests) == 2
        async with api(base) as http:
            await assert_stored(http, sid, api_name, history)
            session = (await http.get(f"/v1/sessions/{sid}")).json()
        assert session["usage_count"] == 2  # the tokens spent on the lost answer count


@pytest.mark.parametrize("api_name", ["openai", "anthropic"])
async def test_a_call_sent_again_gets_its_stored_reply(
    db_url: str, settings: Settings, upstream: Upstream, api_name: str
) -> None:
    """An answer sent that the agent did not read (its SDK timed out as it came) is
    stored: the call sent again, whole or streamed, gets that stored reply, with no
    upstream call and nothing stored twice; the agent then goes on from it."""
    upstream.script(
        [ToolCalls((("read_file", {"path": "a.py"}),), text="Reading."), Reply("Read it.")]
    )
    sid = f"again-{api_name}"
    history: list[Any] = [{"role": "user", "content": "What is in a.py?"}]
    with proxy(settings, db_url, upstream) as base:
        async with client_of(base, api_name, sid, timeout=60, retries=0) as client:
            first = await ask(client, history)
            assert await ask(client, history) == first
            # (The SDK's stream carries no null refusal, no empty annotations.)
            streamed = {k: v for k, v in first.items() if k not in ("refusal", "annotations")}
            assert await ask(client, history, stream=True) == streamed
            assert len(upstream.requests) == 1
            if isinstance(client, openai.AsyncOpenAI):
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL["openai"], messages=history
                )
                assert raw.headers["x-compactd-replay"] == "2"  # the stored reply's seq
                call_id = first["tool_calls"][0]["id"]
                result: Any = {"role": "tool", "tool_call_id": call_id, "content": "print(1)"}
            else:
                call_id = first["content"][1]["id"]
                result = {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "1"}],
                }
            history += [first, result]
            history.append(await ask(client, history))
        assert texts(history)[-1] == "Read it."
        assert len(upstream.requests) == 2
        async with api(base) as http:
            await assert_stored(http, sid, api_name, history)


async def test_a_replay_reads_as_the_provider_s_own_answer(
    db_url: str, settings: Settings, upstream: Upstream
) -> None:
    """Over plain HTTP: a replayed answer is the API's JSON, its usage none."""
    upstream.script([Reply("Once.")])
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Say it once."}]}
    headers = {"X-Compactd-Session": "again-raw", "Authorization": f"Bearer {PROVIDER_KEY}"}
    with proxy(settings, db_url, upstream) as base:
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            url = "/proxy/openai/v1/chat/completions"
            first = await http.post(url, json=body, headers=headers)
            assert first.status_code == 200
            again = await http.post(url, json=body, headers=headers)
        assert again.status_code == 200
        assert again.headers["content-type"] == "application/json"
        answer = again.json()
        assert answer["choices"][0]["message"]["content"] == "Once."
        assert answer["usage"] == {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        assert answer["model"] == "gpt-4o"
        assert len(upstream.requests) == 1
