"""The upstream LLM client against a real HTTP server playing OpenAI and Anthropic."""

from __future__ import annotations

import asyncio
import math
import socket
import time
import traceback
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from itertools import pairwise
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.formats.storable import find_unstorable
from app.upstream import (
    Completion,
    UpstreamConfig,
    UpstreamError,
    backoff_delay,
    complete,
    parse_retry_after,
)
from app.upstream.client import MAX_EXCERPT_CHARS, MAX_RETRY_AFTER_SECONDS, storable
from tests.upstream_server import (
    Close,
    Drip,
    Empty,
    Garbage,
    Hang,
    Reply,
    Status,
    Upstream,
    context_overflow,
    default_summary,
)

APIS = ["openai", "anthropic"]
KEY = "sk-test-4f9c2a7e61d84b0bb3e5"
SYSTEM = "You summarise coding sessions."
PROMPT = "Fix the flaky login test\nand the rest of the history."


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def config_for(upstream: Upstream, api: Any, **overrides: Any) -> UpstreamConfig:
    upstream.api_key = KEY
    overrides.setdefault("timeout_seconds", 5.0)
    return UpstreamConfig(api=api, base_url=upstream.url, api_key=KEY, **overrides)


async def call(http: httpx.AsyncClient, config: UpstreamConfig, prompt: str = PROMPT) -> Completion:
    return await complete(http, config, model="summariser-1", system=SYSTEM, prompt=prompt)


async def failure(
    http: httpx.AsyncClient, config: UpstreamConfig, prompt: str = PROMPT
) -> UpstreamError:
    with pytest.raises(UpstreamError) as caught:
        await call(http, config, prompt)
    return caught.value


# Success


@pytest.mark.parametrize("api", APIS)
async def test_default_answer_comes_back_with_usage(
    http: httpx.AsyncClient, upstream: Upstream, api: str
) -> None:
    done = await call(http, config_for(upstream, api))

    assert done.text == default_summary(PROMPT)
    assert done.model == "summariser-1"
    assert done.usage["input_tokens"] > 0
    assert done.usage["output_tokens"] > 0
    assert done.finish_reason == ("stop" if api == "openai" else "end_turn")
    assert not done.truncated
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    assert [r.path for r in upstream.requests] == [path]


async def test_openai_request_shape(http: httpx.AsyncClient, upstream: Upstream) -> None:
    await call(http, config_for(upstream, "openai", max_output_tokens=1234))

    (sent,) = upstream.requests
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert "x-api-key" not in sent.headers
    assert sent.headers["content-type"] == "application/json"
    assert sent.json == {
        "model": "summariser-1",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": PROMPT},
        ],
        "max_tokens": 1234,
        "stream": False,
    }


