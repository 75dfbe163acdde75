"""The continuity measurement's replay (bench/continuity.py): the engine in memory must
do what the service does, and every context it measures must be one the service would
hand the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from app.sessions.schemas import SessionConfig
from bench import continuity
from tests import traces
from tests.compactions.helpers import drain
from tests.conftest import make_session


def trace(name: str) -> Path:
    return next(p for p in traces.trace_files() if name in p.name)


def test_a_replayed_trace_gives_valid_contexts_and_baselines_within_their_size() -> None:
    result = continuity.replay(trace("sqlfluff-2419"))
    rows = result["compactions"]
    assert len(rows) >= 2
    for row in rows:
        assert row["pairing_problems"] == []
        assert not row["over_budget"]
        assert row["tokens_after"] < row["tokens_before"]
        assert row["baseline_pairing_problems"] == []
        assert 0 < row["baseline_tokens"] <= row["tokens_after"]
        assert row["cut_index"] <= row["appended"]
        ours = row["compacted"]
        assert ours["terms"] == len(result["terms"]) > 0
        assert ours["named"] is None or ours["named"] == (ours["missing_named"] == [])
        assert ours["listed"] is None or ours["listed"] == (ours["missing_listed"] == [])
    # Later compactions know of at least as many modified files as earlier ones.
    counts = [row["compacted"]["modified"] for row in rows]
    assert counts == sorted(counts)
    figures = continuity.figures(rows)
    assert figures["compactions"] == len(rows)
    passed, counted = figures["compacted"]["task"]
    assert counted == len(rows)
    assert passed == sum(row["compacted"]["task"] for row in rows)
    assert figures["baseline"]["files_listed"] == (0, 0)  # no summary, no list


def test_the_figures_leave_out_compactions_with_nothing_to_check() -> None:
    def row(named: bool | None, error: bool | None) -> dict[str, Any]:
        check: dict[str, Any] = {"task": True, "named": named, "listed": named, "error": error}
        check.update(terms=10, terms_kept=9)
        return {
            "reason": "threshold",
            "summary_tokens": 100,
            "continued": False,
            "pairing_problems": [],
            "over_budget": False,
            "compacted": check,
            "baseline": {**check, "listed": None},
        }

    figures = continuity.figures([row(None, None), row(True, False), row(False, True)])
    assert figures["compacted"]["files_named"] == (1, 2)
    assert figures["compacted"]["error"] == (1, 2)
    assert figures["compacted"]["task"] == (3, 3)
    assert figures["task_terms_kept_avg"] == 0.9


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["summarize", "verbatim_first"])
async def test_the_replay_is_what_the_service_does_with_an_instant_worker(
    app: Any, client: httpx.AsyncClient, policy: str
) -> None:
    """The same trace, turn by turn, through the service (its worker run right after
    each request, so the compaction it queued commits before the agent's next call)
    and through the replay: the same totals, the same context every turn, the same
    compactions with the same summaries."""
    messages = traces.load(trace("sqlfluff-1625"))  # compactions, and a prune
    config = {**continuity.CONFIG}
    config["compaction"] = {**config["compaction"], "policy": policy}
    pure = continuity.Session(SessionConfig.model_validate(config))
    await make_session(
        client,
        id="continuity",
        model=continuity.MODEL,
        context_window=continuity.WINDOW.context_window,
        max_output_tokens=continuity.WINDOW.max_output_tokens,
        config=config,
    )
    base = "/v1/sessions/continuity"
    pruned = 0
    for n, batch in enumerate(traces.turns(messages)):
        prompt = continuity.usage_prompt(pure, batch)
        if prompt is not None:
            pure.report_usage(prompt)
            body = {"input_tokens": prompt, "finish_reason": continuity.FINISH_REASON}
            r = await client.post(f"{base}/usage", json=body)
            assert r.status_code == 200, r.text
            await drain(app)
        pure.append(batch)
        r = await client.post(f"{base}/messages", json={"messages": batch})
        assert r.status_code == 201, r.text
        await drain(app)
        # The agent reads its context before its next call (the service records it as served).
        r = await client.get(f"{base}/context")
        assert r.status_code == 200, r.text
        assert r.json()["messages"] == pure.context(), f"turn {n}"
        session = (await client.get(base)).json()
        for name in ("context_tokens", "stored_tokens", "entry_count", "compaction_count"):
            assert session[name] == getattr(pure.totals, name), f"turn {n}: {name}"
        held = pure.held_seq is not None and pure.totals.next_seq <= pure.held_seq
        assert session["auto_compaction"] == ("held" if held else "on"), f"turn {n}"
        assert session["calibration_factor"] == pure.totals.calibration_factor, f"turn {n}"
        pruned = session["pruned_tokens"]
        assert pruned == pure.totals.pruned_tokens, f"turn {n}"

    r = await client.get(f"{base}/compactions", params={"limit": 100})
    jobs = sorted(r.json()["compactions"], key=lambda j: j["first_kept_seq"])
    assert [j["status"] for j in jobs] == ["succeeded"] * len(jobs)
    assert [(j["reason"], j["first_kept_seq"], j["summary"]) for j in jobs] == [
        (c.reason, c.first_kept_seq, c.summary) for c in pure.compactions
    ]
    assert len(jobs) >= 2
    assert pruned > 0  # pruning ran too, the same way
