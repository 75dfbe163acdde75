"""The client's recall methods (search, get_tools, run_tool_call) against a real compactd
over HTTP, each test once with :class:`AsyncCompactd` and once with :class:`Compactd`
(wrapped as :class:`~tests.client.test_client.Awaited`): a search finds what a
compaction took out of the context and says where it is, with every filter and a page
at a time; the recall tools come in both providers' formats; a model's call of
``history_read`` (a dict, or the SDK's own object) is run and answers the stored
entries, within the call's cap or the session's ``recall.result_tokens``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from anthropic.types import ToolUseBlock
from compactd_client import AsyncCompactd, Compactd, InvalidRequestError, NotFoundError
from compactd_client.types import Compaction, SearchPage
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from tests.client.test_client import MANUAL, Awaited

ERROR = "django.core.exceptions.ImproperlyConfigured: settings/prod_quux.py lacks SECRET_KEY"


@pytest.fixture(params=["async", "sync"])
async def api(request: pytest.FixtureRequest, compactd_url: str) -> AsyncIterator[AsyncCompactd]:
    """A client of this test's compactd: the async one, or the sync one awaited."""
    if request.param == "async":
        async with AsyncCompactd(compactd_url) as client:
            yield client
    else:
        with Compactd(compactd_url) as sync:
            yield cast(AsyncCompactd, Awaited(sync))