async def test_openai_reasoning_models_get_max_completion_tokens_and_temperature(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    config = config_for(
        upstream, "openai", max_tokens_field="max_completion_tokens", temperature=0.2
    )
    await call(http, config)

    body = upstream.requests[0].json
    assert body["max_completion_tokens"] == 4096
    assert "max_tokens" not in body
    assert body["temperature"] == 0.2


async def test_anthropic_request_shape(http: httpx.AsyncClient, upstream: Upstream) -> None:
    await call(http, config_for(upstream, "anthropic"))

    (sent,) = upstream.requests
    assert sent.headers["x-api-key"] == KEY
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in sent.headers
    assert sent.json == {
        "model": "summariser-1",
        "max_tokens": 4096,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": PROMPT}],
    }


@pytest.mark.parametrize("api", APIS)
async def test_no_key_sends_no_credentials(
    http: httpx.AsyncClient, upstream: Upstream, api: Any
) -> None:
    config = UpstreamConfig(api=api, base_url=upstream.url + "/", timeout_seconds=5)
    await call(http, config)

    headers = upstream.requests[0].headers
    assert "authorization" not in headers
    assert "x-api-key" not in headers


@pytest.mark.parametrize("api", APIS)
async def test_wrong_key_is_a_client_error(
    http: httpx.AsyncClient, upstream: Upstream, api: Any
) -> None:
    config = config_for(upstream, api)
    upstream.api_key = "sk-the-right-one"

    error = await failure(http, config)

    assert (error.kind, error.status, error.retryable) == ("client", 401, False)


async def test_openai_usage_normalised_with_cache_and_reasoning(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script(
        [
            Reply(
                "Summary.",
                usage={
                    "prompt_tokens": 1200,
                    "completion_tokens": 300,
                    "total_tokens": 1500,
                    "prompt_tokens_details": {"cached_tokens": 1024},
                    "completion_tokens_details": {"reasoning_tokens": 200},
                },
                model="gpt-4o-mini-2024-07-18",
            )
        ]
    )
    done = await call(http, config_for(upstream, "openai"))

    assert done.usage == {
        "input_tokens": 1200,
        "output_tokens": 300,
        "cache_read_tokens": 1024,
        "reasoning_tokens": 200,
    }
    assert done.model == "gpt-4o-mini-2024-07-18"


async def test_anthropic_usage_counts_cached_prompt_as_input(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    usage = {
        "input_tokens": 50,
        "output_tokens": 400,
        "cache_creation_input_tokens": 2000,
        "cache_read_input_tokens": 8000,
    }
    upstream.script([Reply("Summary.", usage=usage)])
    done = await call(http, config_for(upstream, "anthropic"))

    assert done.usage == {
        "input_tokens": 10050,
        "output_tokens": 400,
        "cache_read_tokens": 8000,
        "cache_write_tokens": 2000,
    }


@pytest.mark.parametrize(("api", "reason"), [("openai", "length"), ("anthropic", "max_tokens")])
async def test_cut_off_answer_is_returned_and_flagged(
    http: httpx.AsyncClient, upstream: Upstream, api: Any, reason: str
) -> None:
    upstream.script([Reply("## Goal\nHalf a summ", finish_reason=reason)])
    done = await call(http, config_for(upstream, api))

    assert done.text == "## Goal\nHalf a summ"
    assert done.truncated


async def test_usage_missing_is_empty(http: httpx.AsyncClient, upstream: Upstream) -> None:
    body = {"choices": [{"message": {"role": "assistant", "content": "ok"}}]}
    upstream.script([Status(200, body=body)])
    done = await call(http, config_for(upstream, "openai"))

    assert (done.text, done.usage, done.finish_reason, done.model) == (
        "ok",
        {},
        None,
        "summariser-1",
    )


# Rate limits and server errors


@pytest.mark.parametrize("api", APIS)
async def test_429_with_retry_after_seconds(
    http: httpx.AsyncClient, upstream: Upstream, api: Any
) -> None:
    upstream.script([Status(429, headers={"Retry-After": "7"})])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable) == ("rate_limited", 429, True)
    assert error.retry_after == 7.0
    assert error.overflow is None


async def test_429_with_retry_after_http_date(http: httpx.AsyncClient, upstream: Upstream) -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    upstream.script([Status(429, headers={"Retry-After": format_datetime(when, usegmt=True)})])
    error = await failure(http, config_for(upstream, "anthropic"))

    assert error.kind == "rate_limited"
    assert error.retry_after is not None
    assert 25 <= error.retry_after <= 31


async def test_retry_after_ms_wins_over_retry_after(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script([Status(429, headers={"retry-after-ms": "1500", "Retry-After": "9"})])
    error = await failure(http, config_for(upstream, "openai"))

    assert error.retry_after == 1.5


async def test_429_without_retry_after(http: httpx.AsyncClient, upstream: Upstream) -> None:
    upstream.script([Status(429)])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.retry_after, error.retryable) == ("rate_limited", None, True)
    assert "rate_limit_exceeded" in error.message


async def test_429_out_of_quota_is_not_retried(http: httpx.AsyncClient, upstream: Upstream) -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    upstream.script([Status(429, body=body)])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.retryable) == ("rate_limited", False)


@pytest.mark.parametrize(
    ("api", "code"), [("openai", 500), ("openai", 503), ("anthropic", 500), ("anthropic", 529)]
)
async def test_server_errors_are_retryable(
    http: httpx.AsyncClient, upstream: Upstream, api: Any, code: int
) -> None:
    upstream.script([Status(code)])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable) == ("server", code, True)
    assert error.overflow is None


