"""Blocks and parts kept as sent (app.engine.formats.opaque): Anthropic's server tool blocks,
documents and search results, OpenAI's files, audio and refusals.

They come back unchanged in their own format, as a short text in the other, are counted
as an estimate, take no part in the pairing of client tool calls, and leave every view
valid, for the engine's checks and for the providers' own SDK types, after pairing,
pruning and a compaction's cut alike.
"""

from __future__ import annotations

import base64
import copy
import os
from collections.abc import Iterable
from typing import Any

import anthropic.types as at
import anthropic.types.beta as bt
import openai.types.chat as oc
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from app.engine.accounting import tokens
from app.engine.compaction.cut import find_cut
from app.engine.compaction.extractive import extractive_summary
from app.engine.compaction.summary import serialize_conversation
from app.engine.formats import anthropic_format, opaque, openai_format
from app.engine.model import Entry
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing, pair_tool_calls
from app.engine.window.view import (
    assemble_anthropic,
    assemble_openai,
    placeholder_entry,
    render_view,
)
from tests.engine.strategies import call_part, messy_histories, text_part, tool_entry
from tests.engine.test_view import stored

# The SDKs' own request types. The beta one is Anthropic's widest (MCP, compaction...).
ANTHROPIC_MESSAGE: TypeAdapter[Any] = TypeAdapter(bt.BetaMessageParam)
OPENAI_MESSAGE: TypeAdapter[Any] = TypeAdapter(oc.ChatCompletionMessageParam)


def _materialize(value: Any) -> Any:
    """The SDKs type content as ``Iterable``: pydantic validates it only when iterated."""
    if isinstance(value, dict):
        return {k: _materialize(v) for k, v in value.items()}
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return [_materialize(v) for v in value]


def assert_sdk_valid_anthropic(messages: Iterable[dict[str, Any]]) -> None:
    for message in messages:
        _materialize(ANTHROPIC_MESSAGE.validate_python(message))


def assert_sdk_valid_openai(messages: Iterable[dict[str, Any]]) -> None:
    for message in messages:
        _materialize(OPENAI_MESSAGE.validate_python(message))


def parse_anthropic(messages: list[dict[str, Any]]) -> list[Entry]:
    entries: list[Entry] = []
    for i, m in enumerate(messages):
        entries += anthropic_format.parse_message(m, f"messages[{i}]")
    return entries


def parse_openai(messages: list[dict[str, Any]]) -> list[Entry]:
    return [openai_format.parse_message(m, f"messages[{i}]") for i, m in enumerate(messages)]


def both_views(entries: list[Entry]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The model's view in both formats, checked valid by the engine and the SDKs."""
    view = pair_tool_calls(entries)
    openai = [openai_format.render_message(e) for e in view]
    system, anthropic = anthropic_format.render_messages(view)
    assert check_openai_pairing(openai) == []
    assert check_anthropic_pairing(anthropic) == []
    assert_sdk_valid_openai(openai)
    assert_sdk_valid_anthropic(anthropic)
    # What a context read assembles from the stored fragments is that same render.
    body, _ = assemble_openai(stored(entries))
    assert orjson.loads(body) == openai
    system_json, messages_json, _ = assemble_anthropic(stored(entries))
    assert orjson.loads(system_json) == system
    assert orjson.loads(messages_json) == anthropic
    return openai, anthropic


PDF = base64.b64encode(b"%PDF-1.7\n" + b"0" * 3000).decode()
PNG = base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001")).decode()


def anthropic_search_reply() -> dict[str, Any]:
    """The assistant message an agent sends back after a web search: the SDK's own
    ``Message`` as the API returns it, its content dumped as the SDK dumps it."""
    message = at.Message.model_validate(
        {
            "id": "msg_01XFDUDYJgAACzvnptvVoYEL",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "text", "text": "I'll search for that."},
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
                    "name": "web_search",
                    "input": {"query": "compactd context compaction"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_01WYG3ziw53XMcoyKL4XcZmE",
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://example.com/compaction",
                            "title": "Context compaction",
                            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC0x",
                            "page_age": "April 30, 2025",
                        }
                    ],
                },
                {
                    "type": "text",
                    "text": "It summarizes old turns.",
                    "citations": [
                        {
                            "type": "web_search_result_location",
                            "url": "https://example.com/compaction",
                            "title": "Context compaction",
                            "encrypted_index": "Eo8BCioIAhgBIiQyYjQ0OWJmZi1lNm",
                            "cited_text": "Compaction summarizes old turns...",
                        }
                    ],
                },
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 6039,
                "output_tokens": 931,
                "server_tool_use": {"web_search_requests": 1, "web_fetch_requests": 0},
            },
        }
    )
    return {"role": "assistant", "content": [b.model_dump(mode="json") for b in message.content]}


