"""The pivot's rules (app/engine/compaction/pivot_rules.py), shared by the service's commit
(app/compactions/pivot.py) and the continuity replay (bench/continuity.py)."""

from __future__ import annotations

import pytest

from app.engine.accounting import budget, ledger
from app.engine.compaction import pivot_rules
from app.engine.compaction import prepare as engine
from app.engine.compaction.fileops import FileOps
from app.engine.compaction.summary import KeptRequest, render_user_requests
from app.engine.model import Entry, Role


def _accounting(context: int, *, overhead: int = 0, factor: float = 1.0) -> budget.Accounting:
    # A reported base that would make any estimate look bigger: judge ignores it.
    return budget.Accounting(
        context_tokens=context,
        calibration_factor=factor,
        overhead_tokens=overhead,
        reported_prompt_tokens=context * 3,
        context_tokens_at_report=context,
    )


def _moved(window: int, *added: int) -> ledger.PivotMoved:
    return ledger.PivotMoved(
        added=added,
        context_start_seq=5,
        summary_seq=9,
        pinned_seqs=(),
        window_tokens=window,
        window_tool_tokens=0,
    )


def test_a_move_that_leaves_the_context_no_smaller_is_not_committed() -> None:
    same = pivot_rules.judge(_accounting(1_000), _moved(900, 100))
    assert (same.gain, same.tokens_before, same.tokens_after) == (False, 1_000, 1_000)
    assert not pivot_rules.judge(_accounting(1_000), _moved(900, 150)).gain
    smaller = pivot_rules.judge(_accounting(1_000), _moved(899, 100))
    assert smaller.gain
    assert smaller.tokens_after == 999


def test_low_yield_is_judged_on_estimates_from_counts_with_the_overhead() -> None:
    # 1,000 counted + 1,000 overhead: saving 99 is under 5% of 2,000, saving 100 is not.
    assert pivot_rules.judge(_accounting(1_000, overhead=1_000), _moved(800, 101)).low_yield
    assert not pivot_rules.judge(_accounting(1_000, overhead=1_000), _moved(800, 100)).low_yield
    # Without overhead the same saving of 99 is a good yield (9.9% of 1,000).
    assert not pivot_rules.judge(_accounting(1_000), _moved(800, 101)).low_yield
    # The calibration factor scales both sides.
    acc = _accounting(1_000, overhead=1_000, factor=2.0)
    assert pivot_rules.estimate_from_counts(acc, 500) == 2_000
    assert not pivot_rules.judge(acc, _moved(800, 101)).low_yield  # 198 of 3,000


def test_what_a_compaction_keeps_by_reason() -> None:
    args = {"keep_recent_tokens": 20_000, "trigger_tokens": 8_000, "context_tokens": 6_000}
    assert pivot_rules.keep_for("threshold", **args) == 4_000  # half the trigger
    assert pivot_rules.keep_for("manual", **args) == 4_000
    assert pivot_rules.keep_for("emergency", **args) == 2_000  # a quarter
    assert pivot_rules.keep_for("overflow", **args) == 1_500  # a quarter of the context
    assert pivot_rules.keep_for("threshold", **{**args, "keep_recent_tokens": 300}) == 300


@pytest.mark.parametrize(
    ("role", "kind", "makes_calls", "finish_reason", "pending", "expected"),
    [
        ("tool", "message", False, None, False, True),
        ("tool", "message", False, None, True, False),  # calls still running
        ("assistant", "message", False, "length", False, True),
        ("assistant", "message", False, "MAX_TOKENS", False, True),
        ("assistant", "message", False, "stop", False, False),
        ("assistant", "message", True, "length", False, False),  # its calls will answer
        ("user", "message", False, "length", False, False),
        ("user", "continue", False, None, False, False),
        ("tool", "compaction", False, None, False, False),
    ],
)
def test_a_continue_follows_only_an_interrupted_agent(
    role: str,
    kind: str,
    makes_calls: bool,
    finish_reason: str | None,
    pending: bool,
    expected: bool,
) -> None:
    got = pivot_rules.continues(
        role=role,
        kind=kind,
        makes_calls=makes_calls,
        finish_reason=finish_reason,
        calls_pending=pending,
    )
    assert got is expected


