"""The scorecard (bench/eval.py): one trace through the real service per strategy gives
figures that agree with each other."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import httpx

from bench import eval as scorecard
from bench import eval_facts
from tests import traces

TRACE = next(p for p in traces.trace_files() if "sqlfluff-2419" in p.name)  # the shortest


def test_a_strategy_the_session_config_refuses_is_skipped_with_a_note() -> None:
    scorecard.STRATEGIES["no_such_policy"] = {"compaction": {"policy": "no_such_policy"}}
    try:
        configs, notes = scorecard.strategies(16_384, ["extractive", "no_such_policy"])
    finally:
        del scorecard.STRATEGIES["no_such_policy"]
    assert list(configs) == ["extractive"]
    assert len(notes) == 1
    assert notes[0].startswith("no_such_policy: skipped")
    # At 16k the replay's config is bench.continuity's.
    assert configs["extractive"]["compaction"]["reserve_tokens"] == 4_096
    assert configs["extractive"]["prune"] == {"protect_tokens": 4_000, "minimum_tokens": 2_000}


def test_a_folder_of_traces_is_read_gzipped_or_not(tmp_path: Path) -> None:
    messages = [{"role": "user", "content": "Fix it."}, {"role": "assistant", "content": "Done."}]
    (tmp_path / "b.traj.json.gz").write_bytes(
        gzip.compress(json.dumps({"messages": [*messages, {"role": "exit"}]}).encode())
    )
    (tmp_path / "a.json").write_text(json.dumps(messages))
    (tmp_path / "notes.txt").write_text("not a trace")
    files = scorecard.trace_files(tmp_path)
    assert [p.name for p in files] == ["a.json", "b.traj.json.gz"]
    assert [scorecard.load(p) for p in files] == [messages, messages]
    assert scorecard.trace_name(files[1]) == "b"


async def test_one_trace_gives_consistent_figures(app: Any, client: httpx.AsyncClient) -> None:
    configs, _ = scorecard.strategies(scorecard.WINDOW, list(scorecard.STRATEGIES))
    assert "extractive" in configs
    worker = scorecard.new_worker(app)
    results: dict[str, list[dict[str, Any]]] = {}
    for name, cfg in configs.items():
        result = await scorecard.replay(client, worker, TRACE, name, cfg)
        results[name] = [result]
        rows = result["compactions"]
        assert len(rows) >= 2, name
        assert result["compaction_count"] >= len(rows)
        for row in rows:
            assert row["status"] == "succeeded"
            assert 0 < row["cut_index"] <= row["appended"]
            assert 0 < row["baseline_tokens"] <= row["tokens_after"]
            assert row["compacted"]["terms"] > 0
            # Facts sampled from what was compacted away: first seen before the cut,
            # at most PER_KIND of a kind, none twice.
            assert row["facts"], row["n"]
            for kind in eval_facts.KINDS:
                picked = [f for f in row["facts"] if f["kind"] == kind]
                assert len(picked) == min(scorecard.PER_KIND, row["pool"][kind])
            assert len({(f["kind"], f["fact"]) for f in row["facts"]}) == len(row["facts"])
            for fact in row["facts"]:
                assert fact["search_rank"] is None or 1 <= fact["search_rank"] <= fact["hits"] <= 5

    document = scorecard.scorecard(
        results,
        [TRACE],
        configs,
        [],
        context_window=scorecard.WINDOW,
        per_kind=scorecard.PER_KIND,
        seed=scorecard.SEED,
        elapsed=0.0,
    )
    document = json.loads(json.dumps(document))  # what --json writes
    assert set(document["strategies"]) == set(configs)
    for name, f in document["strategies"].items():
        rows = results[name][0]["compactions"]
        assert f["compactions_measured"] == len(rows)
        assert f["baseline"]["tokens_kept_avg"] <= f["tokens_kept_avg"]
        for key in ("task", "files_named", "files_listed", "error"):
            passed, counted = f["continuity"][key]
            assert 0 <= passed <= counted <= len(rows)
        assert set(f["recall"]) == {*eval_facts.KINDS, "all"} == set(f["baseline"]["recall"])
        facts = [fact for row in rows for fact in row["facts"]]
        total = f["recall"]["all"]
        assert (
            total["facts"] == len(facts) == sum(f["recall"][k]["facts"] for k in eval_facts.KINDS)
        )
        assert total["in_context"] == sum(fact["in_context"] for fact in facts) <= total["facts"]
        assert total["search"] == sum(fact["search_rank"] is not None for fact in facts)
        for kind in (*eval_facts.KINDS, "all"):
            ours, theirs = f["recall"][kind], f["baseline"]["recall"][kind]
            assert ours["facts"] == theirs["facts"]
            assert 0 <= ours["in_context"] <= ours["facts"]
            assert 0 <= ours["search"] <= ours["facts"]
            assert 0 <= theirs["in_context"] <= theirs["facts"]
            for share in (
                ours["in_context_share"],
                ours["search_share"],
                theirs["in_context_share"],
            ):
                assert share is None or 0.0 <= share <= 1.0
        # One search finds most facts: the search answers, and the queries are sound.
        assert total["search"] > total["facts"] / 2
