"""Provider usage objects read as the native figures: a table of each
provider's shapes, the refusals, and properties of the mapping."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.accounting.provider_usage import (
    FIELDS,
    MARKERS,
    MAX_TOKENS,
    ReadUsage,
    UsageError,
    near_miss,
    read_usage,
    shape_of,
)

# (body, format, (input, output, cache_read, cache_write), finish_reason)
TABLE: list[tuple[dict[str, Any], str, tuple[int, int, int, int], str | None]] = [
    # native, as before
    ({"input_tokens": 100}, "native", (100, 0, 0, 0), None),
    (
        {"input_tokens": 100, "output_tokens": 7, "cache_read_tokens": 50, "cache_write_tokens": 3},
        "native",
        (100, 7, 50, 3),
        None,
    ),
    ({"input_tokens": 100, "finish_reason": "stop"}, "native", (100, 0, 0, 0), "stop"),
    # a stop reason under any provider's name
    ({"input_tokens": 100, "stop_reason": "end_turn"}, "native", (100, 0, 0, 0), "end_turn"),
    # OpenAI chat: prompt_tokens includes the cached tokens
    (
        {"prompt_tokens": 1000, "completion_tokens": 40, "total_tokens": 1040},
        "openai_chat",
        (1000, 40, 0, 0),
        None,
    ),
    (
        {
            "prompt_tokens": 1000,
            "completion_tokens": 40,
            "total_tokens": 1040,
            "prompt_tokens_details": {"cached_tokens": 768, "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 12, "audio_tokens": None},
            "finish_reason": "tool_calls",
        },
        "openai_chat",
        (232, 40, 768, 0),
        "tool_calls",
    ),
    (
        {
            "prompt_tokens": 1000,
            "completion_tokens": 40,
            "prompt_tokens_details": {"cached_tokens": 500, "cache_write_tokens": 300},
        },
        "openai_chat",
        (200, 40, 500, 300),
        None,
    ),
    (
        {"prompt_tokens": 9, "completion_tokens": 1, "prompt_tokens_details": None},
        "openai_chat",
        (9, 1, 0, 0),
        None,
    ),
    # Responses: input_tokens includes the cached tokens (unlike Anthropic)
    (
        {
            "input_tokens": 1000,
            "input_tokens_details": {"cached_tokens": 600},
            "output_tokens": 20,
            "output_tokens_details": {"reasoning_tokens": 5},
            "total_tokens": 1020,
        },
        "openai_responses",
        (400, 20, 600, 0),
        None,
    ),
    ({"input_tokens": 1000, "total_tokens": 1000}, "openai_responses", (1000, 0, 0, 0), None),
    # Anthropic: input_tokens excludes the cache figures
    (
        {
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_creation_input_tokens": 50,
            "cache_read_input_tokens": 500,
            "cache_creation": {"ephemeral_5m_input_tokens": 50, "ephemeral_1h_input_tokens": 0},
            "server_tool_use": {"web_search_requests": 1},
            "service_tier": "standard",
            "stop_reason": "max_tokens",
        },
        "anthropic",
        (100, 20, 500, 50),
        "max_tokens",
    ),
    (
        {
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_creation_input_tokens": None,
            "cache_read_input_tokens": None,
            "service_tier": None,
        },
        "anthropic",
        (100, 20, 0, 0),
        None,
    ),
    # Gemini, REST names: promptTokenCount includes the cached content; the
    # tool-use prompt is outside it; thoughts are output
    (
        {
            "promptTokenCount": 1000,
            "candidatesTokenCount": 30,
            "cachedContentTokenCount": 400,
            "toolUsePromptTokenCount": 70,
            "thoughtsTokenCount": 10,
            "totalTokenCount": 1110,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1000}],
            "cacheTokensDetails": [{"modality": "TEXT", "tokenCount": 400}],
            "candidatesTokensDetails": [{"modality": "TEXT", "tokenCount": 30}],
            "trafficType": "ON_DEMAND",
            "finishReason": "STOP",
        },
        "gemini",
        (600, 40, 400, 0),
        "STOP",
    ),
    # Gemini, the google-genai SDK's names
    (
        {
            "prompt_token_count": 1000,
            "candidates_token_count": 30,
            "cached_content_token_count": None,
            "thoughts_token_count": None,
            "tool_use_prompt_token_count": None,
            "total_token_count": 1030,
            "prompt_tokens_details": [{"modality": "TEXT", "token_count": 1000}],
            "cache_tokens_details": None,
            "traffic_type": None,
            "finish_reason": "MAX_TOKENS",
        },
        "gemini",
        (1000, 30, 0, 0),
        "MAX_TOKENS",
    ),
    # new fields a later SDK may add are ignored in a provider's object
    (
        {"prompt_tokens": 10, "completion_tokens": 2, "x_new_metric": 5, "region": "eu"},
        "openai_chat",
        (10, 2, 0, 0),
        None,
    ),
]


@pytest.mark.parametrize(("body", "fmt", "figures", "reason"), TABLE)
def test_each_shape_is_read_as_the_native_figures(
    body: dict[str, Any], fmt: str, figures: tuple[int, int, int, int], reason: str | None
) -> None:
    read = read_usage(body)
    assert read.format == fmt
    assert (
        read.input_tokens,
        read.output_tokens,
        read.cache_read_tokens,
        read.cache_write_tokens,
    ) == figures
    assert read.finish_reason == reason
    assert read.whole_response is False


# Whole responses: (body, format, prompt, finish_reason)
RESPONSES: list[tuple[dict[str, Any], str, int, str | None]] = [
    (
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 900, "completion_tokens": 1, "total_tokens": 901},
        },
        "openai_chat",
        900,
        "length",
    ),
    (
        {"object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 9}},
        "openai_chat",
        9,
        None,
    ),
    (
        {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "output": [],
            "usage": {
                "input_tokens": 900,
                "input_tokens_details": {"cached_tokens": 100},
                "output_tokens": 1,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 901,
            },
        },
        "openai_responses",
        900,
        "stop",
    ),
    (
        {
            "object": "response",
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 900, "total_tokens": 900},
        },
        "openai_responses",
        900,
        "length",
    ),
    (
        {
            "object": "response",
            "status": "incomplete",
            "incomplete_details": {"reason": "content_filter"},
            "usage": {"input_tokens": 900, "total_tokens": 900},
        },
        "openai_responses",
        900,
        "content_filter",
    ),
    (
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_input_tokens": 890},
        },
        "anthropic",
        900,
        "end_turn",
    ),
    (
        # an Anthropic message whose usage has only the two figures
        {"type": "message", "stop_reason": "tool_use", "usage": {"input_tokens": 900}},
        "anthropic",
        900,
        "tool_use",
    ),
    (
        {
            "candidates": [{"content": {"parts": [{"text": "x"}]}, "finishReason": "MAX_TOKENS"}],
            "usageMetadata": {"promptTokenCount": 900, "candidatesTokenCount": 3},
            "modelVersion": "gemini-2.5-flash",
        },
        "gemini",
        900,
        "MAX_TOKENS",
    ),
    (
        {
            "candidates": [{"finish_reason": "STOP"}],
            "usage_metadata": {"prompt_token_count": 900},
            "model_version": "gemini-2.5-flash",
        },
        "gemini",
        900,
        "STOP",
    ),
]


@pytest.mark.parametrize(("body", "fmt", "prompt", "reason"), RESPONSES)
def test_a_whole_response_gives_its_usage_and_its_reason(
    body: dict[str, Any], fmt: str, prompt: int, reason: str | None
) -> None:
    read = read_usage(body)
    assert (read.format, read.prompt_tokens, read.finish_reason) == (fmt, prompt, reason)
    assert read.whole_response is True


BAD: list[tuple[Any, tuple[str, ...]]] = [
    ([1, 2], ("body",)),
    ({"output_tokens": 3}, ("input_tokens",)),
    ({"input_tokens": 5, "output_token": 3}, ("output_token", "output_tokens")),
    ({"input_tokens": -1}, ("input_tokens",)),
    ({"input_tokens": True}, ("input_tokens",)),
    ({"input_tokens": 1.5}, ("input_tokens",)),
    ({"input_tokens": MAX_TOKENS + 1}, ("input_tokens",)),
    # two shapes mixed
    ({"input_tokens": 10, "prompt_tokens": 10}, ("input_tokens", "prompt_tokens")),
    (
        {"input_tokens": 1, "cache_read_tokens": 1, "cache_read_input_tokens": 1},
        ("cache_read_tokens", "cache_read_input_tokens"),
    ),
    (
        {"input_tokens": 1, "input_tokens_details": {}, "cache_creation_input_tokens": 1},
        ("input_tokens_details", "cache_creation_input_tokens"),
    ),
    ({"prompt_tokens": 1, "promptTokenCount": 1}, ("prompt_tokens", "promptTokenCount")),
    ({"input_tokens": 1, "service_tier": "x", "total_tokens": 1}, ("total_tokens",)),
    # cached beyond the prompt
    (
        {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 9}},
        ("prompt_tokens_details.cached_tokens", "prompt_tokens"),
    ),
    (
        {
            "prompt_tokens": 10,
            "prompt_tokens_details": {"cached_tokens": 6, "cache_write_tokens": 6},
        },
        ("cached_tokens", "cache_write_tokens", "prompt_tokens"),
    ),
    (
        {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 9}},
        ("input_tokens_details.cached_tokens", "input_tokens"),
    ),
    (
        {"promptTokenCount": 5, "cachedContentTokenCount": 9},
        ("cachedContentTokenCount", "promptTokenCount"),
    ),
    # bad nested figures and objects
    ({"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": -1}}, ("cached_tokens",)),
    ({"prompt_tokens": 5, "prompt_tokens_details": [1]}, ("prompt_tokens_details",)),
    ({"promptTokenCount": 5, "promptTokensDetails": {}}, ("promptTokensDetails",)),
    ({"candidatesTokenCount": 5}, ("promptTokenCount",)),
    ({"promptTokenCount": 5, "prompt_token_count": 5}, ("promptTokenCount", "prompt_token_count")),
    # near misses in a provider's object
    (
        {"input_tokens": 1, "service_tier": "standard", "cache_read_input_token": 4},
        ("cache_read_input_token", "cache_read_input_tokens"),
    ),
    (
        {"input_tokens": 1, "service_tier": "standard", "cacheReadInputTokens": 4},
        ("cacheReadInputTokens", "cache_read_input_tokens"),
    ),
    ({"prompt_tokens": 1, "cached_tokens": 4}, ("cached_tokens",)),
    # two different stop reasons
    (
        {"input_tokens": 1, "finish_reason": "stop", "stop_reason": "end_turn"},
        ("finish_reason", "stop_reason"),
    ),
    ({"input_tokens": 1, "finish_reason": 3}, ("finish_reason",)),
    ({"input_tokens": 1, "finish_reason": "x" * 65}, ("finish_reason",)),
    # whole responses
    ({"object": "chat.completion", "choices": [], "usage": None}, ("usage", "include_usage")),
    ({"object": "chat.completion", "choices": []}, ("usage",)),
    ({"candidates": []}, ("usageMetadata",)),
    (
        {
            "object": "chat.completion",
            "choices": [],
            "usage": {"input_tokens": 1, "service_tier": "x"},
        },
        ("usage",),
    ),
    (
        {"type": "message", "usage": {"input_tokens": 1, "cache_read_tokens": 2}},
        ("cache_read_tokens",),
    ),
    ({"usage": {}, "usageMetadata": {}}, ("usage", "usageMetadata")),
    (
        {
            "type": "message",
            "stop_reason": "end_turn",
            "finish_reason": "stop",
            "usage": {"input_tokens": 1},
        },
        ("finish_reason", "stop_reason"),
    ),
    ({"choices": "x", "usage": {"prompt_tokens": 1}}, ("choices",)),
]


@pytest.mark.parametrize(("body", "names"), BAD)
def test_bad_bodies_are_refused_naming_the_fields(body: Any, names: tuple[str, ...]) -> None:
    with pytest.raises(UsageError) as caught:
        read_usage(body)
    text = f"{caught.value.field} {caught.value.detail}"
    for name in names:
        assert name in text, (name, text)


def test_passthrough_fields_are_neither_figures_nor_unknown() -> None:
    body = {"prompt_tokens": 10, "context_version": 3, "tools": [], "tools_tokens": 5}
    assert (
        read_usage(body, passthrough=("context_version", "tools", "tools_tokens")).prompt_tokens
        == 10
    )
    with pytest.raises(UsageError):
        read_usage({"input_tokens": 10, "context_version": 3})


def test_only_a_native_body_is_closed() -> None:
    with pytest.raises(UsageError) as caught:
        read_usage({"input_tokens": 10, "brand_new": 1})
    assert caught.value.native is True
    # The same unknown field in a provider's object is a field a newer SDK added.
    read = read_usage({"input_tokens": 10, "cache_read_input_tokens": 0, "brand_new": 1})
    assert read.format == "anthropic"


def test_the_markers_belong_to_one_shape_each() -> None:
    seen: dict[str, str] = {}
    for fmt, markers in MARKERS.items():
        for name in markers:
            assert name not in seen, (name, fmt, seen.get(name))
            seen[name] = fmt
        if fmt != "native":
            assert markers <= FIELDS[fmt]


def test_no_documented_field_is_a_near_miss_of_another() -> None:
    """Every documented name is known, so never checked; but the rule must not
    fire on any of them either if a shape moves (a guard on the cutoff)."""
    for fields in FIELDS.values():
        for name in fields:
            assert near_miss(name) is None, name


# --- properties ------------------------------------------------------------------

FIGURE = st.integers(min_value=0, max_value=10_000_000)


@st.composite
def provider_bodies(draw: st.DrawFn) -> tuple[dict[str, Any], str, int, int, int]:
    """A usage object of a random provider: (body, format, prompt, cache read, cache write)."""
    prompt = draw(FIGURE)
    cached = draw(st.integers(min_value=0, max_value=prompt))
    written = draw(st.integers(min_value=0, max_value=prompt - cached))
    fmt = draw(
        st.sampled_from(["native", "openai_chat", "openai_responses", "anthropic", "gemini"])
    )
    output = draw(FIGURE)
    body: dict[str, Any]
    if fmt == "native":
        body = {
            "input_tokens": prompt - cached - written,
            "output_tokens": output,
            "cache_read_tokens": cached,
            "cache_write_tokens": written,
        }
    elif fmt == "openai_chat":
        body = {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
            "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        }
    elif fmt == "openai_responses":
        body = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + output,
        }
    elif fmt == "anthropic":
        body = {
            "input_tokens": prompt - cached - written,
            "output_tokens": output,
            "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": written,
        }
    else:
        written = 0  # Gemini reports no cache writes
        body = {
            "promptTokenCount": prompt,
            "cachedContentTokenCount": cached,
            "candidatesTokenCount": output,
            "totalTokenCount": prompt + output,
        }
    if draw(st.booleans()):
        # the whole response around it
        body = {
            "native": lambda u: {"usage": u},
            "openai_chat": lambda u: {"object": "chat.completion", "choices": [], "usage": u},
            "openai_responses": lambda u: {"object": "response", "status": "completed", "usage": u},
            "anthropic": lambda u: {"type": "message", "stop_reason": "end_turn", "usage": u},
            "gemini": lambda u: {"candidates": [], "usageMetadata": u},
        }[fmt](body)
    return body, fmt, prompt, cached, written


@given(provider_bodies())
def test_the_prompt_is_always_what_the_provider_measured(
    case: tuple[dict[str, Any], str, int, int, int],
) -> None:
    body, fmt, prompt, cached, written = case
    read = read_usage(body)
    assert read.format == fmt
    assert read.prompt_tokens == prompt
    assert (read.cache_read_tokens, read.cache_write_tokens) == (cached, written)
    assert read.input_tokens >= 0
    # The native body of what was read reads back the same.
    again = read_usage(read.native())
    assert isinstance(again, ReadUsage)
    assert again.native() == read.native()


@given(provider_bodies(), st.sampled_from(["cached", "negative"]))
def test_a_contradiction_is_always_refused(
    case: tuple[dict[str, Any], str, int, int, int], how: str
) -> None:
    body, fmt, prompt, _, _ = case
    usage = body.get("usage") or body.get("usageMetadata") or body
    if how == "negative":
        name = next(k for k, v in usage.items() if isinstance(v, int))
        usage[name] = -1
    else:
        # a cached figure above the whole prompt
        if fmt == "openai_chat":
            usage["prompt_tokens_details"]["cached_tokens"] = prompt + 1
        elif fmt == "openai_responses":
            usage["input_tokens_details"]["cached_tokens"] = prompt + 1
        elif fmt == "gemini":
            usage["cachedContentTokenCount"] = prompt + 1
        else:
            return  # native and Anthropic add their figures: no prompt to exceed
    with pytest.raises(UsageError):
        read_usage(body)


@given(st.dictionaries(st.text(max_size=30), st.integers() | st.text() | st.none(), max_size=6))
def test_any_mapping_is_read_or_refused_never_crashes(body: dict[str, Any]) -> None:
    field = None
    try:
        read = read_usage(body)
    except UsageError as exc:
        field = exc.field
    else:
        assert read.prompt_tokens >= 0
    assert field is None or field


def test_shape_of_reads_markers_only() -> None:
    assert shape_of({"input_tokens": 1, "output_tokens": 2}) == "native"
    assert shape_of({"input_tokens": 1, "output_tokens_details": None}) == "anthropic"
    assert shape_of({"prompt_token_count": 1}) == "gemini"
    # OpenAI chat's and the google-genai SDK's name alike: it marks neither.
    assert shape_of({"prompt_tokens_details": {}}) == "native"
    with pytest.raises(UsageError):
        read_usage({"prompt_tokens_details": {}})


# --- sums: a figure read as the sum of others is bounded like any one -----------------------

M = MAX_TOKENS
SUMS_TOO_LARGE: list[tuple[dict[str, Any], str, str]] = [
    (
        {"input_tokens": M, "cache_read_tokens": 1},
        "input_tokens",
        f"input_tokens ({M:,}) + cache_read_tokens (1) is {M + 1:,}, the prompt",
    ),
    (
        {"input_tokens": 0, "cache_read_tokens": M, "cache_write_tokens": M},
        "cache_read_tokens",
        f"cache_read_tokens ({M:,}) + cache_write_tokens ({M:,}) is {2 * M:,}, the prompt",
    ),
    (
        {"input_tokens": M, "cache_read_input_tokens": M, "cache_creation_input_tokens": M},
        "input_tokens",
        "+ cache_read_input_tokens (100,000,000) + cache_creation_input_tokens",
    ),
    (
        {"type": "message", "usage": {"input_tokens": M, "cache_read_input_tokens": 7}},
        "usage.input_tokens",
        "usage.input_tokens (100,000,000) + usage.cache_read_input_tokens (7)",
    ),
    (
        {"promptTokenCount": 1, "candidatesTokenCount": M, "thoughtsTokenCount": 1},
        "candidatesTokenCount",
        "candidatesTokenCount (100,000,000) + thoughtsTokenCount (1) is 100,000,001, the output",
    ),
    (
        {"prompt_token_count": 1, "response_token_count": M, "thoughts_token_count": 2},
        "response_token_count",
        "response_token_count (100,000,000) + thoughts_token_count (2)",
    ),
]


@pytest.mark.parametrize(("body", "field", "detail"), SUMS_TOO_LARGE)
def test_a_sum_above_the_bound_is_refused_naming_it(
    body: dict[str, Any], field: str, detail: str
) -> None:
    with pytest.raises(UsageError) as caught:
        read_usage(body)
    assert caught.value.field == field
    assert detail in caught.value.detail
    assert f"no usage figure is above {M:,}" in caught.value.detail


def test_a_sum_at_the_bound_is_read() -> None:
    read = read_usage({"input_tokens": M - 2, "cache_read_tokens": 1, "cache_write_tokens": 1})
    assert read.prompt_tokens == M
    read = read_usage(
        {"promptTokenCount": 5, "candidatesTokenCount": M - 1, "thoughtsTokenCount": 1}
    )
    assert read.output_tokens == M


@given(
    st.sampled_from(["native", "anthropic"]),
    st.lists(st.integers(min_value=0, max_value=M), min_size=3, max_size=3),
)
def test_a_prompt_of_three_figures_is_read_if_and_only_if_within_the_bound(
    fmt: str, figures: list[int]
) -> None:
    names = (
        ("input_tokens", "cache_read_tokens", "cache_write_tokens")
        if fmt == "native"
        else ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    )
    body = dict(zip(names, figures, strict=True))
    if sum(figures) <= M:
        assert read_usage(body).prompt_tokens == sum(figures)
    else:
        with pytest.raises(UsageError, match="the prompt"):
            read_usage(body)
