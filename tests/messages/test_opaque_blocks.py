"""Content the providers' APIs return or accept that compactd keeps as sent: Anthropic's
server tool blocks (web search...), documents and search results; OpenAI's files, audio
and refusals. Refusing them made every later append of the agent a 422 (through the
proxy, a 400 on every later call): the session was dead."""

from __future__ import annotations

import copy
from typing import Any

import httpx
from anthropic.types import Message

from app.engine.accounting import tokens
from app.engine.formats import anthropic_format
from app.engine.window.context import check_anthropic_pairing, check_openai_pairing
from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.engine.test_opaque_format import (
    PDF,
    assert_sdk_valid_anthropic,
    assert_sdk_valid_openai,
    openai_user_with_file_and_audio,
)
from tests.helpers import append, append_ok, history

MANUAL = {"prune": {"auto": False}, "compaction": {"auto": False}}


def search_reply() -> dict[str, Any]:
    """The reply of a call that ran Anthropic's web search, as its SDK hands it back."""
    message = Message.model_validate(
        {
            "id": "msg_01",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01",
                    "name": "web_search",
                    "input": {"query": "postgres skip locked"},
                },
                {
                    "type": "web_search_tool_result",
                    "tool_use_id": "srvtoolu_01",
                    "content": [
                        {
                            "type": "web_search_result",
                            "url": "https://www.postgresql.org/docs/current/sql-select.html",
                            "title": "SELECT",
                            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5" * 40,
                            "page_age": None,
                        }
                    ],
                },
                {"type": "text", "text": "SKIP LOCKED skips rows another transaction holds."},
                {"type": "tool_use", "id": "toolu_01", "name": "bash", "input": {"cmd": "ls"}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5},
        }
    )
    return {"role": "assistant", "content": [b.model_dump(mode="json") for b in message.content]}


def document_result() -> dict[str, Any]:
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_01",
                "content": [
                    {"type": "text", "text": "a.txt\n" * 200},
                    {
                        "type": "document",
                        "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                        "title": "report.pdf",
                    },
                ],
            },
            {
                "type": "document",
                "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                "cache_control": {"type": "ephemeral"},
            },
            {"type": "text", "text": "And read this one too."},
        ],
    }