async def test_anthropic_overloaded_says_so(http: httpx.AsyncClient, upstream: Upstream) -> None:
    upstream.script([Status(529, headers={"retry-after": "3"})])
    error = await failure(http, config_for(upstream, "anthropic"))

    assert "(overloaded_error) Overloaded" in error.message
    assert error.retry_after == 3.0


async def test_408_is_a_timeout(http: httpx.AsyncClient, upstream: Upstream) -> None:
    upstream.script([Status(408, body="Request Timeout")])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.retryable) == ("timeout", True)


# Client errors and context overflow


@pytest.mark.parametrize("api", APIS)
async def test_400_is_not_retryable(http: httpx.AsyncClient, upstream: Upstream, api: Any) -> None:
    upstream.script([Status(400, body=None)])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable, error.overflow) == (
        "client",
        400,
        False,
        None,
    )
    assert "invalid_request_error" in error.message


async def test_400_output_cap_is_not_an_overflow(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    body = {
        "error": {
            "message": "max_tokens is too large: 50000. This model supports at most 16384 "
            "completion tokens, whereas you provided 50000.",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "invalid_value",
        }
    }
    upstream.script([Status(400, body=body)])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.overflow) == ("client", None)


@pytest.mark.parametrize(
    ("api", "provider", "requested", "limit"),
    [("openai", "openai", 9000, 8192), ("anthropic", "anthropic", 208310, 200000)],
)
async def test_400_context_overflow_is_recognised(
    http: httpx.AsyncClient,
    upstream: Upstream,
    api: Any,
    provider: str,
    requested: int,
    limit: int,
) -> None:
    upstream.script([context_overflow(api)])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable) == ("client", 400, False)
    assert error.overflow is not None
    assert error.overflow.overflow
    assert error.overflow.provider == provider
    assert (error.overflow.requested_tokens, error.overflow.limit_tokens) == (requested, limit)


async def test_overflow_answered_with_a_500_is_still_an_overflow(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    body = {
        "error": {
            "code": 500,
            "message": "the request exceeds the available context size, try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 40000,
            "n_ctx": 32768,
        }
    }
    upstream.script([Status(500, body=body)])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.retryable) == ("client", False)
    assert error.overflow is not None
    assert error.overflow.limit_tokens == 32768


async def test_error_inside_a_200_is_read_by_its_code(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    # OpenRouter relays a provider failure as a 200 whose body is only an error.
    upstream.script(
        [
            Status(200, body={"error": {"code": 429, "message": "Rate limit exceeded"}}),
            Status(200, body={"error": {"message": "Provider returned error"}}),
        ]
    )
    config = config_for(upstream, "openai")

    limited = await failure(http, config)
    broken = await failure(http, config)

    assert (limited.kind, limited.status, limited.retryable) == ("rate_limited", 429, True)
    assert (broken.kind, broken.status, broken.retryable) == ("server", None, True)


async def test_redirect_is_a_configuration_error(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script([Status(307, body="", headers={"location": "https://elsewhere.test/v1"})])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.status, error.retryable) == ("client", 307, False)
    assert "base_url" in error.message


# Unusable 200s


@pytest.mark.parametrize("api", APIS)
async def test_empty_answer(http: httpx.AsyncClient, upstream: Upstream, api: Any) -> None:
    upstream.script([Empty()])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable) == ("empty", 200, True)


