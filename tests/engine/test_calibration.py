"""Calibration against provider usage, and when automatic pruning looks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.budget import (
    CALIBRATION_MAX,
    CALIBRATION_MIN,
    Accounting,
    calibrate,
    estimate,
    should_auto_prune,
)


def test_one_report_moves_a_fifth_of_the_way() -> None:
    assert calibrate(1.0, 1300, 1000) == pytest.approx(1.06)
    assert calibrate(2.0, 500, 1000) == pytest.approx(1.7)


def test_nothing_to_compare_leaves_the_factor() -> None:
    assert calibrate(1.4, 0, 1000) == 1.4
    assert calibrate(1.4, 1000, 0) == 1.4


def test_the_factor_is_clamped() -> None:
    assert calibrate(1.0, 10**9, 1) == CALIBRATION_MAX  # one huge ratio is bounded too
    assert calibrate(0.55, 1, 10**9) == CALIBRATION_MIN  # 0.44 unclamped


def test_a_tokenizer_counting_1_3x_is_learned_within_10_reports() -> None:
    factor, reports = 1.0, 0
    counted = 10_000
    while abs(factor * counted - 1.3 * counted) / (1.3 * counted) > 0.05:
        factor = calibrate(factor, round(1.3 * counted), counted)
        reports += 1
    assert reports <= 10


@given(
    ratio=st.floats(min_value=0.01, max_value=100),
    start=st.floats(min_value=CALIBRATION_MIN, max_value=CALIBRATION_MAX),
    counted=st.integers(min_value=1_000, max_value=1_000_000),
)
def test_the_factor_approaches_a_steady_ratio_without_overshooting(
    ratio: float, start: float, counted: int
) -> None:
    target = min(CALIBRATION_MAX, max(CALIBRATION_MIN, ratio))
    factor = start
    for _ in range(60):
        updated = calibrate(factor, max(1, round(ratio * counted)), counted)
        assert CALIBRATION_MIN <= updated <= CALIBRATION_MAX
        # Never past the target, never away from it (rounding aside).
        assert abs(updated - target) <= abs(factor - target) + 1e-3
        factor = updated
    assert abs(factor - target) < 0.02 * target + 2e-3


def test_the_hybrid_estimate_starts_from_the_report() -> None:
    acc = Accounting(
        context_tokens=12_000,
        calibration_factor=1.5,
        reported_prompt_tokens=20_000,
        context_tokens_at_report=10_000,
    )
    assert estimate(acc) == 20_000 + 3_000  # what came since, calibrated


@pytest.mark.parametrize(
    ("action", "tool_tokens", "checked", "checked_urgent", "expected"),
    [
        ("none", 100_000, None, None, False),  # nothing asked
        ("prune", 100_000, None, None, True),  # never looked
        ("prune", 30_000, 20_000, False, False),  # too little new output
        ("prune", 40_000, 20_000, False, True),  # enough new output
        ("compact", 21_000, 20_000, False, True),  # turned urgent: rules loosened
        ("compact", 21_000, 20_000, True, False),  # already looked while urgent
        ("emergency", 45_000, 20_000, True, True),
    ],
)
def test_when_automatic_pruning_looks(
    action: str, tool_tokens: int, checked: int | None, checked_urgent: bool | None, expected: bool
) -> None:
    got = should_auto_prune(action, tool_tokens, checked, checked_urgent, 20_000)  # type: ignore[arg-type]
    assert got is expected
