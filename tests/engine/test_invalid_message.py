"""Messages that cannot be stored are rejected with the JSON path of the offending field."""

from __future__ import annotations

from typing import Any

import pytest

from app.engine.formats import anthropic_format, openai_format
from app.engine.model import InvalidMessage

CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _call(**function: Any) -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": "f", **function}}


@pytest.mark.parametrize(
    ("message", "path", "detail"),
    [
        ({"role": "robot", "content": "hi"}, "m.role", "unknown role 'robot'"),
        ({"content": "hi"}, "m.role", "unknown role None"),
        (
            {"role": "user", "content": "hi", "tool_calls": [CALL]},
            "m.tool_calls",
            "only allowed on assistant",
        ),
        (
            {"role": "user", "content": "hi", "reasoning_content": "x"},
            "m.reasoning_content",
            "only allowed",
        ),
        (
            {"role": "user", "content": "hi", "tool_call_id": "c1"},
            "m.tool_call_id",
            "only allowed on tool",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(arguments="{not json")]},
            "m.tool_calls[0].function.arguments",
            "is not valid JSON",
        ),
        (
            {"role": "assistant", "tool_calls": [CALL, _call(arguments="[1, 2]")]},
            "m.tool_calls[1].function.arguments",
            "must encode a JSON object, got list",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(arguments="42")]},
            "m.tool_calls[0].function.arguments",
            "must encode a JSON object, got int",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(arguments={"a": 1})]},
            "m.tool_calls[0].function.arguments",
            "must be a string, got dict",
        ),
        (
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]},
            "m.tool_calls[0].id",
            "must be a string",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]},
            "m.tool_calls[0].function.name",
            "must be a string",
        ),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "type": "custom", "function": {}}]},
            "m.tool_calls[0].type",
            "unsupported tool call type",
        ),
        (
            {"role": "assistant", "tool_calls": {"id": "c"}},
            "m.tool_calls",
            "must be a list, got dict",
        ),
        ({"role": "tool", "content": "ok"}, "m.tool_call_id", "must be a string, got null"),
        (
            {"role": "tool", "content": "ok", "tool_call_id": ""},
            "m.tool_call_id",
            "must not be empty",
        ),
        ({"role": "tool", "tool_call_id": "c1"}, "m.content", "is required on tool messages"),
        (
            {"role": "user", "content": 42},
            "m.content",
            "must be a string, a list of parts or null, got int",
        ),
        ({"role": "user", "content": {"type": "text", "text": "x"}}, "m.content", "got dict"),
        ({"role": "user", "content": None}, "m.content", "is required on user messages"),
        ({"role": "system"}, "m.content", "is required on system messages"),
        ({"role": "user", "content": ["plain"]}, "m.content[0]", "must be an object, got str"),
        (
            {"role": "user", "content": [{"type": "text", "text": 5}]},
            "m.content[0].text",
            "must be a string, got int",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_video"}]},
            "m.content[1].type",
            "unsupported content part type 'input_video' in a user message; expected 'text' "
            "or 'image_url' or 'file' or 'input_audio'",
        ),
        (
            # An input_audio part is taken (kept as sent), but not without its audio.
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "input_audio"}]},
            "m.content[1].input_audio",
            "must be an object, got null",
        ),
        (
            {"role": "user", "content": [{"type": "file", "file": "f.pdf"}]},
            "m.content[0].file",
            "must be an object, got str",
        ),
        (
            {"role": "assistant", "content": [{"type": "refusal", "refusal": None}]},
            "m.content[0].refusal",
            "must be a string, got null",
        ),
        (
            {"role": "user", "content": [{"type": "refusal", "refusal": "no"}]},
            "m.content[0].type",
            "unsupported content part type 'refusal' in a user message",
        ),
        (
            # The chat API takes text only in tool messages (images: OpenAI-compatible servers).
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "file", "file": {}}]},
            "m.content[0].type",
            "unsupported content part type 'file' in a tool message",
        ),
        (
            {"role": "system", "content": [{"type": "input_audio", "input_audio": {}}]},
            "m.content[0].type",
            "expected 'text'",
        ),
        (
            {"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            "m.content[0].type",
            "expected 'text'",
        ),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": "https://x"}]},
            "m.content[0].image_url",
            "must be an object",
        ),
        (
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": ""}}]},
            "m.content[0].image_url.url",
            "must not be empty",
        ),
        ({"role": "user", "content": "hi", "name": 7}, "m.name", "must be a string"),
        ("hello", "m", "must be an object, got str"),
    ],
)
def test_openai_invalid_message_names_the_path(message: Any, path: str, detail: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        openai_format.parse_message(message, "m")
    assert info.value.path == path
    assert detail in info.value.detail
    assert str(info.value).startswith(f"{path}: ")


USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": "ok"}


@pytest.mark.parametrize(
    ("message", "path", "detail"),
    [
        ({"role": "tool", "content": "x"}, "m.role", "unknown role 'tool'"),
        ({"role": "user"}, "m.content", "is required"),
        (
            {"role": "user", "content": 3},
            "m.content",
            "must be a string or a list of content blocks, got int",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": "a"}, RESULT]},
            "m.content[1]",
            "tool_result blocks must come before",
        ),
        (
            {"role": "assistant", "content": [{**USE, "input": [1, 2]}]},
            "m.content[0].input",
            "must be an object, got list",
        ),
        (
            {"role": "assistant", "content": [{**USE, "input": "{}"}]},
            "m.content[0].input",
            "must be an object, got str",
        ),
        (
            {"role": "assistant", "content": [{"type": "text", "text": "a"}, {**USE, "id": ""}]},
            "m.content[1].id",
            "must not be empty",
        ),
        (
            {"role": "assistant", "content": [RESULT]},
            "m.content[0].type",
            "unsupported content block 'tool_result' in a assistant",
        ),
        (
            {"role": "user", "content": [USE]},
            "m.content[0].type",
            "unsupported content block 'tool_use' in a user",
        ),
        (
            {"role": "user", "content": [{**RESULT, "is_error": "yes"}]},
            "m.content[0].is_error",
            "must be a boolean",
        ),
        (
            {"role": "user", "content": [{**RESULT, "tool_use_id": None}]},
            "m.content[0].tool_use_id",
            "must be a string",
        ),
        (
            {"role": "user", "content": [{**RESULT, "content": [{"type": "video"}]}]},
            "m.content[0].content[0].type",
            "unsupported tool_result content type 'video'; expected 'text', 'image', "
            "'browser_state', 'document', 'search_result', 'tool_reference'",
        ),
        (
            # A document is taken in a tool result (kept as sent), but not without its source.
            {"role": "user", "content": [{**RESULT, "content": [{"type": "document"}]}]},
            "m.content[0].content[0].source",
            "must be an object, got null",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "s3", "key": "f"}}],
            },
            "m.content[0].source.type",
            "unsupported image source",
        ),
        (
            {"role": "user", "content": [{"type": "server_tool_use", "id": "s", "name": "n"}]},
            "m.content[0].type",
            "unsupported content block 'server_tool_use' in a user message; expected text, "
            "image, tool_result, container_upload, document, search_result",
        ),
        (
            {"role": "assistant", "content": [{"type": "document", "source": {}}]},
            "m.content[0].type",
            "unsupported content block 'document' in a assistant message",
        ),
        (
            {"role": "assistant", "content": [{"type": "server_tool_use", "name": "web_search"}]},
            "m.content[0].id",
            "must be a string, got null",
        ),
        (
            {
                "role": "assistant",
                "content": [{"type": "server_tool_use", "id": "s", "name": "w", "input": "q"}],
            },
            "m.content[0].input",
            "must be an object, got str",
        ),
        (
            {"role": "assistant", "content": [{"type": "web_search_tool_result", "content": []}]},
            "m.content[0].tool_use_id",
            "must be a string, got null",
        ),
        (
            {"role": "assistant", "content": [{"type": "_tool_result", "tool_use_id": "s"}]},
            "m.content[0].type",
            "unsupported content block '_tool_result' in a assistant message",
        ),
        (
            {"role": "user", "content": [{"type": "container_upload", "file_id": ""}]},
            "m.content[0].file_id",
            "must not be empty",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}],
            },
            "m.content[0].source.media_type",
            "must be a string",
        ),
        (
            {"role": "user", "content": [{"type": "image"}]},
            "m.content[0].source",
            "must be an object",
        ),
        (
            {"role": "system", "content": [{"type": "image"}]},
            "m.content[0].type",
            "system content must be text",
        ),
        ({"role": "user", "content": ["x"]}, "m.content[0]", "must be an object, got str"),
        (
            {"role": "assistant", "content": [{"type": "thinking", "thinking": None}]},
            "m.content[0].thinking",
            "must be a string",
        ),
    ],
)
def test_anthropic_invalid_message_names_the_path(message: Any, path: str, detail: str) -> None:
    with pytest.raises(InvalidMessage) as info:
        anthropic_format.parse_message(message, "m")
    assert info.value.path == path
    assert detail in info.value.detail