def anthropic_user_with_documents() -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                "title": "spec.pdf",
                "citations": {"enabled": True},
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "search_result",
                "source": "https://docs.example.com/a",
                "title": "A",
                "content": [{"type": "text", "text": "The answer is 42."}],
            },
            {"type": "container_upload", "file_id": "file_011CNha8iCJcU1wXNR6q4V8w"},
            {
                "type": "image",
                "source": {"type": "file", "file_id": "file_011CPMxVD3fHLUhvTqtsQA5w"},
            },
            {"type": "text", "text": "Summarize these."},
        ],
    }


# --- round trips and renders ---------------------------------------------------------------


def test_a_server_tool_reply_round_trips_and_renders_valid_in_both_formats() -> None:
    reply = anthropic_search_reply()
    sent = [{"role": "user", "content": "What is compaction?"}, reply]
    original = copy.deepcopy(sent)
    entries = parse_anthropic(sent)
    assert sent == original  # parsing does not mutate the client's data

    # The stored history gives back exactly what was sent.
    _, history = anthropic_format.render_messages(entries, for_history=True)
    assert history == original

    # Server tool blocks are not the client's tool calls.
    assert entries[1].call_ids == ()
    assert [p["type"] for p in entries[1].parts] == ["text", "opaque", "opaque", "text"]

    openai, anthropic = both_views(entries)
    # The Anthropic model sees the server tool's use and result unchanged.
    assert anthropic[1]["content"][1] == reply["content"][1]
    assert anthropic[1]["content"][2] == reply["content"][2]
    # OpenAI gets a short text naming each.
    assert openai[1]["content"] == [
        {"type": "text", "text": "I'll search for that."},
        {"type": "text", "text": "[Anthropic server_tool_use block omitted]"},
        {"type": "text", "text": "[Anthropic web_search_tool_result block omitted]"},
        {"type": "text", "text": "It summarizes old turns."},
    ]
    # The OpenAI history is that same valid degradation.
    assert openai_format.render_message(entries[1], for_history=True)["content"][1] == {
        "type": "text",
        "text": "[Anthropic server_tool_use block omitted]",
    }


def test_user_documents_search_results_uploads_and_file_images_round_trip() -> None:
    user = anthropic_user_with_documents()
    entries = parse_anthropic([copy.deepcopy(user)])
    _, history = anthropic_format.render_messages(entries, for_history=True)
    assert history == [user]

    openai, anthropic = both_views(entries)
    blocks = anthropic[0]["content"]
    # The model's view is the block as sent, but for cache_control (the agent's marker).
    assert blocks[0] == {k: v for k, v in user["content"][0].items() if k != "cache_control"}
    assert blocks[1:4] == user["content"][1:4]
    assert [p.get("text") for p in openai[0]["content"]] == [
        "[Anthropic document block omitted]",
        "[Anthropic search_result block omitted]",
        "[Anthropic container_upload block omitted]",
        "[Anthropic image block omitted]",
        "Summarize these.",
    ]


def test_tool_results_may_hold_documents_and_search_results() -> None:
    use = {"type": "tool_use", "id": "toolu_1", "name": "fetch", "input": {"url": "u"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [
            {"type": "text", "text": "fetched"},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "plain words"},
            },
            {
                "type": "search_result",
                "source": "s",
                "title": "t",
                "content": [{"type": "text", "text": "x"}],
            },
        ],
    }
    sent: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [result]},
    ]
    entries = parse_anthropic(copy.deepcopy(sent))
    _, history = anthropic_format.render_messages(entries, for_history=True)
    assert history == sent
    openai, anthropic = both_views(entries)
    assert anthropic[2]["content"][0]["content"] == result["content"]
    # OpenAI's tool messages take text parts only: the blocks become texts.
    assert openai[2]["content"] == [
        {"type": "text", "text": "fetched"},
        {"type": "text", "text": "[Anthropic document block omitted]"},
        {"type": "text", "text": "[Anthropic search_result block omitted]"},
    ]


