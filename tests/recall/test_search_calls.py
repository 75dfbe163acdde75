"""A tool result is searchable together with its call: its searchable text starts with a
line naming the call (the tool, ``$ <command>`` or the path), written by the append
that stores it, whether the call came in the same append or an earlier one."""

from __future__ import annotations

from typing import Any

import asyncpg
import httpx
import orjson

from tests import postgres
from tests.conftest import make_session
from tests.helpers import append_ok
from tests.recall.support import MANUAL, search, searchable
from tests.tree.support import fork_ok, result

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/work/analyze_fix.py", line 41, in <module>\n'
    "    main()\n"
    "NameError: name 'frobnicate' is not defined"
)


def _calling(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def _texts(db_url: str, sid: str) -> dict[int, str]:
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:
        rows = await conn.fetch("SELECT seq, search_text FROM entry WHERE session_id = $1", sid)
    finally:
        await conn.close()
    return {r["seq"]: r["search_text"] for r in rows}


async def test_a_query_of_a_commands_words_and_its_outputs_finds_the_result(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await make_session(client, id="s", config=MANUAL)
    command = "cd /work && python analyze_fix.py --input data.csv"
    # The call in one append, its result in the next: the append reads the open call.
    await append_ok(
        client,
        "s",
        [
            {"role": "user", "content": "Run the fix script."},  # 1
            _calling("c1", "bash", {"command": command, "timeout": 60}),  # 2
        ],
    )
    await append_ok(client, "s", [result("c1", TRACEBACK)])  # 3
    # The call and its result in one append.
    await append_ok(
        client,
        "s",
        [
            _calling("c2", "read_file", {"path": "src/registry.py", "offset": 120}),  # 4
            result("c2", "135     register(name)"),  # 5
        ],
    )
    texts = await _texts(db_url, "s")
    assert texts[3] == f"bash $ {command}\n{TRACEBACK}"
    assert texts[5] == "read_file src/registry.py offset: 120\n135     register(name)"
    # What the history gives back works out the same text (the tests' own reading).
    assert {seq: text for seq, (_, text) in (await searchable(client, "s")).items()} == texts

    # Words of the command and of the output: only the result holds both.
    page = await search(client, "s", "analyze_fix.py NameError frobnicate")
    assert [h["seq"] for h in page["hits"]] == [3]
    page = await search(client, "s", "python analyze_fix.py data.csv not defined")
    assert page["hits"][0]["seq"] == 3
    # The path a read named finds what it read, with the output's words.
    page = await search(client, "s", "registry.py register name")
    assert page["hits"][0]["seq"] == 5
    # A command as written finds the call and its result, the snippet showing the call.
    page = await search(client, "s", "python analyze_fix.py --input")
    assert sorted(h["seq"] for h in page["hits"]) == [2, 3]
    hit = next(h for h in page["hits"] if h["seq"] == 3)
    assert hit["snippet"].startswith("bash $ cd /work && «python analyze_fix.py --input»")


async def test_a_call_made_before_a_fork_and_answered_on_it_names_its_call(
    client: httpx.AsyncClient, db_url: str
) -> None:
    await make_session(client, id="s", config=MANUAL)
    await append_ok(
        client,
        "s",
        [
            {"role": "user", "content": "Check the version."},  # 1
            _calling("c1", "bash", {"command": "python --version"}),  # 2
        ],
    )
    forked = await fork_ok(client, "s", id="f", at_seq=2)
    assert forked["id"] == "f"
    # Each path answers the call once; each result names the call it answers.
    await append_ok(client, "f", [result("c1", "Python 3.11.7")])
    await append_ok(client, "s", [result("c1", "Python 3.12.1")])
    for sid, version in (("f", "3.11.7"), ("s", "3.12.1")):
        page = await search(client, sid, f"python --version {version}")
        assert page["hits"][0]["seq"] == 3, page
        shown = page["hits"][0]["snippet"].replace("«", "").replace("»", "")
        assert shown == f"bash $ python --version\nPython {version}", page
    conn = await asyncpg.connect(postgres.asyncpg_dsn(db_url))
    try:  # both branches' rows: the family's root holds them
        rows = await conn.fetch("SELECT search_text FROM entry WHERE session_id = 's' AND seq = 3")
    finally:
        await conn.close()
    assert sorted(r["search_text"] for r in rows) == [
        "bash $ python --version\nPython 3.11.7",
        "bash $ python --version\nPython 3.12.1",
    ]