@pytest.mark.parametrize("api", APIS)
async def test_whitespace_answer_is_empty(
    http: httpx.AsyncClient, upstream: Upstream, api: Any
) -> None:
    upstream.script([Reply(" \n\t ")])
    error = await failure(http, config_for(upstream, api))

    assert error.kind == "empty"


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"id": "x", "object": "chat.completion", "choices": []}, id="no-choices"),
        pytest.param({"id": "x", "object": "chat.completion"}, id="choices-missing"),
        pytest.param(
            {
                "choices": [
                    {
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "refusal": "I'm sorry, I cannot help with that.",
                        },
                        "finish_reason": "stop",
                    }
                ]
            },
            id="refusal",
        ),
        pytest.param(
            {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": "Partial"},
                        "finish_reason": "content_filter",
                    }
                ]
            },
            id="content-filter",
        ),
        pytest.param(
            {
                "choices": [
                    {"message": {"role": "assistant", "content": ""}, "finish_reason": "length"}
                ],
                "usage": {"prompt_tokens": 900, "completion_tokens": 4096},
            },
            id="reasoning-ate-the-budget",
        ),
    ],
)
async def test_openai_answers_without_text_are_empty(
    http: httpx.AsyncClient, upstream: Upstream, body: dict[str, Any]
) -> None:
    upstream.script([Status(200, body=body)])
    error = await failure(http, config_for(upstream, "openai"))

    assert (error.kind, error.retryable) == ("empty", True)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"type": "message", "content": [], "stop_reason": "refusal"}, id="refusal"),
        pytest.param(
            {
                "type": "message",
                "content": [{"type": "thinking", "thinking": "Let me see...", "signature": "x"}],
                "stop_reason": "max_tokens",
            },
            id="only-thinking",
        ),
    ],
)
async def test_anthropic_answers_without_text_are_empty(
    http: httpx.AsyncClient, upstream: Upstream, body: dict[str, Any]
) -> None:
    upstream.script([Status(200, body=body)])
    error = await failure(http, config_for(upstream, "anthropic"))

    assert error.kind == "empty"


async def test_anthropic_text_blocks_are_joined_and_others_skipped(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    body = {
        "type": "message",
        "model": "claude-haiku-4-5",
        "content": [
            {"type": "thinking", "thinking": "Plan the summary.", "signature": "x"},
            {"type": "text", "text": "## Goal\n"},
            {"type": "text", "text": "Ship it."},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }
    upstream.script([Status(200, body=body)])
    done = await call(http, config_for(upstream, "anthropic"))

    assert (done.text, done.model) == ("## Goal\nShip it.", "claude-haiku-4-5")


@pytest.mark.parametrize("api", APIS)
async def test_garbage_is_malformed(http: httpx.AsyncClient, upstream: Upstream, api: Any) -> None:
    upstream.script([Garbage()])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable) == ("malformed", 200, True)
    assert "502 Bad Gateway" in error.message


@pytest.mark.parametrize(
    ("api", "body"),
    [
        ("openai", {"choices": "none"}),
        ("openai", {"choices": [{"message": "text"}]}),
        ("openai", {"choices": [{"message": {"content": 42}}]}),
        ("anthropic", {"content": "text"}),
        ("anthropic", {"content": ["text"]}),
    ],
)
async def test_wrong_shape_is_malformed(
    http: httpx.AsyncClient, upstream: Upstream, api: Any, body: dict[str, Any]
) -> None:
    upstream.script([Status(200, body=body)])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.retryable) == ("malformed", True)