def test_mcp_code_execution_and_compaction_blocks_round_trip() -> None:
    mcp_use = bt.BetaMCPToolUseBlock(
        id="mcptoolu_014Q35RayjACSWkSj4X2yov1",
        input={"repo": "a/b"},
        name="list_issues",
        server_name="github",
        type="mcp_tool_use",
    ).model_dump(mode="json")
    mcp_result = bt.BetaMCPToolResultBlock(
        content=[bt.BetaTextBlock(type="text", text="3 issues")],
        is_error=False,
        tool_use_id="mcptoolu_014Q35RayjACSWkSj4X2yov1",
        type="mcp_tool_result",
    ).model_dump(mode="json")
    bash_use = {
        "type": "server_tool_use",
        "id": "srvtoolu_02",
        "name": "bash_code_execution",
        "input": {"command": "ls"},
    }
    bash_result = at.BashCodeExecutionToolResultBlock.model_validate(
        {
            "type": "bash_code_execution_tool_result",
            "tool_use_id": "srvtoolu_02",
            "content": {
                "type": "bash_code_execution_result",
                "stdout": "a.txt\n",
                "stderr": "",
                "return_code": 0,
                "content": [],
            },
        }
    ).model_dump(mode="json")
    compaction = {"type": "compaction", "content": "Earlier: the user asked for issues."}
    sent: list[dict[str, Any]] = [
        {"role": "user", "content": "list issues"},
        {"role": "assistant", "content": [compaction, mcp_use, mcp_result, bash_use, bash_result]},
        {"role": "user", "content": "thanks"},
    ]
    entries = parse_anthropic(copy.deepcopy(sent))
    _, history = anthropic_format.render_messages(entries, for_history=True)
    assert history == sent
    _, anthropic = both_views(entries)
    assert anthropic[1]["content"] == sent[1]["content"]


def openai_user_with_file_and_audio() -> dict[str, Any]:
    wav = base64.b64encode(b"RIFF" + b"\0" * 32_000).decode()
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "Transcribe and compare."},
            {
                "type": "file",
                "file": {"filename": "spec.pdf", "file_data": f"data:application/pdf;base64,{PDF}"},
            },
            {"type": "file", "file": {"file_id": "file-6F2ksmvXxt4VdoqmHRw6kL"}},
            {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}},
        ],
    }


def test_openai_files_audio_and_refusals_round_trip() -> None:
    user = openai_user_with_file_and_audio()
    refusal = {
        "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I can't help with that."}],
        "refusal": None,
    }
    sent = [user, refusal, {"role": "user", "content": "ok"}]
    entries = parse_openai(copy.deepcopy(sent))
    assert [openai_format.render_message(e, for_history=True) for e in entries] == sent

    openai, anthropic = both_views(entries)
    assert openai[0]["content"] == user["content"]
    assert openai[1]["content"] == refusal["content"]
    assert anthropic[0]["content"] == [
        {"type": "text", "text": "Transcribe and compare."},
        {"type": "text", "text": "[OpenAI file part omitted]"},
        {"type": "text", "text": "[OpenAI file part omitted]"},
        {"type": "text", "text": "[OpenAI input_audio part omitted]"},
    ]
    # A refusal reads as the assistant's own words.
    assert anthropic[1]["content"] == [{"type": "text", "text": "I can't help with that."}]


# --- pairing: server tool blocks are not client tool calls --------------------------------


def _assistant_with_server_blocks(*, call: str | None) -> Entry:
    reply = anthropic_search_reply()
    blocks = reply["content"][1:3]  # the server tool's use and result, no text
    if call is not None:
        blocks.append({"type": "tool_use", "id": call, "name": "bash", "input": {}})
    (entry,) = anthropic_format.parse_message({"role": "assistant", "content": blocks}, "m")
    return entry


def test_server_tool_blocks_stay_when_an_abandoned_call_is_dropped() -> None:
    entries = [
        Entry(role="user", parts=[text_part("search, then run")]),
        _assistant_with_server_blocks(call="toolu_abandoned"),
        Entry(role="user", parts=[text_part("never mind")]),
    ]
    view = pair_tool_calls(entries)
    assert len(view) == 3
    assert [p["type"] for p in view[1].parts] == ["opaque", "opaque"]
    openai, anthropic = both_views(entries)
    assert "tool_calls" not in openai[1]
    assert [b["type"] for b in anthropic[1]["content"]] == [
        "server_tool_use",
        "web_search_tool_result",
    ]


def test_server_tool_blocks_need_no_result_entry() -> None:
    # A server tool's use is answered inside its own message: nothing is pending, nothing
    # orphaned, whatever follows.
    entries = [
        Entry(role="user", parts=[text_part("search")]),
        _assistant_with_server_blocks(call=None),
        tool_entry("orphan"),
        Entry(role="user", parts=[text_part("next")]),
    ]
    view = pair_tool_calls(entries)
    assert [e.role for e in view] == ["user", "assistant", "user"]
    both_views(entries)


# --- tokens -------------------------------------------------------------------------------


