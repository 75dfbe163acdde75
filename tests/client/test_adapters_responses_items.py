"""The client's Responses items converter (compactd_client.responses_items, used by
CompactdSession) stores each item as compactd's own Responses proxy does
(app.engine.proxy.responses_format), so that a session written through either reads
the same; and what it writes back from a context is what the proxy sends upstream,
plus the fields the Responses API's input types ask for (an output text's
``annotations``, an image's ``detail``)."""

from __future__ import annotations

import json
from typing import Any

from compactd_client.responses_items import items_to_messages, messages_to_items

from app.engine.proxy.responses_format import to_items, to_message

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "Fix the bug."},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "See this:"},
            {"type": "input_image", "image_url": "https://example.test/a.png", "detail": "low"},
            {"type": "input_file", "file_id": "file-1"},
        ],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Read it first."}],
        "encrypted_content": "gAAAA-opaque",
    },
    {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_1",
        "name": "read_file",
        "arguments": '{"path": "a.py"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "call_1", "output": "print('a')"},
    {
        "id": "ctc_1",
        "type": "custom_tool_call",
        "call_id": "call_2",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** End Patch",
        "status": "completed",
    },
    {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done."},
    {
        "type": "local_shell_call",
        "id": "lsh_1",
        "call_id": "call_3",
        "action": {"type": "exec", "command": ["ls"]},
        "status": "completed",
    },
    {"type": "local_shell_call_output", "call_id": "call_3", "output": "a.py"},
    {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"query": "x"}},
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Fixed.", "annotations": []}],
    },
]


def test_each_item_is_stored_as_the_proxy_stores_it() -> None:
    assert items_to_messages(ITEMS) == [to_message(item, "input") for item in ITEMS]


def context_of(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a context serves them: without the keys only the history gives
    back (an item's id and status)."""
    return [{k: v for k, v in m.items() if k not in ("id", "status")} for m in messages]


def test_a_context_is_written_back_as_the_proxy_writes_it() -> None:
    context = context_of(items_to_messages(ITEMS))
    ours = messages_to_items(context, custom_tools={"apply_patch"})
    proxy = to_items(context, frozenset({"apply_patch"}))
    # An output text's annotations, which the SDK's input type asks for (the proxy
    # echoes the agent's own request, which has them).
    assert "annotations" not in proxy[-1]["content"][0]
    proxy[-1]["content"][0]["annotations"] = []
    assert ours == proxy
    # Every item comes back: the opaque ones whole, the calls with their ids.
    assert json.dumps(ours[2]) == json.dumps(ITEMS[2])
    assert ours[7] == ITEMS[7]
    assert ours[9] == ITEMS[9]
    assert ours[5]["type"] == "custom_tool_call"
    assert ours[6]["type"] == "custom_tool_call_output"


def test_the_history_gives_each_item_back_whole() -> None:
    """Read from the history (ids and statuses kept), the items are the ones stored."""
    back = messages_to_items(items_to_messages(ITEMS), custom_tools={"apply_patch"})
    expected = [{"type": "message", **ITEMS[0]}, *ITEMS[1:]]
    expected[1] = {**ITEMS[1]}
    assert back == expected