async def test_json_that_is_not_an_object_is_malformed(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script([Status(200, body="[1, 2, 3]")])
    error = await failure(http, config_for(upstream, "openai"))

    assert error.kind == "malformed"


# Timeouts and dropped connections


@pytest.mark.parametrize("api", APIS)
async def test_hang_is_a_timeout(http: httpx.AsyncClient, upstream: Upstream, api: Any) -> None:
    upstream.script([Hang(5)])
    started = time.monotonic()
    error = await failure(http, config_for(upstream, api, timeout_seconds=0.3))

    assert (error.kind, error.status, error.retryable) == ("timeout", None, True)
    assert 0.25 <= time.monotonic() - started < 2


async def test_timeout_bounds_the_whole_call_not_each_read(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    # Never silent for 0.35 s, so no single read times out, but ~1.5 s in all.
    upstream.script([Drip(0.05, chunk=8, then=Reply("x" * 40))])
    started = time.monotonic()
    error = await failure(http, config_for(upstream, "openai", timeout_seconds=0.35))

    assert error.kind == "timeout"
    assert time.monotonic() - started < 1


async def test_a_slow_but_steady_answer_within_the_deadline_arrives(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script([Drip(0.01, chunk=64)])
    done = await call(http, config_for(upstream, "anthropic", timeout_seconds=5))

    assert done.text == default_summary(PROMPT)


# Alone in a parallel run: the quick answer must come within 0.5 s, the slow one not in 1 s.
@pytest.mark.alone
async def test_a_hang_does_not_hold_up_other_requests(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script([Hang(1.0, then=Reply("slow")), Reply("fast")])
    config = config_for(upstream, "openai")
    slow = asyncio.ensure_future(call(http, config))
    await asyncio.to_thread(upstream.wait_for, 1)

    started = time.monotonic()
    fast = await call(http, config)

    assert fast.text == "fast"
    assert time.monotonic() - started < 0.5
    assert not slow.done()
    assert (await slow).text == "slow"


@pytest.mark.parametrize("api", APIS)
async def test_close_mid_response_is_a_connection_error(
    http: httpx.AsyncClient, upstream: Upstream, api: Any
) -> None:
    upstream.script([Close()])
    error = await failure(http, config_for(upstream, api))

    assert (error.kind, error.status, error.retryable) == ("connection", None, True)
    assert "RemoteProtocolError" in error.message


async def test_the_shared_client_survives_failures(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    upstream.script([Close(), Hang(5), Garbage()])
    config = config_for(upstream, "anthropic", timeout_seconds=0.3)

    kinds = [(await failure(http, config)).kind for _ in range(3)]
    done = await call(http, config)

    assert kinds == ["connection", "timeout", "malformed"]
    assert done.text == default_summary(PROMPT)
    assert not http.is_closed


async def test_connection_refused(http: httpx.AsyncClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound but not listening: connections are refused
        config = UpstreamConfig(
            api="openai", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, timeout_seconds=2
        )
        error = await failure(http, config)

    assert (error.kind, error.retryable) == ("connection", True)


# Secrets and excerpts


@pytest.mark.parametrize(
    "action",
    [
        pytest.param(
            Status(401, body={"error": {"message": f"Incorrect API key provided: {KEY}."}}),
            id="401-echo",
        ),
        pytest.param(Status(500, body=f"upstream proxy failed for key={KEY}"), id="500-text"),
        pytest.param(Status(429, body={"error": f"slow down {KEY}"}), id="429-echo"),
        pytest.param(Garbage(f"<html>Authorization: Bearer {KEY}</html>"), id="garbage"),
        pytest.param(
            Status(200, body={"choices": [{"message": {"content": 1}}], "key": KEY}),
            id="malformed",
        ),
        pytest.param(
            Status(
                200,
                body={"choices": [{"message": {"content": None, "refusal": f"No, {KEY}"}}]},
            ),
            id="refusal",
        ),
        pytest.param(Hang(5), id="timeout"),
        pytest.param(Close(), id="close"),
    ],
)
async def test_the_api_key_never_appears_in_errors(
    http: httpx.AsyncClient, upstream: Upstream, action: Any
) -> None:
    upstream.script([action])
    config = config_for(upstream, "openai", timeout_seconds=0.3)
    error = await failure(http, config)

    logged = "".join(traceback.format_exception(error))  # as a log line would show it
    for text in (logged, repr(error), error.message, *map(str, error.args)):
        assert KEY not in text
    assert KEY not in repr(config)


async def test_echoed_key_is_shown_redacted(http: httpx.AsyncClient, upstream: Upstream) -> None:
    upstream.script([Status(403, body={"error": {"message": f"key {KEY} is disabled"}})])
    error = await failure(http, config_for(upstream, "openai"))

    assert "key [redacted] is disabled" in error.message


async def test_long_bodies_are_cut(http: httpx.AsyncClient, upstream: Upstream) -> None:
    upstream.script([Status(502, body="<html>" + "x" * 20_000 + "</html>"), Garbage("y" * 9000)])
    config = config_for(upstream, "anthropic")

    for _ in range(2):
        error = await failure(http, config)
        assert len(error.message) < MAX_EXCERPT_CHARS + 100
        assert error.message.endswith("…")


async def test_lone_surrogates_in_the_prompt_are_sent(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    done = await call(http, config_for(upstream, "openai"), prompt="broken \ud800 text")

    assert done.text
    assert upstream.requests[0].json["messages"][1]["content"] == "broken ? text"


# What the upstream sends is cleaned before anyone can store it


@pytest.mark.parametrize("api", APIS)
async def test_nul_in_a_replys_fields_is_dropped(
    http: httpx.AsyncClient, upstream: Upstream, api: Any
) -> None:
    upstream.script([Reply("A summary\x00 of it.", model="gpt\x00-4o", finish_reason="stop\x00")])
    done = await call(http, config_for(upstream, api))

    assert (done.text, done.model, done.finish_reason) == ("A summary of it.", "gpt-4o", "stop")
    assert done.usage["input_tokens"] > 0


async def test_a_reply_with_a_lone_surrogate_is_read_not_malformed(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    raw = (
        '{"model": "gpt\\ud800-4o", "choices": [{"message": {"content": "A \\udfff summary."},'
        ' "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 4}}'
    )
    upstream.script([Status(200, body=raw)])
    done = await call(http, config_for(upstream, "openai"))

    assert (done.text, done.model) == ("A ? summary.", "gpt?-4o")
    assert done.usage == {"input_tokens": 9, "output_tokens": 4}


async def test_usage_counts_beyond_64_bits_are_dropped_not_stored(
    http: httpx.AsyncClient, upstream: Upstream
) -> None:
    """The standard library's fallback parser keeps integers of any size; the job's
    record is JSON that holds 64-bit ones only, so a larger count would make the
    commit fail and throw the good summary away."""
    raw = (
        '{"model": "gpt\\ud800-4o", "choices": [{"message": {"content": "A summary."},'
        ' "finish_reason": "stop"}], "usage": {"prompt_tokens": 99999999999999999999999,'
        ' "completion_tokens": 4}}'
    )
    upstream.script([Status(200, body=raw)])
    done = await call(http, config_for(upstream, "openai"))

    assert done.text == "A summary."
    assert done.usage == {"output_tokens": 4}
    orjson.dumps(done.usage)  # storable as the job's record


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"error": {"message": "over\x00loaded", "type": "server_error"}}, "overloaded"),
        ('{"error": {"message": "bad \\ud800 gateway"}}', "bad ? gateway"),
        ("plain \x00text from a proxy", "plain text from a proxy"),
    ],
    ids=["nul-json", "lone-surrogate-json", "nul-text"],
)
async def test_odd_characters_in_an_error_are_cleaned(
    http: httpx.AsyncClient, upstream: Upstream, body: Any, said: str
) -> None:
    upstream.script([Status(500, body=body)])
    error = await failure(http, config_for(upstream, "openai"))

    assert error.kind == "server"
    assert said in error.message
    assert said in str(error)
    assert find_unstorable(error.message, "") is None


@given(st.text())
def test_storable_text_is_storable_and_clean_text_is_kept(text: str) -> None:
    cleaned = storable(text)
    assert find_unstorable(cleaned, "") is None
    assert storable(cleaned) == cleaned
    if find_unstorable(text, "") is None:
        assert cleaned == text


# Configuration


@pytest.mark.parametrize(
    "overrides",
    [
        {"base_url": "api.openai.com/v1"},
        {"base_url": "ftp://example.com/v1"},
        {"base_url": "http://[::1"},
        {"timeout_seconds": 0},
        {"timeout_seconds": math.inf},
        {"max_output_tokens": 0},
        {"api_key": "sk-with\nnewline"},
        {"api": "gemini"},
    ],
)
def test_bad_configuration_is_refused(overrides: dict[str, Any]) -> None:
    settings_: dict[str, Any] = {
        "api": "openai",
        "base_url": "https://api.openai.com/v1",
        "timeout_seconds": 30.0,
        "api_key": KEY,
    }
    settings_.update(overrides)
    with pytest.raises(ValueError, match=r"\w") as caught:
        UpstreamConfig(**settings_)
    assert KEY not in str(caught.value)


# parse_retry_after


NOW = 1_750_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "12"}, 12.0),
        ({"retry-after": " 0.5 "}, 0.5),
        ({"retry-after": "0"}, 0.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "3"}, 0.25),
        ({"retry-after-ms": "soon", "retry-after": "3"}, 3.0),
        (
            {"retry-after": format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True)},
            90.0,
        ),
        ({"retry-after": format_datetime(datetime.fromtimestamp(NOW - 90, UTC), usegmt=True)}, 0.0),
        ({}, None),
        ({"retry-after": ""}, None),
        ({"retry-after": "-5"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "1_000"}, None),
        ({"retry-after": "tomorrow"}, None),
    ],
)
def test_parse_retry_after(headers: dict[str, str], expected: float | None) -> None:
    got = parse_retry_after(httpx.Headers(headers), now=NOW)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


