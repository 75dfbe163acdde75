"""Search on the real traces, after compaction: identifiers, paths, error names and
phrases that only the compacted part of a session holds are found, and the entries
that hold them come first.

Each trace is stored in three parts, with an extractive compaction after the first two
(a worker run for real), so that its first two thirds or so are compacted: out of the
context, which holds none of the queries below. The queries are taken from the
compacted entries; for each, the entries expected first are those whose searchable
text holds the query as written (any case), worked out in this process from the
history the API gives back.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests import traces
from tests.compactions.helpers import drain
from tests.helpers import append_ok
from tests.recall.support import MANUAL, every_hit, searchable

CONFIG = {**MANUAL, "compaction": {"auto": False, "keep_recent_tokens": 3_000}}

KINDS = {
    "identifier": re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+){2,}\b"),
    "path": re.compile(r"\b[\w.-]+(?:/[\w.-]+)+\.(?:py|cfg|toml|txt|json|rst)\b"),
    "error": re.compile(r"\b[A-Z][A-Za-z]+(?:Error|Exception|Warning)\b"),
    "phrase": re.compile(r"\b[a-z]{4,} [a-z]{4,} [a-z]{4,} [a-z]{4,}\b"),
}
PER_KIND = 2


def sample() -> list[Path]:
    """Seven traces, spread over the set."""
    files = traces.trace_files()
    return files[:: max(1, len(files) // 7)][:7]


async def _store(client: httpx.AsyncClient, app: Any, path: Path) -> str:
    session = await traces.create_session(client, path, "r-", config=CONFIG)
    sid: str = session["id"]
    turns = traces.turns(traces.load(path))
    third = max(1, len(turns) // 3)
    for part, (lo, hi) in enumerate(((0, third), (third, 2 * third), (2 * third, len(turns)))):
        messages = [m for turn in turns[lo:hi] for m in turn]
        if messages:
            await append_ok(client, sid, messages)
        if part < 2:
            r = await client.post(
                f"/v1/sessions/{sid}/compactions", json={"summarizer": "extractive"}
            )
            if r.status_code == 202:
                assert await drain(app) == 1
            else:
                assert r.status_code == 409, r.text  # nothing to cut yet
    return sid


def _queries(
    texts: dict[int, tuple[str, str]], compacted: set[int], context: str, rnd: random.Random
) -> list[tuple[str, str]]:
    """Up to PER_KIND queries of each kind from the compacted entries, each one that
    the context does not hold (any case)."""
    found: dict[str, list[str]] = {kind: [] for kind in KINDS}
    for seq in sorted(compacted):
        for kind, pattern in KINDS.items():
            for term in pattern.findall(texts[seq][1]):
                if term.lower() not in context and term not in found[kind]:
                    found[kind].append(term)
    out = []
    for kind, terms in found.items():
        for term in rnd.sample(terms, min(PER_KIND, len(terms))):
            out.append((kind, term))
    return out


async def test_queries_only_the_compacted_part_holds_find_it_first(
    client: httpx.AsyncClient, app: Any
) -> None:
    rnd = random.Random(16)
    checked: dict[str, int] = {kind: 0 for kind in KINDS}
    for path in sample():
        sid = await _store(client, app, path)
        session = (await client.get(f"/v1/sessions/{sid}")).json()
        assert session["compaction_count"] >= 1, path.name
        ctx = (await client.get(f"/v1/sessions/{sid}/context")).json()
        start = ctx["compaction"]["first_kept_seq"]
        context = orjson.dumps(ctx["messages"]).decode().lower()
        texts = await searchable(client, sid)
        summaries = [seq for seq, (kind, _) in texts.items() if kind == "compaction"]
        # Out of the context: what the latest summary replaced, and earlier summaries.
        compacted = {seq for seq in texts if seq < start} | set(summaries[:-1])
        for kind, term in _queries(texts, compacted, context, rnd):
            holding = {seq for seq, (_, text) in texts.items() if term.lower() in text.lower()}
            assert holding <= compacted, (path.name, term)  # the context holds none of them
            if len(holding) > 50:
                continue  # too common to be a fair test of "first"
            hits = await every_hit(client, sid, term)
            first = hits[: len(holding)]
            assert {h["seq"] for h in first} == holding, (path.name, kind, term, first)
            assert all(h["compacted"] and h["on_path"] for h in first), (path.name, term)
            # Found as written: scored above anything found by its words alone.
            assert all(h["score"] >= 2 for h in first), (path.name, term)
            assert all(h["score"] < 2 for h in hits[len(holding) :]), (path.name, term)
            assert "«" in first[0]["snippet"], first[0]
            checked[kind] += 1
    # Every kind was tried on several traces.
    assert all(count >= 4 for count in checked.values()), checked
