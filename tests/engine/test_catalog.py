"""Model catalog lookups by family, snapshot and provider spelling."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.accounting.catalog import (
    UNKNOWN_CONTEXT_WINDOW,
    Catalog,
    lookup,
    normalize,
    parse_overrides,
    unknown_max_output,
)


@pytest.mark.parametrize(
    ("model", "window", "max_output", "encoding"),
    [
        # OpenAI
        ("gpt-4o", 128_000, 16_384, "o200k_base"),
        ("gpt-4o-mini-2024-07-18", 128_000, 16_384, "o200k_base"),
        ("gpt-4.1-mini", 1_047_576, 32_768, "o200k_base"),
        ("gpt-5", 400_000, 128_000, "o200k_base"),
        ("o3-mini", 200_000, 100_000, "o200k_base"),
        ("o1-mini", 128_000, 65_536, "o200k_base"),
        ("gpt-4", 8_192, 4_096, "cl100k_base"),
        ("gpt-4-0613", 8_192, 4_096, "cl100k_base"),
        ("gpt-4-32k", 32_768, 4_096, "cl100k_base"),
        ("gpt-4-turbo-2024-04-09", 128_000, 4_096, "cl100k_base"),
        ("gpt-3.5-turbo", 16_385, 4_096, "cl100k_base"),
        ("gpt-3.5-turbo-0125", 16_385, 4_096, "cl100k_base"),
        ("openai/gpt-4o", 128_000, 16_384, "o200k_base"),
        # Anthropic, with dated snapshots
        ("claude-sonnet-4-20250514", 200_000, 64_000, "o200k_base"),
        ("claude-opus-4-1-20250805", 200_000, 32_000, "o200k_base"),
        ("claude-3-5-sonnet-20241022", 200_000, 8_192, "o200k_base"),
        ("claude-3-7-sonnet-latest", 200_000, 64_000, "o200k_base"),
        ("claude-3-haiku-20240307", 200_000, 4_096, "o200k_base"),
        ("openrouter/anthropic/claude-sonnet-4", 200_000, 64_000, "o200k_base"),
        ("anthropic/claude-3-5-haiku", 200_000, 8_192, "o200k_base"),
        # Bedrock ids, with and without a cross-region prefix
        ("anthropic.claude-3-5-sonnet-20240620-v1:0", 200_000, 8_192, "o200k_base"),
        ("us.anthropic.claude-sonnet-4-20250514-v1:0", 200_000, 64_000, "o200k_base"),
        ("bedrock/us.anthropic.claude-3-7-sonnet-20250219-v1:0", 200_000, 64_000, "o200k_base"),
        ("apac.anthropic.claude-sonnet-4-20250514-v1:0", 200_000, 64_000, "o200k_base"),
        ("global.anthropic.claude-sonnet-4-20250514-v1:0", 200_000, 64_000, "o200k_base"),
        ("meta.llama3-1-70b-instruct-v1:0", 131_072, 8_192, "o200k_base"),
        ("us.meta.llama3-3-70b-instruct-v1:0", 131_072, 8_192, "o200k_base"),
        ("mistral.mistral-large-2407-v1:0", 131_072, 8_192, "o200k_base"),
        # Gemini
        ("gemini-2.5-pro", 1_048_576, 65_536, "o200k_base"),
        ("gemini-2.5-flash-preview-05-20", 1_048_576, 65_536, "o200k_base"),
        ("gemini-1.5-pro-002", 2_097_152, 8_192, "o200k_base"),
        ("models/gemini-2.0-flash", 1_048_576, 8_192, "o200k_base"),
        ("google/gemini-2.5-pro", 1_048_576, 65_536, "o200k_base"),
        # DeepSeek
        ("deepseek-chat", 128_000, 8_192, "o200k_base"),
        ("deepseek-reasoner", 128_000, 64_000, "o200k_base"),
        ("deepseek/deepseek-r1", 128_000, 32_768, "o200k_base"),
        ("deepseek-r1:14b", 128_000, 32_768, "o200k_base"),
        # Qwen
        ("qwen3-coder-480b-a35b-instruct", 262_144, 65_536, "o200k_base"),
        ("Qwen/Qwen2.5-72B-Instruct", 131_072, 8_192, "o200k_base"),
        ("qwen2.5-coder:32b", 131_072, 8_192, "o200k_base"),
        ("qwen-max", 32_768, 8_192, "o200k_base"),
        # Llama, including Ollama tags
        ("llama3.1:8b", 131_072, 8_192, "o200k_base"),
        ("ollama/llama3.2:3b", 131_072, 8_192, "o200k_base"),
        ("meta-llama/Llama-3.3-70B-Instruct", 131_072, 8_192, "o200k_base"),
        ("llama3:8b", 8_192, 4_096, "o200k_base"),
        ("llama-4-scout-17b-16e-instruct", 10_000_000, 16_384, "o200k_base"),
        # Mistral
        ("mistral-large-latest", 131_072, 8_192, "o200k_base"),
        ("mistral-small-2503", 131_072, 8_192, "o200k_base"),
        ("mistral:7b", 32_768, 8_192, "o200k_base"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 32_768, 8_192, "o200k_base"),
        ("mixtral-8x22b-instruct", 65_536, 8_192, "o200k_base"),
        ("codestral-latest", 262_144, 8_192, "o200k_base"),
        # Gemma through Ollama
        ("gemma3:27b", 131_072, 8_192, "o200k_base"),
    ],
)
def test_known_models(model: str, window: int, max_output: int, encoding: str) -> None:
    spec = lookup(model)
    assert spec.known
    assert (spec.context_window, spec.max_output_tokens, spec.encoding) == (
        window,
        max_output,
        encoding,
    )


def test_gpt5_has_an_input_limit() -> None:
    assert lookup("gpt-5-mini").input_limit == 272_000
    assert lookup("gpt-4o").input_limit is None


def test_longest_prefix_wins() -> None:
    assert lookup("gpt-4o").context_window != lookup("gpt-4").context_window
    assert lookup("gpt-3.5-turbo-16k").context_window == 16_385
    assert lookup("o1-mini").max_output_tokens != lookup("o1").max_output_tokens


@pytest.mark.parametrize("model", ["my-local-model", "", "  ", "text-davinci-003", "foo/bar:baz"])
def test_unknown_models_get_the_default(model: str) -> None:
    spec = lookup(model)
    assert not spec.known
    assert spec.context_window == UNKNOWN_CONTEXT_WINDOW == 128_000
    assert spec.input_limit is None
    assert spec.encoding == "o200k_base"


def test_normalize() -> None:
    assert normalize("  OpenRouter/Anthropic/Claude-Sonnet-4 ") == "claude-sonnet-4"
    assert normalize("llama3.1:8b") == "llama3.1"
    assert normalize("us.anthropic.claude-3-haiku-20240307-v1:0") == "claude-3-haiku-20240307-v1:0"


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_lookup_never_fails(model: str) -> None:
    spec = lookup(model)
    assert spec.context_window > 0
    assert spec.max_output_tokens > 0
    assert spec.known or spec.context_window == UNKNOWN_CONTEXT_WINDOW


# ------------------------------------------------------------ the operator's catalog

OPERATOR = Catalog(
    parse_overrides(
        {
            "my-local-8k": {"context_window": 8192, "max_output_tokens": 2048},
            "ollama/acme": {"context_window": 32_768},
            "gpt-4o": {"context_window": 64_000, "input_limit": 48_000},
            "claude": {"context_window": 100_000},
        }
    ),
    default_context_window=16_384,
)


def test_the_operator_overrides_and_extends_the_catalog() -> None:
    local = lookup("my-local-8k-q4", OPERATOR)  # a prefix, as the built-in entries
    assert (local.known, local.context_window, local.max_output_tokens) == (True, 8192, 2048)
    acme = lookup("Ollama/ACME-7b:latest", OPERATOR)  # normalized as the built-in ones
    assert (acme.known, acme.context_window, acme.max_output_tokens) == (True, 32_768, 8192)
    gpt = lookup("gpt-4o-2024-08-06", OPERATOR)  # the override wins over the built-in entry
    assert (gpt.context_window, gpt.max_output_tokens, gpt.input_limit) == (64_000, 16_384, 48_000)
    assert gpt.encoding == lookup("gpt-4o").encoding
    # A shorter operator prefix still wins over a longer built-in one.
    assert lookup("claude-sonnet-4", OPERATOR).context_window == 100_000
    assert lookup("claude-sonnet-4", OPERATOR).max_output_tokens == 64_000
    # The rest of the built-in catalog is as it was.
    assert lookup("gemini-2.5-pro", OPERATOR) == lookup("gemini-2.5-pro")


def test_the_default_window_is_the_operators() -> None:
    spec = lookup("zeta-llm-7b", OPERATOR)
    assert not spec.known
    assert (spec.context_window, spec.max_output_tokens) == (16_384, 4096)
    small = lookup("acme-llm-7b", Catalog(default_context_window=8192))
    assert (small.context_window, small.max_output_tokens) == (8192, 2048)
    assert lookup("acme-llm-7b").max_output_tokens == 16_384  # 128k: as before
    assert unknown_max_output(1) == 1


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ([1, 2], "must map model names"),
        ({"": {"context_window": 8192}}, "not a model name"),
        ({"x": 8192}, "expected a table"),
        ({"x": {}}, "context_window is required"),
        ({"x": {"context_window": "big"}}, "'x': context_window must be a whole number"),
        ({"x": {"context_window": True}}, "context_window must be a whole number"),
        ({"x": {"context_window": 0}}, "context_window must be a whole number"),
        ({"x": {"context_window": 8192.5}}, "context_window must be a whole number"),
        ({"x": {"context_window": 8192, "max_output_tokens": 8192}}, "must be smaller"),
        ({"x": {"context_window": 8192, "input_limit": 9000}}, "must not exceed"),
        ({"x": {"context_window": 8192, "max_tokens": 1}}, "unknown field 'max_tokens'"),
        ({"x": {"context_window": 8192}, "openai/X": {"context_window": 4096}}, "same models"),
    ],
)
def test_a_bad_override_is_named(data: object, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_overrides(data)