@settings(max_examples=300, deadline=None)
@given(
    retry_after=st.text(max_size=40) | st.from_regex(r"[A-Za-z]{3}, \d{2} [A-Za-z]{3} \d{4}.*"),
    millis=st.none() | st.text(max_size=12),
)
def test_parse_retry_after_never_raises(retry_after: str, millis: str | None) -> None:
    # A plain mapping: httpx decodes received header values as Latin-1, so any of
    # U+0000..U+00FF can arrive, but httpx.Headers only builds from ASCII.
    headers = {"retry-after": retry_after}
    if millis is not None:
        headers["retry-after-ms"] = millis
    got = parse_retry_after(headers, now=NOW)

    assert got is None or (math.isfinite(got) and got >= 0)


# backoff_delay


def test_backoff_grows_then_is_capped() -> None:
    top = [
        backoff_delay(n, base=0.5, cap=30, retry_after=None, rand=lambda: 1.0) for n in range(1, 12)
    ]

    assert top[:7] == [0.5, 1, 2, 4, 8, 16, 30]
    assert all(a <= b for a, b in pairwise(top))
    assert set(top[6:]) == {30}


def test_backoff_is_full_jitter() -> None:
    for r in (0.0, 0.25, 0.5, 0.999):
        delay = backoff_delay(4, base=1, cap=60, retry_after=None, rand=lambda: r)  # noqa: B023
        assert delay == 8 * r


