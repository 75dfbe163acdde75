"""Calibration against provider usage, and when automatic pruning looks."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.engine.accounting.budget import (
    CALIBRATION_ALPHA,
    CALIBRATION_MAX,
    CALIBRATION_MIN,
    CALIBRATION_MIN_COUNTED,
    CALIBRATION_RATIO_MAX,
    CALIBRATION_RATIO_MIN,
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
    # Any ratio counts, clamped into [0.25, 4] first: one EMA step toward the edge.
    assert calibrate(1.0, 60_000, 2_000) == pytest.approx(1.0 + CALIBRATION_ALPHA * 3.0)  # 30x
    assert calibrate(1.0, 100, 2_000) == pytest.approx(1.0 - CALIBRATION_ALPHA * 0.75)  # 0.05x
    assert calibrate(1.0, 7_800, 2_000) == pytest.approx(1.0 + CALIBRATION_ALPHA * 2.9)  # 3.9x


def test_what_can_be_compared() -> None:
    counted = CALIBRATION_MIN_COUNTED
    assert comparable(counted, counted)
    assert not comparable(counted - 1, counted - 1)
    assert comparable(100 * counted, counted)  # any ratio: it is clamped, not ignored
    assert comparable(1, counted)
    assert not comparable(0, counted)


RATIOS = (0.05, 3.5, 4.1, 10.0)


def test_a_persistent_ratio_walks_the_factor_to_its_clamp() -> None:
    """Seed 002: 15 reports each at 3.5x, 4.1x, 10x and 0.05x. The factor is
    monotone in the ratio after every report, and the persistent extremes reach
    the clamp (a report beyond 4x was ignored: the factor stayed 1.0 for ever)."""
    counted = 10_000
    walks = {ratio: [1.0] for ratio in RATIOS}
    for _ in range(15):
        for ratio, walk in walks.items():
            walk.append(calibrate(walk[-1], round(ratio * counted), counted))
    for k in range(16):
        factors = [walks[ratio][k] for ratio in sorted(RATIOS)]
        assert factors == sorted(factors), (k, factors)
    assert walks[4.1][-1] == CALIBRATION_MAX
    assert walks[10.0][-1] == CALIBRATION_MAX
    assert walks[0.05][-1] == CALIBRATION_MIN
    assert walks[3.5][-1] == CALIBRATION_MAX  # 3.5x is beyond the clamp too
    # Each report moved the factor one EMA step at most.
    for walk in walks.values():
        for before, after in itertools.pairwise(walk):
            edge = CALIBRATION_RATIO_MAX if after >= before else CALIBRATION_RATIO_MIN
            assert abs(after - before) <= CALIBRATION_ALPHA * abs(edge - before) + 1e-6


@given(
    factor=st.floats(min_value=CALIBRATION_MIN, max_value=CALIBRATION_MAX),
    smaller=st.integers(min_value=1, max_value=10**12),
    larger=st.integers(min_value=1, max_value=10**12),
    counted=st.integers(min_value=CALIBRATION_MIN_COUNTED, max_value=10**9),
)
def test_a_larger_discrepancy_never_gets_less_correction(
    factor: float, smaller: int, larger: int, counted: int
) -> None:
    smaller, larger = sorted((smaller, larger))
    assert calibrate(factor, smaller, counted) <= calibrate(factor, larger, counted)


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
    # At most alpha of the way to the ratio window's edge, whatever the report says...
    edge = CALIBRATION_RATIO_MAX if updated >= factor else CALIBRATION_RATIO_MIN
    assert abs(updated - factor) <= CALIBRATION_ALPHA * abs(edge - factor) + 1e-6
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
    ratio=st.floats(min_value=0.01, max_value=100.0),
    start=st.floats(min_value=CALIBRATION_MIN, max_value=CALIBRATION_MAX),
    counted=st.integers(min_value=1_000, max_value=1_000_000),
)
def test_the_factor_approaches_a_steady_ratio_without_overshooting(
    ratio: float, start: float, counted: int
) -> None:
    actual = max(1, round(ratio * counted))
    assert comparable(actual, counted)
    target = min(CALIBRATION_MAX, max(CALIBRATION_MIN, actual / counted))
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
