"""What was dropped (issue 16), through the API: a compaction run by a real worker with
the extractive summarizer records in its details the specifics the entries it replaced
named, and GET …/compactions/{cid} shows them."""

from __future__ import annotations

from typing import Any

import httpx

from tests.compactions.helpers import compaction, conversation, drain
from tests.conftest import make_session
from tests.helpers import append_ok, history

MANUAL = {
    "compaction": {"auto": False, "keep_recent_tokens": 3_000},
    "prune": {"auto": False},
}

FAILURE = (
    "Traceback (most recent call last):\n"
    '  File "/testbed/src/dates.py", line 41, in parse_date\n'
    "    return datetime(year, month, day)\n"
    "ValueError: month must be in 1..12\n"
    "See https://docs.python.org/3/library/datetime.html for the formats.\n"
)


async def test_a_compaction_shows_what_left_the_context(
    app: Any, client: httpx.AsyncClient
) -> None:
    await make_session(client, id="dropped", config=MANUAL)
    batches = conversation(24)
    # The first step's result: a failure, a URL and a version, in what will be summarized.
    assert batches[1][1]["role"] == "tool"
    batches[1][1]["content"] = FAILURE + "python 3.11.4 on linux\n" + batches[1][1]["content"]
    for batch in batches:
        await append_ok(client, "dropped", batch)

    r = await client.post("/v1/sessions/dropped/compactions", json={})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    done = await compaction(client, "dropped", r.json()["id"])
    assert done["status"] == "succeeded", done
    dropped: dict[str, Any] = done["details"]["dropped"]

    assert set(dropped) == {
        "paths",
        "commands",
        "errors",
        "identifiers",
        "numbers",
        "urls",
        "truncated",
    }
    for kind in ("paths", "commands", "errors", "identifiers", "numbers", "urls"):
        assert dropped[kind]["count"] >= len(dropped[kind]["first"])
        assert len(dropped[kind]["first"]) <= 20
    assert dropped["truncated"] is False
    # The task's file (the first request), then the files in the order the calls and
    # the outputs named them.
    assert dropped["paths"]["first"][:4] == [
        "src/dates.py",
        "src/mod0.py",
        "/testbed/src/dates.py",
        "src/mod1.py",
    ]
    assert dropped["commands"]["first"][:2] == ["cat src/mod0.py", "cat src/mod1.py"]
    assert dropped["errors"]["first"] == [
        'File "/testbed/src/dates.py", line 41, in parse_date',
        "ValueError: month must be in 1..12",
    ]
    # Each value with the seqs of the entries that hold it (tests/recall/test_dropped_seqs.py).
    seqs = {kind: dropped[kind].pop("seqs") for kind in ("identifiers", "numbers", "urls")}
    assert dropped["identifiers"] == {"count": 2, "first": ["parse_date", "ValueError"]}
    assert dropped["numbers"] == {"count": 1, "first": ["3.11.4"]}
    assert dropped["urls"] == {
        "count": 1,
        "first": ["https://docs.python.org/3/library/datetime.html"],
    }
    assert seqs["numbers"] == seqs["urls"] == [[4]]  # the first step's result

    # Only what the compaction replaced: the commands of the kept entries are not there.
    stored = await history(client, "dropped")
    kept_commands = {
        call["function"]["arguments"]
        for entry in stored
        if entry["seq"] >= done["first_kept_seq"] and entry["role"] == "assistant"
        for call in entry["message"].get("tool_calls") or []
    }
    assert kept_commands
    replaced = [
        entry
        for entry in stored
        if entry["seq"] < done["first_kept_seq"] and entry["role"] == "assistant"
    ]
    replaced_commands = {
        call["function"]["arguments"]
        for entry in replaced
        for call in entry["message"].get("tool_calls") or []
    }
    # Parallel calls ran the same command: it is counted once.
    assert dropped["commands"]["count"] == len(replaced_commands) > 10
    assert dropped["paths"]["count"] == len(replaced_commands) + 2  # one file a command
    for command in kept_commands:
        assert command.split('"')[3] not in dropped["commands"]["first"]