def _block_tokens(block: dict[str, Any]) -> int:
    return tokens.count_opaque_block(block)


def _pdf_block(size: int, seed: bytes = b"") -> dict[str, Any]:
    data = base64.b64encode((seed + os.urandom(size))[:size]).decode()
    return {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }


def test_an_inline_document_is_estimated_from_its_size_not_tokenized() -> None:
    small, medium, large = _pdf_block(1_000), _pdf_block(80_000), _pdf_block(800_000)
    frame = tokens.count_opaque(
        '{"type":"document","source":{"type":"base64","media_type":"application/pdf"}}'
    )
    assert _block_tokens(small) == frame + tokens.DOCUMENT_MIN_TOKENS
    assert _block_tokens(medium) == frame + 80_000 // tokens.DOCUMENT_BYTES_PER_TOKEN
    assert _block_tokens(large) == tokens.MAX_TOKENS_PER_PART
    # Random bytes tokenize to many more tokens than that: they were not tokenized.
    assert _block_tokens(medium) < tokens.count_text(medium["source"]["data"]) / 2
    assert _block_tokens(_pdf_block(80_000)) == _block_tokens(medium)


def test_audio_is_estimated_at_ten_tokens_a_second() -> None:
    user = openai_user_with_file_and_audio()
    audio = user["content"][3]
    second_of_wav = 32_000 + 4  # what the test's WAV holds
    frame = tokens.count_opaque('{"type":"input_audio","input_audio":{"format":"wav"}}')
    assert _block_tokens(audio) == frame + -(-second_of_wav // 3_200)
    mp3 = {"type": "input_audio", "input_audio": {"data": "A" * 21_336, "format": "mp3"}}
    assert _block_tokens(mp3) == tokens.count_opaque(
        '{"type":"input_audio","input_audio":{"format":"mp3"}}'
    ) + -(-16_002 // 1_600)


def test_an_inline_image_in_a_block_is_priced_as_an_image() -> None:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    frame = tokens.count_opaque(
        '{"type":"image","source":{"type":"base64","media_type":"image/png"}}'
    )
    image = tokens.count_image({"type": "image", "media_type": "image/png", "data": PNG})
    assert _block_tokens(block) == frame + image


def test_text_blocks_are_counted_as_their_json() -> None:
    reply = anthropic_search_reply()
    result = reply["content"][2]
    assert _block_tokens(result) == tokens.count_opaque(orjson.dumps(result).decode())
    (entry,) = anthropic_format.parse_message(reply, "m")
    expected = (
        tokens.MESSAGE_OVERHEAD_TOKENS
        + tokens.count_text(reply["content"][0]["text"])
        + sum(_block_tokens(b) for b in reply["content"][1:3])
        + tokens.count_text(reply["content"][3]["text"])
    )
    assert tokens.count_entry(entry) == expected


def test_a_file_data_url_is_a_document_and_a_file_id_is_its_json() -> None:
    user = openai_user_with_file_and_audio()
    inline, by_id = user["content"][1], user["content"][2]
    frame = tokens.count_opaque('{"type":"file","file":{"filename":"spec.pdf"}}')
    assert _block_tokens(inline) == frame + tokens.DOCUMENT_MIN_TOKENS
    assert _block_tokens(by_id) == tokens.count_opaque(orjson.dumps(by_id).decode())


# --- property: any history with opaque blocks stays valid ---------------------------------

DOCUMENT = opaque.opaque_part(
    "anthropic",
    {
        "type": "document",
        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
        "cache_control": {"type": "ephemeral"},
    },
)
SEARCH = opaque.opaque_part(
    "anthropic",
    {
        "type": "search_result",
        "source": "s",
        "title": "t",
        "content": [{"type": "text", "text": "x"}],
    },
)
AUDIO = opaque.opaque_part(
    "openai", {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
)
FILE = opaque.opaque_part("openai", {"type": "file", "file": {"file_id": "file-1"}})
REFUSAL = opaque.opaque_part("openai", {"type": "refusal", "refusal": "no"})
SERVER_PAIR = [opaque.opaque_part("anthropic", b) for b in anthropic_search_reply()["content"][1:3]]

USER_OPAQUE = st.sampled_from([[DOCUMENT], [SEARCH], [AUDIO], [FILE], [DOCUMENT, AUDIO]])
ASSISTANT_OPAQUE = st.sampled_from([SERVER_PAIR, [REFUSAL], [*SERVER_PAIR, REFUSAL]])
RESULT_OPAQUE = st.sampled_from([[DOCUMENT], [SEARCH], [DOCUMENT, SEARCH]])


@st.composite
def histories_with_opaque_blocks(draw: st.DrawFn) -> list[Entry]:
    """Messy histories (results missing, doubled, misplaced, orphaned) whose messages
    also hold opaque blocks of both formats, anywhere."""
    entries = draw(messy_histories())
    if draw(st.booleans()):
        # An assistant whose only words are server tool blocks, and a call never answered.
        at_ = draw(st.integers(0, len(entries)))
        entries.insert(at_, Entry(role="assistant", parts=[*SERVER_PAIR, call_part("gone")]))
    out: list[Entry] = []
    for entry in entries:
        if entry.role in ("user", "assistant", "tool") and draw(st.booleans()):
            pool = {"user": USER_OPAQUE, "assistant": ASSISTANT_OPAQUE, "tool": RESULT_OPAQUE}
            added = [dict(p) for p in draw(pool[entry.role])]
            at_ = draw(st.integers(0, len(entry.parts)))
            parts = [*entry.parts[:at_], *added, *entry.parts[at_:]]
            if entry.role == "assistant":  # reasoning first, as parsed
                parts.sort(key=lambda p: p["type"] != "reasoning")
            entry = Entry(
                role=entry.role,
                parts=parts,
                tool_call_id=entry.tool_call_id,
                content_form="parts",
            )
        out.append(entry)
    return out


@settings(max_examples=200, deadline=None)
@given(histories_with_opaque_blocks())
def test_views_with_opaque_blocks_are_valid_in_both_formats(entries: list[Entry]) -> None:
    both_views(entries)
    # The summarizers read them without failing.
    serialize_conversation(entries)
    extractive_summary(entries)


@settings(max_examples=200, deadline=None)
@given(histories_with_opaque_blocks(), st.data())
def test_after_a_cut_or_a_prune_the_view_is_still_valid(
    entries: list[Entry], data: st.DataObject
) -> None:
    for e in entries:
        e.tokens = tokens.count_entry(e)
    # A compaction keeps the entries from its cut on (after the pinned system entries).
    body = [e for e in entries if e.role not in ("system", "developer")]
    keep = data.draw(st.integers(0, sum(e.tokens for e in body)), label="keep_recent_tokens")
    cut = find_cut(body, keep)
    kept = body[cut.first_kept :]
    summary = Entry(role="user", parts=[text_part("<summary>earlier</summary>")])
    both_views([summary, *kept] if cut.first_kept else kept)

    # A prune shows placeholders for some tool results.
    results = [i for i, e in enumerate(entries) if e.role == "tool"]
    chosen = data.draw(st.sets(st.sampled_from(results)) if results else st.just(set()))
    pruned = [
        placeholder_entry(e.tool_call_id, e.tool_name, e.is_error, "[cleared]")
        if i in chosen
        else e
        for i, e in enumerate(entries)
    ]
    both_views(pruned)


@pytest.mark.parametrize("fmt", ["anthropic", "openai"])
def test_the_stored_view_of_an_opaque_part_is_what_the_render_gives(fmt: str) -> None:
    part = DOCUMENT if fmt == "anthropic" else AUDIO
    entry = Entry(role="user", parts=[text_part("see"), part])
    view_openai, view_anthropic = render_view(entry)
    assert orjson.loads(view_openai) == openai_format.render_message(entry)
    assert orjson.loads(view_anthropic) == anthropic_format.entry_blocks(entry)


def test_a_block_sent_back_without_its_nulls_or_cache_marker_compares_equal() -> None:
    message = at.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": anthropic_search_reply()["content"],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        }
    )
    with_nulls = [b.model_dump(mode="json") for b in message.content]
    without = [b.model_dump(mode="json", exclude_none=True) for b in message.content]
    assert with_nulls != without  # the SDK writes caller: null, page_age: null...
    marked = copy.deepcopy(without)
    marked[2]["cache_control"] = {"type": "ephemeral"}
    seen = []
    for blocks in (with_nulls, without, marked):
        (entry,) = anthropic_format.parse_message({"role": "assistant", "content": blocks}, "m")
        seen.append([opaque.comparable(p) for p in entry.parts if p["type"] == "opaque"])
        # What is stored is what was sent, nulls included.
        _, (back,) = anthropic_format.render_messages([entry], for_history=True)
        assert back["content"] == blocks
    assert seen[0] == seen[1] == seen[2]
    other = copy.deepcopy(without)
    other[1]["input"]["query"] = "something else"
    (entry,) = anthropic_format.parse_message({"role": "assistant", "content": other}, "m")
    assert [opaque.comparable(p) for p in entry.parts if p["type"] == "opaque"] != seen[0]