def test_anthropic_tool_input_that_json_cannot_hold_is_rejected_not_crashed() -> None:
    # A JSON body may carry integers beyond 64 bits; storing them must fail cleanly.
    message = {"role": "assistant", "content": [{**USE, "input": {"n": 2**70}}]}
    with pytest.raises(InvalidMessage) as info:
        anthropic_format.parse_message(message, "m")
    assert info.value.path == "m.content[0].input"


@pytest.mark.parametrize(
    "literal", ["123456789012345678901234567890", "9223372036854775808", "-9223372036854775809"]
)
def test_openai_arguments_holding_an_integer_beyond_64_bits_are_rejected(literal: str) -> None:
    """orjson reads such an integer as a float, so the stored Anthropic view would
    have changed the number silently; it is refused as it is anywhere else in a body."""
    with pytest.raises(InvalidMessage) as info:
        openai_format.parse_arguments(f'{{"id": {literal}, "s": "x"}}', "m.arguments")
    assert info.value.path == "m.arguments"
    assert "64-bit" in info.value.detail


def test_long_digit_runs_in_arguments_that_are_not_big_integers_are_kept() -> None:
    args = '{"sha": "12345678901234567890123", "n": 9223372036854775807, "x": 1.5e300}'
    assert openai_format.parse_arguments(args, "p") == {
        "sha": "12345678901234567890123",
        "n": 9223372036854775807,
        "x": 1.5e300,
    }


def test_invalid_message_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"^m\.role: "):
        openai_format.parse_message({"role": 1}, "m")


def test_empty_arguments_mean_no_arguments() -> None:
    assert openai_format.parse_arguments("  ", "p") == {}
    assert openai_format.parse_arguments('{"a": [1]}', "p") == {"a": [1]}
