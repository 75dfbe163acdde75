"""A session under the verbatim_first compaction policy, through the API and a real
worker (extractive summarizer): its compactions keep the user's and the assistant's
text as written within the capped share, leave a one-line pointer per old tool
output that history_read opens, and the context stays valid and under budget."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

from app.engine.window.context import check_openai_pairing
from tests.compactions.helpers import compaction, conversation, drain
from tests.conftest import make_session
from tests.helpers import append_ok

# usable = 16,000 - 2,000 = 14,000; the threshold 10,000 tokens (reserve 4,000).
SMALL = {"context_window": 16_000, "max_output_tokens": 2_000}
USABLE = 14_000
VERBATIM = {
    "compaction": {
        "reserve_tokens": 4_000,
        "keep_recent_tokens": 3_000,
        "summarizer": "extractive",
        "policy": "verbatim_first",
        "verbatim_share": 0.2,
    },
    "prune": {"auto": False},
}
POINTER = re.compile(
    r"^- tool output seq (\d+): bash `([^`]*)`.*history_read from_seq=(\d+) to_seq=(\d+)$", re.M
)


async def test_a_verbatim_first_session_compacts_and_its_pointers_read_back(
    app: Any, client: httpx.AsyncClient
) -> None:
    created = await make_session(client, id="v", **SMALL, config=VERBATIM)
    assert created["config"]["compaction"]["policy"] == "verbatim_first"
    jobs: list[str] = []
    for batch in conversation(60, words=300):
        body = await append_ok(client, "v", batch)
        if body["compaction"] is not None:
            jobs.append(body["compaction"]["id"])
            await drain(app)
    jobs = list(dict.fromkeys(jobs))
    assert len(jobs) >= 2, "the history should compact more than once"

    budget = int(0.2 * USABLE)
    for cid in jobs:
        done = await compaction(client, "v", cid)
        assert done["status"] == "succeeded", done
        assert done["summarizer_used"] == "extractive"
        details = done["details"]
        assert details["policy"] == "verbatim_first"
        kept = details["verbatim"]
        # The cap: never more than the share of the usable window, previous block included.
        assert 0 < kept["tokens"] <= kept["budget_tokens"] <= budget
        assert kept["messages"], "the recent user and assistant text stays as written"
        assert "<verbatim-history>" in done["summary"]
        for message in kept["messages"]:
            assert message["text"] in done["summary"]

    r = await client.get("/v1/sessions/v/context", params={"format": "openai"})
    assert r.status_code == 200, r.text
    ctx = r.json()
    assert check_openai_pairing(ctx["messages"], allow_pending=False) == []
    assert ctx["tokens"]["estimated"] <= ctx["tokens"]["budget"]
    summary = next(
        m["content"]
        for m in ctx["messages"]
        if isinstance(m.get("content"), str) and "<verbatim-history>" in m["content"]
    )
    assert summary.count("<verbatim-history>") == 1
    # The old outputs themselves are gone; each left one line that names its seq.
    pointers = POINTER.findall(summary)
    assert pointers
    for seq, _command, low, high in pointers:
        assert seq == low == high
    seq, command, _, _ = pointers[-1]
    module = re.fullmatch(r"cat src/mod(\d+)\.py", command)
    assert module is not None, command
    k = int(module[1])
    call = {
        "id": "call_read",
        "type": "function",
        "function": {
            "name": "history_read",
            "arguments": json.dumps({"from_seq": int(seq), "to_seq": int(seq)}),
        },
    }
    r = await client.post("/v1/sessions/v/tool-calls", json={"tool_call": call})
    assert r.status_code == 200, r.text
    result = r.json()
    assert not result["is_error"], result
    # That entry is the output of the call the pointer names (conversation(): the
    # output of call c{k} lists "value = n * k").
    assert f"line 7 of c{k}" in result["content"]
    assert f"value = {7 * k}" in result["content"]
    assert f"line 7 of c{k}" not in summary