async def contexts(client: httpx.AsyncClient, sid: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The context in both formats, checked valid by the engine and the SDKs' types."""
    out = []
    for fmt in ("openai", "anthropic"):
        r = await client.get(f"/v1/sessions/{sid}/context", params={"format": fmt})
        assert r.status_code == 200, r.text
        out.append(r.json())
    openai, anthropic = out
    assert check_openai_pairing(openai["messages"]) == []
    assert check_anthropic_pairing(anthropic["messages"]) == []
    assert_sdk_valid_openai(openai["messages"])
    assert_sdk_valid_anthropic(anthropic["messages"])
    return openai, anthropic


async def test_a_session_with_server_tool_blocks_and_documents_lives_on(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="web", model="claude-sonnet-4-5", config=MANUAL)
    turn1: list[dict[str, Any]] = [
        {"role": "user", "content": "How does SKIP LOCKED work? Search."},
        search_reply(),
    ]
    turn2 = [document_result()]
    turn3: list[dict[str, Any]] = [
        {"role": "assistant", "content": [{"type": "text", "text": "Both read."}]},
        {"role": "user", "content": "Thanks. Next question."},
    ]
    sent = copy.deepcopy(turn1 + turn2 + turn3)
    for batch in (turn1, turn2, turn3):
        body = await append_ok(client, "web", batch, fmt="anthropic")
    assert body["version"] >= 4

    # The stored history gives back every block exactly as sent (a user message's tool
    # results are entries of their own, the rest of it one more).
    stored = [e["message"] for e in await history(client, "web", fmt="anthropic")]
    with_results: list[dict[str, Any]] = sent[2]["content"]
    split = [
        {"role": "user", "content": with_results[:1]},
        {"role": "user", "content": with_results[1:]},
    ]
    assert stored == [*sent[:2], *split, *sent[3:]]

    # Counted as an estimate, once, on write: the reply costs at least its blocks' JSON.
    entries = await history(client, "web", fmt="anthropic")
    reply = entries[1]
    assert reply["role"] == "assistant"
    blocks = search_reply()["content"]
    assert reply["tokens"] >= sum(tokens.count_opaque_block(b) for b in blocks[:2])
    (parsed,) = anthropic_format.parse_message(search_reply(), "m")
    assert reply["tokens"] == tokens.count_entry(parsed)

    openai, anthropic = await contexts(client, "web")
    shown = anthropic["messages"][1]["content"]
    assert shown[:2] == blocks[:2]  # the server tool's use and result, unchanged
    assert shown[3]["type"] == "tool_use"
    shown_user = anthropic["messages"][2]["content"]
    assert shown_user[0]["type"] == "tool_result"
    assert shown_user[0]["content"][1]["type"] == "document"
    assert shown_user[1] == {k: v for k, v in with_results[1].items() if k != "cache_control"}
    # OpenAI: the blocks are short texts, and the client call keeps its result.
    assistant = openai["messages"][1]
    assert assistant["content"][0] == {
        "type": "text",
        "text": "[Anthropic server_tool_use block omitted]",
    }
    assert [c["id"] for c in assistant["tool_calls"]] == ["toolu_01"]
    assert openai["messages"][2]["role"] == "tool"


async def test_pruning_a_result_that_holds_a_document_leaves_a_valid_context(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="pr", model="claude-sonnet-4-5", config=MANUAL)
    await append_ok(
        client,
        "pr",
        [{"role": "user", "content": "Search."}, search_reply(), document_result()],
        fmt="anthropic",
    )
    await append_ok(
        client,
        "pr",
        [
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "Next."},
            {"role": "assistant", "content": "Ok."},
            {"role": "user", "content": "And next."},
        ],
        fmt="anthropic",
    )
    r = await client.post(
        "/v1/sessions/pr/prune",
        json={"protect_tokens": 0, "minimum_tokens": 0, "protect_turns": 0},
    )
    assert r.status_code == 200, r.text
    assert [p["seq"] for p in r.json()["pruned"]] == [3]
    _, anthropic = await contexts(client, "pr")
    result = anthropic["messages"][2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == "toolu_01"
    assert isinstance(result["content"], str)  # the placeholder
    # The server tool blocks are untouched: pruning is for client tool results.
    assert anthropic["messages"][1]["content"][0]["type"] == "server_tool_use"


async def test_a_compaction_over_opaque_blocks_leaves_a_valid_context(
    client: httpx.AsyncClient, app: Any
) -> None:
    config = {"prune": {"auto": False}, "compaction": {"auto": False, "keep_recent_tokens": 100}}
    await make_session(client, id="cp", model="claude-sonnet-4-5", config=config)
    await append_ok(
        client,
        "cp",
        [{"role": "user", "content": "Search."}, search_reply(), document_result()],
        fmt="anthropic",
    )
    searched = search_reply()["content"][:2]
    for k in range(3):
        # Every later turn searches again: the cut falls among server tool blocks.
        ids = {"srvtoolu_01": f"srvtoolu_1{k}"}
        blocks = [
            {**searched[0], "id": ids["srvtoolu_01"]},
            {**searched[1], "tool_use_id": ids["srvtoolu_01"]},
            {"type": "text", "text": f"Finding {k}: " + "rows are skipped. " * 40},
        ]
        await append_ok(
            client,
            "cp",
            [{"role": "assistant", "content": blocks}, {"role": "user", "content": f"More {k}."}],
            fmt="anthropic",
        )
    r = await client.post("/v1/sessions/cp/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = (await client.get(f"/v1/sessions/cp/compactions/{r.json()['id']}")).json()
    assert job["status"] == "succeeded", job
    assert job["first_kept_seq"] > 3
    _, anthropic = await contexts(client, "cp")
    kept = [b for m in anthropic["messages"] for b in m["content"]]
    # What is kept holds each server tool's use with its result.
    uses = [b["id"] for b in kept if b["type"] == "server_tool_use"]
    results = [b["tool_use_id"] for b in kept if b["type"] == "web_search_tool_result"]
    assert uses
    assert uses == results


async def test_openai_files_audio_and_refusals_are_stored_and_shown(
    client: httpx.AsyncClient,
) -> None:
    await make_session(client, id="oa", config=MANUAL)
    sent = [
        openai_user_with_file_and_audio(),
        {
            "role": "assistant",
            "content": [{"type": "refusal", "refusal": "I can't transcribe that."}],
            "refusal": None,
            "annotations": [],
        },
        {"role": "user", "content": "Then just the PDF."},
    ]
    await append_ok(client, "oa", copy.deepcopy(sent))
    stored = [e["message"] for e in await history(client, "oa")]
    assert stored == sent
    entries = await history(client, "oa")
    # The audio (32 kB of WAV, a second) and the inline PDF are estimated, not tokenized.
    audio_b64 = sent[0]["content"][3]["input_audio"]["data"]
    assert entries[0]["tokens"] < tokens.count_text(audio_b64) + tokens.DOCUMENT_MIN_TOKENS

    openai, anthropic = await contexts(client, "oa")
    assert openai["messages"][0]["content"] == sent[0]["content"]
    assert anthropic["messages"][0]["content"][3] == {
        "type": "text",
        "text": "[OpenAI input_audio part omitted]",
    }
    assert anthropic["messages"][1]["content"] == [
        {"type": "text", "text": "I can't transcribe that."}
    ]


async def test_unknown_blocks_are_still_422s_naming_them(client: httpx.AsyncClient) -> None:
    await make_session(client, id="bad")
    r = await append(
        client,
        "bad",
        [{"role": "user", "content": [{"type": "hologram", "data": "x"}]}],
        fmt="anthropic",
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "messages[0].content[0].type"
    r = await append(
        client,
        "bad",
        [{"role": "user", "content": [{"type": "input_audio", "input_audio": "AAAA"}]}],
    )
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "messages[0].content[0].input_audio"
    assert await history(client, "bad") == []