def test_the_entries_appended_are_the_rendered_summary_then_the_continue() -> None:
    alone = pivot_rules.pivot_entries(7, "the summary", continued=False, encoding="o200k_base")
    assert [(e.seq, e.kind, e.entry.role) for e in alone] == [(7, "compaction", "user")]
    assert "the summary" in alone[0].entry.text()
    assert alone[0].entry.tokens > 0
    both = pivot_rules.pivot_entries(7, "the summary", continued=True, encoding="o200k_base")
    assert [(e.seq, e.kind) for e in both] == [(7, "compaction"), (8, "continue")]
    assert both[1].entry.text() == pivot_rules.CONTINUE_TEXT
    move = pivot_rules.moved(
        _plan(pinned=[1]), both, (1,), window_tokens=300, window_tool_tokens=50
    )
    assert move.summary_seq == 7
    assert move.context_start_seq == 4
    assert move.added == (both[0].entry.tokens, both[1].entry.tokens)
    assert move.context_tokens == 300 + sum(move.added)


def _plan(pinned: list[int]) -> engine.Plan:
    return engine.Plan(
        start_seq=1,
        first_kept_seq=4,
        history=[],
        turn_prefix=[],
        pinned=pinned,
        summarized_tokens=0,
        kept_tokens=0,
        file_ops=FileOps(),
    )


def test_pinned_entries_are_the_union_in_order() -> None:
    assert pivot_rules.pinned_after([5, 1], _plan([3, 1])) == (1, 3, 5)
    assert pivot_rules.pinned_after((), _plan([])) == ()


def test_the_previous_summary_is_read_without_its_quoted_requests() -> None:
    block = render_user_requests([KeptRequest(3, "fix the parser", first=True)], 0)
    summary = f"## Goal\nfix it\n\n{block}"
    stripped = pivot_rules.previous_summary(summary)
    assert stripped == "## Goal\nfix it"
    assert pivot_rules.previous_summary(None) is None


def test_the_plan_keeps_by_reason_and_quotes_within_the_requests_budget() -> None:
    def source(seq: int, role: Role, text: str) -> engine.Source:
        entry = Entry(role=role, parts=[{"type": "text", "text": text}], tokens=500)
        return engine.Source(seq=seq, kind="message", entry=entry)

    sources = [
        source(1, "system", "be brief"),
        *(source(k, "user" if k % 2 == 0 else "assistant", f"turn {k}") for k in range(2, 14)),
    ]

    def plan_for(reason: str) -> engine.Plan:
        got = pivot_rules.plan(
            sources,
            reason=reason,
            start_seq=1,
            end_seq=14,
            context_tokens=6_500,
            trigger_tokens=8_000,
            keep_recent_tokens=20_000,
            keep_requests_tokens=20_000,
            previous_details=None,
            encoding="o200k_base",
        )
        assert got is not None
        return got

    threshold, overflow = plan_for("threshold"), plan_for("overflow")
    # The cut keeps whole turns: as the engine's plan with the keep each reason gets.
    for got, keep in ((threshold, 4_000), (overflow, 6_500 // 4)):
        direct = engine.plan(
            sources,
            start_seq=1,
            end_seq=14,
            keep=keep,
            previous_details=None,
            threshold_tokens=8_000,
            keep_requests_tokens=20_000,
            encoding="o200k_base",
        )
        assert direct is not None
        assert got.first_kept_seq == direct.first_kept_seq
    assert overflow.first_kept_seq > threshold.first_kept_seq
    assert overflow.kept_tokens < threshold.kept_tokens <= 4_000
    assert threshold.pinned == [1]
    assert threshold.requests is not None
    assert threshold.requests.budget_tokens == 1_200  # 15% of the trigger
    assert threshold.requests.first is not None
    assert threshold.requests.first.text == "turn 2"
