"""Exact identifiers and places in files rank above prose: a query ``registry.py:135``
(or ``registry.py line 135``) finds the traceback frame ``File "…/registry.py", line
135`` and its snippet shows that line; an identifier as written outranks its words,
and the entry that holds it outranks a summary that lists it."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

from tests.compactions.helpers import drain
from tests.conftest import make_session
from tests.helpers import append_ok
from tests.recall.support import MANUAL, search
from tests.tree.support import result

FRAMES = "".join(
    f'  File "/srv/app/lib/mod{i}.py", line {100 + i}, in step{i}\n    step{i + 1}()\n'
    for i in range(200)
)
TRACEBACK = (
    "Traceback (most recent call last):\n"
    + FRAMES
    + '  File "/srv/app/lib/registry.py", line 135, in <module>\n'
    + "    register(name)\n"
    + "KeyError: 'plugin'\n"
)


def _calling(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    call = {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}


async def test_a_path_and_line_finds_the_frame_and_shows_it(client: httpx.AsyncClient) -> None:
    await make_session(client, id="s", config=MANUAL)
    assert len(TRACEBACK) > 8_000
    await append_ok(
        client,
        "s",
        [
            {"role": "user", "content": "The registry has 135 plugins; line them up by .py file."},
            _calling("c1", "bash", {"command": "python -m app.lib.registry"}),  # 2
            result("c1", TRACEBACK),  # 3
            _calling("c2", "bash", {"command": "pytest tests/test_registry.py"}),  # 4
            result("c2", "lib/registry.py:135: in load\n    register(name)\nE   KeyError"),  # 5
            _calling("c3", "bash", {"command": "grep -n register lib/registry.py"}),  # 6
            result("c3", "lib/registry.py:1350:    register(name)"),  # 7
            {"role": "assistant", "content": "registry.py, line 135 is where it fails."},  # 8
        ],
    )
    for query in ("registry.py:135", "registry.py line 135", "registry.py, line 135"):
        hits = (await search(client, "s", query))["hits"]
        by_seq = {h["seq"]: h for h in hits}
        # The three that name the place, however written, first; the prose and the
        # other line (1350) after them, by their words only.
        assert {h["seq"] for h in hits[:3]} == {3, 5, 8}, (query, hits)
        assert all(h["score"] >= 4 for h in hits[:3]), (query, hits)
        assert all(h["score"] < 2 for h in hits[3:]), (query, hits)
        assert 7 not in {h["seq"] for h in hits[:3]}
        # The frame's line, as written, from deep in the output.
        frame = by_seq[3]["snippet"]
        assert '  File "/srv/app/lib/«registry.py", line 135», in <module>' in frame, query
        assert "KeyError: 'plugin'" in frame
        assert "Traceback" not in frame
        assert "«lib/registry.py:135»" in by_seq[5]["snippet"] or (
            "lib/«registry.py:135»: in load" in by_seq[5]["snippet"]
        )


async def test_an_identifier_outranks_its_words_and_a_summary_that_lists_it(
    client: httpx.AsyncClient, app: Any
) -> None:
    config = {**MANUAL, "compaction": {"auto": False, "keep_recent_tokens": 50}}
    await make_session(client, id="s", config=config)
    filler = " ".join(f"detail{i}" for i in range(120))
    await append_ok(
        client,
        "s",
        [
            {"role": "user", "content": "Fix the loader in src/plugin_loader.py please."},  # 1
            _calling("c1", "read_file", {"path": "src/plugin_loader.py"}),  # 2
            result("c1", "def load_plugins(names):\n    return [plugin(n) for n in names]"),  # 3
            {
                "role": "user",
                "content": f"The src plugin loader, a py module, loads plugins. {filler}",
            },  # 4
            {"role": "assistant", "content": f"Loader noted. {filler}"},  # 5
        ],
    )
    for k in range(4):
        await append_ok(
            client,
            "s",
            [
                {"role": "user", "content": f"Step {k}. {filler}"},
                {"role": "assistant", "content": f"Done {k}. {filler}"},
            ],
        )
    r = await client.post("/v1/sessions/s/compactions", json={"summarizer": "extractive"})
    assert r.status_code == 202, r.text
    assert await drain(app) == 1
    job = (await client.get(f"/v1/sessions/s/compactions/{r.json()['id']}")).json()
    assert job["status"] == "succeeded", job["error"]
    assert "src/plugin_loader.py" in job["summary"]

    hits = (await search(client, "s", "src/plugin_loader.py"))["hits"]
    seqs = [h["seq"] for h in hits]
    summary = seqs.index(job["entry_seq"])
    # The entries that hold the path as written, then the summary that lists it, then
    # the prose that has only its words ("plugin loader").
    assert set(seqs[:summary]) == {1, 2, 3}, hits
    assert all(h["score"] >= 4 for h in hits[:summary])
    assert 3 <= hits[summary]["score"] < 4
    assert all(h["score"] < 2 for h in hits[summary + 1 :])
    assert 4 in seqs[summary + 1 :]
