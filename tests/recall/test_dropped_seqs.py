"""The dropped index is linked to the entries: what a compaction lists as dropped
(``details.dropped`` at GET …/compactions/{id}) names, for each value, the seqs of the
entries that hold it, and ``history_read`` with those seqs opens the entry that holds it."""

from __future__ import annotations

from typing import Any

import httpx

from tests.recall.test_tools import openai_call, run, seeded


async def test_each_dropped_value_names_the_entries_that_hold_it(
    app: Any, client: httpx.AsyncClient
) -> None:
    cid = await seeded(app, client, "r")
    job = (await client.get(f"/v1/sessions/r/compactions/{cid}")).json()
    assert job["status"] == "succeeded", job["error"]
    index = job["details"]["dropped"]
    opened = 0
    for kind in ("paths", "commands", "errors", "identifiers", "numbers", "urls"):
        values, seqs = index[kind]["first"], index[kind]["seqs"]
        assert len(seqs) == len(values), kind
        for value, where in zip(values, seqs, strict=True):
            assert 1 <= len(where) <= 3, (kind, value, where)
            assert where == sorted(set(where))
            assert all(s < job["first_kept_seq"] for s in where)
            for seq in where:
                read = await run(client, "r", openai_call("history_read", from_seq=seq, to_seq=seq))
                # The entry at that seq, and the value in it as written.
                assert read["content"].startswith(f"[seq {seq}]"), read["content"][:80]
                assert value in read["content"], (kind, value, seq)
                opened += 1
    # The seeded history's odd step: its exception's name and its command, at their seqs.
    names = dict(zip(index["identifiers"]["first"], index["identifiers"]["seqs"], strict=True))
    # Step 2's tool result (3 entries a step, from seq 1).
    assert names["django.core.exceptions.ImproperlyConfigured"] == [9]
    commands = dict(zip(index["commands"]["first"], index["commands"]["seqs"], strict=True))
    assert commands["cat step2.log"] == [8]  # the call that ran it
    assert "settings/prod_quux.py" in index["paths"]["first"]
    assert opened > 10