def step(k: int) -> list[dict[str, Any]]:
    """A user asks, the assistant runs a command, the command's log comes back (step 2's
    is the error) and the assistant answers."""
    call = f"call_{k}"
    output = ERROR if k == 2 else f"deploy log line {k} " * 40
    return [
        {"role": "user", "content": f"Step {k}: why does the deploy fail?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call,
                    "type": "function",
                    "function": {
                        "name": "bash",
                        "arguments": json.dumps({"command": f"cat deploy{k}.log"}),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call, "content": output},
        {"role": "assistant", "content": f"Step {k}'s log is read."},
    ]


async def compacted(api: AsyncCompactd, sid: str) -> Compaction:
    """A session of six steps (24 entries, step 2's at seqs 9-12) whose early history an
    extractive compaction replaced; that compaction."""
    await api.create_session("gpt-4o", id=sid, config=MANUAL)
    await api.append_messages(sid, [m for k in range(6) for m in step(k)])
    job = await api.request_compaction(sid, summarizer="extractive", wait=60)
    assert job["status"] == "succeeded", job
    assert job["first_kept_seq"] is not None
    assert job["first_kept_seq"] > 12, job  # step 2 left the context
    return job


async def test_a_search_finds_a_compacted_entry_and_says_where_it_is(api: AsyncCompactd) -> None:
    job = await compacted(api, "found")
    assert ERROR not in json.dumps((await api.get_context("found"))["messages"])

    page = await api.search("found", "prod_quux.py")
    assert page["complete"] is True
    assert page["next_cursor"] is None
    assert [(h["seq"], h["role"], h["tool_name"]) for h in page["hits"]] == [(11, "tool", "bash")]
    hit = page["hits"][0]
    assert (hit["kind"], hit["branch"], hit["on_path"], hit["compacted"]) == (
        "message",
        0,
        True,
        True,
    )
    assert "«prod_quux.py»" in hit["snippet"]
    assert hit["score"] >= 4  # where the query stands as written
    stored = (await api.list_messages("found", after_seq=10, limit=1))["entries"][0]
    assert (stored["id"], stored["message"]["content"]) == (hit["id"], ERROR)

    # Each filter narrows to what it names; a filter that leaves the entry out finds
    # nothing.
    async def seqs(**filters: Any) -> list[int]:
        return [h["seq"] for h in (await api.search("found", "prod_quux.py", **filters))["hits"]]

    assert await seqs(role=["tool", "user"], tool=["bash"], kind=["message"]) == [11]
    assert await seqs(role=["user", "tool"], tool=["read_file", "bash"]) == [11]
    assert await seqs(from_seq=11, to_seq=11, compaction=job["id"]) == [11]
    assert await seqs(role=["assistant"]) == []
    assert await seqs(tool=["read_file"]) == []
    assert await seqs(kind=["compaction"]) == []
    assert await seqs(from_seq=12) == []
    assert await seqs(to_seq=10) == []

    # A word of every step's user request (and of the summary, which quotes the first),
    # a page at a time.
    summary = await api.search("found", "deploy", kind=["compaction"])
    assert [(h["seq"], h["compacted"]) for h in summary["hits"]] == [(job["entry_seq"], False)]

    async def requests(limit: int, cursor: str | None = None) -> SearchPage:
        return await api.search(
            "found", "deploy", role=["user"], kind=["message"], limit=limit, cursor=cursor
        )

    whole = await requests(50)
    assert sorted(h["seq"] for h in whole["hits"]) == [1, 5, 9, 13, 17, 21]
    pages = [await requests(4)]
    while (cursor := pages[-1]["next_cursor"]) is not None:
        pages.append(await requests(4, cursor))
    assert [len(p["hits"]) for p in pages] == [4, 2]
    assert [h for p in pages for h in p["hits"]] == whole["hits"]
    assert {h["seq"]: h["compacted"] for h in whole["hits"]} == {
        seq: seq < cast(int, job["first_kept_seq"]) for seq in (1, 5, 9, 13, 17, 21)
    }

    with pytest.raises(InvalidRequestError) as other_query:
        await api.search("found", "deploy", role=["tool"], cursor=pages[0]["next_cursor"])
    assert [e["field"] for e in other_query.value.errors] == ["cursor"], other_query.value.body
    with pytest.raises(InvalidRequestError) as bad_role:
        await api.search("found", "deploy", role=cast(Any, ["wizard"]))
    assert bad_role.value.status == 422
    with pytest.raises(NotFoundError):
        await api.search("found", "deploy", compaction="00000000-0000-0000-0000-000000000000")
    with pytest.raises(NotFoundError):
        await api.search("nobody", "deploy")


async def test_the_recall_tools_come_in_both_formats(api: AsyncCompactd) -> None:
    openai = await api.get_tools(format="openai")
    assert openai["format"] == "openai"
    assert [t["type"] for t in openai["tools"]] == ["function", "function"]
    assert [t["function"]["name"] for t in openai["tools"]] == ["history_search", "history_read"]
    assert all(t["function"]["parameters"]["type"] == "object" for t in openai["tools"])
    assert await api.get_tools() == openai  # OpenAI's by default

    anthropic = await api.get_tools(format="anthropic")
    assert anthropic["format"] == "anthropic"
    assert [t["name"] for t in anthropic["tools"]] == ["history_search", "history_read"]
    assert [t["input_schema"] for t in anthropic["tools"]] == [
        t["function"]["parameters"] for t in openai["tools"]
    ]

    with pytest.raises(InvalidRequestError) as bad:
        await api.get_tools(format=cast(Any, "gemini"))
    assert bad.value.status == 422


async def test_a_history_read_call_answers_the_stored_entries(api: AsyncCompactd) -> None:
    job = await compacted(api, "read")
    session = await api.get_session("read")
    assert session["config"]["recall"] == {"result_tokens": 4_000, "proxy_tools": False}

    # The model's call as a dict, OpenAI's: step 2 read back as stored.
    call: dict[str, Any] = {
        "id": "call_read",
        "type": "function",
        "function": {
            "name": "history_read",
            "arguments": json.dumps({"from_seq": 9, "to_seq": 12}),
        },
    }
    read = await api.run_tool_call("read", call)
    assert (read["tool_call_id"], read["name"], read["format"]) == (
        "call_read",
        "history_read",
        "openai",
    )
    assert (read["is_error"], read["truncated"]) == (False, False)
    assert read["content"].startswith("[seq 9] user: Step 2: why does the deploy fail?")
    assert f"[seq 11] tool (bash): {ERROR}" in read["content"]
    assert "Step 3" not in read["content"]
    assert 0 < read["tokens"] <= 4_000
    assert read["message"] == {
        "role": "tool",
        "tool_call_id": "call_read",
        "content": read["content"],
    }

    # The SDKs' own objects: what the compaction replaced, from seq 9 on.
    block = ToolUseBlock(
        type="tool_use",
        id="toolu_read",
        name="history_read",
        input={"compaction": job["id"], "from_seq": 9, "to_seq": 12},
    )
    replaced = await api.run_tool_call("read", block)
    assert replaced["format"] == "anthropic"
    assert replaced["content"] == read["content"]
    assert replaced["message"] == {
        "type": "tool_result",
        "tool_use_id": "toolu_read",
        "content": read["content"],
    }
    sdk_call = ChatCompletionMessageFunctionToolCall.model_validate(call)
    assert await api.run_tool_call("read", sdk_call) == read

    # Within the call's cap, else the session's: cut, ending with how to read on.
    whole = {**call, "function": {"name": "history_read", "arguments": '{"from_seq": 1}'}}
    capped = await api.run_tool_call("read", whole, max_tokens=200)
    assert capped["truncated"] is True
    assert capped["tokens"] <= 200
    assert "history_read with from_seq=" in capped["content"]
    await api.update_session("read", {"config": {"recall": {"result_tokens": 300}}})
    by_config = await api.run_tool_call("read", whole)
    assert by_config["truncated"] is True
    assert capped["tokens"] < by_config["tokens"] <= 300

    # Wrong arguments are a result for the model to try again; no tool call is a 422.
    wrong = await api.run_tool_call(
        "read", {**call, "function": {**call["function"], "arguments": "{}"}}
    )
    assert wrong["is_error"] is True
    assert wrong["content"].startswith("Error: ")
    with pytest.raises(InvalidRequestError) as not_a_call:
        await api.run_tool_call("read", {"name": "history_read"})
    assert [e["field"] for e in not_a_call.value.errors] == ["tool_call"], not_a_call.value.body
    with pytest.raises(InvalidRequestError):
        await api.run_tool_call("read", call, max_tokens=10)
