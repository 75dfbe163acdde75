"""POST …/usage with what the providers' SDKs return, renamed nothing: the
usage objects and whole responses of the official openai and anthropic SDKs
(``model_dump()`` of their own types, every optional field filled, and with
nulls), Gemini's documented shapes, and the refusals."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from anthropic.types import (
    CacheCreation,
    Message,
    ServerToolUsage,
    TextBlock,
    ToolUseBlock,
    Usage,
)
from anthropic.types.output_tokens_details import OutputTokensDetails as AnthropicOutputDetails
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails
from openai.types.responses import Response, ResponseUsage
from openai.types.responses.response_usage import (
    InputTokensDetails,
    InputTokensDetailsCacheWriteTokensDetails,
    OutputTokensDetails,
)
from pydantic import BaseModel

from app.budget.schemas import USAGE_EXAMPLES
from tests.compactions.helpers import compaction, conversation, drain, overflow_error
from tests.conftest import make_session
from tests.helpers import append_ok, assert_problem, get_session, history

PROMPT = 9_000  # every fixture's whole prompt, however its provider splits it


def unfilled(model: BaseModel) -> list[str]:
    """The fields of an SDK object left null: the "every optional field filled"
    fixtures must have none, so that a field the SDK adds is noticed here."""
    return [name for name, value in model if value is None]


def openai_usage_full() -> CompletionUsage:
    usage = CompletionUsage(
        prompt_tokens=PROMPT,
        completion_tokens=300,
        total_tokens=PROMPT + 300,
        prompt_tokens_details=PromptTokensDetails(
            audio_tokens=0,
            cache_write_tokens=1_000,
            cached_tokens=6_000,
            image_tokens=0,
            text_tokens=PROMPT,
        ),
        completion_tokens_details=CompletionTokensDetails(
            accepted_prediction_tokens=0,
            audio_tokens=0,
            reasoning_tokens=120,
            rejected_prediction_tokens=0,
            text_tokens=180,
        ),
    )
    assert not unfilled(usage)
    assert not unfilled(usage.prompt_tokens_details)  # type: ignore[arg-type]
    assert not unfilled(usage.completion_tokens_details)  # type: ignore[arg-type]
    return usage


def responses_usage_full() -> ResponseUsage:
    usage = ResponseUsage(
        input_tokens=PROMPT,
        input_tokens_details=InputTokensDetails(
            cached_tokens=6_000,
            cache_write_tokens=1_000,
            cache_write_tokens_details=InputTokensDetailsCacheWriteTokensDetails(
                ttl_12h_tokens=0, ttl_30m_tokens=1_000
            ),
        ),
        output_tokens=300,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=120),
        total_tokens=PROMPT + 300,
    )
    assert not unfilled(usage)
    assert not unfilled(usage.input_tokens_details)
    return usage


def anthropic_usage_full() -> Usage:
    usage = Usage(
        input_tokens=2_000,
        output_tokens=300,
        cache_read_input_tokens=6_000,
        cache_creation_input_tokens=1_000,
        cache_creation=CacheCreation(ephemeral_5m_input_tokens=1_000, ephemeral_1h_input_tokens=0),
        server_tool_use=ServerToolUsage(web_search_requests=1, web_fetch_requests=0),
        service_tier="standard",
        inference_geo="us",
        speed="standard",
        output_tokens_details=AnthropicOutputDetails(thinking_tokens=100),
    )
    assert not unfilled(usage)
    return usage


# (name, body, usage_format, (input, cache_read, cache_write), finish_reason)
USAGE_OBJECTS: list[tuple[str, dict[str, Any], str, tuple[int, int, int], str | None]] = [
    (
        "openai CompletionUsage, every field",
        openai_usage_full().model_dump(),
        "openai_chat",
        (2_000, 6_000, 1_000),
        None,
    ),
    (
        "openai CompletionUsage, nulls",
        CompletionUsage(
            prompt_tokens=PROMPT, completion_tokens=3, total_tokens=PROMPT + 3
        ).model_dump(),
        "openai_chat",
        (PROMPT, 0, 0),
        None,
    ),
    (
        "openai CompletionUsage, details with nulls, and the finish reason",
        {
            **CompletionUsage(
                prompt_tokens=PROMPT,
                completion_tokens=3,
                total_tokens=PROMPT + 3,
                prompt_tokens_details=PromptTokensDetails(cached_tokens=4_000),
                completion_tokens_details=CompletionTokensDetails(),
            ).model_dump(),
            "finish_reason": "tool_calls",
        },
        "openai_chat",
        (5_000, 4_000, 0),
        "tool_calls",
    ),
    (
        "openai ResponseUsage, every field",
        responses_usage_full().model_dump(),
        "openai_responses",
        (2_000, 6_000, 1_000),
        None,
    ),
    (
        "anthropic Usage, every field, with stop_reason",
        {**anthropic_usage_full().model_dump(), "stop_reason": "end_turn"},
        "anthropic",
        (2_000, 6_000, 1_000),
        "end_turn",
    ),
    (
        "anthropic Usage, nulls",
        Usage(input_tokens=PROMPT, output_tokens=3).model_dump(),
        "anthropic",
        (PROMPT, 0, 0),
        None,
    ),
    (
        "anthropic Usage as JSON (mode=json)",
        anthropic_usage_full().model_dump(mode="json"),
        "anthropic",
        (2_000, 6_000, 1_000),
        None,
    ),
    (
        "gemini usageMetadata, REST names",
        {
            "promptTokenCount": PROMPT,
            "candidatesTokenCount": 200,
            "cachedContentTokenCount": 6_000,
            "toolUsePromptTokenCount": 50,
            "thoughtsTokenCount": 100,
            "totalTokenCount": PROMPT + 350,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": PROMPT}],
            "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 6_000}],
            "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 200}],
            "toolUsePromptTokensDetails": [{"modality": "TEXT", "tokenCount": 50}],
            "trafficType": "ON_DEMAND",
            "finishReason": "STOP",
        },
        "gemini",
        (3_000, 6_000, 0),
        "STOP",
    ),
    (
        "gemini usage_metadata, google-genai SDK names with nulls",
        {
            "cache_tokens_details": None,
            "cached_content_token_count": None,
            "candidates_token_count": 200,
            "candidates_tokens_details": None,
            "prompt_token_count": PROMPT,
            "prompt_tokens_details": [{"modality": "TEXT", "token_count": PROMPT}],
            "thoughts_token_count": None,
            "tool_use_prompt_token_count": None,
            "tool_use_prompt_tokens_details": None,
            "total_token_count": PROMPT + 200,
            "traffic_type": None,
            "finish_reason": "MAX_TOKENS",
        },
        "gemini",
        (PROMPT, 0, 0),
        "MAX_TOKENS",
    ),
]


async def session_with_history(client: httpx.AsyncClient, sid: str) -> dict[str, Any]:
    await make_session(client, id=sid, config={"prune": {"auto": False}})
    return await append_ok(
        client, sid, [{"role": "user", "content": "Explain the failing test. " * 400}]
    )


@pytest.mark.parametrize(
    ("body", "fmt", "figures", "reason"),
    [case[1:] for case in USAGE_OBJECTS],
    ids=[case[0] for case in USAGE_OBJECTS],
)
async def test_a_providers_usage_object_is_taken_as_its_sdk_gives_it(
    client: httpx.AsyncClient,
    body: dict[str, Any],
    fmt: str,
    figures: tuple[int, int, int],
    reason: str | None,
) -> None:
    await session_with_history(client, "u")
    r = await client.post("/v1/sessions/u/usage", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["usage_format"] == fmt
    assert answer["reported_prompt_tokens"] == sum(figures)
    assert answer["overflow"]["estimated_tokens"] == sum(figures)  # the exact base
    last = (await get_session(client, "u"))["last_usage"]
    assert (last["input_tokens"], last["cache_read_tokens"], last["cache_write_tokens"]) == figures
    assert last["finish_reason"] == reason
    assert last["usage_format"] == fmt


def chat_completion(finish_reason: str = "stop") -> ChatCompletion:
    return ChatCompletion(
        id="chatcmpl-1",
        object="chat.completion",
        created=1_700_000_000,
        model="gpt-4o-2024-08-06",
        system_fingerprint="fp_1",
        service_tier="default",
        choices=[
            Choice(
                index=0,
                finish_reason=finish_reason,
                logprobs=None,
                message=ChatCompletionMessage(role="assistant", content="All done."),
            )
        ],
        usage=openai_usage_full(),
    )


def responses_response(status: str = "completed", reason: str | None = None) -> Response:
    return Response.model_validate(
        {
            "id": "resp_1",
            "object": "response",
            "created_at": 1_700_000_000,
            "model": "gpt-4.1",
            "status": status,
            "incomplete_details": {"reason": reason} if reason else None,
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "All done.", "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [
                {
                    "type": "function",
                    "name": "bash",
                    "description": "Run a command.",
                    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
                    "strict": True,
                }
            ],
            "temperature": 1.0,
            "top_p": 1.0,
            "metadata": {"run": "7"},
            "usage": responses_usage_full().model_dump(),
        }
    )


def anthropic_message(stop_reason: str = "end_turn") -> Message:
    return Message(
        id="msg_01",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=[
            TextBlock(type="text", text="Reading it.", citations=None),
            ToolUseBlock(type="tool_use", id="toolu_1", name="read", input={"path": "a.py"}),
        ],
        stop_reason=stop_reason,
        stop_sequence=None,
        usage=anthropic_usage_full(),
    )


def gemini_response(finish_reason: str = "STOP") -> dict[str, Any]:
    """A GenerateContentResponse as the REST API returns it."""
    return {
        "candidates": [
            {
                "content": {"parts": [{"text": "All done."}], "role": "model"},
                "finishReason": finish_reason,
                "index": 0,
                "safetyRatings": [],
            }
        ],
        "usageMetadata": {
            "promptTokenCount": PROMPT,
            "candidatesTokenCount": 5,
            "cachedContentTokenCount": 6_000,
            "totalTokenCount": PROMPT + 5,
        },
        "modelVersion": "gemini-2.5-flash",
        "responseId": "r1",
    }


WHOLE: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "openai ChatCompletion",
        chat_completion("tool_calls").model_dump(),
        "openai_chat",
        "tool_calls",
    ),
    (
        "openai ChatCompletion as JSON",
        chat_completion().model_dump(mode="json"),
        "openai_chat",
        "stop",
    ),
    ("openai Response", responses_response().model_dump(), "openai_responses", "stop"),
    (
        "openai Response, incomplete at max_output_tokens",
        responses_response("incomplete", "max_output_tokens").model_dump(),
        "openai_responses",
        "length",
    ),
    ("anthropic Message", anthropic_message("tool_use").model_dump(), "anthropic", "tool_use"),
    ("gemini GenerateContentResponse", gemini_response("MAX_TOKENS"), "gemini", "MAX_TOKENS"),
]


@pytest.mark.parametrize(
    ("body", "fmt", "reason"), [c[1:] for c in WHOLE], ids=[c[0] for c in WHOLE]
)
async def test_a_whole_response_gives_its_usage_and_stop_reason(
    client: httpx.AsyncClient, body: dict[str, Any], fmt: str, reason: str
) -> None:
    await session_with_history(client, "w")
    r = await client.post("/v1/sessions/w/usage", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage_format"] == fmt
    assert r.json()["reported_prompt_tokens"] == PROMPT
    last = (await get_session(client, "w"))["last_usage"]
    assert last["finish_reason"] == reason
    assert last["input_tokens"] + last["cache_read_tokens"] + last["cache_write_tokens"] == PROMPT


async def test_a_whole_response_goes_with_the_reports_own_fields(client: httpx.AsyncClient) -> None:
    """context_version and tools_tokens beside a whole response; a Responses
    object's own tools are the request's, counted as the overhead."""
    appended = await session_with_history(client, "c")
    ctx = (await client.get("/v1/sessions/c/context")).json()
    body = {
        **anthropic_message().model_dump(),
        "context_version": ctx["version"],
        "tools_tokens": 321,
    }
    r = await client.post("/v1/sessions/c/usage", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["overhead_tokens"] == 321
    assert (await get_session(client, "c"))["last_usage"]["context_version"] == ctx["version"]
    assert appended["version"] < r.json()["version"]

    r = await client.post("/v1/sessions/c/usage", json=responses_response().model_dump())
    assert r.status_code == 200, r.text
    assert 0 < r.json()["overhead_tokens"] != 321  # the Response's own tools, counted


@pytest.mark.parametrize(
    ("stop", "continued"),
    [
        (anthropic_message("end_turn").model_dump(), False),
        (anthropic_message("max_tokens").model_dump(), True),
        (chat_completion("stop").model_dump(), False),
        (chat_completion("length").model_dump(), True),
        (responses_response().model_dump(), False),
        (responses_response("incomplete", "max_output_tokens").model_dump(), True),
        (gemini_response("STOP"), False),
        (gemini_response("MAX_TOKENS"), True),
        ({**anthropic_usage_full().model_dump(), "stop_reason": "end_turn"}, False),
        ({**openai_usage_full().model_dump(), "finish_reason": "length"}, True),
    ],
)
async def test_the_providers_stop_reason_decides_the_synthetic_continue(
    app: Any, client: httpx.AsyncClient, stop: dict[str, Any], continued: bool
) -> None:
    """No "continue" after a reply that ended on its own, whatever the provider
    called it; one after a reply cut off at the output limit."""
    await make_session(client, id="s", config={"prune": {"auto": False}})
    for batch in conversation(12):
        await append_ok(client, "s", batch)
    r = await client.post("/v1/sessions/s/usage", json=stop)
    assert r.status_code == 200, r.text
    await append_ok(client, "s", [{"role": "assistant", "content": "All done."}])
    job = (await overflow_error(client, "s"))["compaction"]
    assert await drain(app) == 1
    assert (await compaction(client, "s", job["id"]))["details"]["continued"] is continued
    kinds = [e["kind"] for e in await history(client, "s")]
    assert ("continue" in kinds) is continued


BAD: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("native typo", {"input_tokens": 10, "output_token": 3}, ("output_token",)),
    (
        "two shapes mixed",
        {**openai_usage_full().model_dump(), "input_tokens": 5},
        ("input_tokens",),
    ),
    (
        "anthropic and native cache figures",
        {**anthropic_usage_full().model_dump(), "cache_read_tokens": 5},
        ("cache_read_tokens", "cache_read_input_tokens"),
    ),
    (
        "negative figure in a provider object",
        {**openai_usage_full().model_dump(), "prompt_tokens": -1},
        ("prompt_tokens",),
    ),
    (
        "cached beyond the prompt",
        {
            "prompt_tokens": 100,
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": 101},
        },
        ("prompt_tokens_details.cached_tokens", "prompt_tokens"),
    ),
    (
        "responses cached beyond the input",
        {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 500},
            "output_tokens": 1,
            "total_tokens": 101,
        },
        ("input_tokens_details.cached_tokens",),
    ),
    (
        "gemini cached beyond the prompt",
        {"promptTokenCount": 10, "cachedContentTokenCount": 11},
        ("cachedContentTokenCount",),
    ),
    (
        "near miss in a provider object",
        {**anthropic_usage_full().model_dump(), "cache_read_input_token": 3},
        ("cache_read_input_token",),
    ),
    (
        "two stop reasons",
        {"input_tokens": 10, "finish_reason": "stop", "stop_reason": "max_tokens"},
        ("finish_reason", "stop_reason"),
    ),
    (
        "a stream's completion without usage",
        {**chat_completion().model_dump(), "usage": None},
        ("usage", "include_usage"),
    ),
    (
        "a bad figure inside a whole response",
        {**anthropic_message().model_dump(), "usage": {"input_tokens": "many"}},
        ("usage.input_tokens",),
    ),
    (
        "a bad context_version beside a provider object",
        {"prompt_tokens": 5, "context_version": -1},
        ("context_version",),
    ),
]


@pytest.mark.parametrize(("body", "names"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
async def test_bad_provider_bodies_are_422s_naming_the_fields_and_change_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], names: tuple[str, ...]
) -> None:
    await session_with_history(client, "bad")
    before = await get_session(client, "bad")
    r = await client.post("/v1/sessions/bad/usage", json=body)
    doc = assert_problem(r, 422, *names)
    # The first rejected field is the one named, not the body as a whole.
    assert doc["errors"][0]["field"] != "body", doc
    assert await get_session(client, "bad") == before


async def test_a_field_a_newer_sdk_adds_does_not_break_the_report(
    client: httpx.AsyncClient,
) -> None:
    await session_with_history(client, "new")
    body = {**anthropic_usage_full().model_dump(), "priority_lane": {"x": 1}, "cache_tier": "gold"}
    r = await client.post("/v1/sessions/new/usage", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage_format"] == "anthropic"
    # The native body stays closed.
    r = await client.post("/v1/sessions/new/usage", json={"input_tokens": 5, "cache_tier": "gold"})
    assert_problem(r, 422, "cache_tier")


@pytest.mark.parametrize("name", sorted(USAGE_EXAMPLES))
async def test_the_documented_examples_are_accepted(client: httpx.AsyncClient, name: str) -> None:
    await session_with_history(client, "doc")
    r = await client.post("/v1/sessions/doc/usage", json=USAGE_EXAMPLES[name]["value"])
    assert r.status_code == 200, r.text
    expected = "anthropic" if name == "whole_response" else name
    assert r.json()["usage_format"] == expected
