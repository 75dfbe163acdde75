"""Calibration against provider usage, and when automatic pruning looks."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from app.engine.budget import (
    CALIBRATION_ALPHA,
    CALIBRATION_MAX,
    CALIBRATION_MIN,
    CALIBRATION_MIN_COUNTED,
    CALIBRATION_PLAUSIBLE_MAX,
    CALIBRATION_PLAUSIBLE_MIN,
    Accounting,
    calibrate,
    comparable,
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
    factor = 1.0
    for _ in range(80):  # a provider counting 3.9x: the factor stops at the bound
        factor = calibrate(factor, 39_000, 10_000)
        assert factor <= CALIBRATION_MAX
    assert factor == pytest.approx(CALIBRATION_MAX, abs=1e-5)
    for _ in range(80):
        factor = calibrate(factor, 2_600, 10_000)  # 0.26x
        assert factor >= CALIBRATION_MIN
    assert factor == pytest.approx(CALIBRATION_MIN, abs=1e-5)


def test_one_odd_report_does_not_send_the_factor_to_its_clamp() -> None:
    """The defect: a large prompt against a tiny counted context moved the factor
    from 1.0 straight to 3.0 (and tripled every estimate after it)."""
    assert calibrate(1.0, 10**9, 1) == 1.0  # nothing comparable: too few counted
    assert calibrate(1.0, 5_000, 20) == 1.0
    assert calibrate(1.0, 60_000, 2_000) == 1.0  # 30x: not a tokenizer difference
    assert calibrate(1.0, 100, 2_000) == 1.0  # 0.05x
    # A plausible ratio beyond the bound moves one EMA step toward the bound.
    assert calibrate(1.0, 7_800, 2_000) == pytest.approx(1.0 + CALIBRATION_ALPHA * 2.0)


def test_what_can_be_compared() -> None:
    counted = CALIBRATION_MIN_COUNTED
    assert comparable(counted, counted)
    assert not comparable(counted - 1, counted - 1)
    assert comparable(round(CALIBRATION_PLAUSIBLE_MAX * counted), counted)
    assert not comparable(round(CALIBRATION_PLAUSIBLE_MAX * counted) + 1, counted)
    assert comparable(round(CALIBRATION_PLAUSIBLE_MIN * counted), counted)
    assert not comparable(round(CALIBRATION_PLAUSIBLE_MIN * counted) - 1, counted)
    assert not comparable(0, counted)


@given(
    factor=st.floats(min_value=CALIBRATION_MIN, max_value=CALIBRATION_MAX),
    actual=st.integers(min_value=0, max_value=10**12),
    counted=st.integers(min_value=0, max_value=10**9),
)
def test_one_report_moves_the_factor_by_at_most_the_ema_step(
    factor: float, actual: int, counted: int
) -> None:
    updated = calibrate(factor, actual, counted)
    assert CALIBRATION_MIN <= updated <= CALIBRATION_MAX
    # At most alpha of the way to the bound, whatever the report says...
    bound = CALIBRATION_MAX if updated >= factor else CALIBRATION_MIN
    assert abs(updated - factor) <= CALIBRATION_ALPHA * abs(bound - factor) + 1e-6
    # ...and no move at all from a report that cannot be compared.
    if not comparable(actual, counted):
        assert updated == factor


def test_a_tokenizer_counting_1_3x_is_learned_within_10_reports() -> None:
    factor, reports = 1.0, 0
    counted = 10_000
    while abs(factor * counted - 1.3 * counted) / (1.3 * counted) > 0.05:
        factor = calibrate(factor, round(1.3 * counted), counted)
        reports += 1
    assert reports <= 10


@given(
    ratio=st.floats(min_value=CALIBRATION_PLAUSIBLE_MIN, max_value=CALIBRATION_PLAUSIBLE_MAX),
    start=st.floats(min_value=CALIBRATION_MIN, max_value=CALIBRATION_MAX),
    counted=st.integers(min_value=1_000, max_value=1_000_000),
)
def test_the_factor_approaches_a_steady_ratio_without_overshooting(
    ratio: float, start: float, counted: int
) -> None:
    actual = max(1, round(ratio * counted))
    # A ratio at the edge of the plausible band may round out of it (see
    # test_one_odd_report_does_not_send_the_factor_to_its_clamp for those).
    assume(comparable(actual, counted))
    target = min(CALIBRATION_MAX, max(CALIBRATION_MIN, ratio))
    factor = start
    for _ in range(60):
        updated = calibrate(factor, actual, counted)
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