def test_retry_after_is_a_floor() -> None:
    assert backoff_delay(1, base=1, cap=60, retry_after=10, rand=lambda: 0.0) == 10
    assert backoff_delay(1, base=1, cap=60, retry_after=10, rand=lambda: 0.99) == 10
    # Above the floor, the jittered delay stands.
    assert backoff_delay(8, base=1, cap=60, retry_after=10, rand=lambda: 0.5) == 30


def test_retry_after_floor_is_capped() -> None:
    delay = backoff_delay(1, base=1, cap=60, retry_after=86_400, rand=lambda: 0.5)

    assert delay == MAX_RETRY_AFTER_SECONDS


def test_backoff_survives_absurd_attempts_and_inputs() -> None:
    assert backoff_delay(10**9, base=2, cap=120, retry_after=None, rand=lambda: 1.0) == 120
    assert backoff_delay(0, base=2, cap=120, retry_after=None, rand=lambda: 1.0) == 2
    assert backoff_delay(-3, base=2, cap=120, retry_after=math.nan, rand=lambda: 1.0) == 2
    assert backoff_delay(3, base=2, cap=120, retry_after=-1, rand=lambda: 7.0) == 8
    with pytest.raises(ValueError, match="non-negative"):
        backoff_delay(1, base=-1, cap=10, retry_after=None, rand=lambda: 0.5)


@settings(max_examples=300, deadline=None)
@given(
    attempt=st.integers(min_value=-5, max_value=10_000),
    base=st.floats(min_value=0, max_value=100),
    cap=st.floats(min_value=0, max_value=3600),
    retry_after=st.none() | st.floats(min_value=0, max_value=1e9),
    r=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_bounds(
    attempt: int, base: float, cap: float, retry_after: float | None, r: float
) -> None:
    delay = backoff_delay(attempt, base=base, cap=cap, retry_after=retry_after, rand=lambda: r)

    assert 0 <= delay <= max(cap, MAX_RETRY_AFTER_SECONDS)
    exponential = min(cap, base * 2.0 ** min(max(attempt, 1) - 1, 64))
    assert delay <= max(exponential, min(retry_after or 0, MAX_RETRY_AFTER_SECONDS))
    if retry_after is not None:
        assert delay >= min(retry_after, MAX_RETRY_AFTER_SECONDS)


@settings(max_examples=200, deadline=None)
@given(
    base=st.floats(min_value=0.01, max_value=10),
    cap=st.floats(min_value=0.01, max_value=600),
    r=st.floats(min_value=0, max_value=1, exclude_max=True),
)
def test_backoff_ceiling_never_shrinks(base: float, cap: float, r: float) -> None:
    delays = [
        backoff_delay(n, base=base, cap=cap, retry_after=None, rand=lambda: r) for n in range(1, 40)
    ]

    assert all(a <= b for a, b in pairwise(delays))
